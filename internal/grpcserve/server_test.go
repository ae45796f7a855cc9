package grpcserve_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	testpb "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/stats"
	"google.golang.org/grpc/status"

	"github.com/hotkeyd/hotkey/internal/grpcserve"
	"github.com/hotkeyd/hotkey/internal/testkit"
	"github.com/hotkeyd/hotkey/loadgen"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// testServer serves grpc.testing.TestService's UnaryCall: it answers a
// payload of ResponseSize bytes, or ResponseStatus as an error; a payload
// "wait" waits for the call's context to end and reports its error on
// ended; "hold" waits for release or the context's end, "stubborn" for
// release alone.
type testServer struct {
	testgrpc.UnimplementedTestServiceServer
	started   chan struct{}
	ended     chan error
	deadlines chan time.Time // of each "wait" call's context; zero: none
	release   chan struct{}
}

func newTestServer() *testServer {
	return &testServer{started: make(chan struct{}, 1000), ended: make(chan error, 1000), deadlines: make(chan time.Time, 1000), release: make(chan struct{})}
}

func (s *testServer) UnaryCall(ctx context.Context, req *testpb.SimpleRequest) (*testpb.SimpleResponse, error) {
	if st := req.GetResponseStatus(); st != nil && st.Code != 0 {
		return nil, status.Error(codes.Code(st.Code), st.Message)
	}
	switch string(req.GetPayload().GetBody()) {
	case "wait":
		send(s.started, struct{}{})
		dl, _ := ctx.Deadline()
		send(s.deadlines, dl)
		<-ctx.Done()
		send(s.ended, ctx.Err())
		return nil, status.FromContextError(ctx.Err()).Err()
	case "stubborn": // a handler that does not heed its context
		send(s.started, struct{}{})
		<-s.release
	case "hold":
		send(s.started, struct{}{})
		select {
		case <-s.release:
		case <-ctx.Done():
			return nil, status.FromContextError(ctx.Err()).Err()
		}
	}
	return &testpb.SimpleResponse{Payload: &testpb.Payload{Body: make([]byte, req.GetResponseSize())}}, nil
}

func (s *testServer) StreamingOutputCall(req *testpb.StreamingOutputCallRequest, stream testgrpc.TestService_StreamingOutputCallServer) error {
	for _, p := range req.GetResponseParameters() {
		if err := stream.Send(&testpb.StreamingOutputCallResponse{Payload: &testpb.Payload{Body: make([]byte, p.GetSize())}}); err != nil {
			return err
		}
	}
	return nil
}

// send sends v on c unless c is full: a fuzz test makes more calls than
// any channel holds, and reads none.
func send[T any](c chan T, v T) {
	select {
	case c <- v:
	default:
	}
}

// served is a Server on loopback with the test service, health and
// reflection.
type served struct {
	srv    *grpcserve.Server
	addr   string
	ts     *testServer
	health *health.Server
	done   chan error // Serve's error
}

// serve starts a Server of cfg on loopback, stopped with the test.
func serve(t testing.TB, cfg grpcserve.Config) *served {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &served{srv: grpcserve.NewServer(cfg), addr: ln.Addr().String(), ts: newTestServer(), health: health.NewServer(), done: make(chan error, 1)}
	testgrpc.RegisterTestServiceServer(s.srv, s.ts)
	healthpb.RegisterHealthServer(s.srv, s.health)
	reflection.Register(s.srv)
	go func() { s.done <- s.srv.Serve(ln) }()
	t.Cleanup(func() {
		s.srv.Stop()
		if err := <-s.done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return s
}

// grpcClient dials addr with grpc-go, closed with the test.
func grpcClient(t testing.TB, addr string, opts ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	if len(opts) == 0 {
		opts = []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	}
	cc, err := grpc.NewClient(addr, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

// leanClient dials addr with loadgen's client, closed with the test.
func leanClient(t testing.TB, addr string, tlsConf *tls.Config) *loadgen.GRPCConn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute) // only catches a hang
	defer cancel()
	c, err := loadgen.DialGRPC(ctx, addr, tlsConf)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// clients are the two clients each test runs with.
func clients(t *testing.T, addr string) map[string]grpc.ClientConnInterface {
	return map[string]grpc.ClientConnInterface{"grpc-go": grpcClient(t, addr), "loadgen": leanClient(t, addr, nil)}
}

func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute) // only catches a hang
	t.Cleanup(cancel)
	return ctx
}

func TestUnaryOK(t *testing.T) {
	s := serve(t, grpcserve.Config{})
	for name, cc := range clients(t, s.addr) {
		resp, err := testgrpc.NewTestServiceClient(cc).UnaryCall(testCtx(t), &testpb.SimpleRequest{ResponseSize: 100})
		if err != nil || len(resp.GetPayload().GetBody()) != 100 {
			t.Errorf("%s: %d bytes, %v; want 100 bytes", name, len(resp.GetPayload().GetBody()), err)
		}
	}
}

// TestUnaryStatus: a handler's status reaches the client with its code
// and message, bytes outside printable ASCII and '%' included.
func TestUnaryStatus(t *testing.T) {
	s := serve(t, grpcserve.Config{})
	cases := []struct {
		give codes.Code
		msg  string
	}{
		{codes.InvalidArgument, "bad domain"},
		{codes.ResourceExhausted, "100% used: naïve\nline"},
		{codes.Unavailable, ""},
		{codes.Internal, strings.Repeat("long ", 5000)}, // a trailer block over one frame
	}
	for name, cc := range clients(t, s.addr) {
		c := testgrpc.NewTestServiceClient(cc)
		for _, tc := range cases {
			_, err := c.UnaryCall(testCtx(t), &testpb.SimpleRequest{ResponseStatus: &testpb.EchoStatus{Code: int32(tc.give), Message: tc.msg}})
			if st := status.Convert(err); st.Code() != tc.give || st.Message() != tc.msg {
				t.Errorf("%s: %v %.40q; want %v %.40q", name, st.Code(), st.Message(), tc.give, tc.msg)
			}
		}
	}
}

// TestUnaryDeadline: the handler's context has the client's deadline
// (later by the time the call took to reach the server, as grpc-timeout
// carries a duration), and ends by then, by the server's timer or the
// client's reset, which race. TestRawDeadline sees the server's end it.
func TestUnaryDeadline(t *testing.T) {
	s := serve(t, grpcserve.Config{})
	for name, cc := range clients(t, s.addr) {
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		_, err := testgrpc.NewTestServiceClient(cc).UnaryCall(ctx, &testpb.SimpleRequest{Payload: &testpb.Payload{Body: []byte("wait")}})
		cancel()
		if status.Code(err) != codes.DeadlineExceeded {
			t.Errorf("%s: %v, want DeadlineExceeded", name, err)
		}
		want, _ := ctx.Deadline()
		if dl := waitFor(t, s.ts.deadlines); dl.Before(want) || dl.After(want.Add(10*time.Second)) {
			t.Errorf("%s: the handler's deadline is %v after the client's", name, dl.Sub(want))
		}
		if err := waitFor(t, s.ts.ended); err == nil {
			t.Errorf("%s: the handler's context did not end", name)
		}
	}
}

// TestUnaryCancel: a client that cancels its call (RST_STREAM) cancels
// the handler's context.
func TestUnaryCancel(t *testing.T) {
	s := serve(t, grpcserve.Config{})
	for name, cc := range clients(t, s.addr) {
		ctx, cancel := context.WithCancel(context.Background())
		errc := make(chan error, 1)
		go func() {
			_, err := testgrpc.NewTestServiceClient(cc).UnaryCall(ctx, &testpb.SimpleRequest{Payload: &testpb.Payload{Body: []byte("wait")}})
			errc <- err
		}()
		waitFor(t, s.ts.started)
		cancel()
		if err := waitFor(t, s.ts.ended); !errors.Is(err, context.Canceled) {
			t.Errorf("%s: the handler's context ended with %v, want Canceled", name, err)
		}
		if err := waitFor(t, errc); status.Code(err) != codes.Canceled {
			t.Errorf("%s: %v, want Canceled", name, err)
		}
	}
}

func waitFor[T any](t testing.TB, c chan T) T {
	t.Helper()
	select {
	case v := <-c:
		return v
	case <-time.After(time.Minute): // only catches a hang
		t.Fatal("timed out")
		panic("unreachable")
	}
}

// TestManyCalls: 1,000 calls at once on one connection that takes 16 at
// a time all complete.
func TestManyCalls(t *testing.T) {
	s := serve(t, grpcserve.Config{MaxConcurrentStreams: 16})
	for name, cc := range clients(t, s.addr) {
		c := testgrpc.NewTestServiceClient(cc)
		var wg sync.WaitGroup
		var ok atomic.Int64
		for range 1000 {
			wg.Go(func() {
				if _, err := c.UnaryCall(testCtx(t), &testpb.SimpleRequest{ResponseSize: 10}); err != nil {
					t.Errorf("%s: %v", name, err)
					return
				}
				ok.Add(1)
			})
		}
		wg.Wait()
		if ok.Load() != 1000 {
			t.Errorf("%s: %d calls of 1000 answered", name, ok.Load())
		}
	}
}

// TestLargeMessages: a request up to the limit, over many DATA frames and
// past the stream's first window, and an answer over the client's first
// windows, which the server sends as the client gives credit.
func TestLargeMessages(t *testing.T) {
	const limit = 3 << 20
	s := serve(t, grpcserve.Config{MaxRecvMsgSize: limit})
	for name, cc := range clients(t, s.addr) {
		c := testgrpc.NewTestServiceClient(cc)
		req := &testpb.SimpleRequest{ResponseSize: 2 << 20, Payload: &testpb.Payload{Body: make([]byte, limit-100)}}
		resp, err := c.UnaryCall(testCtx(t), req)
		if err != nil || len(resp.GetPayload().GetBody()) != 2<<20 {
			t.Errorf("%s: %d bytes, %v; want %d", name, len(resp.GetPayload().GetBody()), err, 2<<20)
		}
		req.Payload.Body = make([]byte, limit+1)
		_, err = c.UnaryCall(testCtx(t), req, grpc.MaxCallSendMsgSize(8<<20))
		if status.Code(err) != codes.ResourceExhausted {
			t.Errorf("%s: over the limit: %v, want ResourceExhausted", name, err)
		}
		if _, err := c.UnaryCall(testCtx(t), &testpb.SimpleRequest{ResponseSize: 1}); err != nil {
			t.Errorf("%s: after the refused call: %v", name, err)
		}
	}
}

// TestUnknownMethod: a method or service not registered is answered
// UNIMPLEMENTED.
func TestUnknownMethod(t *testing.T) {
	s := serve(t, grpcserve.Config{})
	for name, cc := range clients(t, s.addr) {
		for _, m := range []string{"/grpc.testing.TestService/Nope", "/no.Such/Call", "nonsense"} {
			err := cc.Invoke(testCtx(t), m, &testpb.Empty{}, &testpb.Empty{})
			if status.Code(err) != codes.Unimplemented {
				t.Errorf("%s: %s: %v, want Unimplemented", name, m, err)
			}
		}
		_, err := testgrpc.NewTestServiceClient(cc).EmptyCall(testCtx(t), &testpb.Empty{})
		if status.Code(err) != codes.Unimplemented {
			t.Errorf("%s: EmptyCall: %v, want Unimplemented", name, err)
		}
	}
}

// TestGracefulStop: the calls in flight when GracefulStop is called are
// answered; it returns once they are, and Serve returns nil.
func TestGracefulStop(t *testing.T) {
	s := serve(t, grpcserve.Config{})
	cc := grpcClient(t, s.addr)
	c := testgrpc.NewTestServiceClient(cc)
	const n = 5
	errc := make(chan error, n)
	for range n {
		go func() {
			_, err := c.UnaryCall(testCtx(t), &testpb.SimpleRequest{Payload: &testpb.Payload{Body: []byte("hold")}})
			errc <- err
		}()
	}
	for range n {
		waitFor(t, s.ts.started)
	}
	stopped := make(chan struct{})
	go func() { s.srv.GracefulStop(); close(stopped) }()
	select {
	case <-stopped:
		t.Fatal("GracefulStop returned with calls in flight")
	case <-time.After(20 * time.Millisecond):
	}
	close(s.ts.release)
	for range n {
		if err := waitFor(t, errc); err != nil {
			t.Errorf("call in flight: %v", err)
		}
	}
	waitFor(t, stopped)
	if err := waitFor(t, s.done); err != nil {
		t.Errorf("Serve: %v", err)
	}
	s.done <- nil
	if _, err := c.UnaryCall(testCtx(t), &testpb.SimpleRequest{}, grpc.WaitForReady(false)); err == nil {
		t.Error("a call after GracefulStop was answered")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if err := s.srv.Serve(ln); !errors.Is(err, grpcserve.ErrServerStopped) {
		t.Errorf("Serve after GracefulStop: %v, want ErrServerStopped", err)
	}
}

// TestStop: Stop fails the calls in flight and cancels their contexts.
func TestStop(t *testing.T) {
	s := serve(t, grpcserve.Config{})
	c := testgrpc.NewTestServiceClient(leanClient(t, s.addr, nil))
	errc := make(chan error, 1)
	go func() {
		_, err := c.UnaryCall(testCtx(t), &testpb.SimpleRequest{Payload: &testpb.Payload{Body: []byte("wait")}})
		errc <- err
	}()
	waitFor(t, s.ts.started)
	s.srv.Stop()
	if err := waitFor(t, s.ts.ended); !errors.Is(err, context.Canceled) {
		t.Errorf("the handler's context ended with %v, want Canceled", err)
	}
	if err := waitFor(t, errc); status.Code(err) != codes.Unavailable {
		t.Errorf("call in flight: %v, want Unavailable", err)
	}
}

// TestMaxConnectionAge: a connection is sent a GOAWAY at its age; the
// client dials again, and every call is answered.
func TestMaxConnectionAge(t *testing.T) {
	s := serve(t, grpcserve.Config{MaxConnectionAge: 50 * time.Millisecond, MaxConnectionAgeGrace: time.Minute})
	var dials atomic.Int64
	cc := grpcClient(t, s.addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			dials.Add(1)
			var d net.Dialer
			return d.DialContext(ctx, "tcp", addr)
		}))
	c := testgrpc.NewTestServiceClient(cc)
	for dials.Load() < 3 {
		if _, err := c.UnaryCall(testCtx(t), &testpb.SimpleRequest{}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(5 * time.Millisecond) // calls spread over the connections' lives
	}
	lc := leanClient(t, s.addr, nil)
	for {
		_, err := testgrpc.NewTestServiceClient(lc).UnaryCall(testCtx(t), &testpb.SimpleRequest{})
		if err != nil {
			// loadgen's client never dials again: its calls fail once the
			// server goes away.
			if status.Code(err) != codes.Unavailable {
				t.Fatalf("loadgen's call: %v, want Unavailable", err)
			}
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestMaxConnectionAgeGrace: a call still in flight a grace after the
// connection's age is cancelled with its connection.
func TestMaxConnectionAgeGrace(t *testing.T) {
	s := serve(t, grpcserve.Config{MaxConnectionAge: 20 * time.Millisecond, MaxConnectionAgeGrace: 20 * time.Millisecond})
	c := testgrpc.NewTestServiceClient(leanClient(t, s.addr, nil))
	_, err := c.UnaryCall(testCtx(t), &testpb.SimpleRequest{Payload: &testpb.Payload{Body: []byte("wait")}})
	if status.Code(err) != codes.Unavailable {
		t.Errorf("%v, want Unavailable", err)
	}
	if err := waitFor(t, s.ts.ended); !errors.Is(err, context.Canceled) {
		t.Errorf("the handler's context ended with %v, want Canceled", err)
	}
}

// TestTLS: a server with a certificate serves TLS clients that ask for
// ALPN h2.
func TestTLS(t *testing.T) {
	ca := testkit.NewCA(t, "grpcserve")
	leaf := ca.Issue(t, testkit.LeafConfig{Name: "server", IPs: []net.IP{net.IPv4(127, 0, 0, 1)}})
	cert, err := tls.X509KeyPair(leaf.CertPEM, leaf.KeyPEM)
	if err != nil {
		t.Fatal(err)
	}
	s := serve(t, grpcserve.Config{TLS: &tls.Config{Certificates: []tls.Certificate{cert}, NextProtos: []string{"h2"}}})
	pool := x509.NewCertPool()
	pool.AddCert(ca.Cert)
	clientConf := &tls.Config{RootCAs: pool}
	for name, cc := range map[string]grpc.ClientConnInterface{
		"grpc-go": grpcClient(t, s.addr, grpc.WithTransportCredentials(credentials.NewTLS(clientConf))),
		"loadgen": leanClient(t, s.addr, clientConf),
	} {
		if _, err := testgrpc.NewTestServiceClient(cc).UnaryCall(testCtx(t), &testpb.SimpleRequest{ResponseSize: 10}); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
	cc := grpcClient(t, s.addr)
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if _, err := testgrpc.NewTestServiceClient(cc).UnaryCall(ctx, &testpb.SimpleRequest{}); err == nil {
		t.Error("a cleartext call to a TLS server was answered")
	}
}

// recorder is a stats.Handler that keeps the Begin and End of each call.
type recorder struct {
	mu    sync.Mutex
	names []string
	ends  []stats.End // copies: the server reuses what it gives
	begin int
}

type nameKey struct{}

func (r *recorder) TagRPC(ctx context.Context, info *stats.RPCTagInfo) context.Context {
	return context.WithValue(ctx, nameKey{}, info.FullMethodName)
}

func (r *recorder) HandleRPC(ctx context.Context, s stats.RPCStats) {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch s := s.(type) {
	case *stats.Begin:
		r.begin++
	case *stats.End:
		r.names = append(r.names, ctx.Value(nameKey{}).(string))
		r.ends = append(r.ends, *s)
	}
}

func (r *recorder) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context { return ctx }
func (r *recorder) HandleConn(context.Context, stats.ConnStats)                       {}

// TestStatsHandler: each call is tagged with its method and seen to
// begin and end, with its error. As on grpc-go's server, End comes once
// the answer is on its way, so the client may have it first.
func TestStatsHandler(t *testing.T) {
	r := &recorder{}
	s := serve(t, grpcserve.Config{StatsHandler: r})
	c := testgrpc.NewTestServiceClient(leanClient(t, s.addr, nil))
	ended := func(n int) {
		t.Helper()
		testkit.For(t, time.Minute, fmt.Sprintf("%d calls ended", n), func() bool {
			r.mu.Lock()
			defer r.mu.Unlock()
			return len(r.ends) >= n
		})
	}
	c.UnaryCall(testCtx(t), &testpb.SimpleRequest{})
	ended(1)
	c.UnaryCall(testCtx(t), &testpb.SimpleRequest{ResponseStatus: &testpb.EchoStatus{Code: int32(codes.Aborted)}})
	ended(2)
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.begin != 2 || len(r.ends) != 2 {
		t.Fatalf("%d begins, %d ends; want 2, 2", r.begin, len(r.ends))
	}
	for i, want := range []codes.Code{codes.OK, codes.Aborted} {
		e := r.ends[i]
		if r.names[i] != testgrpc.TestService_UnaryCall_FullMethodName || status.Code(e.Error) != want || e.EndTime.Before(e.BeginTime) {
			t.Errorf("call %d: %s, %v, %v to %v; want %s, %v", i, r.names[i], e.Error, e.BeginTime, e.EndTime, testgrpc.TestService_UnaryCall_FullMethodName, want)
		}
	}
}

// TestGracefulStopHandshake: GracefulStop does not wait for a connection
// whose client has not sent its preface.
func TestGracefulStopHandshake(t *testing.T) {
	s := serve(t, grpcserve.Config{})
	nc, err := net.Dial("tcp", s.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	nc.Write([]byte("PRI * HTTP/2.0\r\n")) // half a preface
	stopped := make(chan struct{})
	go func() { s.srv.GracefulStop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(20 * time.Second): // the handshake's own timeout is 30 s
		t.Fatal("GracefulStop waits for a connection in its handshake")
	}
}
