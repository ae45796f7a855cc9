package daemon

import (
	"context"
	"errors"
	"io"
	"maps"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	ratelimit "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlpb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/nats-io/nats.go"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
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
		{"GET", "/nope", ``},
		{"GET", "/v1/auth/default", ``},
		{"HEAD", "/v1/auth/nope", ``},
	}
	const wantHTTP, wantAuth = 5, 2
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
	want := map[string]uint64{"http": wantHTTP, "auth": wantAuth, "nats": uint64(len(natsReqs)), "grpc": uint64(len(grpcReqs))}
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
					got[l.GetValue()] += m.GetHistogram().GetSampleCount()
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

// TestRequestDurationCode: hotkeyd_request_duration_seconds counts each
// request of the decision APIs under the code of its answer: the HTTP
// status, ok or error over NATS, the gRPC status code's name.
func TestRequestDurationCode(t *testing.T) {
	policies := filepath.Join(t.TempDir(), "policies.yaml")
	writeTestFile(t, policies, "policies:\n  default:\n    limit: 1\n    period: 24h\n")
	d, err := StartArgs(context.Background(), "--listen", "127.0.0.1:0", "--nats-listen", "127.0.0.1:0", "--policies", policies, "--hot-threshold", "1e9")
	if err != nil {
		t.Fatal(err)
	}
	stopped := false
	defer func() {
		if !stopped {
			shutdown(t, d)
		}
	}()

	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()
	for _, r := range []struct{ method, body string }{
		{"POST", `{"key":"a"}`},                                    // 200
		{"POST", `{"key":"a"}`},                                    // 429: 1 a day
		{"POST", `{"requests":[{"key":"a"}]}`},                     // 200: a batch
		{"POST", `{"key":"a","policy":"nope"}`},                    // 404
		{"POST", `{"key":`},                                        // 400
		{"POST", `{"key":"` + strings.Repeat("x", MaxBody) + `"}`}, // 413
		{"GET", ``}, // 405
	} {
		req, err := http.NewRequest(r.method, "http://"+d.Addr()+"/v1/allow", strings.NewReader(r.body))
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

	nc, err := nats.Connect(d.NATSURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	for _, body := range []string{`{"key":"n"}`, `{"key":"n"}`, `{"key":"n","policy":"nope"}`, `not json`} {
		if _, err := nc.Request(natsSubject, []byte(body), time.Minute); err != nil {
			t.Fatal(err)
		}
	}

	conn, err := grpc.NewClient(d.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	rls := rlpb.NewRateLimitServiceClient(conn)
	desc := []*ratelimit.RateLimitDescriptor{{Entries: []*ratelimit.RateLimitDescriptor_Entry{{Key: "tenant", Value: "t"}}}}
	for _, r := range []*rlpb.RateLimitRequest{{Domain: "gateway", Descriptors: desc}, {Domain: "", Descriptors: desc}, {Domain: "gateway"}} {
		rls.ShouldRateLimit(context.Background(), r)
	}

	stopped = true
	shutdown(t, d)
	want := map[string]uint64{
		"http 200": 2, "http 429": 1, "http 404": 1, "http 400": 1, "http 413": 1, "http 405": 1,
		"auth 200": 0,
		"nats ok":  2, "nats error": 2,
		"grpc OK": 1, "grpc InvalidArgument": 2,
	}
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
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			got[labels["api"]+" "+labels["code"]] = m.GetHistogram().GetSampleCount()
		}
	}
	if !maps.Equal(got, want) {
		t.Errorf("requests by api and code %v, want %v", got, want)
	}
}

// TestCodeLabels: the code label takes a bounded set of values, whatever
// the status.
func TestCodeLabels(t *testing.T) {
	for _, tt := range []struct {
		give int
		want string
	}{
		{200, "200"}, {429, "429"}, {400, "400"}, {401, "401"}, {403, "403"}, {404, "404"}, {405, "405"}, {413, "413"}, {500, "500"}, {503, "503"},
		{204, "2xx"}, {302, "3xx"}, {418, "4xx"}, {502, "5xx"}, {0, "other"}, {99, "other"}, {600, "other"}, {-1, "other"},
	} {
		if got := httpCode(tt.give); got != tt.want {
			t.Errorf("httpCode(%d) = %q, want %q", tt.give, got, tt.want)
		}
	}
	for _, tt := range []struct {
		give error
		want string
	}{
		{nil, "OK"},
		{status.Error(codes.InvalidArgument, "x"), "InvalidArgument"},
		{status.Error(codes.Unavailable, "x"), "Unavailable"},
		{errors.New("not a status"), "Unknown"},
		{status.Error(codes.Code(99), "x"), "Unknown"},
	} {
		if got := grpcCode(tt.give); got != tt.want {
			t.Errorf("grpcCode(%v) = %q, want %q", tt.give, got, tt.want)
		}
	}
}
