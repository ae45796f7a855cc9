package daemon

import (
	"bytes"
	"context"
	"math"
	"net/http"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	rlpb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"

	"github.com/hotkeyd/hotkey"
	"github.com/hotkeyd/hotkey/internal/envoyconf"
	"github.com/hotkeyd/hotkey/internal/testkit"
)

// TestRLSAnswerWire: appendWire writes the bytes proto.Marshal writes of
// the answer's message, size() long.
func TestRLSAnswerWire(t *testing.T) {
	limit := &envoyconf.Rule{Name: "per-user", RequestsPerUnit: 100, Unit: envoyconf.Second}
	unnamed := &envoyconf.Rule{RequestsPerUnit: math.MaxUint32, Unit: envoyconf.Year}
	tests := []struct {
		name string
		give rlsAnswer
	}{
		{"empty", rlsAnswer{}},
		{"no rule", rlsAnswer{statuses: []rlsStatus{{code: rlpb.RateLimitResponse_OK}}}},
		{"unlimited", rlsAnswer{statuses: []rlsStatus{{code: rlpb.RateLimitResponse_OK, remaining: math.MaxUint32}}}},
		{"limit only", rlsAnswer{statuses: []rlsStatus{{code: rlpb.RateLimitResponse_OK, limit: unnamed}}}},
		{"reset 0", rlsAnswer{statuses: []rlsStatus{{code: rlpb.RateLimitResponse_OK, limit: limit, remaining: 99, hasReset: true}}}},
		{"over", rlsAnswer{
			overall: rlpb.RateLimitResponse_OVER_LIMIT,
			statuses: []rlsStatus{
				{code: rlpb.RateLimitResponse_OVER_LIMIT, limit: limit, reset: 1500 * time.Millisecond, hasReset: true},
				{code: rlpb.RateLimitResponse_OK, limit: unnamed, remaining: 1 << 31, reset: 365 * 24 * time.Hour, hasReset: true},
				{},
			},
			headers: []rlsHeader{{"ratelimit", `"envoy/edge.user";r=0;t=2`}, {"retry-after", "2"}, {"x-empty", ""}},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := tt.give.appendWire(nil)
			want, err := proto.MarshalOptions{Deterministic: true}.Marshal(tt.give.proto())
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("appendWire %x, proto.Marshal %x", got, want)
			}
			if n := tt.give.size(); n != len(got) {
				t.Errorf("size %d, wrote %d", n, len(got))
			}
		})
	}
}

// TestRLSServeAllocs bounds the allocations of serving one ShouldRateLimit
// of one descriptor, from its wire data to its answer's, decoded,
// decided on the memory store and encoded as the gRPC server does.
func TestRLSServeAllocs(t *testing.T) {
	e := startRLS(t, "memory", `domain: edge
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 1000000000}
`)
	codec := newRLSCodec()
	b := wireRequest("edge", []string{"user", "alice"})
	dec := func(v any) error { return codec.Unmarshal(mem.BufferSlice{mem.SliceBuffer(b)}, v) }
	ctx := context.Background()
	serve := func() []byte {
		resp, err := shouldRateLimitHandler(e.d.rls, ctx, dec, nil)
		if err != nil {
			t.Fatal(err)
		}
		out, err := codec.Marshal(resp)
		if err != nil {
			t.Fatal(err)
		}
		defer out.Free()
		return out[0].ReadOnlyData()
	}
	var got rlpb.RateLimitResponse
	if err := proto.Unmarshal(serve(), &got); err != nil || got.GetOverallCode() != rlpb.RateLimitResponse_OK ||
		len(got.GetStatuses()) != 1 || got.GetStatuses()[0].GetCurrentLimit().GetRequestsPerUnit() != 1000000000 || len(got.GetResponseHeadersToAdd()) == 0 {
		t.Fatalf("answered %v, %v", &got, err)
	}
	allocs := testing.AllocsPerRun(500, func() { serve() })
	t.Logf("%.0f allocations a call", allocs)
	if max := 45.0; allocs > max {
		t.Errorf("%.0f allocations a call, want at most %.0f", allocs, max)
	}
}

// TestGRPCStreamWorkers: the gRPC server keeps goroutines to serve calls,
// whose stacks have grown to what a call needs, and a call is served on
// one of them: grpc-go starts grpcStreamWorkers at once, the lean server
// keeps those that served a call, up to as many, idle.
func TestGRPCStreamWorkers(t *testing.T) {
	for _, tc := range []struct {
		server, fn string
		want       int
	}{
		{GRPCServerGRPCGo, "grpc.(*Server).serverWorker(", grpcStreamWorkers},
		{GRPCServerLean, "grpcserve.(*Server).worker(", 1},
	} {
		t.Run(tc.server, func(t *testing.T) {
			e := startRLS(t, "memory", invalidUTF8Rules, "--grpc-server", tc.server)
			if _, err := e.raw(wireRequest("edge", []string{"remote_address", "10.0.0.1"})); err != nil {
				t.Fatal(err)
			}
			// The server starts its workers as goroutines: count them until all
			// have begun (on a loaded machine the last may not have yet).
			buf := make([]byte, 1<<22)
			n := 0
			testkit.For(t, time.Minute, "the gRPC server's workers", func() bool {
				n = strings.Count(string(buf[:runtime.Stack(buf, true)]), tc.fn)
				return n >= tc.want
			})
			t.Logf("%d goroutines wait for gRPC calls", n)
		})
	}
}

// TestRLSAnswerHeaders: an Envoy answer's response_headers_to_add are the
// headers hotkey.SetHeaders writes, named in lower case and in order, for
// admissions, denials, shadow denials and an unnamed policy.
func TestRLSAnswerHeaders(t *testing.T) {
	now := time.Unix(1_800_000_000, 123)
	for _, tc := range []struct {
		p   *hotkey.Policy
		res hotkey.Result
	}{
		{&hotkey.Policy{Name: "envoy/api.user", Limit: hotkey.PerSecond(100)}, hotkey.Result{Allowed: true, Limit: 100, Remaining: 99, ResetAfter: 10 * time.Millisecond}},
		{&hotkey.Policy{Name: "envoy/api.user", Limit: hotkey.Limit{Rate: 5, Period: time.Minute}}, hotkey.Result{Limit: 5, RetryAfter: 1500 * time.Millisecond, ResetAfter: time.Minute}},
		{&hotkey.Policy{Name: `q"uote`, Limit: hotkey.PerSecond(1)}, hotkey.Result{Allowed: true, ShadowDenied: true, Limit: 1, Remaining: -3}},
		{&hotkey.Policy{Limit: hotkey.PerSecond(7)}, hotkey.Result{Limit: 7, RetryAfter: time.Nanosecond}},
	} {
		h := http.Header{}
		hotkey.SetHeaders(h, tc.p, tc.res, now)
		var want []rlsHeader
		for k, vs := range h {
			for _, v := range vs {
				want = append(want, rlsHeader{strings.ToLower(k), v})
			}
		}
		slices.SortFunc(want, func(x, y rlsHeader) int { return strings.Compare(x.key, y.key) })
		var a rlsAnswer
		a.setHeaders(tc.p, tc.res, now)
		if !slices.Equal(a.headers, want) {
			t.Errorf("%+v under %q:\n got %q\nwant %q", tc.res, tc.p.Name, a.headers, want)
		}
	}
}
