package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/hotkeyd/hotkey/internal/testkit"
)

// The tests run the real binary, built once here, as a subprocess on free
// loopback ports.
var (
	bin     string // the hotkeyd binary
	testDir string // parent of everything the tests write
)

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	var err error
	if testDir, err = os.MkdirTemp("", "hotkeyd-test-"); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(testDir)
	bin = filepath.Join(testDir, "hotkeyd")
	// Built as the Dockerfile builds it (static, -trimpath), so that the
	// tests run what ships, and deploy's check of that build finds the
	// packages compiled.
	build := exec.Command("go", "build", "-trimpath", "-o", bin, "-ldflags", "-X main.version=v0.0.0-test", ".")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "go build: %v\n%s", err, out)
		return 1
	}
	code := m.Run()
	client.CloseIdleConnections()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			return 1
		}
	}
	return code
}

// client is the tests' HTTP client. Its timeout only catches a hang.
var client = &http.Client{
	Timeout:   time.Minute,
	Transport: &http.Transport{MaxIdleConnsPerHost: 64, DisableCompression: true},
}

// freeAddr returns a loopback address whose port was free a moment ago.
func freeAddr(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// proc is a hotkeyd subprocess.
type proc struct {
	t        testing.TB
	cmd      *exec.Cmd
	base     string // http://127.0.0.1:PORT of the API
	admin    string // http://127.0.0.1:PORT of the admin listener
	grpcAddr string // 127.0.0.1:PORT of the gRPC listener
	natsURL  string // the embedded server's, or the one joined
	id       string // instance ID, from the "serving" log line
	stderr   *testkit.Buffer
	done     chan struct{} // closed when the process has exited
	exitCode int
}

// daemonOpts say how to start a daemon.
type daemonOpts struct {
	args []string // extra flags
	join string   // --nats URL; empty: embedded server on a free port
	env  []string // extra environment
	// viaEnv passes the listen addresses as HOTKEYD_LISTEN,
	// HOTKEYD_NATS_LISTEN, HOTKEYD_GRPC_LISTEN and HOTKEYD_ADMIN_LISTEN
	// instead of flags.
	viaEnv bool
}

// startDaemon starts hotkeyd on free ports and waits until /healthz
// answers; a port taken between choosing and binding it is retried on new
// ports. The daemon is stopped (SIGTERM, then SIGKILL) at cleanup.
func startDaemon(t testing.TB, o daemonOpts) *proc {
	t.Helper()
	for attempt := 0; ; attempt++ {
		d, err := tryStart(t, o)
		if err == nil {
			return d
		}
		if attempt < 4 && strings.Contains(err.Error(), "already in use") {
			t.Logf("port race, retrying: %v", err)
			continue
		}
		t.Fatal(err)
	}
}

var idRe = regexp.MustCompile(`msg=serving .*instance=(\S+)`)

func tryStart(t testing.TB, o daemonOpts) (*proc, error) {
	listen := freeAddr(t)
	var args, env []string
	if o.viaEnv {
		env = append(env, "HOTKEYD_LISTEN="+listen)
	} else {
		args = append(args, "--listen", listen)
	}
	natsURL := o.join
	if o.join == "" {
		n := freeAddr(t)
		if o.viaEnv {
			env = append(env, "HOTKEYD_NATS_LISTEN="+n)
		} else {
			args = append(args, "--nats-listen", n)
		}
		natsURL = "nats://" + n
	} else {
		args = append(args, "--nats", o.join)
	}
	grpcAddr := freeAddr(t)
	if o.viaEnv {
		env = append(env, "HOTKEYD_GRPC_LISTEN="+grpcAddr)
	} else {
		args = append(args, "--grpc-listen", grpcAddr)
	}
	admin := freeAddr(t)
	if o.viaEnv {
		env = append(env, "HOTKEYD_ADMIN_LISTEN="+admin)
	} else {
		args = append(args, "--admin-listen", admin)
	}
	args = append(args, o.args...)
	d := &proc{t: t, base: "http://" + listen, admin: "http://" + admin, grpcAddr: grpcAddr, natsURL: natsURL, stderr: &testkit.Buffer{}, done: make(chan struct{})}
	d.cmd = exec.Command(bin, args...)
	d.cmd.Env = append(append(os.Environ(), o.env...), env...)
	d.cmd.Stderr = d.stderr
	d.cmd.Stdout = d.stderr
	d.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := d.cmd.Start(); err != nil {
		return nil, err
	}
	go func() {
		d.cmd.Wait()
		d.exitCode = d.cmd.ProcessState.ExitCode()
		close(d.done)
	}()
	deadline := time.Now().Add(time.Minute)
	for {
		select {
		case <-d.done:
			return nil, fmt.Errorf("hotkeyd %s exited with %d: %s", strings.Join(args, " "), d.exitCode, d.stderr)
		default:
		}
		if resp, err := client.Get(d.base + "/healthz"); err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == 200 {
				break
			}
		}
		if time.Now().After(deadline) {
			d.kill()
			return nil, fmt.Errorf("hotkeyd not serving after a minute: %s", d.stderr)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// The "serving" line may come just after /healthz first answers.
	testkit.For(t, 30*time.Second, "the serving log line", func() bool {
		m := idRe.FindStringSubmatch(d.stderr.String())
		if m != nil {
			d.id = m[1]
		}
		return m != nil
	})
	t.Cleanup(func() {
		d.stop()
		if t.Failed() {
			t.Logf("hotkeyd %s stderr:\n%s", strings.Join(args, " "), d.stderr)
		}
	})
	return d, nil
}

// stop sends SIGTERM and waits up to a minute, then kills.
func (d *proc) stop() {
	select {
	case <-d.done:
		return
	default:
	}
	d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.done:
	case <-time.After(time.Minute):
		d.t.Errorf("hotkeyd still running a minute after SIGTERM")
		d.kill()
	}
}

func (d *proc) kill() {
	d.cmd.Process.Kill()
	<-d.done
}

// reply is an HTTP answer.
type reply struct {
	status int
	header http.Header
	body   []byte
}

func (r reply) json(t testing.TB, v any) {
	t.Helper()
	if err := json.Unmarshal(r.body, v); err != nil {
		t.Fatalf("status %d, body %q: %v", r.status, r.body, err)
	}
}

func (r reply) errorMsg(t testing.TB) string {
	t.Helper()
	var e struct {
		Error string `json:"error"`
	}
	r.json(t, &e)
	if e.Error == "" {
		t.Fatalf("status %d: no error message in %s", r.status, r.body)
	}
	return e.Error
}

func do(t testing.TB, method, url, body string) reply {
	t.Helper()
	r, err := doErr(context.Background(), method, url, body)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func doErr(ctx context.Context, method, url, body string) (reply, error) {
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, rd)
	if err != nil {
		return reply{}, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return reply{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return reply{}, err
	}
	return reply{status: resp.StatusCode, header: resp.Header, body: b}, nil
}

func (d *proc) allow(t testing.TB, body string) reply {
	t.Helper()
	return do(t, "POST", d.base+"/v1/allow", body)
}

// allowResp is the body of a decision.
type allowResp struct {
	Allowed      *bool  `json:"allowed"`
	Limit        *int64 `json:"limit"`
	Remaining    *int64 `json:"remaining"`
	ResetAfterMs *int64 `json:"reset_after_ms"`
	RetryAfterMs *int64 `json:"retry_after_ms"`
	Shards       *int   `json:"shards"`
}

// hotKeys is the body of GET /v1/hotkeys.
type hotKeys struct {
	Peers   int `json:"peers"`
	HotKeys []struct {
		Policy      string `json:"policy"`
		Key         string `json:"key"`
		Level       int    `json:"level"`
		ExpiresInMs int64  `json:"expires_in_ms"`
		Origin      string `json:"origin"`
	} `json:"hotkeys"`
}

func (d *proc) hotKeys(t testing.TB) hotKeys {
	t.Helper()
	r := do(t, "GET", d.admin+"/v1/hotkeys", "")
	if r.status != 200 {
		t.Fatalf("/v1/hotkeys: %d %s", r.status, r.body)
	}
	var h hotKeys
	r.json(t, &h)
	return h
}

// writeFile writes a file under a test's temporary directory.
func writeFile(t testing.TB, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// metric returns the value of the sample line name (with labels, as
// exposed) in a /metrics scrape, or -1.
func metric(scrape, name string) float64 {
	for _, line := range strings.Split(scrape, "\n") {
		if rest, ok := strings.CutPrefix(line, name+" "); ok {
			v, err := strconv.ParseFloat(strings.TrimSpace(rest), 64)
			if err == nil {
				return v
			}
		}
	}
	return -1
}

// runBinary runs hotkeyd to completion (it must exit by itself within a
// minute) and returns its exit code and output.
func runBinary(t testing.TB, args ...string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return 0, string(out)
	case errors.As(err, &ee):
		return ee.ExitCode(), string(out)
	}
	t.Fatal(err)
	return -1, ""
}
