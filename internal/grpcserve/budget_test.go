package grpcserve_test

import (
	"testing"

	"golang.org/x/net/http2"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	testpb "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/protobuf/proto"

	"github.com/hotkeyd/hotkey/internal/grpcserve"
)

// flowConn is a rawConn that keeps to the server's windows, as a client
// must: it sends DATA only as far as the connection's and the stream's
// windows let it.
type flowConn struct {
	*rawConn
	conn    int64            // the connection's send window
	streams map[uint32]int64 // each stream's, once it sent DATA
	pings   byte
}

func dialFlow(t *testing.T, addr string) *flowConn {
	return &flowConn{rawConn: dialRaw(t, addr), conn: 65535, streams: map[uint32]int64{}}
}

// sync sends a PING and reads frames to its ACK, applying the
// WINDOW_UPDATEs read on the way: the server has then acted on all that
// was sent before.
func (c *flowConn) sync() {
	c.t.Helper()
	c.pings++
	c.fr.WritePing(false, [8]byte{c.pings})
	for {
		f, err := c.fr.ReadFrame()
		if err != nil {
			c.t.Fatalf("waiting for PING %d's ACK: %v", c.pings, err)
		}
		c.apply(f)
		if p, ok := f.(*http2.PingFrame); ok && p.IsAck() && p.Data == [8]byte{c.pings} {
			return
		}
	}
}

// apply applies f if it is a WINDOW_UPDATE, and fails the test if it is
// a GOAWAY.
func (c *flowConn) apply(f http2.Frame) {
	c.t.Helper()
	switch f := f.(type) {
	case *http2.WindowUpdateFrame:
		if f.StreamID == 0 {
			c.conn += int64(f.Increment)
		} else if _, ok := c.streams[f.StreamID]; ok {
			c.streams[f.StreamID] += int64(f.Increment)
		}
	case *http2.GoAwayFrame:
		c.t.Fatalf("GOAWAY %v", f.ErrCode)
	}
}

// status reads frames, applying them, until stream id ends, and returns
// its grpc-status, or the RST_STREAM's code.
func (c *flowConn) status(id uint32) string {
	c.t.Helper()
	st := ""
	for {
		f, err := c.fr.ReadFrame()
		if err != nil {
			c.t.Fatalf("reading stream %d's answer: %v", id, err)
		}
		c.apply(f)
		if f.Header().StreamID != id {
			continue
		}
		switch f := f.(type) {
		case *http2.MetaHeadersFrame:
			for _, hf := range f.Fields {
				if hf.Name == "grpc-status" {
					st = hf.Value
				}
			}
			if f.StreamEnded() {
				return st
			}
		case *http2.RSTStreamFrame:
			return f.ErrCode.String()
		}
	}
}

// send sends b on stream id in DATA frames of at most 16 KiB, ending the
// stream after if end, as far as the windows let it, and returns how
// much it sent; short of len(b) once the server gives no more credit.
func (c *flowConn) send(id uint32, b []byte, end bool) int {
	c.t.Helper()
	if _, ok := c.streams[id]; !ok {
		c.streams[id] = 1 << 20 // the server's SETTINGS_INITIAL_WINDOW_SIZE
	}
	sent := 0
	for sent < len(b) {
		n := int64(min(len(b)-sent, 16384))
		n = min(n, c.conn, c.streams[id])
		if n == 0 {
			c.sync()
			if min(c.conn, c.streams[id]) == 0 {
				return sent
			}
			continue
		}
		last := end && sent+int(n) == len(b)
		if err := c.fr.WriteData(id, last, b[sent:sent+int(n)]); err != nil {
			c.t.Fatal(err)
		}
		c.conn -= n
		c.streams[id] -= n
		sent += int(n)
	}
	return sent
}

// TestRawHeldRequests: a client that starts a message on each of many
// streams and ends none can make the server hold no more than the
// connection's window of them, however many streams it opens. A call
// whose message is whole is still served, and gives its bytes back; so
// do the streams the client resets, after which new calls are served.
func TestRawHeldRequests(t *testing.T) {
	const (
		limit   = 1 << 20
		streams = 100
		part    = 900 << 10
		window  = 16 << 20 // the server's connection window
	)
	s := serve(t, grpcserve.Config{MaxRecvMsgSize: limit})
	c := dialFlow(t, s.addr)
	c.sync()
	req, _ := proto.Marshal(&testpb.SimpleRequest{ResponseSize: 10, Payload: &testpb.Payload{Body: make([]byte, part)}})
	whole := grpcFrame(req)
	c.headers(1, testgrpc.TestService_UnaryCall_FullMethodName, false)
	if n := c.send(1, whole, false); n != len(whole) {
		t.Fatalf("the first call sent %d of %d bytes", n, len(whole))
	}
	base := heapAlloc()
	msg := grpcFrame(make([]byte, limit-100))[:part]
	total := 0
	for i := range streams {
		id := uint32(2*i + 3)
		c.headers(id, testgrpc.TestService_UnaryCall_FullMethodName, false)
		total += c.send(id, msg, false)
	}
	c.sync()
	grown := heapAlloc() - base
	t.Logf("%d streams of %d KiB begun: %.1f MiB sent, the heap grew by %.1f MiB", streams, part>>10, float64(total)/(1<<20), float64(grown)/(1<<20))
	if grown > window+window/2 {
		t.Errorf("the heap grew by %.1f MiB, want at most %d MiB", float64(grown)/(1<<20), (window+window/2)>>20)
	}

	// The first call's message is whole: ended, it is served, and its
	// bytes are given back.
	c.fr.WriteData(1, true, nil)
	if got := c.status(1); got != "0" {
		t.Fatalf("the first call, ended once the window was held: status %s, want 0", got)
	}
	c.sync()
	if c.conn < int64(len(whole)) {
		t.Errorf("after the first call was served, a window of %d bytes, want at least %d", c.conn, len(whole))
	}

	for i := range streams {
		c.fr.WriteRSTStream(uint32(2*i+3), http2.ErrCodeCancel)
	}
	c.sync()
	if c.conn <= window/2 {
		t.Errorf("after the resets, a window of %d bytes, want over %d", c.conn, window/2)
	}
	for i := range 3 {
		id := uint32(2*(streams+i) + 3)
		c.headers(id, testgrpc.TestService_UnaryCall_FullMethodName, false)
		if n := c.send(id, whole, true); n != len(whole) {
			t.Fatalf("after the resets, call %d sent %d of %d bytes: no more credit", i, n, len(whole))
		}
		if got := c.status(id); got != "0" {
			t.Fatalf("after the resets, call %d: status %s, want 0", i, got)
		}
	}
}

// TestRawMaxSizeMessage: a MaxRecvMsgSize over the connection's usual
// window widens it, so that a message of that size is read whole.
func TestRawMaxSizeMessage(t *testing.T) {
	const limit = 24 << 20
	s := serve(t, grpcserve.Config{MaxRecvMsgSize: limit})
	c := dialFlow(t, s.addr)
	c.sync()
	req, _ := proto.Marshal(&testpb.SimpleRequest{ResponseSize: 10, Payload: &testpb.Payload{Body: make([]byte, limit-100)}})
	b := grpcFrame(req)
	c.headers(1, testgrpc.TestService_UnaryCall_FullMethodName, false)
	if n := c.send(1, b, true); n != len(b) {
		t.Fatalf("sent %d of %d bytes: no more credit", n, len(b))
	}
	if got := c.status(1); got != "0" {
		t.Fatalf("status %s, want 0", got)
	}
}

// TestRawMessageStarts: a message's buffer grows with what comes of it,
// not to what its prefix announces; so a client that begins a message of
// MaxRecvMsgSize on each of its streams, and sends a byte of each, makes
// the server hold little.
func TestRawMessageStarts(t *testing.T) {
	const (
		limit   = 1 << 20
		streams = 1000
	)
	s := serve(t, grpcserve.Config{MaxRecvMsgSize: limit})
	c := dialFlow(t, s.addr)
	c.sync()
	base := heapAlloc()
	start := grpcFrame(make([]byte, limit))[:6]
	for i := range streams {
		id := uint32(2*i + 1)
		c.headers(id, testgrpc.TestService_UnaryCall_FullMethodName, false)
		if n := c.send(id, start, false); n != len(start) {
			t.Fatalf("stream %d sent %d of %d bytes", id, n, len(start))
		}
	}
	c.sync()
	grown := heapAlloc() - base
	t.Logf("%d messages of %d KiB begun with a byte: the heap grew by %.1f MiB", streams, limit>>10, float64(grown)/(1<<20))
	if want := 8 << 20; grown > int64(want) {
		t.Errorf("the heap grew by %.1f MiB, want at most %d MiB", float64(grown)/(1<<20), want>>20)
	}
}
