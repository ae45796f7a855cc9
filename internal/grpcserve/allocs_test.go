package grpcserve_test

import (
	"context"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/mem"

	"github.com/hotkeyd/hotkey/internal/grpcserve"
)

// rawCodec passes messages as they are: a *[]byte, unmarshalled into
// the bytes it holds.
type rawCodec struct{}

func (rawCodec) Name() string { return "proto" }

func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	return mem.BufferSlice{mem.SliceBuffer(*v.(*[]byte))}, nil
}

func (rawCodec) AppendMarshal(b []byte, v any) ([]byte, bool, error) {
	return append(b, *v.(*[]byte)...), true, nil
}

func (rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	p := v.(*[]byte)
	*p = (*p)[:0]
	for _, d := range data {
		*p = append(*p, d.ReadOnlyData()...)
	}
	return nil
}

var rawAnswer = []byte("answer")

// rawService answers each call rawAnswer, its request decoded into a
// buffer of the caller's.
var rawService = grpc.ServiceDesc{
	ServiceName: "raw.Raw",
	Methods: []grpc.MethodDesc{{MethodName: "Call", Handler: func(_ any, _ context.Context, dec func(any) error, _ grpc.UnaryServerInterceptor) (any, error) {
		var in [64]byte
		b := in[:0]
		if err := dec(&b); err != nil {
			return nil, err
		}
		return &rawAnswer, nil
	}}},
}

// TestAllocs: a unary call with a deadline costs the server four
// allocations (its HEADERS frame, the grpc-timeout field's name and value
// that the HPACK decoder makes, the call's context) beside its handler's
// two, and loadgen's client six.
func TestAllocs(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpcserve.NewServer(grpcserve.Config{Codec: rawCodec{}})
	srv.RegisterService(&rawService, nil)
	done := make(chan struct{})
	go func() { defer close(done); srv.Serve(ln) }()
	defer func() { srv.Stop(); <-done }()
	c := leanClient(t, ln.Addr().String(), nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute) // only catches a hang
	defer cancel()
	req, resp := []byte("request"), make([]byte, 0, 64)
	opt := grpc.ForceCodecV2(rawCodec{})
	call := func() {
		if err = c.Invoke(ctx, "/raw.Raw/Call", &req, &resp, opt); err != nil {
			t.Fatal(err)
		}
	}
	call()
	allocs := testing.AllocsPerRun(1000, call)
	if string(resp) != "answer" {
		t.Fatalf("answered %q", resp)
	}
	t.Logf("%.1f allocations a call", allocs)
	want := 12.0
	if raceEnabled {
		want = 20
	}
	if allocs > want {
		t.Errorf("%.1f allocations a call, want at most %.0f", allocs, want)
	}
}
