package loadgencmd_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
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
		{[]string{"--target", "grpc://127.0.0.1:8081", "--descriptor", "user={key}"}, "--domain: a grpc:// target asks in a rate-limit domain"},
		{[]string{"--target", "grpc://127.0.0.1:8081", "--domain", "edge"}, "--descriptor: a grpc:// target needs at least one descriptor"},
		{[]string{"--target", "grpc://127.0.0.1:8081", "--domain", "edge", "--descriptor", "user"}, `-descriptor: "user": want key=value`},
		{[]string{"--target", "grpc://127.0.0.1:8081", "--domain", "edge", "--descriptor", "user={key},=x"}, `-descriptor: "user={key},=x": want key=value`},
		{[]string{"--target", "grpc://127.0.0.1:8081/rls", "--domain", "edge", "--descriptor", "a=b"}, "without a path"},
		{[]string{"--target", "grpc://127.0.0.1:8081", "--domain", "edge", "--descriptor", "a=b", "--api", "plain"}, "--api plain: a grpc:// target is Envoy's"},
		{[]string{"--target", "grpc://127.0.0.1:8081", "--domain", "edge", "--descriptor", "a=b", "--policy", "p"}, "--policy names a hotkeyd policy: it does not apply"},
		{[]string{"--target", "grpc://127.0.0.1:8081", "--domain", "edge", "--descriptor", "a=b", "--cost", "5000000000"}, "--cost 5000000000: hits_addend holds at most 4294967295"},
		{[]string{"--domain", "edge"}, "--domain is a grpc:// target's: it does not apply to http://127.0.0.1:8080 (--api hotkeyd)"},
		{[]string{"--target", "grpc://127.0.0.1:8081", "--domain", "edge", "--descriptor", "a=b", "--grpc-client", "grpc"}, `--grpc-client "grpc": want lean (loadgen's own client) or grpc-go`},
		{[]string{"--grpc-client", "grpc-go"}, "--grpc-client is a grpc:// target's: it does not apply to http://127.0.0.1:8080 (--api hotkeyd)"},
		{[]string{"--target", "http://gw.example/api/orders"}, "has a path: for any HTTP endpoint (2xx admitted, 429 denied) give --api plain"},
		{[]string{"--api", "gateway"}, `--api "gateway": want hotkeyd`},
		{[]string{"--target", "nats://127.0.0.1:4222", "--api", "plain"}, "--api plain: a nats:// target is hotkeyd's NATS API"},
		{[]string{"--key-header", "X-Api-Key"}, "--key-header is --api plain's"},
		{[]string{"--api", "plain", "--cost", "2"}, "--cost 2: an HTTP endpoint is sent one request a decision"},
		{[]string{"--api", "plain", "--method", "GET /"}, "--method"},
		{[]string{"--limit", "-1"}, "--limit -1"},
		{[]string{"--limit", "10", "--period", "0s"}, "--period 0s"},
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

// envoyRules limit each user to 20 a day.
const envoyRules = `domain: bench
descriptors:
  - key: user
    rate_limit: {unit: day, requests_per_unit: 20}
`

// TestGRPCTarget: 50 requests of one user, at 20 a day, to a hotkeyd's
// Envoy rate-limit service: loadgen reports 20 admitted and 30 denied, an
// ideal of 20, and the user's limit from the answers' statuses, over
// either gRPC client (--grpc-client).
func TestGRPCTarget(t *testing.T) {
	path := filepath.Join(t.TempDir(), "rules.yaml")
	if err := os.WriteFile(path, []byte(envoyRules), 0o644); err != nil {
		t.Fatal(err)
	}
	d, err := daemon.StartArgs(context.Background(), "--listen", "127.0.0.1:0", "--nats-listen", "127.0.0.1:0", "--grpc-listen", "127.0.0.1:0", "--envoy-config", path)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		d.Shutdown(ctx)
	}()
	// Each client asks for a user of its own.
	for client, user := range map[string]string{"lean": "alice", "grpc-go": "bob"} {
		var out, errOut bytes.Buffer
		code := loadgencmd.Main([]string{"--target", "grpc://" + d.GRPCAddr(), "--domain", "bench", "--descriptor", "user={key}", "--grpc-client", client,
			"--workload", "key", "--key", user, "--rate", "500", "--duration", "100ms", "--limit", "20", "--period", "24h", "--json", "--progress=false"}, &out, &errOut)
		sum := decodeSummary(t, code, &out, &errOut)
		if sum.API != "envoy" || sum.Sent != 50 || sum.Allowed != 20 || sum.Denied != 30 || sum.Errors != 0 {
			t.Errorf("%s: api %s, %d sent: %d admitted, %d denied, %d errors; want envoy, 50: 20, 30, 0", client, sum.API, sum.Sent, sum.Allowed, sum.Denied, sum.Errors)
		}
		if i := sum.Key.Ideal; i == nil || i.Ideal != 20 || i.Admitted != 20 || i.OfIdeal != 1 {
			t.Errorf("%s: ideal %+v; want 20 admitted of an ideal 20", client, i)
		}
		// The request meant last may be answered before others still in
		// flight: what it saw left is anything a decision leaves.
		if q := sum.LastQuota; sum.Quotas != 50 || q == nil || q.Limit != 20 || q.Window != 86400 || q.Remaining < 0 || q.Remaining > 19 {
			t.Errorf("%s: %d quotas, last %+v; want 50, the user's 20 a day with 0 to 19 remaining", client, sum.Quotas, q)
		}
	}
}

// TestPlainTarget: 200 requests of one key to an HTTP service behind a
// limit of 30 per key that fails one request in five: loadgen reports 30
// admitted (2xx), 130 denied (429) and 40 errors (500), an ideal of 30, and
// the last 429's rate-limit headers.
func TestPlainTarget(t *testing.T) {
	var mu sync.Mutex // guards seen, admitted
	seen, admitted := map[string]int{}, map[string]int{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get("X-Api-Key")
		mu.Lock()
		seen[key]++
		fail := seen[key]%5 == 0
		ok := !fail && admitted[key] < 30
		if ok {
			admitted[key]++
		}
		mu.Unlock()
		switch {
		case r.Method != http.MethodPost || r.URL.Path != "/api/orders":
			http.Error(w, "not here", http.StatusNotFound)
		case fail:
			http.Error(w, "upstream broke", http.StatusInternalServerError)
		case ok:
			w.Write([]byte("ok"))
		default:
			w.Header().Set("RateLimit-Policy", `"api";q=30;w=60`)
			w.Header().Set("RateLimit", `"api";r=0;t=42`)
			w.Header().Set("Retry-After", "42")
			http.Error(w, "slow down", http.StatusTooManyRequests)
		}
	}))
	defer srv.Close()
	var out, errOut bytes.Buffer
	code := loadgencmd.Main([]string{"--target", srv.URL + "/api/orders", "--api", "plain", "--method", "POST", "--key-header", "X-Api-Key",
		"--workload", "key", "--key", "acme", "--rate", "2000", "--duration", "100ms", "--limit", "30", "--period", "1m", "--json", "--progress=false"}, &out, &errOut)
	sum := decodeSummary(t, code, &out, &errOut)
	if sum.API != "plain" || sum.Sent != 200 || sum.Allowed != 30 || sum.Denied != 130 || sum.Errors != 40 || !strings.Contains(sum.FirstError, "500 Internal Server Error: upstream broke") {
		t.Errorf("api %s, %d sent: %d admitted, %d denied, %d errors (first %q); want plain, 200: 30, 130, 40 (500)", sum.API, sum.Sent, sum.Allowed, sum.Denied, sum.Errors, sum.FirstError)
	}
	if i := sum.Key.Ideal; i == nil || i.Ideal != 30 || i.Admitted != 30 || i.OfIdeal != 1 {
		t.Errorf("ideal %+v; want 30 admitted of an ideal 30", i)
	}
	// Of the 50 requests meant last, at least 10 are not answered 500,
	// and each is answered past the 30 admitted (37th or later): the
	// quota meant last is a 429's.
	if q := sum.LastQuota; sum.Quotas != 130 || q == nil || *q != (quota{Limit: 30, Window: 60, ResetAfter: 42, RetryAfter: 42}) {
		t.Errorf("%d quotas, last %+v; want 130 (the 429s), the last 429's", sum.Quotas, q)
	}
	// The table says it too.
	out.Reset()
	code = loadgencmd.Main([]string{"--target", srv.URL + "/api/orders", "--api", "plain", "--method", "POST", "--key-header", "X-Api-Key",
		"--workload", "key", "--key", "acme", "--rate", "100", "--duration", "100ms", "--limit", "30", "--period", "1m", "--progress=false"}, &out, &errOut)
	for _, want := range []string{"HTTP endpoint: 2xx admitted, 429 denied", "ideal", "admitted ÷ ideal 0.000", "quota", "retry after 42s"} {
		if code != 0 || !strings.Contains(out.String(), want) {
			t.Errorf("exit %d, table lacks %q:\n%s", code, want, out.String())
		}
	}
}

// quota is the last_quota of --json.
type quota struct {
	Limit      int64   `json:"limit"`
	Window     float64 `json:"window_s"`
	Remaining  int64   `json:"remaining"`
	ResetAfter float64 `json:"reset_after_s"`
	RetryAfter float64 `json:"retry_after_s"`
}

// summary is the part of --json the tests read.
type summary struct {
	API                           string
	Sent, Allowed, Denied, Errors int64
	FirstError                    string `json:"first_error"`
	Key                           struct {
		Ideal *struct {
			Ideal, Admitted int64
			OfIdeal         float64 `json:"admitted_of_ideal"`
		}
	}
	Quotas    int64
	LastQuota *quota `json:"last_quota"`
}

func decodeSummary(t *testing.T, code int, out, errOut *bytes.Buffer) summary {
	t.Helper()
	var sum summary
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	if err := json.Unmarshal(out.Bytes(), &sum); err != nil {
		t.Fatalf("--json: %v: %s", err, out.String())
	}
	t.Logf("%s: %d sent: %d admitted, %d denied, %d errors; ideal %+v; %d quotas, last %+v", sum.API, sum.Sent, sum.Allowed, sum.Denied, sum.Errors, sum.Key.Ideal, sum.Quotas, sum.LastQuota)
	return sum
}
