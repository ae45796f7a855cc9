package grpcserve_test

import (
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/encoding/gzip"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	testpb "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/hotkeyd/hotkey/internal/grpcserve"
)

// TestInterop: what a grpc-go client may send beside a plain call: gzip
// is refused with UNIMPLEMENTED, metadata is ignored up to the header
// list limit, and a list over it fails that call alone.
func TestInterop(t *testing.T) {
	s := serve(t, grpcserve.Config{})
	c := testgrpc.NewTestServiceClient(grpcClient(t, s.addr))
	req := &testpb.SimpleRequest{ResponseSize: 10, Payload: &testpb.Payload{Body: []byte("x")}}
	if _, err := c.UnaryCall(testCtx(t), req, grpc.UseCompressor(gzip.Name)); status.Code(err) != codes.Unimplemented {
		t.Errorf("gzip: %v, want Unimplemented", err)
	}
	md := metadata.AppendToOutgoingContext(testCtx(t), "x-user", "a", "x-trace-bin", "\x00\xff", "x-user", "b")
	if _, err := c.UnaryCall(md, req); err != nil {
		t.Errorf("with metadata: %v", err)
	}
	near := metadata.AppendToOutgoingContext(testCtx(t), "x-big", strings.Repeat("v", 15<<10))
	if _, err := c.UnaryCall(near, req); err != nil {
		t.Errorf("with 15 KiB of metadata: %v", err)
	}
	over := metadata.AppendToOutgoingContext(testCtx(t), "x-big", strings.Repeat("v", 17<<10))
	if _, err := c.UnaryCall(over, req); err == nil {
		t.Error("with 17 KiB of metadata: answered, want an error")
	}
	if _, err := c.UnaryCall(testCtx(t), req); err != nil {
		t.Errorf("after: %v", err)
	}
}
