package daemon

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	ratelimit "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlpb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/nats-io/nats.go"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// TestRequestDuration: hotkeyd_request_duration_seconds observes each
// request of the decision APIs once, by api, errors and batches included,
// and nothing else (health, metrics, gRPC health checks).
func TestRequestDuration(t *testing.T) {
	d, err := StartArgs(context.Background(), "--listen", "127.0.0.1:0", "--nats-listen", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	stopped := false
	defer func() {
		if !stopped {
			shutdown(t, d)
		}
	}()

	// HTTP: single, batch, bad body, wrong method; and other endpoints,
	// not counted.
	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()
	httpReqs := []struct{ method, path, body string }{
		{"POST", "/v1/allow", `{"key":"a"}`},
		{"POST", "/v1/allow", `{"key":"a","cost":2}`},
		{"POST", "/v1/allow", `{"requests":[{"key":"a"},{"key":"b"},{"key":"c","policy":"nope"}]}`},
		{"POST", "/v1/allow", `{"key":`},
		{"GET", "/v1/allow", ``},
		{"GET", "/healthz", ``},
		{"GET", "/metrics", ``},
		{"GET", "/v1/hotkeys", ``},
	}
	const wantHTTP = 5
	for _, r := range httpReqs {
		req, err := http.NewRequest(r.method, "http://"+d.Addr()+r.path, strings.NewReader(r.body))
		if err != nil {
			t.Fatal(err)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}

	// NATS: single, batch, unknown policy, bad body.
	nc, err := nats.Connect(d.NATSURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	natsReqs := []string{`{"key":"n"}`, `{"requests":[{"key":"n"},{"key":"m"}]}`, `{"key":"n","policy":"nope"}`, `not json`, `{"key":"n"}`, `{"key":"n"}`}
	for _, body := range natsReqs {
		if _, err := nc.Request(natsSubject, []byte(body), time.Minute); err != nil {
			t.Fatal(err)
		}
	}

	// gRPC: answered (no rules: OK), refused (no domain); health checks
	// not counted.
	conn, err := grpc.NewClient(d.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	rls := rlpb.NewRateLimitServiceClient(conn)
	ctx := context.Background()
	desc := []*ratelimit.RateLimitDescriptor{{Entries: []*ratelimit.RateLimitDescriptor_Entry{{Key: "tenant", Value: "t"}}}}
	grpcReqs := []*rlpb.RateLimitRequest{
		{Domain: "gateway", Descriptors: desc},
		{Domain: "gateway", Descriptors: append(desc, desc...)},
		{Domain: "", Descriptors: desc},
		{Domain: "gateway"},
	}
	for i, r := range grpcReqs {
		_, err := rls.ShouldRateLimit(ctx, r)
		if (err != nil) != (i >= 2) {
			t.Fatalf("ShouldRateLimit %d: %v", i, err)
		}
	}
	for range 3 {
		if _, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
			t.Fatal(err)
		}
	}

	// Once the daemon has stopped, every request's handler has returned.
	stopped = true
	shutdown(t, d)
	want := map[string]uint64{"http": wantHTTP, "nats": uint64(len(natsReqs)), "grpc": uint64(len(grpcReqs))}
	mfs, err := d.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]uint64{}
	for _, mf := range mfs {
		if mf.GetName() != "hotkeyd_request_duration_seconds" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "api" {
					got[l.GetValue()] = m.GetHistogram().GetSampleCount()
				}
			}
		}
	}
	if len(got) != len(want) {
		t.Errorf("apis %v, want %v", got, want)
	}
	for api, n := range want {
		if got[api] != n {
			t.Errorf("api %s: %d requests observed, want %d", api, got[api], n)
		}
	}
}
