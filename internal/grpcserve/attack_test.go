package grpcserve_test

import (
	"bytes"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	testpb "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/protobuf/proto"

	"github.com/hotkeyd/hotkey/internal/grpcserve"
)

// TestStopRacingCalls: Stop while a client's calls are still being read
// cancels every call the server starts, however late it reads it, and
// returns.
func TestStopRacingCalls(t *testing.T) {
	req, _ := proto.Marshal(&testpb.SimpleRequest{Payload: &testpb.Payload{Body: []byte("hold")}})
	hung := 0
	const rounds = 40
	for range rounds {
		s := serve(t, grpcserve.Config{})
		c := dialRaw(t, s.addr)
		var b, hb bytes.Buffer
		fr, he := http2.NewFramer(&b, nil), hpack.NewEncoder(&hb)
		for id := uint32(1); id < 400; id += 2 {
			hb.Reset()
			for _, f := range [][2]string{{":method", "POST"}, {":scheme", "http"}, {":path", testgrpc.TestService_UnaryCall_FullMethodName}, {":authority", "x"}, {"content-type", "application/grpc"}} {
				he.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
			}
			fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: hb.Bytes(), EndHeaders: true})
			fr.WriteData(id, true, grpcFrame(req))
		}
		c.nc.Write(b.Bytes())
		waitFor(t, s.ts.started)
		stopped := make(chan struct{})
		go func() { s.srv.Stop(); close(stopped) }()
		select {
		case <-stopped:
		case <-time.After(10 * time.Second): // only catches a hang
			hung++
			close(s.ts.release)
			<-stopped
		}
	}
	if hung > 0 {
		t.Errorf("Stop hung in %d of %d rounds, a handler not cancelled", hung, rounds)
	}
}
