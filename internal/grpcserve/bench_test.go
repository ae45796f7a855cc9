package grpcserve_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"syscall"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"google.golang.org/grpc"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	testpb "google.golang.org/grpc/interop/grpc_testing"

	"github.com/hotkeyd/hotkey/internal/grpcserve"
)

// BenchmarkUnary: unary calls from parallel callers over one loopback
// connection of loadgen's client, answered by the lean server and by
// grpc-go's in the same run; allocations are the client's and the
// server's.
func BenchmarkUnary(b *testing.B) {
	for _, s := range benchServers {
		b.Run(s.name, func(b *testing.B) {
			c := testgrpc.NewTestServiceClient(leanClient(b, s.serve(b), nil))
			req := &testpb.SimpleRequest{ResponseSize: 32, Payload: &testpb.Payload{Body: make([]byte, 64)}}
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if _, err := c.UnaryCall(context.Background(), req); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}

// benchServers are the servers a benchmark compares in one run: the lean
// one and grpc-go's.
var benchServers = []struct {
	name  string
	serve func(b *testing.B) string
}{
	{"lean", func(b *testing.B) string { return serve(b, grpcserve.Config{}).addr }},
	{"grpc-go", func(b *testing.B) string { return serveGRPCGo(b, grpc.NumStreamWorkers(256)) }},
}

// serveGRPCGo starts grpc-go's server made with opts, with the test
// service, on loopback, stopped with t, and returns its address.
func serveGRPCGo(t testing.TB, opts ...grpc.ServerOption) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(opts...)
	testgrpc.RegisterTestServiceServer(srv, newTestServer())
	done := make(chan struct{})
	go func() { defer close(done); srv.Serve(ln) }()
	t.Cleanup(func() { srv.Stop(); <-done })
	return ln.Addr().String()
}

// BenchmarkSettingsFlood: the CPU time of the process (the server's
// reading and applying, and the test client's writing) per SETTINGS frame
// of n SETTINGS_INITIAL_WINDOW_SIZE entries, each waited for its ACK, on a
// connection with 1000 streams open; the frames alternate their last
// value, so each changes every stream's window. grpc-go's server is the
// baseline.
func BenchmarkSettingsFlood(b *testing.B) {
	for _, srv := range benchServers {
		for _, n := range []int{1, 100, 2730} {
			b.Run(fmt.Sprintf("%s/entries=%d", srv.name, n), func(b *testing.B) {
				settingsFlood(b, srv.serve(b), n)
			})
		}
	}
}

// settingsFlood is BenchmarkSettingsFlood's run of frames of n entries
// against the server at addr.
func settingsFlood(b *testing.B, addr string, n int) {
	c := dialRaw(b, addr)
	for i := range 1000 {
		c.headers(uint32(2*i+1), testgrpc.TestService_UnaryCall_FullMethodName, false)
	}
	c.ping(1)
	var frames [2][]byte
	for k := range frames {
		for i := range n {
			frames[k] = binary.BigEndian.AppendUint16(frames[k], uint16(http2.SettingInitialWindowSize))
			frames[k] = binary.BigEndian.AppendUint32(frames[k], uint32(65535+(i+n+k+1)%2))
		}
	}
	start := cpuTime()
	b.ResetTimer()
	for i := range b.N {
		c.fr.WriteRawFrame(http2.FrameSettings, 0, 0, frames[i%2])
		for acked := false; !acked; {
			f, err := c.fr.ReadFrame()
			if err != nil {
				b.Fatal(err)
			}
			if g, ok := f.(*http2.GoAwayFrame); ok {
				b.Skipf("refused: GOAWAY %v", g.ErrCode)
			}
			sf, ok := f.(*http2.SettingsFrame)
			acked = ok && sf.IsAck()
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(cpuTime()-start)/float64(b.N), "cpu-ns/frame")
}

// cpuTime returns the user and system CPU time the process used so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
