package grpcserve_test

import (
	"bytes"
	"io"
	"net"
	"runtime"
	"slices"
	"strconv"
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

// outcome reads frames until stream next ends or the connection does,
// and returns the first RST_STREAM code of stream probe (0: none), the GOAWAY
// code (-1: none) and next's grpc-status ("": not answered).
func (c *rawConn) outcome(probe, next uint32) (rst http2.ErrCode, goAway int64, grpcStatus string) {
	goAway = -1
	for {
		f, err := c.fr.ReadFrame()
		if err != nil {
			return
		}
		switch f := f.(type) {
		case *http2.GoAwayFrame:
			goAway = int64(f.ErrCode)
		case *http2.RSTStreamFrame:
			if f.StreamID == probe {
				if rst == 0 {
					rst = f.ErrCode
				}
			} else if f.StreamID == next && grpcStatus == "" {
				grpcStatus = "RST " + f.ErrCode.String()
				return
			}
		case *http2.MetaHeadersFrame:
			for _, hf := range f.Fields {
				if hf.Name == "grpc-status" && f.StreamID == next {
					grpcStatus = hf.Value
				}
			}
			if f.StreamID == next && f.StreamEnded() {
				return
			}
		}
	}
}

// fieldsBlock HPACK-encodes name, value pairs, in order, with a fresh
// table.
func fieldsBlock(fields ...string) []byte {
	var hb bytes.Buffer
	he := hpack.NewEncoder(&hb)
	for i := 0; i < len(fields); i += 2 {
		he.WriteField(hpack.HeaderField{Name: fields[i], Value: fields[i+1]})
	}
	return hb.Bytes()
}

// TestRawConformance: how the server answers frames RFC 9113 says are a
// stream's error, the connection's, or to be ignored; after a stream's
// error the connection serves a call.
func TestRawConformance(t *testing.T) {
	s := serve(t, grpcserve.Config{})
	call := testgrpc.TestService_UnaryCall_FullMethodName
	req, _ := proto.Marshal(&testpb.SimpleRequest{ResponseSize: 1})
	good := []string{":method", "POST", ":scheme", "http", ":path", call, ":authority", "x", "content-type", "application/grpc"}
	const none, ok = -1, "0"
	cases := []struct {
		name       string
		write      func(c *rawConn)
		wantRST    http2.ErrCode
		wantGoAway int64
		wantNext   string
	}{
		{"window update 0 on a stream", func(c *rawConn) { c.headers(1, call, false); c.fr.WriteWindowUpdate(1, 0) }, http2.ErrCodeProtocol, none, ok},
		{"window update 0 on the connection", func(c *rawConn) { c.fr.WriteWindowUpdate(0, 0) }, 0, int64(http2.ErrCodeProtocol), ""},
		{"stream window overflow", func(c *rawConn) { c.headers(1, call, false); c.fr.WriteWindowUpdate(1, 1<<31-1) }, http2.ErrCodeFlowControl, none, ok},
		{"initial window over 2^31-1", func(c *rawConn) {
			c.fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 1 << 31})
		}, 0, int64(http2.ErrCodeFlowControl), ""},
		{"max frame size under 16384", func(c *rawConn) {
			c.fr.WriteSettings(http2.Setting{ID: http2.SettingMaxFrameSize, Val: 16383})
		}, 0, int64(http2.ErrCodeProtocol), ""},
		{"max frame size over 2^24-1", func(c *rawConn) {
			c.fr.WriteSettings(http2.Setting{ID: http2.SettingMaxFrameSize, Val: 1 << 24})
		}, 0, int64(http2.ErrCodeProtocol), ""},
		{"SETTINGS of 100 parameters", func(c *rawConn) { c.fr.WriteSettings(windowSettings(100)...) }, 0, none, ok},
		{"SETTINGS of 101 parameters", func(c *rawConn) { c.fr.WriteSettings(windowSettings(101)...) }, 0, int64(http2.ErrCodeProtocol), ""},
		{"initial window given twice: the last applies", func(c *rawConn) {
			c.headers(1, call, false)
			c.fr.WriteWindowUpdate(1, 1)
			c.fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 1<<31 - 1}, http2.Setting{ID: http2.SettingInitialWindowSize, Val: 65535})
		}, 0, none, ok},
		{"enable push 2", func(c *rawConn) { c.fr.WriteSettings(http2.Setting{ID: http2.SettingEnablePush, Val: 2}) }, 0, int64(http2.ErrCodeProtocol), ""},
		{"push promise", func(c *rawConn) {
			c.headers(1, call, false)
			c.fr.WritePushPromise(http2.PushPromiseParam{StreamID: 1, PromiseID: 2, BlockFragment: fieldsBlock(good...), EndHeaders: true})
		}, 0, int64(http2.ErrCodeProtocol), ""},
		{"headers on stream 0", func(c *rawConn) {
			c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 0, BlockFragment: fieldsBlock(good...), EndHeaders: true})
		}, 0, int64(http2.ErrCodeProtocol), ""},
		{"ping inside a header block", func(c *rawConn) {
			c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: fieldsBlock(good...)[:2]})
			c.fr.WritePing(false, [8]byte{})
		}, 0, int64(http2.ErrCodeProtocol), ""},
		{"HEADERS padding over its length", func(c *rawConn) {
			c.fr.WriteRawFrame(http2.FrameHeaders, http2.FlagHeadersPadded|http2.FlagHeadersEndHeaders, 1, []byte{200, 0x82})
		}, 0, int64(http2.ErrCodeProtocol), ""},
		{"HEADERS padding over its length, block continued", func(c *rawConn) {
			c.headers(1, call, false)
			c.fr.WriteRawFrame(http2.FrameHeaders, http2.FlagHeadersPadded, 5, []byte{200, 0x82})
			c.fr.WriteContinuation(5, true, fieldsBlock(good...))
		}, 0, int64(http2.ErrCodeProtocol), ""},
		{"unknown frame types", func(c *rawConn) {
			c.fr.WriteRawFrame(0xfa, 0, 0, []byte{1, 2, 3})
			c.fr.WriteRawFrame(0xfb, 0xff, 1, nil)
		}, 0, none, ok},
		{"priority on an idle stream", func(c *rawConn) { c.fr.WritePriority(7, http2.PriorityParam{StreamDep: 1, Weight: 9}) }, 0, none, ok},
		{"priority depending on itself", func(c *rawConn) { c.fr.WritePriority(1, http2.PriorityParam{StreamDep: 1, Weight: 9}) }, http2.ErrCodeProtocol, none, ok},
		{"headers depending on themselves", func(c *rawConn) {
			c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: fieldsBlock(good...), EndHeaders: true, EndStream: true, Priority: http2.PriorityParam{StreamDep: 1, Weight: 9}})
		}, http2.ErrCodeProtocol, none, ok},
		{"headers depending on another", func(c *rawConn) {
			c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: fieldsBlock(good...), EndHeaders: true, Priority: http2.PriorityParam{StreamDep: 7, Weight: 9}})
			c.fr.WriteData(1, true, grpcFrame(req))
		}, 0, none, ok},
		{"uppercase field name", func(c *rawConn) { c.headers(1, call, true, "X-Up", "1") }, http2.ErrCodeProtocol, none, ok},
		{"connection field", func(c *rawConn) { c.headers(1, call, true, "connection", "close") }, http2.ErrCodeProtocol, none, ok},
		{"a field name with a space", func(c *rawConn) { c.headers(1, call, true, "x up", "1") }, http2.ErrCodeProtocol, none, ok},
		{"a field name with a colon", func(c *rawConn) { c.headers(1, call, true, "x:up", "1") }, http2.ErrCodeProtocol, none, ok},
		{"an empty field name", func(c *rawConn) { c.headers(1, call, true, "", "1") }, http2.ErrCodeProtocol, none, ok},
		{"a field name not ASCII", func(c *rawConn) { c.headers(1, call, true, "x-\xe9", "1") }, http2.ErrCodeProtocol, none, ok},
		{"CR in a value", func(c *rawConn) { c.headers(1, call, true, "x-a", "a\rb") }, http2.ErrCodeProtocol, none, ok},
		{"LF in a value", func(c *rawConn) { c.headers(1, call, true, "x-a", "a\nb") }, http2.ErrCodeProtocol, none, ok},
		{"NUL in a value", func(c *rawConn) { c.headers(1, call, true, "x-a", "a\x00b") }, http2.ErrCodeProtocol, none, ok},
		{"CR in :path", func(c *rawConn) { c.headers(1, call+"\r", true) }, http2.ErrCodeProtocol, none, ok},
		{"te other than trailers", func(c *rawConn) { c.headers(1, call, true, "te", "gzip") }, http2.ErrCodeProtocol, none, ok},
		{"te trailers", func(c *rawConn) {
			c.headers(1, call, false, "te", "trailers")
			c.fr.WriteData(1, true, grpcFrame(req))
		}, 0, none, ok},
		{"content-length the DATA matches", func(c *rawConn) {
			c.headers(1, call, false, "content-length", strconv.Itoa(len(grpcFrame(req))))
			c.fr.WriteData(1, false, grpcFrame(req)[:3])
			c.fr.WriteDataPadded(1, true, grpcFrame(req)[3:], make([]byte, 7))
		}, 0, none, ok},
		{"content-length over the DATA", func(c *rawConn) {
			c.headers(1, call, false, "content-length", strconv.Itoa(len(grpcFrame(req))+1))
			c.fr.WriteData(1, true, grpcFrame(req))
		}, http2.ErrCodeProtocol, none, ok},
		{"content-length under the DATA", func(c *rawConn) {
			c.headers(1, call, false, "content-length", strconv.Itoa(len(grpcFrame(req))-1))
			c.fr.WriteData(1, true, grpcFrame(req))
		}, http2.ErrCodeProtocol, none, ok},
		{"content-length over the sum of DATA frames", func(c *rawConn) {
			c.headers(1, call, false, "content-length", strconv.Itoa(len(grpcFrame(req))+1))
			c.fr.WriteData(1, false, grpcFrame(req)[:3])
			c.fr.WriteData(1, true, grpcFrame(req)[3:])
		}, http2.ErrCodeProtocol, none, ok},
		{"content-length and no DATA", func(c *rawConn) { c.headers(1, call, true, "content-length", "1") }, http2.ErrCodeProtocol, none, ok},
		{"content-length not a number", func(c *rawConn) { c.headers(1, call, true, "content-length", "-0") }, http2.ErrCodeProtocol, none, ok},
		{"content-length twice", func(c *rawConn) {
			c.headers(1, call, false, "content-length", strconv.Itoa(len(grpcFrame(req))), "content-length", strconv.Itoa(len(grpcFrame(req))))
			c.fr.WriteData(1, true, grpcFrame(req))
		}, http2.ErrCodeProtocol, none, ok},
		{"pseudo-header after a regular one", func(c *rawConn) {
			c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: fieldsBlock(append(good[2:], good[:2]...)...), EndHeaders: true, EndStream: true})
		}, http2.ErrCodeProtocol, none, ok},
		{"no :scheme", func(c *rawConn) {
			c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: fieldsBlock(append(good[:2:2], good[4:]...)...), EndHeaders: true, EndStream: true})
		}, http2.ErrCodeProtocol, none, ok},
		{"no :path", func(c *rawConn) {
			c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: fieldsBlock(append(good[:4:4], good[6:]...)...), EndHeaders: true, EndStream: true})
		}, http2.ErrCodeProtocol, none, ok},
		{"client trailers", func(c *rawConn) {
			c.headers(1, call, false)
			c.fr.WriteData(1, false, grpcFrame(req))
			c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: fieldsBlock("x-trailer", "1"), EndHeaders: true, EndStream: true})
		}, 0, none, ok},
		{"client trailers with LF in a value", func(c *rawConn) {
			c.headers(1, call, false)
			c.fr.WriteData(1, false, grpcFrame(req))
			c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: fieldsBlock("x-trailer", "1\n"), EndHeaders: true, EndStream: true})
		}, http2.ErrCodeProtocol, none, ok},
		{"second headers without END_STREAM", func(c *rawConn) {
			c.headers(1, call, false)
			c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: fieldsBlock("x-more", "1"), EndHeaders: true})
		}, http2.ErrCodeProtocol, none, ok},
		{"DATA on a reset stream", func(c *rawConn) {
			c.headers(1, call, false)
			c.fr.WriteRSTStream(1, http2.ErrCodeCancel)
			for range 20 << 20 / 16384 { // over the connection's window
				c.fr.WriteData(1, false, make([]byte, 16384))
			}
		}, http2.ErrCodeStreamClosed, none, ok},
		{"DATA on a stream the client ended, once answered", func(c *rawConn) {
			c.headers(1, call, false)
			c.fr.WriteData(1, true, grpcFrame(req))
			c.answer(1)
			c.fr.WriteData(1, true, []byte{0})
		}, http2.ErrCodeStreamClosed, none, ok},
	}
	for _, tc := range cases {
		c := dialRaw(t, s.addr)
		c.fr.AllowIllegalWrites = true
		tc.write(c)
		c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 3, BlockFragment: fieldsBlock(good...), EndHeaders: true})
		c.fr.WriteData(3, true, grpcFrame(req))
		rst, goAway, next := c.outcome(1, 3)
		if rst != tc.wantRST || goAway != tc.wantGoAway || next != tc.wantNext {
			t.Errorf("%s: RST %v, GOAWAY %d, next call %q; want RST %v, GOAWAY %d, next %q", tc.name, rst, goAway, next, tc.wantRST, tc.wantGoAway, tc.wantNext)
		}
		c.nc.Close()
	}
}

// windowSettings returns n SETTINGS_INITIAL_WINDOW_SIZE parameters of
// the default value.
func windowSettings(n int) []http2.Setting {
	s := make([]http2.Setting, n)
	for i := range s {
		s[i] = http2.Setting{ID: http2.SettingInitialWindowSize, Val: 65535}
	}
	return s
}

// dataUntilPing sends PING v, and another once the first's ACK came
// (the writer writes ACKs before DATA of the same round), and returns the
// bytes of DATA read until the second's ACK.
func (c *rawConn) dataUntilPing(v byte) int {
	c.t.Helper()
	c.fr.WritePing(false, [8]byte{v, 1})
	n := 0
	for {
		f, err := c.fr.ReadFrame()
		if err != nil {
			c.t.Fatalf("waiting for PING %d's ACK: %v", v, err)
		}
		switch f := f.(type) {
		case *http2.DataFrame:
			n += len(f.Data())
		case *http2.PingFrame:
			if f.IsAck() && f.Data == [8]byte{v, 1} {
				c.fr.WritePing(false, [8]byte{v, 2})
			}
			if f.IsAck() && f.Data == [8]byte{v, 2} {
				return n
			}
		}
	}
}

// TestRawNegativeWindow: SETTINGS that shrink a stream's window below
// what was sent make it negative; the server sends nothing until
// WINDOW_UPDATEs make it positive, then no more than it.
func TestRawNegativeWindow(t *testing.T) {
	s := serve(t, grpcserve.Config{})
	c := dialRaw(t, s.addr)
	c.fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 100})
	c.headers(1, testgrpc.TestService_UnaryCall_FullMethodName, false)
	c.message(1, &testpb.SimpleRequest{ResponseSize: 5000})
	got := 0
	for got < 100 {
		f, err := c.fr.ReadFrame()
		if err != nil {
			t.Fatal(err)
		}
		if d, ok := f.(*http2.DataFrame); ok {
			got += len(d.Data())
		}
	}
	steps := []struct {
		write func()
		want  int
	}{
		{func() {}, 0},
		{func() { c.fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 0}) }, 0}, // -100
		{func() { c.fr.WriteWindowUpdate(1, 50) }, 0},                                                 // -50
		{func() { c.fr.WriteWindowUpdate(1, 1000) }, 950},
		{func() { c.fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 40}) }, 40},
	}
	for i, st := range steps {
		st.write()
		if n := c.dataUntilPing(byte(10 + i)); n != st.want {
			t.Errorf("step %d: %d bytes sent, want %d", i, n, st.want)
		}
	}
}

// TestRawMessages: a unary call's request of two messages is answered
// INTERNAL, as grpc-go answers it; one of zero bytes is a message, and an
// empty DATA ending the stream after it is no second one.
func TestRawMessages(t *testing.T) {
	s := serve(t, grpcserve.Config{})
	c := dialRaw(t, s.addr)
	call := testgrpc.TestService_UnaryCall_FullMethodName
	m, _ := proto.Marshal(&testpb.SimpleRequest{ResponseSize: 1})
	cases := []struct {
		name  string
		write func(id uint32)
		want  string
	}{
		{"two messages in one DATA", func(id uint32) { c.fr.WriteData(id, true, append(grpcFrame(m), grpcFrame(m)...)) }, "13"},
		{"two messages in two DATA", func(id uint32) { c.fr.WriteData(id, false, grpcFrame(m)); c.fr.WriteData(id, true, grpcFrame(nil)) }, "13"},
		{"zero-length message", func(id uint32) { c.fr.WriteData(id, true, grpcFrame(nil)) }, "0"},
		{"empty DATA after", func(id uint32) { c.fr.WriteData(id, false, grpcFrame(m)); c.fr.WriteData(id, true, nil) }, "0"},
		{"message in 1-byte DATA", func(id uint32) {
			b := grpcFrame(m)
			for i := range b {
				c.fr.WriteData(id, i == len(b)-1, b[i:i+1])
			}
		}, "0"},
	}
	for i, tc := range cases {
		id := uint32(2*i + 1)
		c.headers(id, call, false)
		tc.write(id)
		if got, rst := c.answer(id); rst != 0 || got["grpc-status"] != tc.want {
			t.Errorf("%s: grpc-status %s (%q), RST %v; want %s", tc.name, got["grpc-status"], got["grpc-message"], rst, tc.want)
		}
	}
}

// TestRawHandshakeTimeout: connections that send nothing, or half a
// preface, are closed once the handshake timeout passes.
func TestRawHandshakeTimeout(t *testing.T) {
	t.Cleanup(grpcserve.SetHandshakeTimeout(20 * time.Millisecond))
	s := serve(t, grpcserve.Config{})
	const n = 50
	ended := make(chan error, n)
	for i := range n {
		nc, err := net.Dial("tcp", s.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		nc.SetDeadline(time.Now().Add(time.Minute)) // only catches a hang
		if i%2 == 1 {
			nc.Write([]byte(http2.ClientPreface[:10]))
		}
		go func() {
			_, err := nc.Read(make([]byte, 1))
			ended <- err
		}()
	}
	for range n {
		if err := waitFor(t, ended); err == nil {
			t.Error("a connection in its handshake was sent a byte")
		} else if ne, ok := err.(net.Error); ok && ne.Timeout() {
			t.Error("a connection in its handshake was not closed")
		}
	}
}

// TestRawDataOnClosed: DATA on a stream the client closed (reset, or
// ended and answered) is answered with one RST_STREAM STREAM_CLOSED,
// however many frames follow; DATA on a stream the server reset is
// dropped, since the client may have sent it before it read the reset
// (RFC 9113 5.1).
func TestRawDataOnClosed(t *testing.T) {
	s := serve(t, grpcserve.Config{})
	call := testgrpc.TestService_UnaryCall_FullMethodName
	cases := []struct {
		name string
		open func(c *rawConn) // stream 1, and closes it
		want []http2.ErrCode  // the RST_STREAMs on stream 1
	}{
		{"reset by the client", func(c *rawConn) {
			c.headers(1, call, false)
			c.fr.WriteRSTStream(1, http2.ErrCodeCancel)
		}, []http2.ErrCode{http2.ErrCodeStreamClosed}},
		{"ended by the client, answered", func(c *rawConn) {
			c.headers(1, call, false)
			c.message(1, &testpb.SimpleRequest{})
			c.answer(1)
		}, []http2.ErrCode{http2.ErrCodeStreamClosed}},
		{"reset by the server", func(c *rawConn) { c.headers(1, call, false, "te", "gzip") }, []http2.ErrCode{http2.ErrCodeProtocol}},
		{"answered before the client ended it", func(c *rawConn) { c.headers(1, "/grpc.testing.TestService/Nope", false) }, []http2.ErrCode{http2.ErrCodeNo}},
		{"its handler done before the client ended it", func(c *rawConn) {
			c.headers(1, testgrpc.TestService_StreamingOutputCall_FullMethodName, false)
			b, _ := proto.Marshal(&testpb.StreamingOutputCallRequest{})
			c.fr.WriteData(1, false, grpcFrame(b))
			c.answer(1)
		}, []http2.ErrCode{http2.ErrCodeNo}},
	}
	for _, tc := range cases {
		c := dialRaw(t, s.addr)
		tc.open(c)
		for range 3 {
			c.fr.WriteData(1, false, []byte{0})
		}
		c.fr.WritePing(false, [8]byte{9})
		var got []http2.ErrCode
		for {
			f, err := c.fr.ReadFrame()
			if err != nil {
				t.Fatalf("%s: waiting for the PING's ACK: %v", tc.name, err)
			}
			if r, ok := f.(*http2.RSTStreamFrame); ok && r.StreamID == 1 {
				got = append(got, r.ErrCode)
			}
			if p, ok := f.(*http2.PingFrame); ok && p.IsAck() {
				break
			}
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("%s, then 3 DATA: RST_STREAMs %v, want %v", tc.name, got, tc.want)
		}
		c.nc.Close()
	}
}

// TestRawBadPreface: a client whose preface is not HTTP/2's sees its
// connection closed, not reset, though it sent more bytes than the
// preface's length, which the server does not read as frames (RFC 9113
// 3.4; h2spec 3.5/2).
func TestRawBadPreface(t *testing.T) {
	s := serve(t, grpcserve.Config{})
	for _, give := range []string{"invalid connection preface\r\n", "GET / HTTP/1.1\r\nHost: x\r\n\r\n" + strings.Repeat("x", 4096)} {
		nc, err := net.Dial("tcp", s.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		nc.SetDeadline(time.Now().Add(time.Minute)) // only catches a hang
		if _, err := nc.Write([]byte(give)); err != nil {
			t.Fatal(err)
		}
		if n, err := io.Copy(io.Discard, nc); n != 0 || err != nil {
			t.Errorf("a preface of %q: %d bytes read, then %v; want the connection closed (EOF) with nothing sent", give[:12], n, err)
		}
	}
}
