package daemon

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	rlpb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/nats-io/nats.go"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/hotkeyd/hotkey/internal/testkit"
)

// drainRules allow the Envoy descriptor (k, v) 1000 times a second.
const drainRules = `domain: edge
descriptors:
  - key: k
    rate_limit: {unit: second, requests_per_unit: 1000}
`

// TestDrainDelay: during --drain-delay /readyz answers 503 draining and the
// gRPC health service NOT_SERVING, while POST /v1/allow, ShouldRateLimit
// and hotkey.allow still decide; once the delay is over (its timer fires),
// Shutdown closes the listeners.
func TestDrainDelay(t *testing.T) {
	e := startRLS(t, "memory", drainRules, "--drain-delay", "5s")
	fire := make(chan time.Time)
	var asked time.Duration
	after := func(d time.Duration) <-chan time.Time { asked = d; return fire }
	sigs := make(chan os.Signal, 1)
	done := make(chan bool, 1)
	go func() { done <- drainDelay(e.d, e.d.cfg.DrainDelay, after, sigs) }()

	hc := healthpb.NewHealthClient(e.conn)
	testkit.For(t, time.Minute, "gRPC health NOT_SERVING", func() bool {
		for _, svc := range []string{"", rlsService} {
			r, err := hc.Check(context.Background(), &healthpb.HealthCheckRequest{Service: svc})
			if err != nil || r.Status != healthpb.HealthCheckResponse_NOT_SERVING {
				return false
			}
		}
		return true
	})
	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()
	resp, err := client.Get("http://" + e.d.Addr() + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(body), `"status":"draining"`) {
		t.Errorf("/readyz during the drain delay: %d %s, want 503 draining", resp.StatusCode, body)
	}

	nc, err := nats.Connect(e.d.NATSURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	const n = 20
	var httpOK, grpcOK, natsOK int
	for range n {
		if resp, err := client.Post("http://"+e.d.Addr()+"/v1/allow", "application/json", strings.NewReader(`{"key":"d"}`)); err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				httpOK++
			}
		}
		if r, err := e.raw(wireRequest("edge", []string{"k", "v"})); err == nil && r.OverallCode == rlpb.RateLimitResponse_OK {
			grpcOK++
		}
		if m, err := nc.Request(natsSubject, []byte(`{"key":"d"}`), time.Minute); err == nil && strings.Contains(string(m.Data), `"allowed":true`) {
			natsOK++
		}
	}
	t.Logf("during the drain delay: HTTP %d of %d allowed, gRPC %d of %d OK, NATS %d of %d allowed", httpOK, n, grpcOK, n, natsOK, n)
	if httpOK != n || grpcOK != n || natsOK != n {
		t.Errorf("during the drain delay: HTTP %d, gRPC %d, NATS %d of %d decided; want all", httpOK, grpcOK, natsOK, n)
	}
	select {
	case <-done:
		t.Fatal("the drain delay ended before its timer fired")
	default:
	}

	fire <- time.Time{}
	if cut := <-done; cut || asked != 5*time.Second {
		t.Errorf("drain delay: cut %v, waited for %v; want not cut, 5s", cut, asked)
	}
	shutdown(t, e.d)
	for what, addr := range map[string]string{"HTTP": e.d.Addr(), "gRPC": e.d.GRPCAddr()} {
		if c, err := net.DialTimeout("tcp", addr, time.Minute); err == nil {
			c.Close()
			t.Errorf("%s %s still accepts connections after Shutdown", what, addr)
		}
	}
}

// TestDrainDelayCut: a second signal ends the drain delay at once; with no
// delay, draining starts with Shutdown, not before.
func TestDrainDelayCut(t *testing.T) {
	d, err := StartArgs(context.Background(), "--listen", "127.0.0.1:0", "--nats", "none")
	if err != nil {
		t.Fatal(err)
	}
	defer shutdown(t, d)
	if drainDelay(d, 0, time.After, nil) || d.draining.Load() {
		t.Errorf("--drain-delay 0: cut or draining (%v), want neither", d.draining.Load())
	}

	never := func(time.Duration) <-chan time.Time { return nil }
	sigs := make(chan os.Signal, 1)
	done := make(chan bool, 1)
	go func() { done <- drainDelay(d, time.Hour, never, sigs) }()
	testkit.For(t, time.Minute, "/readyz 503", func() bool {
		rec := httptest.NewRecorder()
		d.routes().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/readyz", nil))
		return rec.Code == http.StatusServiceUnavailable
	})
	sigs <- syscall.SIGTERM
	select {
	case cut := <-done:
		if !cut {
			t.Error("drain delay ended by a signal: cut false, want true")
		}
	case <-time.After(time.Minute): // only catches a hang
		t.Fatal("a second signal did not end the drain delay")
	}
}
