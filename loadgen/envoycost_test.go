package loadgen_test

import (
	"context"
	"math"
	"net"
	"sync"
	"syscall"
	"testing"
	"time"

	ratelimit "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlpb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/hotkeyd/hotkey/loadgen"
)

// fixedRLS answers every ShouldRateLimit with the same response, so that
// what a call costs is the client's and gRPC's, not a limiter's.
// It keeps the last request it was sent.
type fixedRLS struct {
	rlpb.UnimplementedRateLimitServiceServer
	resp *rlpb.RateLimitResponse
	mu   sync.Mutex // guards last
	last *rlpb.RateLimitRequest
}

func (f *fixedRLS) ShouldRateLimit(_ context.Context, req *rlpb.RateLimitRequest) (*rlpb.RateLimitResponse, error) {
	f.mu.Lock()
	f.last = req
	f.mu.Unlock()
	return f.resp, nil
}

// fixedAnswer is an answer as hotkeyd gives for a tenant's and a user's
// descriptor: the user over its 20 a day.
var fixedAnswer = &rlpb.RateLimitResponse{
	OverallCode: rlpb.RateLimitResponse_OVER_LIMIT,
	Statuses: []*rlpb.RateLimitResponse_DescriptorStatus{
		{Code: rlpb.RateLimitResponse_OK, LimitRemaining: 900, DurationUntilReset: durationpb.New(3 * time.Hour),
			CurrentLimit: &rlpb.RateLimitResponse_RateLimit{RequestsPerUnit: 1000, Unit: rlpb.RateLimitResponse_RateLimit_DAY}},
		{Code: rlpb.RateLimitResponse_OVER_LIMIT, DurationUntilReset: durationpb.New(3 * time.Hour),
			CurrentLimit: &rlpb.RateLimitResponse_RateLimit{RequestsPerUnit: 20, Unit: rlpb.RateLimitResponse_RateLimit_DAY}},
	},
}

// startFixedRLS serves resp on loopback in this process and returns a
// connection to it.
func startFixedRLS(tb testing.TB, resp *rlpb.RateLimitResponse) (*grpc.ClientConn, *fixedRLS) {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	srv := grpc.NewServer()
	rls := &fixedRLS{resp: resp}
	rlpb.RegisterRateLimitServiceServer(srv, rls)
	done := make(chan struct{})
	go func() { defer close(done); srv.Serve(ln) }()
	tb.Cleanup(func() { srv.Stop(); <-done })
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { conn.Close() })
	return conn, rls
}

var costDescriptors = [][]loadgen.Entry{{{Key: "tenant", Value: "acme"}}, {{Key: "user", Value: "{key}"}}}

// TestEnvoyRequest: the request a service is sent has the target's domain
// and descriptors, with the key for each "{key}", and the cost as its
// hits_addend.
func TestEnvoyRequest(t *testing.T) {
	conn, rls := startFixedRLS(t, fixedAnswer)
	target := loadgen.Envoy(conn, "bench", [][]loadgen.Entry{
		{{Key: "tenant", Value: "acme"}, {Key: "user", Value: "{key}"}},
		{{Key: "path", Value: "/u/{key}/{key}"}},
		{},
	})
	for _, key := range []string{"alice", "", "bob"} {
		if _, err := target.Decide(context.Background(), key, 7); err != nil {
			t.Fatal(err)
		}
		want := &rlpb.RateLimitRequest{Domain: "bench", HitsAddend: 7, Descriptors: []*ratelimit.RateLimitDescriptor{
			{Entries: []*ratelimit.RateLimitDescriptor_Entry{{Key: "tenant", Value: "acme"}, {Key: "user", Value: key}}},
			{Entries: []*ratelimit.RateLimitDescriptor_Entry{{Key: "path", Value: "/u/" + key + "/" + key}}},
			{},
		}}
		rls.mu.Lock()
		got := rls.last
		rls.mu.Unlock()
		if !proto.Equal(got, want) {
			t.Errorf("key %q: sent %v; want %v", key, got, want)
		}
	}
}

// TestEnvoyDecideAllocs pins the allocations the Envoy target adds to a
// ShouldRateLimit call over those of gRPC itself, client and server: every
// allocation the load generator makes is CPU taken from the server it
// measures when both share a machine.
func TestEnvoyDecideAllocs(t *testing.T) {
	conn, _ := startFixedRLS(t, fixedAnswer)
	target := loadgen.Envoy(conn, "bench", costDescriptors)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var out loadgen.Outcome
	var err error
	decide := func() { out, err = target.Decide(ctx, "alice", 1) }
	decide()
	if err != nil || out.Allowed || out.Quota.Limit != 20 || out.Quota.Remaining != 0 || out.Quota.Window != 24*time.Hour || out.Quota.ResetAfter != 3*time.Hour {
		t.Fatalf("Decide: %+v, %v; want denied, 0 of 20 a day left, reset in 3h", out, err)
	}
	// The same call, with its request's bytes written once and its answer
	// left unread: what gRPC allocates, client and server.
	req, err := proto.Marshal(&rlpb.RateLimitRequest{Domain: "bench", HitsAddend: 1, Descriptors: []*ratelimit.RateLimitDescriptor{
		{Entries: []*ratelimit.RateLimitDescriptor_Entry{{Key: "tenant", Value: "acme"}}},
		{Entries: []*ratelimit.RateLimitDescriptor_Entry{{Key: "user", Value: "alice"}}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	opts := []grpc.CallOption{grpc.ForceCodecV2(fixedCodec{mem.BufferSlice{mem.SliceBuffer(req)}})}
	var invokeErr error
	invoke := func() {
		invokeErr = conn.Invoke(ctx, "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit", &req, &req, opts...)
	}
	// gRPC's own allocations vary by a few a call (flow-control pings and
	// window updates come when they come), and only ever add: the least of
	// several rounds is each call's.
	allocs, base := math.Inf(1), math.Inf(1)
	for range 5 {
		allocs = min(allocs, testing.AllocsPerRun(100, decide))
		base = min(base, testing.AllocsPerRun(100, invoke))
	}
	if err != nil || invokeErr != nil {
		t.Fatal(err, invokeErr)
	}
	t.Logf("%.1f allocations a call, %.1f of them gRPC's", allocs, base)
	if allocs-base > maxEnvoyAllocs {
		t.Errorf("%.1f allocations a call over gRPC's own %.1f; want at most %d", allocs-base, base, maxEnvoyAllocs)
	}
}

// maxEnvoyAllocs is what the Envoy target may allocate a call: its
// request's bytes and their wrapping for gRPC (3), and room for gRPC's
// noise.
const maxEnvoyAllocs = 6

// fixedCodec sends the same bytes every time and reads nothing of the
// answer.
type fixedCodec struct{ req mem.BufferSlice }

func (fixedCodec) Name() string                           { return "proto" }
func (c fixedCodec) Marshal(any) (mem.BufferSlice, error) { return c.req, nil }
func (fixedCodec) Unmarshal(mem.BufferSlice, any) error   { return nil }

// cpuTime is the CPU time this process has used.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkEnvoyDecide: one caller's ShouldRateLimit calls against a
// server that answers the same each time; cpu-ns/op is the process's CPU
// time, client and server, a call.
func BenchmarkEnvoyDecide(b *testing.B) {
	conn, _ := startFixedRLS(b, fixedAnswer)
	target := loadgen.Envoy(conn, "bench", costDescriptors)
	ctx := context.Background()
	b.ReportAllocs()
	cpu := cpuTime()
	for b.Loop() {
		if _, err := target.Decide(ctx, "alice", 1); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(cpuTime()-cpu)/float64(b.N), "cpu-ns/op")
}

// BenchmarkEnvoyDecideHotkeyd is BenchmarkEnvoyDecide against a hotkeyd
// in this process.
func BenchmarkEnvoyDecideHotkeyd(b *testing.B) {
	target := loadgen.Envoy(startRLS(b), "bench", costDescriptors)
	ctx := context.Background()
	b.ReportAllocs()
	cpu := cpuTime()
	for b.Loop() {
		if _, err := target.Decide(ctx, "alice", 1); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(cpuTime()-cpu)/float64(b.N), "cpu-ns/op")
}

// BenchmarkEnvoyDecideLean is BenchmarkEnvoyDecide over a GRPCConn to the
// same server.
func BenchmarkEnvoyDecideLean(b *testing.B) {
	conn, _ := startFixedRLS(b, fixedAnswer)
	target := loadgen.Envoy(leanConn(b, conn.Target(), nil), "bench", costDescriptors)
	ctx := context.Background()
	b.ReportAllocs()
	cpu := cpuTime()
	for b.Loop() {
		if _, err := target.Decide(ctx, "alice", 1); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(cpuTime()-cpu)/float64(b.N), "cpu-ns/op")
}
