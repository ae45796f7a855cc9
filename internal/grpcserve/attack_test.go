package grpcserve_test

import (
	"bytes"
	"net"
	"runtime"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	testpb "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/protobuf/proto"

	"github.com/hotkeyd/hotkey/internal/grpcserve"
)

// heapAlloc returns the bytes of live heap, after a collection.
func heapAlloc() int64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapAlloc)
}

// TestRawUnreadStream: a stream whose handler does not read what the
// client sends (health's Watch reads one request) keeps at most
// MaxRecvMsgSize of it, however much is sent.
func TestRawUnreadStream(t *testing.T) {
	const limit = 1 << 20
	s := serve(t, grpcserve.Config{MaxRecvMsgSize: limit})
	c := dialRaw(t, s.addr)
	c.headers(1, healthpb.Health_Watch_FullMethodName, false)
	req, _ := proto.Marshal(&healthpb.HealthCheckRequest{})
	c.fr.WriteData(1, false, grpcFrame(req))
	if got, _ := c.firstData(1); got == 0 {
		t.Fatal("Watch sent nothing")
	}
	base := heapAlloc()
	msg := grpcFrame(make([]byte, 16000))
	const sent = 48 << 20
	for n := 0; n < sent; n += len(msg) {
		if err := c.fr.WriteData(1, false, msg); err != nil {
			t.Fatal(err)
		}
	}
	c.ping(1) // the server has read all the DATA once it answers
	grown := heapAlloc() - base
	t.Logf("%d MiB sent unread: the heap grew by %.1f MiB", sent>>20, float64(grown)/(1<<20))
	if grown > 4*limit {
		t.Errorf("%d MiB sent unread: the heap grew by %.1f MiB, want at most %d MiB", sent>>20, float64(grown)/(1<<20), 4*limit>>20)
	}
}

// firstData reads frames until stream id's first DATA, and returns its
// length.
func (c *rawConn) firstData(id uint32) (int, error) {
	for {
		f, err := c.fr.ReadFrame()
		if err != nil {
			return 0, err
		}
		if d, ok := f.(*http2.DataFrame); ok && d.StreamID == id {
			return len(d.Data()), nil
		}
	}
}

// ping sends a PING and reads frames until its ACK; it fails the test if
// the connection ends first.
func (c *rawConn) ping(v byte) {
	c.t.Helper()
	c.fr.WritePing(false, [8]byte{v})
	for {
		f, err := c.fr.ReadFrame()
		if err != nil {
			c.t.Fatalf("waiting for PING %d's ACK: %v", v, err)
		}
		if p, ok := f.(*http2.PingFrame); ok && p.IsAck() && p.Data == [8]byte{v} {
			return
		}
	}
}

// TestRawContinuationFlood: a header block that goes on in CONTINUATIONs
// past the header list limit, in fields HPACK encodes in a byte each,
// ends the connection rather than being read to its end.
func TestRawContinuationFlood(t *testing.T) {
	s := serve(t, grpcserve.Config{MaxHeaderListSize: 16 << 10})
	c := dialRaw(t, s.addr)
	go func() {
		c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: []byte{0x83}})
		frag := bytes.Repeat([]byte{0x82}, 16384) // :method GET, each counted 42 bytes
		for range 4 << 20 / len(frag) {
			if c.fr.WriteContinuation(1, false, frag) != nil {
				return
			}
		}
		c.fr.WriteContinuation(1, true, []byte{0x82})
		c.fr.WritePing(false, [8]byte{9})
	}()
	for {
		f, err := c.fr.ReadFrame()
		if err != nil {
			t.Fatalf("the connection ended with no GOAWAY: %v", err)
		}
		switch f := f.(type) {
		case *http2.GoAwayFrame:
			return
		case *http2.PingFrame:
			if f.IsAck() {
				t.Fatal("a header block of 4 MiB in CONTINUATIONs was read to its end, the connection kept")
			}
		}
	}
}

// TestRawIdleConns: a connection that sends nothing costs the server
// little memory until its handshake times out.
func TestRawIdleConns(t *testing.T) {
	s := serve(t, grpcserve.Config{})
	const n = 200
	base := heapAlloc()
	for range n {
		nc, err := net.Dial("tcp", s.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
	}
	// Wait for the server to wait for the prefaces.
	for waiting := 0; waiting < n; {
		buf := make([]byte, 1<<20)
		buf = buf[:runtime.Stack(buf, true)]
		waiting = 0
		for _, g := range strings.Split(string(buf), "\n\n") {
			if strings.Contains(g, "[IO wait") && strings.Contains(g, "(*conn).handshake") {
				waiting++
			}
		}
		runtime.Gosched()
	}
	per := (heapAlloc() - base) / n
	t.Logf("%d idle connections: %d bytes of heap each", n, per)
	if per > 8<<10 {
		t.Errorf("an idle connection holds %d bytes of heap, want at most 8 KiB", per)
	}
}

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
