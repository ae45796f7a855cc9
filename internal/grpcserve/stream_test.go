package grpcserve_test

import (
	"io"
	"slices"
	"testing"

	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	testpb "google.golang.org/grpc/interop/grpc_testing"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"

	"github.com/hotkeyd/hotkey/internal/grpcserve"
)

// TestHealth: Check answers a service's status, and Watch streams each
// change of it.
func TestHealth(t *testing.T) {
	s := serve(t, grpcserve.Config{})
	s.health.SetServingStatus("svc", healthpb.HealthCheckResponse_SERVING)
	c := healthpb.NewHealthClient(grpcClient(t, s.addr))
	resp, err := c.Check(testCtx(t), &healthpb.HealthCheckRequest{Service: "svc"})
	if err != nil || resp.Status != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("Check: %v, %v; want SERVING", resp, err)
	}
	if _, err := c.Check(testCtx(t), &healthpb.HealthCheckRequest{Service: "nope"}); status.Code(err) != codes.NotFound {
		t.Errorf("Check of an unknown service: %v, want NotFound", err)
	}
	w, err := c.Watch(testCtx(t), &healthpb.HealthCheckRequest{Service: "svc"})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []healthpb.HealthCheckResponse_ServingStatus{healthpb.HealthCheckResponse_SERVING, healthpb.HealthCheckResponse_NOT_SERVING, healthpb.HealthCheckResponse_SERVING} {
		got, err := w.Recv()
		if err != nil || got.Status != want {
			t.Fatalf("Watch: %v, %v; want %v", got, err, want)
		}
		if want == healthpb.HealthCheckResponse_SERVING && got.Status == want {
			s.health.SetServingStatus("svc", healthpb.HealthCheckResponse_NOT_SERVING)
		} else {
			s.health.SetServingStatus("svc", healthpb.HealthCheckResponse_SERVING)
		}
	}
	s.health.Shutdown() // NOT_SERVING
	if got, err := w.Recv(); err != nil || got.Status != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Errorf("Watch after Shutdown: %v, %v; want NOT_SERVING", got, err)
	}
}

// TestReflection: a reflection client lists the services registered, and
// gets the file of one, over a bidirectional stream.
func TestReflection(t *testing.T) {
	s := serve(t, grpcserve.Config{})
	stream, err := reflectionpb.NewServerReflectionClient(grpcClient(t, s.addr)).ServerReflectionInfo(testCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}); err != nil {
		t.Fatal(err)
	}
	resp, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, svc := range resp.GetListServicesResponse().GetService() {
		names = append(names, svc.Name)
	}
	slices.Sort(names)
	want := []string{"grpc.health.v1.Health", "grpc.reflection.v1.ServerReflection", "grpc.reflection.v1alpha.ServerReflection", "grpc.testing.TestService"}
	if !slices.Equal(names, want) {
		t.Errorf("services %q, want %q", names, want)
	}
	if err := stream.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_FileContainingSymbol{FileContainingSymbol: "grpc.testing.TestService"}}); err != nil {
		t.Fatal(err)
	}
	if resp, err := stream.Recv(); err != nil || len(resp.GetFileDescriptorResponse().GetFileDescriptorProto()) == 0 {
		t.Errorf("file of grpc.testing.TestService: %v, %v", resp, err)
	}
	if err := stream.CloseSend(); err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Recv(); err != io.EOF {
		t.Errorf("after CloseSend: %v, want EOF", err)
	}
}

// TestServerStreaming: a server stream's messages, more than the
// client's windows take at once, all arrive in order.
func TestServerStreaming(t *testing.T) {
	s := serve(t, grpcserve.Config{})
	c := testgrpc.NewTestServiceClient(grpcClient(t, s.addr))
	req := &testpb.StreamingOutputCallRequest{}
	for i := range 40 {
		req.ResponseParameters = append(req.ResponseParameters, &testpb.ResponseParameters{Size: int32(16<<10 + i)})
	}
	stream, err := c.StreamingOutputCall(testCtx(t), req)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 40 {
		resp, err := stream.Recv()
		if err != nil || len(resp.GetPayload().GetBody()) != 16<<10+i {
			t.Fatalf("message %d: %d bytes, %v; want %d", i, len(resp.GetPayload().GetBody()), err, 16<<10+i)
		}
	}
	if _, err := stream.Recv(); err != io.EOF {
		t.Errorf("after the last message: %v, want EOF", err)
	}
}
