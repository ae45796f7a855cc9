package loadgen_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"math/big"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlpb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"go.uber.org/goleak"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"

	"github.com/hotkeyd/hotkey/internal/h2rules"
	"github.com/hotkeyd/hotkey/loadgen"
)

// leanConn dials addr with DialGRPC, closed with the test.
func leanConn(t testing.TB, addr string, tlsConf *tls.Config) *loadgen.GRPCConn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute) // only catches a hang
	defer cancel()
	conn, err := loadgen.DialGRPC(ctx, addr, tlsConf)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// serveRLS serves rls with a grpc-go server on loopback until the test
// ends, and returns its address.
func serveRLS(t testing.TB, rls rlpb.RateLimitServiceServer, opts ...grpc.ServerOption) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(opts...)
	rlpb.RegisterRateLimitServiceServer(srv, rls)
	done := make(chan struct{})
	go func() { defer close(done); srv.Serve(ln) }()
	t.Cleanup(func() { srv.Stop(); <-done })
	return ln.Addr().String()
}

// sameOutcome reports whether got and want agree, their times until reset
// to within a second (the service computes them at each call).
func sameOutcome(got, want loadgen.Outcome) bool {
	d := got.Quota.ResetAfter - want.Quota.ResetAfter
	got.Quota.ResetAfter, want.Quota.ResetAfter = 0, 0
	return got == want && d > -time.Second && d < time.Second
}

// TestGRPCConnEnvoyHotkeyd: the Envoy target decides the same over
// GRPCConn as over grpc-go's ClientConn against a hotkeyd: each of two
// users at 20 a day, one asked over each, is admitted 20 times of 30,
// with the same quotas.
func TestGRPCConnEnvoyHotkeyd(t *testing.T) {
	conn := startRLS(t)
	lean := leanConn(t, conn.Target(), nil)
	ctx := context.Background()
	viaGRPC, viaLean := loadgen.Envoy(conn, "bench", costDescriptors), loadgen.Envoy(lean, "bench", costDescriptors)
	admitted := 0
	for i := range 30 {
		want, err := viaGRPC.Decide(ctx, "alice", 1)
		if err != nil {
			t.Fatal(err)
		}
		got, err := viaLean.Decide(ctx, "bob", 1)
		if err != nil {
			t.Fatal(err)
		}
		if !sameOutcome(got, want) {
			t.Errorf("call %d: %+v over GRPCConn; %+v over grpc-go", i, got, want)
		}
		if got.Allowed {
			admitted++
		}
	}
	if admitted != 20 {
		t.Errorf("admitted %d of 30 over GRPCConn; want 20", admitted)
	}
}

// TestGRPCConnEnvoyFixed: against a grpc-go server, the Envoy target's
// request and outcome are the same over GRPCConn as over grpc-go's.
func TestGRPCConnEnvoyFixed(t *testing.T) {
	conn, rls := startFixedRLS(t, fixedAnswer)
	lean := leanConn(t, conn.Target(), nil)
	ctx := context.Background()
	viaGRPC, viaLean := loadgen.Envoy(conn, "bench", costDescriptors), loadgen.Envoy(lean, "bench", costDescriptors)
	for _, key := range []string{"alice", "", "bob", strings.Repeat("k", 20000)} {
		want, err := viaGRPC.Decide(ctx, key, 3)
		if err != nil {
			t.Fatal(err)
		}
		rls.mu.Lock()
		wantReq := rls.last
		rls.mu.Unlock()
		got, err := viaLean.Decide(ctx, key, 3)
		if err != nil {
			t.Fatal(err)
		}
		rls.mu.Lock()
		gotReq := rls.last
		rls.mu.Unlock()
		if got != want || !proto.Equal(gotReq, wantReq) {
			t.Errorf("key of %d bytes: %+v after sending %v over GRPCConn; %+v after %v over grpc-go", len(key), got, gotReq, want, wantReq)
		}
	}
}

// errRLS fails every call with err.
type errRLS struct {
	rlpb.UnimplementedRateLimitServiceServer
	err error
}

func (e errRLS) ShouldRateLimit(context.Context, *rlpb.RateLimitRequest) (*rlpb.RateLimitResponse, error) {
	return nil, e.err
}

// TestGRPCConnStatus: a call a grpc-go server fails with grpc-status 8
// fails with the same error over GRPCConn as over grpc-go's: its code
// and its message, percent-decoded.
func TestGRPCConnStatus(t *testing.T) {
	const msg = "over 100% of quota: try later\nü"
	addr := serveRLS(t, errRLS{err: status.Error(codes.ResourceExhausted, msg)})
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	lean := leanConn(t, addr, nil)
	ctx := context.Background()
	_, want := loadgen.Envoy(conn, "bench", costDescriptors).Decide(ctx, "alice", 1)
	_, got := loadgen.Envoy(lean, "bench", costDescriptors).Decide(ctx, "alice", 1)
	if st, _ := status.FromError(errors.Unwrap(got)); status.Code(got) != codes.ResourceExhausted || st.Message() != msg || got.Error() != want.Error() {
		t.Errorf("over GRPCConn: %v (code %v); over grpc-go: %v; want ResourceExhausted, %q", got, status.Code(got), want, msg)
	}
}

// TestGRPCConnDeadline: a call whose deadline passes before the answer
// sends its grpc-timeout, returns codes.DeadlineExceeded, and resets its
// stream; one cancelled returns codes.Canceled and resets its stream too.
func TestGRPCConnDeadline(t *testing.T) {
	var timeout atomic.Value
	paths := make(chan uint32, 4)
	s := &h2Server{rsts: make(chan h2RST, 4), fields: func(id uint32, f hpack.HeaderField) {
		switch f.Name {
		case "grpc-timeout":
			timeout.Store(f.Value)
		case ":path":
			paths <- id
		}
	}}
	s.start(t)
	target := loadgen.Envoy(leanConn(t, s.addr, nil), "bench", costDescriptors)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if _, err := target.Decide(ctx, "alice", 1); status.Code(err) != codes.DeadlineExceeded {
		t.Errorf("past the deadline: %v; want DeadlineExceeded", err)
	}
	if rst := waitFor(t, s.rsts); rst != (h2RST{1, http2.ErrCodeCancel}) {
		t.Errorf("%+v; want stream 1 reset with CANCEL", rst)
	}
	waitFor(t, paths)
	v, _ := timeout.Load().(string)
	units := map[string]string{"n": "ns", "u": "us"}
	if d, err := time.ParseDuration(strings.TrimRight(v, "nu") + units[strings.TrimLeft(v, "0123456789")]); err != nil || d <= 0 || d > 100*time.Millisecond {
		t.Errorf("grpc-timeout %q; want at most 100ms, in n or u", v)
	}

	ctx, cancel = context.WithCancel(context.Background())
	errc := make(chan error)
	go func() {
		_, err := target.Decide(ctx, "alice", 1)
		errc <- err
	}()
	if id := waitFor(t, paths); id != 3 {
		t.Errorf("second call on stream %d; want 3", id)
	}
	cancel()
	if err := <-errc; status.Code(err) != codes.Canceled {
		t.Errorf("cancelled: %v; want Canceled", err)
	}
	if rst := waitFor(t, s.rsts); rst != (h2RST{3, http2.ErrCodeCancel}) {
		t.Errorf("%+v; want stream 3 reset with CANCEL", rst)
	}
}

// waitFor returns the next value of c.
func waitFor[T any](t *testing.T, c chan T) T {
	t.Helper()
	select {
	case v := <-c:
		return v
	case <-time.After(time.Minute): // only catches a hang
		t.Fatal("nothing came")
		var zero T
		return zero
	}
}

// TestGRPCConnServerErrors: what a server answers besides a message
// fails the call with grpc-go's code, and leaves the connection serving:
// a second call meets the same answer.
func TestGRPCConnServerErrors(t *testing.T) {
	msg := grpcMessage([]byte{8, 1})
	for _, tc := range []struct {
		name   string
		answer func(r *h2Reply)
		want   codes.Code
		substr string
	}{
		{"trailers only", func(r *h2Reply) {
			r.headers(true, []hpack.HeaderField{{Name: ":status", Value: "200"}, {Name: "content-type", Value: "application/grpc"},
				{Name: "grpc-status", Value: "8"}, {Name: "grpc-message", Value: "100%25 used"}})
		}, codes.ResourceExhausted, "desc = 100% used"},
		{"refused stream", func(r *h2Reply) { r.fr.WriteRSTStream(r.id, http2.ErrCodeRefusedStream) }, codes.Unavailable, "REFUSED_STREAM"},
		{"enhance your calm", func(r *h2Reply) { r.fr.WriteRSTStream(r.id, http2.ErrCodeEnhanceYourCalm) }, codes.ResourceExhausted, "ENHANCE_YOUR_CALM"},
		{"HTTP 503", func(r *h2Reply) {
			r.headers(true, []hpack.HeaderField{{Name: ":status", Value: "503"}, {Name: "content-type", Value: "text/plain"}})
		}, codes.Unavailable, "503"},
		{"compressed", func(r *h2Reply) {
			c := append([]byte(nil), msg...)
			c[0] = 1
			r.reply(c, grpcOK)
		}, codes.Internal, "compressed"},
		{"no trailers", func(r *h2Reply) {
			r.headers(false, grpcHeaders)
			r.fr.WriteData(r.id, true, msg)
		}, codes.Internal, "without sending trailers"},
		{"no message", func(r *h2Reply) { r.headers(false, grpcHeaders); r.headers(true, grpcOK) }, codes.Internal, "cardinality"},
		{"two messages", func(r *h2Reply) { r.reply(append(append([]byte(nil), msg...), msg...), grpcOK) }, codes.Internal, "cardinality"},
		{"over 4 MiB", func(r *h2Reply) { r.reply(grpcMessage(make([]byte, 4<<20+1))[:100], grpcOK) }, codes.ResourceExhausted, "larger than max"},
		{"LF in a header value", func(r *h2Reply) {
			r.headers(false, append(grpcHeaders[:2:2], hpack.HeaderField{Name: "x-a", Value: "a\nb"}))
			r.fr.WriteData(r.id, false, msg)
			r.headers(true, grpcOK)
		}, codes.Internal, "malformed"},
		{"NUL in a trailer value", func(r *h2Reply) {
			r.reply(msg, append(grpcOK[:1:1], hpack.HeaderField{Name: "x-a", Value: "\x00"}))
		}, codes.Internal, "malformed"},
		{"a space in a trailer name", func(r *h2Reply) {
			r.reply(msg, append(grpcOK[:1:1], hpack.HeaderField{Name: "x a", Value: "1"}))
		}, codes.Internal, "malformed"},
		{"no grpc-status", func(r *h2Reply) { r.reply(msg, []hpack.HeaderField{{Name: "x", Value: "y"}}) }, codes.Unknown, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &h2Server{answer: tc.answer}
			s.start(t)
			conn := leanConn(t, s.addr, nil)
			for i := range 2 {
				var reply rlpb.RateLimitResponse
				err := conn.Invoke(context.Background(), "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit", &rlpb.RateLimitRequest{}, &reply)
				if status.Code(err) != tc.want || !strings.Contains(err.Error(), tc.substr) {
					t.Errorf("call %d: %v; want %v, with %q", i, err, tc.want, tc.substr)
				}
			}
		})
	}
}

// TestGRPCConnBroken: a call in flight when the server closes the
// connection fails with codes.Unavailable, and so does every later call,
// at once; the client does not redial.
func TestGRPCConnBroken(t *testing.T) {
	s := &h2Server{answer: func(r *h2Reply) { r.nc.Close() }}
	s.start(t)
	conn := leanConn(t, s.addr, nil)
	target := loadgen.Envoy(conn, "bench", costDescriptors)
	ctx := context.Background()
	if _, err := target.Decide(ctx, "alice", 1); status.Code(err) != codes.Unavailable {
		t.Errorf("in flight: %v; want Unavailable", err)
	}
	for range 3 {
		if _, err := target.Decide(ctx, "alice", 1); status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "broken") {
			t.Errorf("later: %v; want Unavailable, connection broken", err)
		}
	}
}

// TestGRPCConnGoAway: after a GOAWAY, a call on a stream above its last
// fails with codes.Unavailable, as does every later call, and one below
// it is answered.
func TestGRPCConnGoAway(t *testing.T) {
	answer := grpcMessage(mustMarshal(t, fixedAnswer))
	paths := make(chan uint32, 4)
	s := &h2Server{
		fields: func(id uint32, f hpack.HeaderField) {
			if f.Name == ":path" {
				paths <- id
			}
		},
		answer: func(r *h2Reply) {
			if r.id == 1 {
				return // answered after the GOAWAY, below
			}
			r.fr.WriteGoAway(1, http2.ErrCodeNo, nil)
			r.id = 1
			r.reply(answer, grpcOK)
		},
	}
	s.start(t)
	target := loadgen.Envoy(leanConn(t, s.addr, nil), "bench", costDescriptors)
	ctx := context.Background()
	first := make(chan error, 1)
	go func() {
		_, err := target.Decide(ctx, "alice", 1)
		first <- err
	}()
	if id := waitFor(t, paths); id != 1 {
		t.Fatalf("first call on stream %d; want 1", id)
	}
	if _, err := target.Decide(ctx, "bob", 1); status.Code(err) != codes.Unavailable {
		t.Errorf("above the GOAWAY's last stream: %v; want Unavailable", err)
	}
	if err := waitFor(t, first); err != nil {
		t.Errorf("below the GOAWAY's last stream: %v; want answered", err)
	}
	if _, err := target.Decide(ctx, "carol", 1); status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "GOAWAY") {
		t.Errorf("after the GOAWAY: %v; want Unavailable", err)
	}
}

func mustMarshal(t testing.TB, m proto.Message) []byte {
	t.Helper()
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestGRPCConnMaxStreams: 64 callers sharing 3,200 calls over one
// GRPCConn, to a grpc-go server allowing 8 streams at a time whose calls
// are answered in groups of 8 (the last group, of the calls left, may be
// smaller): all are answered, 8 at a time, none refused. The callers share
// the calls so that 8 are asked at once until fewer are left: with 50
// each, the last callers, fewer than 8, could never fill a group.
func TestGRPCConnMaxStreams(t *testing.T) {
	const calls = 3200
	var mu sync.Mutex // guards arrived, released, gate and most
	arrived, released, most, gate := 0, 0, 0, make(chan struct{})
	groups := grpc.UnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		mu.Lock()
		arrived++
		most = max(most, arrived)
		g := gate
		if arrived == 8 || arrived == calls-released {
			close(gate)
			released += arrived
			arrived, gate = 0, make(chan struct{})
		}
		mu.Unlock()
		select {
		case <-g:
		case <-time.After(time.Minute): // only catches a hang
		}
		return h(ctx, req)
	})
	addr := serveRLS(t, &fixedRLS{resp: fixedAnswer}, grpc.MaxConcurrentStreams(8), groups)
	target := loadgen.Envoy(leanConn(t, addr, nil), "bench", costDescriptors)
	var wg sync.WaitGroup
	var failed atomic.Int32
	var firstErr atomic.Value
	var left atomic.Int64
	left.Store(calls)
	for range 64 {
		wg.Go(func() {
			for left.Add(-1) >= 0 {
				if out, err := target.Decide(context.Background(), "alice", 1); err != nil || out.Quota.Limit != 20 {
					failed.Add(1)
					firstErr.CompareAndSwap(nil, fmtErr(err))
				}
			}
		})
	}
	wg.Wait()
	if failed.Load() != 0 || most != 8 {
		t.Errorf("%d of %d calls failed (first: %v), %d at once at most; want none, 8", failed.Load(), calls, firstErr.Load(), most)
	}
}

func fmtErr(err error) string {
	if err == nil {
		return "wrong answer"
	}
	return err.Error()
}

// TestGRPCConnTLS: over TLS, with a certificate the client is given the
// root of, calls are answered as in cleartext.
func TestGRPCConnTLS(t *testing.T) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(cert)
	creds := credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}})
	addr := serveRLS(t, &fixedRLS{resp: fixedAnswer}, grpc.Creds(creds))
	target := loadgen.Envoy(leanConn(t, addr, &tls.Config{RootCAs: roots}), "bench", costDescriptors)
	out, err := target.Decide(context.Background(), "alice", 1)
	if err != nil || out.Allowed || out.Quota.Limit != 20 {
		t.Errorf("over TLS: %+v, %v; want denied, of 20 a day", out, err)
	}
	// Without the root, the handshake fails.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute) // only catches a hang
	defer cancel()
	if conn, err := loadgen.DialGRPC(ctx, addr, &tls.Config{}); err == nil {
		conn.Close()
		t.Error("dialed a server of an unknown certificate")
	}
}

// TestGRPCConnLargeAnswers: answers of 3 MiB, larger than the stream's
// and, six of them, the connection's receive windows, are read whole: the
// client gives the windows back as it reads.
func TestGRPCConnLargeAnswers(t *testing.T) {
	big := &rlpb.RateLimitResponse{OverallCode: rlpb.RateLimitResponse_OK,
		ResponseHeadersToAdd: []*core.HeaderValue{{Key: "x-big", Value: strings.Repeat("b", 3<<20)}}}
	addr := serveRLS(t, &fixedRLS{resp: big})
	conn := leanConn(t, addr, nil)
	for i := range 6 {
		var reply rlpb.RateLimitResponse
		if err := conn.Invoke(context.Background(), "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit", &rlpb.RateLimitRequest{Domain: "d"}, &reply); err != nil {
			t.Fatalf("answer %d: %v", i, err)
		}
		if !proto.Equal(&reply, big) {
			t.Fatalf("answer %d: not what the server sent", i)
		}
	}
}

// TestGRPCConnClose: Close fails a call in flight with codes.Canceled
// and later calls too, and leaves no goroutine behind.
func TestGRPCConnClose(t *testing.T) {
	s := &h2Server{} // never answers
	s.start(t)
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	conn := leanConn(t, s.addr, nil)
	target := loadgen.Envoy(conn, "bench", costDescriptors)
	errc := make(chan error)
	go func() {
		_, err := target.Decide(context.Background(), "alice", 1)
		errc <- err
	}()
	conn.Close()
	if err := waitFor(t, errc); status.Code(err) != codes.Canceled {
		t.Errorf("in flight: %v; want Canceled", err)
	}
	if _, err := target.Decide(context.Background(), "alice", 1); status.Code(err) != codes.Canceled {
		t.Errorf("after Close: %v; want Canceled", err)
	}
	if _, err := conn.NewStream(context.Background(), &grpc.StreamDesc{}, "/x/y"); err == nil {
		t.Error("NewStream: no error")
	}
}

// TestGRPCConnAllocs: a call over GRPCConn costs the client at most
// maxLeanAllocs allocations, the server allocating none; the Envoy
// target's decision adds its own.
func TestGRPCConnAllocs(t *testing.T) {
	answer := grpcMessage(mustMarshal(t, fixedAnswer))
	s := &h2Server{answer: func(r *h2Reply) { r.reply(answer, grpcOK) }}
	s.start(t)
	conn := leanConn(t, s.addr, nil)
	req := mustMarshal(t, &rlpb.RateLimitRequest{Domain: "bench", HitsAddend: 1})
	opts := []grpc.CallOption{grpc.ForceCodecV2(fixedCodec{mem.BufferSlice{mem.SliceBuffer(req)}})}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var err error
	invoke := func() {
		err = conn.Invoke(ctx, "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit", &req, &req, opts...)
	}
	target := loadgen.Envoy(conn, "bench", costDescriptors)
	var out loadgen.Outcome
	var derr error
	decide := func() { out, derr = target.Decide(ctx, "alice", 1) }
	invoke()
	decide()
	allocs := testing.AllocsPerRun(1000, invoke)
	decideAllocs := testing.AllocsPerRun(1000, decide)
	if err != nil || derr != nil || out.Quota.Limit != 20 {
		t.Fatal(err, derr, out)
	}
	t.Logf("%.1f allocations a call, %.1f a decision of the Envoy target", allocs, decideAllocs)
	if allocs > maxLeanAllocs() {
		t.Errorf("%.1f allocations a call; want at most %.0f", allocs, maxLeanAllocs())
	}
}

// maxLeanAllocs is the most allocations a GRPCConn call may cost: the
// HEADERS frames of its answer and trailers, which http2.Framer
// allocates. Under the race detector pooled calls are allocated again
// now and then.
func maxLeanAllocs() float64 {
	if raceEnabled {
		return 10
	}
	return 2
}

// TestGRPCConnWaitForStream: with the server's one stream taken, a call
// waits for it, and fails with codes.DeadlineExceeded if its deadline
// passes first, opening no stream; once the stream is given back (its
// call cancelled), the next call takes it.
func TestGRPCConnWaitForStream(t *testing.T) {
	answer := grpcMessage(mustMarshal(t, fixedAnswer))
	paths := make(chan uint32, 4)
	s := &h2Server{
		settings: []http2.Setting{{ID: http2.SettingMaxConcurrentStreams, Val: 1}},
		rsts:     make(chan h2RST, 4),
		fields: func(id uint32, f hpack.HeaderField) {
			if f.Name == ":path" {
				paths <- id
			}
		},
		answer: func(r *h2Reply) {
			if r.id != 1 {
				r.reply(answer, grpcOK)
			}
		},
	}
	s.start(t)
	target := loadgen.Envoy(leanConn(t, s.addr, nil), "bench", costDescriptors)
	ctx, cancel := context.WithCancel(context.Background())
	first := make(chan error, 1)
	go func() {
		_, err := target.Decide(ctx, "alice", 1)
		first <- err
	}()
	waitFor(t, paths)
	wctx, wcancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer wcancel()
	if _, err := target.Decide(wctx, "bob", 1); status.Code(err) != codes.DeadlineExceeded {
		t.Errorf("waiting for a stream past the deadline: %v; want DeadlineExceeded", err)
	}
	cancel()
	if err := waitFor(t, first); status.Code(err) != codes.Canceled {
		t.Errorf("cancelled: %v; want Canceled", err)
	}
	if rst := waitFor(t, s.rsts); rst != (h2RST{1, http2.ErrCodeCancel}) {
		t.Errorf("%+v; want stream 1 reset with CANCEL", rst)
	}
	if out, err := target.Decide(context.Background(), "carol", 1); err != nil || out.Quota.Limit != 20 {
		t.Errorf("after the stream was given back: %+v, %v; want answered", out, err)
	}
	if id := waitFor(t, paths); id != 3 {
		t.Errorf("the call after on stream %d; want 3: the one that waited opened none", id)
	}
}

// TestGRPCConnSettingsBound: a server whose SETTINGS carry over
// h2rules.MaxSettings parameters is refused at the dial; one of
// h2rules.MaxSettings is not.
func TestGRPCConnSettingsBound(t *testing.T) {
	for _, n := range []int{h2rules.MaxSettings, h2rules.MaxSettings + 1} {
		s := &h2Server{settings: make([]http2.Setting, n)}
		for i := range s.settings {
			s.settings[i] = http2.Setting{ID: http2.SettingInitialWindowSize, Val: 65535}
		}
		s.start(t)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute) // only catches a hang
		conn, err := loadgen.DialGRPC(ctx, s.addr, nil)
		cancel()
		if err == nil {
			conn.Close()
		}
		if refused := err != nil; refused != (n > h2rules.MaxSettings) {
			t.Errorf("SETTINGS of %d parameters: dial error %v", n, err)
		}
	}
}
