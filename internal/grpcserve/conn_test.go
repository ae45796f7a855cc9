package grpcserve_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	testpb "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/protobuf/proto"

	"github.com/hotkeyd/hotkey/internal/grpcserve"
)

// rawConn is an HTTP/2 client that writes what a test says, frame by
// frame or byte by byte.
type rawConn struct {
	t  testing.TB
	nc net.Conn
	fr *http2.Framer
	hb bytes.Buffer
	he *hpack.Encoder
}

// dialRaw connects to addr and sends the client preface and SETTINGS.
func dialRaw(t testing.TB, addr string) *rawConn {
	t.Helper()
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	nc.SetDeadline(time.Now().Add(time.Minute)) // only catches a hang
	c := &rawConn{t: t, nc: nc, fr: http2.NewFramer(nc, nc)}
	c.fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	c.he = hpack.NewEncoder(&c.hb)
	io.WriteString(nc, http2.ClientPreface)
	c.fr.WriteSettings()
	return c
}

// headers sends a call's HEADERS on stream id: POST path, gRPC, with the
// extra fields (name, value pairs) after.
func (c *rawConn) headers(id uint32, path string, end bool, extra ...string) {
	c.hb.Reset()
	fields := append([]string{":method", "POST", ":scheme", "http", ":path", path, ":authority", "x", "content-type", "application/grpc"}, extra...)
	for i := 0; i < len(fields); i += 2 {
		c.he.WriteField(hpack.HeaderField{Name: fields[i], Value: fields[i+1]})
	}
	if err := c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: c.hb.Bytes(), EndHeaders: true, EndStream: end}); err != nil {
		c.t.Fatal(err)
	}
}

// message sends m with its prefix as one DATA frame ending stream id.
func (c *rawConn) message(id uint32, m proto.Message) {
	b, err := proto.Marshal(m)
	if err != nil {
		c.t.Fatal(err)
	}
	if err := c.fr.WriteData(id, true, grpcFrame(b)); err != nil {
		c.t.Fatal(err)
	}
}

func grpcFrame(b []byte) []byte {
	return append(binary.BigEndian.AppendUint32([]byte{0}, uint32(len(b))), b...)
}

// answer reads frames until stream id ends, and returns its fields, the
// header blocks' in order, or the RST_STREAM code. It fails the test if
// the connection closes first.
func (c *rawConn) answer(id uint32) (fields map[string]string, rst http2.ErrCode) {
	c.t.Helper()
	fields = map[string]string{}
	for {
		f, err := c.fr.ReadFrame()
		if err != nil {
			c.t.Fatalf("reading stream %d's answer: %v", id, err)
		}
		if f.Header().StreamID != id {
			continue
		}
		switch f := f.(type) {
		case *http2.MetaHeadersFrame:
			for _, hf := range f.Fields {
				fields[hf.Name] = hf.Value
			}
			if f.StreamEnded() {
				return fields, 0
			}
		case *http2.RSTStreamFrame:
			return fields, f.ErrCode
		case *http2.DataFrame:
			if f.StreamEnded() {
				return fields, 0
			}
		}
	}
}

// goAway reads frames until a GOAWAY, then until the connection closes,
// and returns the GOAWAY's code; -1 if there was none.
func (c *rawConn) goAway() http2.ErrCode {
	code := http2.ErrCode(1<<32 - 1)
	for {
		f, err := c.fr.ReadFrame()
		if err != nil {
			if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) && code == 1<<32-1 {
				var ne *net.OpError
				if !errors.As(err, &ne) {
					c.t.Errorf("reading to the GOAWAY: %v", err)
				}
			}
			return code
		}
		if g, ok := f.(*http2.GoAwayFrame); ok {
			code = g.ErrCode
		}
	}
}

// TestRawAnswers: what a call that cannot be made is answered.
func TestRawAnswers(t *testing.T) {
	s := serve(t, grpcserve.Config{})
	c := dialRaw(t, s.addr)
	cases := []struct {
		extra      []string
		path       string
		wantStatus string
		wantGRPC   string
	}{
		{extra: []string{"content-type", "text/plain"}, wantStatus: "415", wantGRPC: "3"},
		{extra: []string{":method", "GET"}, wantStatus: "405", wantGRPC: "13"},
		{path: "/grpc.testing.TestService/Nope", wantStatus: "200", wantGRPC: "12"},
		{extra: []string{"grpc-encoding", "gzip"}, wantStatus: "200", wantGRPC: "12"},
		{extra: []string{"grpc-timeout", "soon"}, wantStatus: "400", wantGRPC: "13"},
	}
	for i, tc := range cases {
		id := uint32(2*i + 1)
		c.hb.Reset()
		path := tc.path
		if path == "" {
			path = testgrpc.TestService_UnaryCall_FullMethodName
		}
		fields := map[string]string{":method": "POST", ":scheme": "http", ":path": path, ":authority": "x", "content-type": "application/grpc"}
		for j := 0; j < len(tc.extra); j += 2 {
			fields[tc.extra[j]] = tc.extra[j+1]
		}
		for _, name := range []string{":method", ":scheme", ":path", ":authority", "content-type", "grpc-encoding", "grpc-timeout"} {
			if v, ok := fields[name]; ok {
				c.he.WriteField(hpack.HeaderField{Name: name, Value: v})
			}
		}
		c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: c.hb.Bytes(), EndHeaders: true, EndStream: true})
		got, rst := c.answer(id)
		if rst != 0 || got[":status"] != tc.wantStatus || got["grpc-status"] != tc.wantGRPC {
			t.Errorf("%q: :status %s, grpc-status %s (%q), RST %v; want %s, %s", tc.extra, got[":status"], got["grpc-status"], got["grpc-message"], rst, tc.wantStatus, tc.wantGRPC)
		}
	}
}

// TestRawDeadline: a call whose grpc-timeout passes is answered
// DEADLINE_EXCEEDED by the server, and its handler's context ends with
// context.DeadlineExceeded.
func TestRawDeadline(t *testing.T) {
	s := serve(t, grpcserve.Config{})
	c := dialRaw(t, s.addr)
	c.headers(1, testgrpc.TestService_UnaryCall_FullMethodName, false, "grpc-timeout", "20m")
	c.message(1, &testpb.SimpleRequest{Payload: &testpb.Payload{Body: []byte("wait")}})
	got, rst := c.answer(1)
	if rst != 0 || got["grpc-status"] != "4" {
		t.Errorf("grpc-status %s (%q), RST %v; want 4", got["grpc-status"], got["grpc-message"], rst)
	}
	if err := waitFor(t, s.ts.ended); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("the handler's context ended with %v, want DeadlineExceeded", err)
	}
}

// TestRawTruncated: a request whose message ends short at END_STREAM is
// answered INTERNAL, one over the limit RESOURCE_EXHAUSTED, and a client's
// RST_STREAM ends its call.
func TestRawTruncated(t *testing.T) {
	s := serve(t, grpcserve.Config{MaxRecvMsgSize: 1000})
	c := dialRaw(t, s.addr)
	c.headers(1, testgrpc.TestService_UnaryCall_FullMethodName, false)
	c.fr.WriteData(1, true, []byte{0, 0, 0, 0, 10, 1, 2, 3})
	if got, _ := c.answer(1); got["grpc-status"] != "13" {
		t.Errorf("truncated: grpc-status %s (%q), want 13", got["grpc-status"], got["grpc-message"])
	}
	c.headers(3, testgrpc.TestService_UnaryCall_FullMethodName, false)
	c.fr.WriteData(3, false, []byte{0, 0, 0, 4, 0})
	if got, _ := c.answer(3); got["grpc-status"] != "8" {
		t.Errorf("over the limit: grpc-status %s (%q), want 8", got["grpc-status"], got["grpc-message"])
	}
	c.headers(5, testgrpc.TestService_UnaryCall_FullMethodName, false)
	c.fr.WriteData(5, true, []byte{1, 0, 0, 0, 0})
	if got, _ := c.answer(5); got["grpc-status"] != "13" {
		t.Errorf("compressed: grpc-status %s (%q), want 13", got["grpc-status"], got["grpc-message"])
	}
	c.headers(7, testgrpc.TestService_UnaryCall_FullMethodName, false)
	c.message(7, &testpb.SimpleRequest{Payload: &testpb.Payload{Body: []byte("wait")}})
	waitFor(t, s.ts.started)
	c.fr.WriteRSTStream(7, http2.ErrCodeCancel)
	if err := waitFor(t, s.ts.ended); !errors.Is(err, context.Canceled) {
		t.Errorf("reset: the handler's context ended with %v, want Canceled", err)
	}
}

// TestRawFlowControl: the server sends no more than the client's stream
// window, which SETTINGS shrink and WINDOW_UPDATEs grow, and answers
// PING.
func TestRawFlowControl(t *testing.T) {
	s := serve(t, grpcserve.Config{})
	c := dialRaw(t, s.addr)
	c.fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 1000})
	c.headers(1, testgrpc.TestService_UnaryCall_FullMethodName, false)
	c.message(1, &testpb.SimpleRequest{ResponseSize: 5000})
	c.fr.WritePing(false, [8]byte{1, 2, 3})
	got, pinged := 0, false
	for got < 1000 || !pinged {
		f, err := c.fr.ReadFrame()
		if err != nil {
			t.Fatal(err)
		}
		switch f := f.(type) {
		case *http2.DataFrame:
			got += len(f.Data())
		case *http2.PingFrame:
			pinged = f.IsAck() && f.Data == [8]byte{1, 2, 3}
		}
	}
	if got != 1000 {
		t.Fatalf("%d bytes sent in a window of 1000", got)
	}
	c.fr.WritePing(false, [8]byte{4})
	for {
		f, err := c.fr.ReadFrame()
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := f.(*http2.DataFrame); ok {
			t.Fatal("DATA past the window")
		}
		if p, ok := f.(*http2.PingFrame); ok && p.IsAck() && p.Data == [8]byte{4} {
			break
		}
	}
	// SETTINGS grow the open stream's window by 2000: 2000 bytes more
	// come, then none until the WINDOW_UPDATE.
	c.fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 3000})
	c.fr.WritePing(false, [8]byte{5})
	more := 0
	for more < 2000 {
		f, err := c.fr.ReadFrame()
		if err != nil {
			t.Fatal(err)
		}
		if d, ok := f.(*http2.DataFrame); ok {
			more += len(d.Data())
		}
	}
	c.fr.WritePing(false, [8]byte{6})
	for {
		f, err := c.fr.ReadFrame()
		if err != nil {
			t.Fatal(err)
		}
		if d, ok := f.(*http2.DataFrame); ok {
			more += len(d.Data())
		}
		if p, ok := f.(*http2.PingFrame); ok && p.IsAck() && p.Data == [8]byte{6} {
			break
		}
	}
	if more != 2000 {
		t.Fatalf("%d bytes sent after SETTINGS grew the window by 2000", more)
	}
	got += more
	c.fr.WriteWindowUpdate(1, 10000)
	for {
		f, err := c.fr.ReadFrame()
		if err != nil {
			t.Fatal(err)
		}
		if d, ok := f.(*http2.DataFrame); ok {
			got += len(d.Data())
		}
		if h, ok := f.(*http2.MetaHeadersFrame); ok && h.StreamEnded() {
			break
		}
	}
	if want := 5 + proto.Size(&testpb.SimpleResponse{Payload: &testpb.Payload{Body: make([]byte, 5000)}}); got != want {
		t.Errorf("%d bytes of answer, want %d", got, want)
	}
}

// TestRawGarbage: bytes that are not HTTP/2 frames after the preface, or
// frames that break the protocol, are answered with a GOAWAY and the
// connection closed.
func TestRawGarbage(t *testing.T) {
	s := serve(t, grpcserve.Config{})
	cases := map[string]func(c *rawConn){
		"garbage":         func(c *rawConn) { c.nc.Write(bytes.Repeat([]byte{0xff}, 100)) },
		"even stream":     func(c *rawConn) { c.headers(2, testgrpc.TestService_UnaryCall_FullMethodName, true) },
		"data on idle":    func(c *rawConn) { c.fr.WriteData(9, true, []byte{0, 0, 0, 0, 0}) },
		"stream id down":  func(c *rawConn) { c.headers(5, "/x/y", true); c.headers(3, "/x/y", true) },
		"window overflow": func(c *rawConn) { c.fr.WriteWindowUpdate(0, 1<<31-1) },
		"bad hpack": func(c *rawConn) {
			c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: []byte{0xff, 0xff, 0xff}, EndHeaders: true})
		},
		"frame too large":   func(c *rawConn) { c.fr.WriteData(1, false, make([]byte, 20000)) },
		"lone continuation": func(c *rawConn) { c.fr.WriteContinuation(1, true, []byte{0x82}) },
	}
	for name, write := range cases {
		c := dialRaw(t, s.addr)
		write(c)
		if code := c.goAway(); code == 0 || code == 1<<32-1 {
			t.Errorf("%s: GOAWAY %v, want an error's", name, code)
		}
	}
	if _, err := testgrpc.NewTestServiceClient(grpcClient(t, s.addr)).UnaryCall(testCtx(t), &testpb.SimpleRequest{}); err != nil {
		t.Errorf("after the garbage: %v", err)
	}
}

// fuzzSeeds are frames a client sends: calls, whole and not, and the
// connection's own frames.
func fuzzSeeds(t testing.TB) [][]byte {
	var seeds [][]byte
	frames := func(write func(fr *http2.Framer, he *hpack.Encoder, hb *bytes.Buffer)) {
		var b, hb bytes.Buffer
		write(http2.NewFramer(&b, nil), hpack.NewEncoder(&hb), &hb)
		seeds = append(seeds, b.Bytes())
	}
	call := func(fr *http2.Framer, he *hpack.Encoder, hb *bytes.Buffer, id uint32, body string) {
		hb.Reset()
		for _, f := range [][2]string{{":method", "POST"}, {":scheme", "http"}, {":path", testgrpc.TestService_UnaryCall_FullMethodName}, {":authority", "x"}, {"content-type", "application/grpc"}, {"grpc-timeout", "1S"}} {
			he.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
		}
		block := hb.Bytes()
		fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: block[:3], EndHeaders: false})
		fr.WriteContinuation(id, true, block[3:])
		m, _ := proto.Marshal(&testpb.SimpleRequest{ResponseSize: 10, Payload: &testpb.Payload{Body: []byte(body)}})
		fr.WriteData(id, true, grpcFrame(m))
	}
	frames(func(fr *http2.Framer, he *hpack.Encoder, hb *bytes.Buffer) { call(fr, he, hb, 1, "") })
	frames(func(fr *http2.Framer, he *hpack.Encoder, hb *bytes.Buffer) {
		call(fr, he, hb, 1, "wait")
		fr.WriteRSTStream(1, http2.ErrCodeCancel)
		call(fr, he, hb, 3, "")
	})
	frames(func(fr *http2.Framer, he *hpack.Encoder, hb *bytes.Buffer) {
		fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 1}, http2.Setting{ID: http2.SettingMaxFrameSize, Val: 1 << 14})
		fr.WritePing(false, [8]byte{1})
		fr.WriteWindowUpdate(0, 100)
		call(fr, he, hb, 1, "")
		fr.WriteWindowUpdate(1, 100)
		fr.WriteSettingsAck()
		fr.WriteGoAway(0, http2.ErrCodeNo, nil)
	})
	frames(func(fr *http2.Framer, he *hpack.Encoder, hb *bytes.Buffer) {
		hb.Reset()
		he.WriteField(hpack.HeaderField{Name: ":path", Value: "/grpc.health.v1.Health/Watch"})
		fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: hb.Bytes(), EndHeaders: true})
		fr.WriteData(1, false, []byte{0, 0, 0, 0})
		fr.WritePriority(1, http2.PriorityParam{Weight: 3})
	})
	return seeds
}

// FuzzConn: no bytes after the preface make the server panic, hang or
// keep the connection open once the client has closed its side.
func FuzzConn(f *testing.F) {
	for _, s := range fuzzSeeds(f) {
		f.Add(s)
	}
	s := serve(f, grpcserve.Config{MaxRecvMsgSize: 1 << 16})
	f.Fuzz(func(t *testing.T, data []byte) {
		nc, err := net.Dial("tcp", s.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		nc.SetDeadline(time.Now().Add(time.Minute)) // only catches a hang
		go func() {
			nc.Write(append([]byte(http2.ClientPreface+"\x00\x00\x00\x04\x00\x00\x00\x00\x00"), data...))
			nc.(*net.TCPConn).CloseWrite()
		}()
		if _, err := io.Copy(io.Discard, nc); err != nil && !errors.Is(err, net.ErrClosed) {
			var ne *net.OpError
			if !errors.As(err, &ne) || ne.Timeout() {
				t.Fatalf("reading to the connection's end: %v", err)
			}
		}
	})
}

// TestRawHeaderLimits: a header list over the limit (of fields each under
// it: a longer one breaks the HPACK decoding, and the connection), or
// with a response's pseudo-header, resets its stream only; a header block split over
// CONTINUATIONs is read whole, and the HPACK table stays in step.
func TestRawHeaderLimits(t *testing.T) {
	s := serve(t, grpcserve.Config{MaxHeaderListSize: 1000})
	c := dialRaw(t, s.addr)
	big := string(make([]byte, 400))
	c.headers(1, testgrpc.TestService_UnaryCall_FullMethodName, true, "x-a", big, "x-b", big, "x-c", big)
	if _, rst := c.answer(1); rst != http2.ErrCodeFrameSize {
		t.Errorf("header list over the limit: RST %v, want FRAME_SIZE_ERROR", rst)
	}
	c.headers(3, testgrpc.TestService_UnaryCall_FullMethodName, true, ":status", "200")
	if _, rst := c.answer(3); rst != http2.ErrCodeProtocol {
		t.Errorf(":status in a request: RST %v, want PROTOCOL_ERROR", rst)
	}
	c.hb.Reset()
	for _, f := range [][2]string{{":method", "POST"}, {":scheme", "http"}, {":path", testgrpc.TestService_UnaryCall_FullMethodName}, {":authority", "x"}, {"content-type", "application/grpc"}} {
		c.he.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
	}
	block := c.hb.Bytes()
	c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 5, BlockFragment: block[:2]})
	c.fr.WriteContinuation(5, false, block[2:5])
	c.fr.WriteContinuation(5, true, block[5:])
	c.message(5, &testpb.SimpleRequest{ResponseSize: 3})
	if got, rst := c.answer(5); rst != 0 || got["grpc-status"] != "0" {
		t.Errorf("a call over CONTINUATIONs: grpc-status %s (%q), RST %v; want 0", got["grpc-status"], got["grpc-message"], rst)
	}
}

// TestRawStreamCap: a stream over SETTINGS_MAX_CONCURRENT_STREAMS is
// refused with REFUSED_STREAM, and a client that closes its connection
// cancels its calls.
func TestRawStreamCap(t *testing.T) {
	s := serve(t, grpcserve.Config{MaxConcurrentStreams: 1})
	c := dialRaw(t, s.addr)
	c.headers(1, testgrpc.TestService_UnaryCall_FullMethodName, false)
	c.message(1, &testpb.SimpleRequest{Payload: &testpb.Payload{Body: []byte("wait")}})
	waitFor(t, s.ts.started)
	c.headers(3, testgrpc.TestService_UnaryCall_FullMethodName, true)
	if _, rst := c.answer(3); rst != http2.ErrCodeRefusedStream {
		t.Errorf("a second stream of 1: RST %v, want REFUSED_STREAM", rst)
	}
	c.nc.Close()
	if err := waitFor(t, s.ts.ended); !errors.Is(err, context.Canceled) {
		t.Errorf("the handler's context ended with %v, want Canceled", err)
	}
}

// TestRawResetHandlers: a call reset while its handler runs still counts
// against the stream cap until the handler returns, so that a client that
// resets its calls cannot have more handlers run than the cap.
func TestRawResetHandlers(t *testing.T) {
	s := serve(t, grpcserve.Config{MaxConcurrentStreams: 1})
	c := dialRaw(t, s.addr)
	c.headers(1, testgrpc.TestService_UnaryCall_FullMethodName, false)
	c.message(1, &testpb.SimpleRequest{Payload: &testpb.Payload{Body: []byte("stubborn")}})
	waitFor(t, s.ts.started)
	c.fr.WriteRSTStream(1, http2.ErrCodeCancel)
	c.headers(3, testgrpc.TestService_UnaryCall_FullMethodName, false)
	c.message(3, &testpb.SimpleRequest{})
	if _, rst := c.answer(3); rst != http2.ErrCodeRefusedStream {
		t.Errorf("a call while a reset call's handler runs: RST %v, want REFUSED_STREAM", rst)
	}
	close(s.ts.release)
	for id := uint32(5); ; id += 2 {
		c.headers(id, testgrpc.TestService_UnaryCall_FullMethodName, false)
		c.message(id, &testpb.SimpleRequest{})
		got, rst := c.answer(id)
		if rst == http2.ErrCodeRefusedStream {
			continue // the handler has not returned yet
		}
		if rst != 0 || got["grpc-status"] != "0" {
			t.Errorf("a call once the handler returned: grpc-status %s, RST %v; want 0", got["grpc-status"], rst)
		}
		break
	}
}

// TestRawDrainWhileOpening: a GOAWAY queued while the reader has taken a
// call's stream ID, and not yet opened its stream, counts the call in its
// last stream ID; the connection stays open until the call is answered,
// so the client, which will not retry it, is not left with EOF.
func TestRawDrainWhileOpening(t *testing.T) {
	var s *served
	var once sync.Once
	t.Cleanup(grpcserve.SetOpeningHook(func() { once.Do(func() { grpcserve.DrainAll(s.srv) }) }))
	s = serve(t, grpcserve.Config{})
	c := dialRaw(t, s.addr)
	c.headers(1, testgrpc.TestService_UnaryCall_FullMethodName, false)
	c.message(1, &testpb.SimpleRequest{})
	fields, rst := c.answer(1)
	if rst != 0 || fields["grpc-status"] != "0" {
		t.Fatalf("stream 1: fields %v, reset %v; want grpc-status 0", fields, rst)
	}
	c.goAway() // the GOAWAY came before the answer; then the connection closes
}
