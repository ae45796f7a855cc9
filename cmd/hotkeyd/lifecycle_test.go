package main

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/hotkeyd/hotkey/internal/testkit"
)

// TestSIGTERM: under load over HTTP and NATS, and with an idle connection
// open, SIGTERM stops the daemon gracefully (its Shutdown finished within
// ShutdownTimeout: nothing held it, the idle connection included) with exit
// code 0, and no request in flight gets an error.
func TestSIGTERM(t *testing.T) {
	t.Parallel()
	d := startDaemon(t, daemonOpts{})
	nc, err := nats.Connect(d.natsURL, nats.MaxReconnects(0))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	var ok, bad atomic.Int64
	for i := 0; i < 4; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				r, err := doErr(ctx, "POST", d.base+"/v1/allow", `{"key":"busy"}`)
				if err != nil {
					return // the daemon stopped accepting
				}
				if r.status == 200 || r.status == 429 {
					ok.Add(1)
				} else {
					bad.Add(1)
				}
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for ctx.Err() == nil {
			m, err := nc.Request("hotkey.allow", []byte(`{"key":"busy-nats"}`), time.Second)
			if err != nil {
				return
			}
			if m.Header.Get("Nats-Service-Error-Code") != "" {
				bad.Add(1)
			} else {
				ok.Add(1)
			}
		}
	}()
	testkit.For(t, time.Minute, "some decisions", func() bool { return ok.Load() > 200 })
	// A connection that never sends a request (HTTP clients dial ahead)
	// must not hold the shutdown up.
	idle, err := net.Dial("tcp", strings.TrimPrefix(d.base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer idle.Close()
	time.Sleep(50 * time.Millisecond) // accepted

	start := time.Now()
	if err := d.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-d.done:
	case <-time.After(time.Minute):
		t.Fatal("still running a minute after SIGTERM")
	}
	took := time.Since(start)
	cancel()
	wg.Wait()
	t.Logf("exited %d in %v after SIGTERM, %d decisions answered under load", d.exitCode, took, ok.Load())
	if d.exitCode != 0 {
		t.Errorf("exit code %d after SIGTERM, want 0", d.exitCode)
	}
	if n := bad.Load(); n > 0 {
		t.Errorf("%d requests answered with an error while shutting down", n)
	}
	// "stopped", not "shutdown incomplete": Shutdown returned before its
	// deadline, which an idle connection would have held it to.
	if out := d.stderr.String(); !strings.Contains(out, "signal=SIGTERM") {
		t.Errorf("the shutdown log does not name SIGTERM: %s", out)
	}
	if out := d.stderr.String(); !strings.Contains(out, "msg=stopped") || strings.Contains(out, "shutdown incomplete") {
		t.Errorf("no graceful stop logged:\n%s", out)
	}
}

// TestPortTaken: a taken HTTP, NATS or gRPC port ends the daemon with a message
// naming the flag to change.
func TestPortTaken(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	taken := l.Addr().String()
	flags := []struct{ flag, env string }{
		{"--listen", "HOTKEYD_LISTEN"}, {"--nats-listen", "HOTKEYD_NATS_LISTEN"},
		{"--grpc-listen", "HOTKEYD_GRPC_LISTEN"}, {"--admin-listen", "HOTKEYD_ADMIN_LISTEN"},
	}
	for i, f := range flags {
		want := fmt.Sprintf("change it with %s (%s)", f.flag, f.env)
		for try := 1; ; try++ {
			var args []string
			for j, g := range flags {
				addr := taken
				if j != i {
					addr = freeAddr(t)
				}
				args = append(args, g.flag, addr)
			}
			code, out := runBinary(t, args...)
			if code != 0 && strings.Contains(out, "already in use") && !strings.Contains(out, want) && try < 3 {
				// Another of the addresses, free when drawn, was taken by
				// something else on the machine before the daemon bound
				// it: draw them again.
				continue
			}
			if code == 0 || !strings.Contains(out, "already in use") || !strings.Contains(out, want) {
				t.Errorf("%v: exit %d, output %q: want non-zero and a message naming %s", args, code, out, want)
			}
			break
		}
	}
}

// TestInvalidPoliciesRefused: the daemon does not start on a bad policies
// file, and says which line and field are at fault.
func TestInvalidPoliciesRefused(t *testing.T) {
	t.Parallel()
	cases := []struct {
		file string
		want []string
	}{
		{"policies:\n  login:\n    algorithm: sliding_log\n    limit: 5\n    period: 1m\n    on_store_failure: sometimes\n",
			[]string{"line 6", "policies.login.on_store_failure", `unknown value "sometimes"`}},
		{"policies:\n  api:\n    limit: 100\n    period: 1s\n    brust: 200\n",
			[]string{"line 5", "policies.api.brust", "unknown field"}},
		{"policies:\n  api:\n    algorithm: leaky_bucket\n    limit: 100\n    period: 1s\n",
			[]string{"line 3", "policies.api.algorithm", "leaky_bucket"}},
		{"policies:\n  api:\n    limit: 100\n    period: soon\n",
			[]string{"line 4", "policies.api.period", "not a duration"}},
		{"policies:\n  big:\n    algorithm: sliding_log\n    limit: 1000000\n    period: 1s\n",
			[]string{"line 4", "policies.big.limit", "too large"}},
		{"policies:\n  api:\n    limit: 100\n   period: 1s\n",
			[]string{"line 4", "invalid YAML"}},
	}
	for _, c := range cases {
		path := writeFile(t, "policies.yaml", c.file)
		code, out := runBinary(t, "--policies", path, "--listen", freeAddr(t), "--nats-listen", freeAddr(t), "--grpc-listen", freeAddr(t), "--admin-listen", freeAddr(t))
		if code == 0 {
			t.Errorf("started on %q", c.file)
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(out, w) {
				t.Errorf("file %q: output %q lacks %q", c.file, out, w)
			}
		}
		if !strings.Contains(out, path) {
			t.Errorf("output %q does not name the file", out)
		}
	}
	code, out := runBinary(t, "--policies", "/nonexistent/policies.yaml")
	if code == 0 || !strings.Contains(out, "--policies") {
		t.Errorf("missing file: exit %d, %q", code, out)
	}
}

// TestInvalidEnvoyConfigRefused: the daemon does not start on a bad
// --envoy-config, and names the file, line and field at fault; a missing
// path names the flag, and --envoy-config without gRPC is refused.
func TestInvalidEnvoyConfigRefused(t *testing.T) {
	t.Parallel()
	cases := []struct {
		file string
		want []string
	}{
		{"domain: rl\ndescriptors:\n  - key: foo\n    rate_limit:\n      unit: fortnight\n      requests_per_unit: 5\n",
			[]string{"line 5", "descriptors[0].rate_limit.unit", "fortnight"}},
		{"domain: rl\ndescriptors:\n  - key: foo\n    rate_limit:\n      unit: minute\n",
			[]string{"descriptors[0].rate_limit", "requests_per_unit: 0"}},
		{"domain: rl\ndescriptors:\n  - key: foo\n    shadow_mode: true\n    rate_limts:\n      unit: minute\n",
			[]string{"line 5", "descriptors[0].rate_limts", "unknown field"}},
	}
	for _, c := range cases {
		path := writeFile(t, "rl.yaml", c.file)
		code, out := runBinary(t, "--envoy-config", path, "--listen", freeAddr(t), "--nats-listen", freeAddr(t), "--grpc-listen", freeAddr(t), "--admin-listen", freeAddr(t))
		if code == 0 {
			t.Errorf("started on %q", c.file)
			continue
		}
		for _, w := range append(c.want, path, "--envoy-config") {
			if !strings.Contains(out, w) {
				t.Errorf("file %q: output %q lacks %q", c.file, out, w)
			}
		}
	}
	if code, out := runBinary(t, "--envoy-config", "/nonexistent/rl.yaml", "--listen", freeAddr(t), "--nats-listen", freeAddr(t), "--grpc-listen", freeAddr(t), "--admin-listen", freeAddr(t)); code == 0 || !strings.Contains(out, "--envoy-config") {
		t.Errorf("missing path: exit %d, %q", code, out)
	}
	if code, out := runBinary(t, "--envoy-config", "/x.yaml", "--grpc-listen", ""); code != 2 || !strings.Contains(out, "--grpc-listen") {
		t.Errorf("--envoy-config without gRPC: exit %d, %q", code, out)
	}
}

// TestVersionAndHelp: hotkeyd version, and --help documenting every flag.
func TestVersionAndHelp(t *testing.T) {
	t.Parallel()
	for _, arg := range []string{"version", "--version"} {
		if code, out := runBinary(t, arg); code != 0 || out != "hotkeyd v0.0.0-test\n" {
			t.Errorf("%s: %d %q", arg, code, out)
		}
	}
	code, out := runBinary(t, "--help")
	if code != 0 {
		t.Fatalf("--help: exit %d", code)
	}
	for _, f := range []string{"listen", "policies", "redis", "redis-cluster", "nats", "nats-listen", "nats-user", "nats-password",
		"nats-token", "nats-nkey-seed", "nats-creds", "nats-ca", "nats-cert", "nats-key", "hot-threshold", "cool-down", "breaker-probe", "log-level"} {
		env := "HOTKEYD_" + strings.ToUpper(strings.ReplaceAll(f, "-", "_"))
		if !strings.Contains(out, "--"+f+" ") || !strings.Contains(out, "env "+env+", default ") {
			t.Errorf("--help does not document --%s with %s and its default", f, env)
		}
	}
	if code, out := runBinary(t, "--listen"); code != 2 || !strings.Contains(out, "--help") {
		t.Errorf("flag without value: %d %q", code, out)
	}
}
