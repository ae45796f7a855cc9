package loadgen_test

import (
	"context"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlpb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"go.uber.org/goleak"
	"golang.org/x/net/http2"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"

	"github.com/hotkeyd/hotkey/loadgen"
)

// leanClient dials addr with DialGRPCClient, closed with the test.
func leanClient(t testing.TB, addr string) *loadgen.GRPCClient {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute) // only catches a hang
	defer cancel()
	g, err := loadgen.DialGRPCClient(ctx, addr, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.Close() })
	return g
}

// countingListener counts the connections it accepts.
type countingListener struct {
	net.Listener
	accepted atomic.Int64
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.accepted.Add(1)
	}
	return c, err
}

// rlsServer is a grpc-go server of fixedAnswer on ln, until stop.
type rlsServer struct {
	srv  *grpc.Server
	done chan struct{}
}

func startRLSServer(ln net.Listener, opts ...grpc.ServerOption) *rlsServer {
	s := &rlsServer{srv: grpc.NewServer(opts...), done: make(chan struct{})}
	rlpb.RegisterRateLimitServiceServer(s.srv, &fixedRLS{resp: fixedAnswer})
	go func() { defer close(s.done); s.srv.Serve(ln) }()
	return s
}

// stop stops the server, closing its listener and connections, and waits
// for it to end. It may be called more than once.
func (s *rlsServer) stop() {
	s.srv.Stop()
	<-s.done
}

// TestGRPCClientServerRestart: while the server is down every call fails
// with codes.Unavailable; once a server listens on the same address
// again, the same client's calls are answered, every one after the
// first answered.
func TestGRPCClientServerRestart(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	srv := startRLSServer(ln)
	t.Cleanup(srv.stop)
	target := loadgen.Envoy(leanClient(t, addr), "bench", costDescriptors)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute) // only catches a hang
	defer cancel()
	if _, err := target.Decide(ctx, "alice", 1); err != nil {
		t.Fatalf("before the restart: %v", err)
	}

	srv.stop()
	for i := range 20 {
		if _, err := target.Decide(ctx, "alice", 1); status.Code(err) != codes.Unavailable {
			t.Fatalf("call %d with the server down: %v; want Unavailable", i, err)
		}
	}

	ln, err = net.Listen("tcp", addr)
	if err != nil {
		t.Skipf("listening again on %s: %v (the port was taken meanwhile)", addr, err)
	}
	srv = startRLSServer(ln)
	t.Cleanup(srv.stop)
	// The calls fail fast until the backoff lets the client dial again.
	failed := 0
	for {
		_, err := target.Decide(ctx, "alice", 1)
		if err == nil {
			break
		}
		if status.Code(err) != codes.Unavailable || ctx.Err() != nil {
			t.Fatalf("after the restart, after %d failures: %v; want Unavailable until answered", failed, err)
		}
		failed++
		time.Sleep(5 * time.Millisecond)
	}
	for i := range 100 {
		if out, err := target.Decide(ctx, "alice", 1); err != nil || out.Quota.Limit != 20 {
			t.Fatalf("call %d after the first answered: %+v, %v", i, out, err)
		}
	}
	t.Logf("%d calls failed fast after the restart, until the backoff's end", failed)
}

// TestGRPCClientGoAway: a server with a short maximum connection age
// sends GOAWAY every few milliseconds; concurrent callers see every call
// answered, none Unavailable, over several connections, and none is left
// open or running once the client is closed.
func TestGRPCClientGoAway(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cl := &countingListener{Listener: ln}
	srv := startRLSServer(cl, grpc.KeepaliveParams(keepalive.ServerParameters{
		MaxConnectionAge:      20 * time.Millisecond,
		MaxConnectionAgeGrace: time.Minute,
	}))
	defer srv.stop()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute) // only catches a hang
	defer cancel()
	g, err := loadgen.DialGRPCClient(ctx, ln.Addr().String(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	target := loadgen.Envoy(g, "bench", costDescriptors)

	// The callers stop once 4 connections were accepted and 2,000 calls
	// made, or at 100,000 calls.
	const callers, minCalls, maxCalls, wantConns = 8, 2000, 100000, 4
	var calls, failed atomic.Int64
	var firstErr atomic.Value
	var wg sync.WaitGroup
	for range callers {
		wg.Go(func() {
			for {
				n := calls.Add(1)
				if n > maxCalls || n > minCalls && cl.accepted.Load() >= wantConns {
					return
				}
				if _, err := target.Decide(ctx, "alice", 1); err != nil {
					failed.Add(1)
					firstErr.CompareAndSwap(nil, err)
				}
			}
		})
	}
	wg.Wait()
	made := min(calls.Load()-callers, maxCalls)
	t.Logf("%d calls over %d connections", made, cl.accepted.Load())
	if n := failed.Load(); n > 0 {
		t.Errorf("%d of %d calls failed, the first with %v", n, made, firstErr.Load())
	}
	if n := cl.accepted.Load(); n < 2 {
		t.Errorf("%d connection(s) accepted; want a new one after each GOAWAY", n)
	}
	g.Close()
	srv.stop()
}

// TestGRPCClientBackoff: with nothing listening, a failed dial fails the
// call that waited for it; the calls after fail fast with its error, and
// dial nothing, until the backoff has passed; the next dial's failure
// doubles it.
func TestGRPCClientBackoff(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	answer := grpcMessage(mustMarshal(t, fixedAnswer))
	s := &h2Server{answer: func(r *h2Reply) { r.reply(answer, grpcOK) }}
	served := make(chan net.Conn, 1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		nc, err := ln.Accept()
		if err != nil {
			return
		}
		served <- nc
		s.serve(nc)
	}()
	g := leanClient(t, addr)
	var dials atomic.Int64
	var mu sync.Mutex
	now := time.Now()
	loadgen.SetGRPCClientHooks(g, func(ctx context.Context) (*loadgen.GRPCConn, error) {
		dials.Add(1)
		return loadgen.DialGRPC(ctx, addr, nil)
	}, func() time.Time {
		mu.Lock()
		defer mu.Unlock()
		return now
	})
	advance := func(d time.Duration) {
		mu.Lock()
		now = now.Add(d)
		mu.Unlock()
	}
	target := loadgen.Envoy(g, "bench", costDescriptors)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute) // only catches a hang
	defer cancel()
	if _, err := target.Decide(ctx, "alice", 1); err != nil {
		t.Fatal(err)
	}

	// Nothing listens on addr any more, and the connection breaks.
	ln.Close()
	waitFor(t, served).Close()
	<-done
	for i := 0; dials.Load() == 0; i++ {
		if i == 10000 {
			t.Fatal("no dial after the connection broke")
		}
		if _, err := target.Decide(ctx, "alice", 1); status.Code(err) != codes.Unavailable {
			t.Fatalf("the connection broken: %v; want Unavailable", err)
		}
		time.Sleep(time.Millisecond)
	}
	burst := func(when string, wantDials int64) {
		t.Helper()
		for range 20 {
			_, err := target.Decide(ctx, "alice", 1)
			if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), addr) {
				t.Fatalf("%s: %v; want Unavailable naming %s", when, err, addr)
			}
		}
		if n := dials.Load(); n != wantDials {
			t.Fatalf("%s: %d dials; want %d", when, n, wantDials)
		}
	}
	burst("in the first backoff", 1)
	// The first backoff is the least ±20%, the second twice that.
	advance(loadgen.GRPCMinBackoff * 6 / 5)
	burst("after the first backoff", 2)
	advance(loadgen.GRPCMinBackoff * 6 / 5)
	burst("in the second backoff", 2)
	advance(loadgen.GRPCMinBackoff * 6 / 5)
	burst("after the second backoff", 3)
}

// TestGRPCClientClose: Close fails with codes.Canceled a call in flight
// on a connection the server sent GOAWAY, and the calls waiting for the
// dial that replaces it, ends that dial, fails every later call the same
// way, and leaves no goroutine behind.
func TestGRPCClientClose(t *testing.T) {
	// One stream a connection, and the first call's not answered but
	// followed by GOAWAY: the next call waits for a stream, is refused by
	// the GOAWAY and waits for a dial, which hangs.
	s := &h2Server{
		settings: []http2.Setting{{ID: http2.SettingMaxConcurrentStreams, Val: 1}},
		answer:   func(r *h2Reply) { r.fr.WriteGoAway(r.id, http2.ErrCodeNo, nil) },
	}
	s.start(t)
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	g := leanClient(t, s.addr)
	dialing := make(chan struct{}, 1)
	loadgen.SetGRPCClientHooks(g, func(ctx context.Context) (*loadgen.GRPCConn, error) {
		dialing <- struct{}{}
		<-ctx.Done()
		return nil, ctx.Err()
	}, nil)
	target := loadgen.Envoy(g, "bench", costDescriptors)
	errc := make(chan error, 3)
	decide := func() {
		_, err := target.Decide(context.Background(), "alice", 1)
		errc <- err
	}
	go decide()
	go decide()
	waitFor(t, dialing)
	go decide()
	g.Close()
	for range 3 {
		if err := waitFor(t, errc); status.Code(err) != codes.Canceled {
			t.Errorf("in flight or waiting: %v; want Canceled", err)
		}
	}
	if _, err := target.Decide(context.Background(), "alice", 1); status.Code(err) != codes.Canceled {
		t.Errorf("after Close: %v; want Canceled", err)
	}
	if _, err := g.NewStream(context.Background(), &grpc.StreamDesc{}, "/x/y"); err == nil {
		t.Error("NewStream: no error")
	}
}

// TestGRPCConnDrain: a draining connection refuses new calls with
// codes.Canceled, answers the call it holds, and then closes itself,
// leaving no goroutine behind, with no Close.
func TestGRPCConnDrain(t *testing.T) {
	answer := grpcMessage(mustMarshal(t, fixedAnswer))
	got, release := make(chan uint32, 1), make(chan struct{})
	s := &h2Server{answer: func(r *h2Reply) {
		got <- r.id
		<-release
		r.reply(answer, grpcOK)
	}}
	s.start(t)
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent()) // before the cleanup closes conn
	conn := leanConn(t, s.addr, nil)
	target := loadgen.Envoy(conn, "bench", costDescriptors)
	errc := make(chan error, 1)
	go func() {
		_, err := target.Decide(context.Background(), "alice", 1)
		errc <- err
	}()
	waitFor(t, got)
	loadgen.DrainGRPCConn(conn)
	if _, err := target.Decide(context.Background(), "bob", 1); status.Code(err) != codes.Canceled {
		t.Errorf("a call on the draining connection: %v; want Canceled", err)
	}
	close(release)
	if err := waitFor(t, errc); err != nil {
		t.Errorf("the call the draining connection held: %v; want answered", err)
	}
}

// TestGRPCClientDialOutlivesCall: a call whose deadline passes while it
// waits for a dial ends with codes.DeadlineExceeded, but the dial goes
// on, and the next call is made on the connection it makes.
func TestGRPCClientDialOutlivesCall(t *testing.T) {
	answer := grpcMessage(mustMarshal(t, fixedAnswer))
	var first atomic.Bool
	s := &h2Server{answer: func(r *h2Reply) {
		r.reply(answer, grpcOK)
		if first.CompareAndSwap(false, true) {
			r.fr.WriteGoAway(r.id, http2.ErrCodeNo, nil)
		}
	}}
	s.start(t)
	g := leanClient(t, s.addr)
	var dials atomic.Int64
	release := make(chan struct{})
	loadgen.SetGRPCClientHooks(g, func(ctx context.Context) (*loadgen.GRPCConn, error) {
		dials.Add(1)
		<-release
		return loadgen.DialGRPC(ctx, s.addr, nil)
	}, nil)
	target := loadgen.Envoy(g, "bench", costDescriptors)
	var err error
	for i := 0; dials.Load() == 0; i++ { // until the GOAWAY is read
		if i == 1000 {
			t.Fatal("no dial after GOAWAY")
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
		_, err = target.Decide(ctx, "alice", 1)
		cancel()
	}
	if status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("the call waiting for the dial: %v; want DeadlineExceeded", err)
	}
	errc := make(chan error, 1)
	go func() {
		_, err := target.Decide(context.Background(), "bob", 1)
		errc <- err
	}()
	close(release)
	if err := waitFor(t, errc); err != nil {
		t.Errorf("the call after: %v; want answered", err)
	}
	if n := dials.Load(); n != 1 {
		t.Errorf("%d dials; want 1", n)
	}
}

// TestGRPCClientAllocs: a call over GRPCClient costs no allocation more
// than one over GRPCConn.
func TestGRPCClientAllocs(t *testing.T) {
	answer := grpcMessage(mustMarshal(t, fixedAnswer))
	s := &h2Server{answer: func(r *h2Reply) { r.reply(answer, grpcOK) }}
	s.start(t)
	g := leanClient(t, s.addr)
	req := mustMarshal(t, &rlpb.RateLimitRequest{Domain: "bench", HitsAddend: 1})
	opts := []grpc.CallOption{grpc.ForceCodecV2(fixedCodec{mem.BufferSlice{mem.SliceBuffer(req)}})}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var err error
	invoke := func() {
		err = g.Invoke(ctx, "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit", &req, &req, opts...)
	}
	invoke()
	allocs := testing.AllocsPerRun(1000, invoke)
	if err != nil {
		t.Fatal(err)
	}
	if allocs > maxLeanAllocs() {
		t.Errorf("%.1f allocations a call; want at most %.0f", allocs, maxLeanAllocs())
	}
}
