package daemon

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/hotkeyd/hotkey/internal/envoyconf"
	"github.com/hotkeyd/hotkey/internal/natsserver"
	"github.com/hotkeyd/hotkey/internal/testkit"
)

// TestReadyDraining: once Shutdown begins, the gRPC health service says
// NOT_SERVING (for the server, the rate-limit service and strictService)
// to the clients that watch it, and /readyz answers 503 draining, strict
// or not.
func TestReadyDraining(t *testing.T) {
	d, err := StartArgs(context.Background(), "--listen", "127.0.0.1:0", "--nats-listen", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(d.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	hc := healthpb.NewHealthClient(conn)
	services := []string{"", rlsService, strictService}
	testkit.For(t, time.Minute, "SERVING", func() bool {
		for _, svc := range services {
			r, err := hc.Check(context.Background(), &healthpb.HealthCheckRequest{Service: svc})
			if err != nil || r.Status != healthpb.HealthCheckResponse_SERVING {
				return false
			}
		}
		return true
	})
	wctx, stopWatch := context.WithCancel(context.Background())
	defer stopWatch()
	var watches []healthpb.Health_WatchClient
	for _, svc := range services {
		w, err := hc.Watch(wctx, &healthpb.HealthCheckRequest{Service: svc})
		if err != nil {
			t.Fatal(err)
		}
		if r, err := w.Recv(); err != nil || r.Status != healthpb.HealthCheckResponse_SERVING {
			t.Fatalf("watch %q: %v, %v; want SERVING", svc, r, err)
		}
		watches = append(watches, w)
	}

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute) // only catches a hang
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- d.Shutdown(ctx) }()
	for i, w := range watches {
		r, err := w.Recv()
		if err != nil || r.Status != healthpb.HealthCheckResponse_NOT_SERVING {
			t.Errorf("watch %q once Shutdown began: %v, %v; want NOT_SERVING", services[i], r, err)
		}
	}
	stopWatch() // a watch is a call in flight, which a graceful stop waits for
	if err := <-done; err != nil {
		t.Errorf("shutdown: %v", err)
	}

	h := d.routes()
	for _, path := range []string{"/readyz", "/readyz?strict=true"} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
		if rec.Code != http.StatusServiceUnavailable || !strings.Contains(rec.Body.String(), `"status":"draining"`) {
			t.Errorf("%s once Shutdown began: %d %s, want 503 draining", path, rec.Code, rec.Body)
		}
	}
}

// readiness is GET /readyz of d.
func readiness(t *testing.T, d *Daemon) Readiness {
	t.Helper()
	rec := httptest.NewRecorder()
	d.routes().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/readyz", nil))
	var r Readiness
	if err := json.Unmarshal(rec.Body.Bytes(), &r); err != nil {
		t.Fatalf("/readyz: %d %s: %v", rec.Code, rec.Body, err)
	}
	return r
}

// TestReadyGossipAlone: while a sync: gossip policy is configured and the
// daemon's NATS connection is down, /readyz says degraded, naming the
// gossip policies and what their counts alone allow; with --nats none (a
// daemon alone by its configuration) it is ready and warns so; with no
// gossip policy, --nats none is ready without the warning, and a NATS that
// returns makes the daemon ready again.
func TestReadyGossipAlone(t *testing.T) {
	dir := t.TempDir()
	mixed := filepath.Join(dir, "mixed.yaml")
	writeTestFile(t, mixed, "policies:\n  g:\n    limit: 5\n    period: 1m\n    sync: gossip\n  s:\n    limit: 5\n    period: 1m\n")
	const alone = "this daemon decides the sync: gossip policy g on its own counts alone, so each daemon admits a key's limit by itself and a key may be admitted up to N times its limit across N daemons"

	d, err := StartArgs(context.Background(), "--listen", "127.0.0.1:0", "--nats", "none", "--policies", mixed, "--reload-interval", "0")
	if err != nil {
		t.Fatal(err)
	}
	if r := readiness(t, d); r.Status != "ready" || !slices.Contains(r.Warnings, "with --nats (HOTKEYD_NATS) none, "+alone) {
		t.Errorf("--nats none with a gossip policy: %+v, want ready, warning that it decides alone", r)
	}
	writeTestFile(t, mixed, "policies:\n  s:\n    limit: 5\n    period: 1m\n")
	if err := d.Reload("test"); err != nil {
		t.Fatal(err)
	}
	if r := readiness(t, d); r.Status != "ready" || len(r.Warnings) > 0 {
		t.Errorf("--nats none with no gossip policy: %+v, want ready, no warning", r)
	}
	shutdown(t, d)

	ns, err := natsserver.Start(natsserver.Options{})
	if err != nil {
		t.Fatal(err)
	}
	addr := strings.TrimPrefix(ns.URL(), "nats://")
	writeTestFile(t, mixed, "policies:\n  g:\n    limit: 5\n    period: 1m\n    sync: gossip\n  s:\n    limit: 5\n    period: 1m\n")
	d, err = StartArgs(context.Background(), "--listen", "127.0.0.1:0", "--nats", ns.URL(), "--policies", mixed, "--reload-interval", "0")
	if err != nil {
		ns.Shutdown()
		t.Fatal(err)
	}
	defer shutdown(t, d)
	testkit.For(t, time.Minute, "ready with NATS up", func() bool { return readiness(t, d).Status == "ready" })
	ns.Shutdown()
	testkit.For(t, time.Minute, "degraded with NATS down", func() bool {
		r := readiness(t, d)
		return r.Status == "degraded" && strings.Contains(r.Reason, "NATS connection reconnecting: "+alone)
	})

	host, port, _ := net.SplitHostPort(addr)
	p, _ := strconv.Atoi(port)
	ns, err = natsserver.Start(natsserver.Options{Configure: func(o *server.Options) { o.Host, o.Port = host, p }})
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Shutdown()
	testkit.For(t, time.Minute, "ready once NATS is back", func() bool { return readiness(t, d).Status == "ready" })
}

// TestReadyWarnsMemoryApart: daemons on the memory store that share NATS
// are warned of the policies whose counters each keeps apart, naming
// those (and suggesting sync: gossip); none when every policy has sync:
// gossip.
func TestReadyWarnsMemoryApart(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "policies.yaml")
	const gossipOnly = "policies:\n  default:\n    limit: 5\n    period: 1m\n    sync: gossip\n  g:\n    limit: 5\n    period: 1m\n    sync: gossip\n"
	writeTestFile(t, path, gossipOnly)
	args := []string{"--listen", "127.0.0.1:0", "--policies", path, "--reload-interval", "0"}
	d1, err := StartArgs(context.Background(), append(args, "--nats-listen", "127.0.0.1:0")...)
	if err != nil {
		t.Fatal(err)
	}
	defer shutdown(t, d1)
	d2, err := StartArgs(context.Background(), append(args, "--nats", d1.NATSURL())...)
	if err != nil {
		t.Fatal(err)
	}
	defer shutdown(t, d2)
	testkit.For(t, time.Minute, "each daemon sees the other", func() bool {
		return d1.engine.Stats().Instances == 2 && d2.engine.Stats().Instances == 2
	})
	for _, d := range []*Daemon{d1, d2} {
		if r := readiness(t, d); len(r.Warnings) != 0 {
			t.Errorf("every policy sync: gossip: warnings %q, want none", r.Warnings)
		}
	}

	writeTestFile(t, path, gossipOnly+"  s:\n    limit: 5\n    period: 1m\n  r:\n    limit: 5\n    period: 1m\n    sync: reserve\n")
	if err := d1.Reload("test"); err != nil {
		t.Fatal(err)
	}
	const want = "2 daemons share NATS but each keeps the counters of policies r and s in memory, apart from the others': requests spread over them (hotkey.allow's queue group, a load balancer) are counted apart, so a key may be admitted up to 2 times its limit; give them one store with --redis, --redis-cluster or --redis-sentinel, or give those policies sync: gossip to share their counts over NATS"
	if r := readiness(t, d1); len(r.Warnings) != 1 || r.Warnings[0] != want {
		t.Errorf("policies r (reserve) and s (store) beside gossip ones: warnings %q, want %q", r.Warnings, want)
	}
}

// TestBySync: the policies and Envoy rules of sync: gossip, and the
// others, each sorted; a rule without a counter is in neither, and
// /v1/config's dump shows each mode.
func TestBySync(t *testing.T) {
	ps, err := ParsePolicies([]byte("policies:\n  b:\n    limit: 5\n    period: 1s\n    sync: gossip\n  a:\n    limit: 5\n    period: 1s\n    sync: gossip\n  r:\n    limit: 5\n    period: 1s\n    sync: reserve\n"))
	if err != nil {
		t.Fatal(err)
	}
	envoy, err := envoyconf.Parse(map[string][]byte{"e.yaml": []byte("domain: edge\ndescriptors:\n  - key: g\n    rate_limit: {unit: minute, requests_per_unit: 5, sync: gossip}\n  - key: s\n    rate_limit: {unit: minute, requests_per_unit: 5}\n  - key: u\n    rate_limit: {unlimited: true}\n  - key: z\n    rate_limit: {unit: minute, requests_per_unit: 0}\n")})
	if err != nil {
		t.Fatal(err)
	}
	gossip, apart := bySync(ps, envoy)
	if want := []string{"a", "b", "envoy/edge.g"}; !slices.Equal(gossip, want) {
		t.Errorf("gossip %q, want %q", gossip, want)
	}
	if want := []string{"default", "envoy/edge.s", "r"}; !slices.Equal(apart, want) {
		t.Errorf("apart %q, want %q", apart, want)
	}
	dump := (&rules{policies: ps, envoy: envoy}).dump(Config{})
	if p := dump.Policies[0]; p.Name != "a" || p.Sync != "gossip" {
		t.Errorf("/v1/config's policy a: %+v, want sync gossip", p)
	}
	if r := dump.EnvoyRules[0]; r.Path != "edge.g" || r.Sync != "gossip" {
		t.Errorf("/v1/config's rule edge.g: %+v, want sync gossip", r)
	}
	for _, c := range []struct {
		give []string
		want string
	}{
		{[]string{"a"}, "policy a"},
		{[]string{"a", "b"}, "policies a and b"},
		{[]string{"a", "b", "c"}, "policies a, b and c"},
		{[]string{"a", "b", "c", "d", "e", "f", "g"}, "policies a, b, c, d, e and 2 more"},
	} {
		if got := plural(c.give, "policy ", "policies "); got != c.want {
			t.Errorf("plural(%q) = %q, want %q", c.give, got, c.want)
		}
	}
}
