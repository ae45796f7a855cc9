package grpcserve_test

import (
	"bytes"
	"context"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc/codes"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	testpb "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/hotkeyd/hotkey/internal/grpcserve"
)

// callFrames appends the frames of a unary call on stream id to b: its
// HEADERS and one DATA ending it.
func callFrames(fr *http2.Framer, hb *bytes.Buffer, he *hpack.Encoder, id uint32, req []byte) {
	hb.Reset()
	for _, f := range [][2]string{{":method", "POST"}, {":scheme", "http"}, {":path", testgrpc.TestService_UnaryCall_FullMethodName}, {":authority", "x"}, {"content-type", "application/grpc"}} {
		he.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
	}
	fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: hb.Bytes(), EndHeaders: true})
	fr.WriteData(id, true, grpcFrame(req))
}

// TestRawRapidReset: a client that makes calls and resets them at once
// (CVE-2023-44487), or has the server reset them with a frame that breaks
// their flow control, has no more handlers run at a time than the stream
// cap.
func TestRawRapidReset(t *testing.T) {
	const limit, n = 100, 20000
	s := serve(t, grpcserve.Config{MaxConcurrentStreams: limit})
	c := dialRaw(t, s.addr)
	last := uint32(2*n + 1)
	ended := make(chan string, 1)
	go func() { // the server's answers: resets, refusals, and the last call's
		outcome := "the connection ended"
		defer func() { ended <- outcome }()
		for {
			f, err := c.fr.ReadFrame()
			if err != nil {
				return
			}
			switch f := f.(type) {
			case *http2.GoAwayFrame:
				outcome = "GOAWAY " + f.ErrCode.String()
			case *http2.RSTStreamFrame:
				if f.StreamID == last {
					outcome = "the last call: RST " + f.ErrCode.String()
					return
				}
			case *http2.MetaHeadersFrame:
				if f.StreamID == last && f.StreamEnded() {
					outcome = "the last call answered"
					return
				}
			}
		}
	}()
	base := runtime.NumGoroutine()
	var peak atomic.Int64
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			peak.Store(max(peak.Load(), int64(runtime.NumGoroutine()-base)))
			select {
			case <-done:
				return
			default:
				runtime.Gosched()
			}
		}
	})
	req, _ := proto.Marshal(&testpb.SimpleRequest{Payload: &testpb.Payload{Body: []byte("hold")}})
	var b, hb bytes.Buffer
	fr, he := http2.NewFramer(&b, nil), hpack.NewEncoder(&hb)
	for id := uint32(1); id < 2*n; id += 2 {
		callFrames(fr, &hb, he, id, req)
		if id%4 == 1 {
			fr.WriteRSTStream(id, http2.ErrCodeCancel)
		} else { // the server resets it (CVE-2025-8671)
			fr.WriteWindowUpdate(id, 1<<31-1)
		}
		if b.Len() > 64<<10 {
			if _, err := c.nc.Write(b.Bytes()); err != nil {
				break // cut off: refusals and resets unread past maxCtrlBytes
			}
			b.Reset()
		}
	}
	// The server has read every call once it answers the last.
	callFrames(fr, &hb, he, last, nil)
	c.nc.Write(b.Bytes())
	outcome := waitFor(t, ended)
	close(done)
	wg.Wait()
	t.Logf("%d calls made and reset: %s; goroutines peaked at %d over the %d before", n, outcome, peak.Load(), base)
	if p := peak.Load(); p > 2*limit+50 {
		t.Errorf("%d calls made and reset with a stream cap of %d: goroutines peaked at %d more", n, limit, p)
	}
}

// TestRawPingFlood: a client that sends PINGs and reads nothing is cut
// off, rather than have their ACKs queued without bound.
func TestRawPingFlood(t *testing.T) {
	s := serve(t, grpcserve.Config{})
	c := dialRaw(t, s.addr)
	var b bytes.Buffer
	fr := http2.NewFramer(&b, nil)
	for range 1000 {
		fr.WritePing(false, [8]byte{1})
	}
	sent := 0
	for ; sent < 1000000; sent += 1000 {
		if _, err := c.nc.Write(b.Bytes()); err != nil {
			break
		}
	}
	if sent == 1000000 {
		t.Fatalf("%d PINGs sent and none read: the connection still open", sent)
	}
	t.Logf("the connection ended after %d PINGs sent unread", sent)
}

// TestStopUnreadAnswers: Stop ends a connection whose client reads no
// answer, and GracefulStop waits for it until Stop is called, as the
// daemon does when its context ends.
func TestStopUnreadAnswers(t *testing.T) {
	s := serve(t, grpcserve.Config{})
	c := dialRaw(t, s.addr)
	c.fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 1 << 30})
	c.fr.WriteWindowUpdate(0, 1<<30)
	c.ping(1) // the handshake is done
	const n = 20
	req, _ := proto.Marshal(&testpb.SimpleRequest{ResponseSize: 1 << 20, Payload: &testpb.Payload{Body: []byte("hold")}})
	var b, hb bytes.Buffer
	fr, he := http2.NewFramer(&b, nil), hpack.NewEncoder(&hb)
	for id := uint32(1); id < 2*n; id += 2 {
		callFrames(fr, &hb, he, id, req)
	}
	c.nc.Write(b.Bytes())
	for range n {
		waitFor(t, s.ts.started)
	}
	graceful := make(chan struct{})
	go func() { s.srv.GracefulStop(); close(graceful) }()
	close(s.ts.release) // 20 MiB of answers, unread
	select {
	case <-graceful:
		t.Fatal("GracefulStop returned with answers unread")
	case <-time.After(50 * time.Millisecond):
	}
	s.srv.Stop()
	waitFor(t, graceful)
}

// TestStress: several grpc-go connections make calls with random
// deadlines and cancels while the server is stopped under them: every
// call ends, no goroutine is left (TestMain), nothing races.
func TestStress(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for round := range 4 {
		s := serve(t, grpcserve.Config{MaxConcurrentStreams: 50, Workers: 8})
		var wg sync.WaitGroup
		for i := range 4 {
			cl := testgrpc.NewTestServiceClient(grpcClient(t, s.addr))
			if i == 0 { // Serve has begun: Stop before it would make it fail
				if _, err := cl.UnaryCall(testCtx(t), &testpb.SimpleRequest{}); err != nil {
					t.Fatal(err)
				}
			}
			seed := rng.Uint64()
			wg.Go(func() {
				rng := rand.New(rand.NewPCG(seed, 0))
				var calls sync.WaitGroup
				for range 200 {
					body := []string{"", "", "wait", "hold"}[rng.IntN(4)]
					d := time.Duration(1+rng.IntN(20)) * time.Millisecond
					cancelFirst := rng.IntN(3) == 0
					calls.Go(func() {
						ctx, cancel := context.WithTimeout(context.Background(), d)
						defer cancel()
						if cancelFirst {
							go cancel()
						}
						_, err := cl.UnaryCall(ctx, &testpb.SimpleRequest{ResponseSize: 10, Payload: &testpb.Payload{Body: []byte(body)}})
						switch status.Code(err) {
						case codes.OK, codes.Canceled, codes.DeadlineExceeded, codes.Unavailable:
						default:
							t.Errorf("call: %v", err)
						}
					})
				}
				calls.Wait()
			})
		}
		time.Sleep(time.Duration(rng.IntN(10)) * time.Millisecond) // lets some calls start: the stop races with the rest
		if round%2 == 0 {
			s.srv.Stop()
		} else {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Millisecond)
			go func() { <-ctx.Done(); s.srv.Stop() }()
			s.srv.GracefulStop()
			cancel()
		}
		wg.Wait()
	}
}
