package loadgencmd_test

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/hotkeyd/hotkey/internal/daemon"
	"github.com/hotkeyd/hotkey/internal/loadgencmd"
	"github.com/hotkeyd/hotkey/internal/testkit"
)

// TestBadFlags: each bad flag exits 2 with a message that names it.
func TestBadFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--rate", "0"}, "--rate"},
		{[]string{"--rate", "fast"}, "-rate"},
		{[]string{"--duration", "-1s"}, "--duration"},
		{[]string{"--target", "127.0.0.1:8080"}, "--target"},
		{[]string{"--target", "redis://x:1"}, "--target"},
		{[]string{"--concurrency", "0"}, "--concurrency"},
		{[]string{"--keys", "0"}, "--keys"},
		{[]string{"--cost", "0"}, "--cost"},
		{[]string{"--hot-rate", "5000", "--rate", "1000"}, "--hot-rate"},
		{[]string{"--workload", "storm"}, "--workload"},
		{[]string{"--workload", "zipf", "--zipf-s", "0.5"}, "--zipf-s"},
		{[]string{"--key", ""}, "--key"},
		{[]string{"--nope"}, "-nope"},
		{[]string{"extra"}, "extra"},
		{[]string{"--target", "nats://127.0.0.1:4222", "--namespace", "a.b"}, `--namespace "a.b": want 1 to 64`},
		{[]string{"--namespace", "fleet-a"}, "--namespace names NATS subjects: it applies to a nats:// --target"},
	} {
		var out, errOut bytes.Buffer
		if code := loadgencmd.Main(tc.args, &out, &errOut); code != 2 || !strings.Contains(errOut.String(), tc.want) || !strings.HasPrefix(errOut.String(), "hotkeyd loadgen: ") {
			t.Errorf("%v: exit %d, stderr %q; want 2 and a message naming %s", tc.args, code, errOut.String(), tc.want)
		}
	}
	var out, errOut bytes.Buffer
	if code := loadgencmd.Main([]string{"--help"}, &out, &errOut); code != 0 || !strings.Contains(out.String(), "-hot-rate") || !strings.Contains(out.String(), "Workloads:") {
		t.Errorf("--help: exit %d, %q", code, out.String())
	}
	// Nothing listening: exit 1, saying so.
	errOut.Reset()
	if code := loadgencmd.Main([]string{"--target", "http://127.0.0.1:1", "--duration", "1s"}, &out, &errOut); code != 1 || !strings.Contains(errOut.String(), "does not decide") {
		t.Errorf("no daemon: exit %d, %q", code, errOut.String())
	}
}

// TestAgainstDaemon: a hot spot sent to a hotkeyd over HTTP and over NATS;
// the JSON result adds up, and the hot key is split (the daemon's
// /v1/hotkeys says so, and so do its decisions).
func TestAgainstDaemon(t *testing.T) {
	d, err := daemon.StartArgs(context.Background(), "--listen", "127.0.0.1:0", "--nats-listen", "127.0.0.1:0", "--hot-threshold", "50")
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		d.Shutdown(ctx)
	}()
	for _, target := range []string{"http://" + d.Addr(), d.NATSURL()} {
		t.Run(target[:4], func(t *testing.T) {
			key := "hot-" + target[:4]
			args := []string{"--target", target, "--status", "http://" + d.AdminAddr(), "--key", key,
				"--rate", "600", "--hot-rate", "300", "--duration", "1s", "--keys", "20", "--json"}
			var sum struct {
				Sent, Allowed, Denied, Errors int64
				Key                           struct {
					MaxLevel  int `json:"max_level"`
					PerSecond []struct {
						Allowed, Denied int64
						Shards          int
					} `json:"per_second"`
				} `json:"key"`
			}
			var errOut bytes.Buffer
			took := testkit.For(t, testkit.Patience, key+" split", func() bool {
				var out bytes.Buffer
				errOut.Reset()
				if code := loadgencmd.Main(args, &out, &errOut); code != 0 {
					t.Fatalf("exit %d: %s", code, errOut.String())
				}
				if err := json.Unmarshal(out.Bytes(), &sum); err != nil {
					t.Fatalf("--json: %v: %s", err, out.String())
				}
				if sum.Sent != 600 || sum.Allowed+sum.Denied+sum.Errors != sum.Sent || sum.Errors != 0 {
					t.Fatalf("sent %d: %d allowed, %d denied, %d errors", sum.Sent, sum.Allowed, sum.Denied, sum.Errors)
				}
				return sum.Key.MaxLevel >= 4 && len(sum.Key.PerSecond) == 1 && sum.Key.PerSecond[0].Shards >= 4
			})
			t.Logf("split within %v; last run: %+v", took, sum)
			if !strings.Contains(errOut.String(), "decisions/s") || !strings.Contains(errOut.String(), "level") {
				t.Errorf("no progress line on stderr: %q", errOut.String())
			}
		})
	}
}

// TestNamespace: with --namespace, loadgen asks the daemons of that
// namespace, and gets their decisions; without it, it asks the default
// namespace's hotkey.allow, where no daemon of the fleet answers, and says so.
func TestNamespace(t *testing.T) {
	d, err := daemon.StartArgs(context.Background(), "--listen", "127.0.0.1:0", "--nats-listen", "127.0.0.1:0", "--namespace", "fleet-a")
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		d.Shutdown(ctx)
	}()
	args := []string{"--target", d.NATSURL(), "--rate", "100", "--duration", "200ms", "--keys", "5", "--json", "--progress=false"}

	var out, errOut bytes.Buffer
	code := loadgencmd.Main(append(args, "--namespace", "fleet-a"), &out, &errOut)
	var sum struct{ Sent, Allowed, Denied, Errors int64 }
	if code == 0 {
		if err := json.Unmarshal(out.Bytes(), &sum); err != nil {
			t.Fatalf("--json: %v: %s", err, out.String())
		}
	}
	t.Logf("--namespace fleet-a: exit %d, %d sent, %d allowed, %d denied, %d errors", code, sum.Sent, sum.Allowed, sum.Denied, sum.Errors)
	if code != 0 || sum.Sent == 0 || sum.Allowed+sum.Denied != sum.Sent || sum.Errors != 0 {
		t.Errorf("--namespace fleet-a: exit %d, %d sent, %d decided, %d errors; want exit 0 and every request decided: %s", code, sum.Sent, sum.Allowed+sum.Denied, sum.Errors, errOut.String())
	}

	out.Reset()
	errOut.Reset()
	code = loadgencmd.Main(args, &out, &errOut)
	t.Logf("default namespace: exit %d, %q", code, errOut.String())
	if code != 1 || !strings.Contains(errOut.String(), "hotkey.allow: nats: no responders") || !strings.Contains(errOut.String(), `no hotkeyd of namespace "default" on this NATS`) {
		t.Errorf("default namespace against fleet-a: exit %d, %q; want 1, no responders on hotkey.allow, naming the namespace", code, errOut.String())
	}
}
