package grpcserve_test

import (
	"context"
	"net"
	"testing"

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
	servers := []struct {
		name  string
		serve func(b *testing.B) string
	}{
		{"lean", func(b *testing.B) string { return serve(b, grpcserve.Config{}).addr }},
		{"grpc-go", func(b *testing.B) string {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				b.Fatal(err)
			}
			srv := grpc.NewServer(grpc.NumStreamWorkers(256))
			testgrpc.RegisterTestServiceServer(srv, newTestServer())
			done := make(chan struct{})
			go func() { defer close(done); srv.Serve(ln) }()
			b.Cleanup(func() { srv.Stop(); <-done })
			return ln.Addr().String()
		}},
	}
	for _, s := range servers {
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
