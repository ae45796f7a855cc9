package daemon

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

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
