package grpcserve_test

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	testpb "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/protobuf/proto"

	"github.com/hotkeyd/hotkey/internal/grpcserve"
)

// refusedCalls returns the bytes a client sends to make n calls that are
// refused before a stream opens, each asking for an answer that quotes
// the client's value of 3,990 bytes: the value is sent once, indexed in
// the HPACK table, and each call after costs 13 bytes.
func refusedCalls(kind string, n int) []byte {
	var b, hb bytes.Buffer
	fr, he := http2.NewFramer(&b, nil), hpack.NewEncoder(&hb)
	io.WriteString(&b, http2.ClientPreface)
	fr.WriteSettings()
	path, ct := "/"+strings.Repeat("%", 3990)+"/m", "application/grpc" // unknown service
	if kind == "content-type" {
		path, ct = "/x", strings.Repeat("\xff", 3990)
	}
	for i := range n {
		hb.Reset()
		for _, f := range [][2]string{{":method", "POST"}, {":scheme", "http"}, {":path", path}, {"content-type", ct}} {
			he.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
		}
		fr.WriteHeaders(http2.HeadersFrameParam{StreamID: uint32(2*i + 1), BlockFragment: hb.Bytes(), EndHeaders: true, EndStream: true})
	}
	return b.Bytes()
}

// readersQuiet reports whether every connection of the lean server
// accepted is past its handshake, and its reader, if still reading, waits
// for bytes to read.
func readersQuiet() bool {
	buf := make([]byte, 4<<20)
	buf = buf[:runtime.Stack(buf, true)]
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "grpcserve.(*conn).handshake") ||
			strings.Contains(g, "grpcserve.(*conn).readLoop") && !strings.Contains(g, "[IO wait") {
			return false
		}
	}
	return true
}

// unreadAttack has conns clients each send calls refused before a stream
// opens (half an unknown service, half a bad content-type) and read no
// answer, while a bystander makes calls on a connection of its own; it
// returns the heap the attack holds once the server has read it all, and
// the bystander's p99 before the attack, while the server reads it, and
// once it has read it. quiet reports when the server has read all it was
// sent.
func unreadAttack(t *testing.T, addr string, conns, calls int, quiet func() bool) (held int64, p99 [3]time.Duration) {
	t.Helper()
	req := &testpb.SimpleRequest{ResponseSize: 32}
	const bystander = 500
	lat := func() time.Duration {
		by := testgrpc.NewTestServiceClient(grpcClient(t, addr)) // dials now
		ds := make([]time.Duration, bystander)
		for i := range ds {
			begin := time.Now()
			if _, err := by.UnaryCall(testCtx(t), req); err != nil {
				t.Fatalf("the bystander's call: %v", err)
			}
			ds[i] = time.Since(begin)
		}
		slices.Sort(ds)
		return ds[len(ds)*99/100]
	}
	p99[0] = lat()
	floods := [][]byte{refusedCalls("service", calls), refusedCalls("content-type", calls)}
	base := heapAlloc()
	for i := range conns {
		nc, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { nc.Close() })
		nc.SetDeadline(time.Now().Add(time.Minute)) // only catches a hang
		go nc.Write(floods[i%2])                    // fails once the server cuts the connection off
	}
	p99[1] = lat() // once its connection is served, the server has accepted the attack's
	for !quiet() {
		runtime.Gosched()
	}
	held = heapAlloc() - base
	p99[2] = lat()
	return held, p99
}

// TestRawUnreadRefusedAnswers: 8 clients that make calls refused before a
// stream opens, each answered with an error naming the client's long
// value, and read no answer make the server hold at most 64 MiB of heap
// in all; a bystander's calls are served meanwhile.
func TestRawUnreadRefusedAnswers(t *testing.T) {
	const (
		conns = 8
		calls = 6000 // under 10,000 a connection: a cap on control frames alone never cuts it off
		bound = 64 << 20
	)
	s := serve(t, grpcserve.Config{})
	held, p99 := unreadAttack(t, s.addr, conns, calls, readersQuiet)
	t.Logf("lean: %d connections of %d refused calls unread hold %.1f MiB of heap; a bystander's p99 %v before, %v while read, %v after",
		conns, calls, float64(held)/(1<<20), p99[0], p99[1], p99[2])
	if held > bound {
		t.Errorf("%d connections of %d refused calls unread hold %.1f MiB of heap, want at most %d MiB", conns, calls, float64(held)/(1<<20), bound>>20)
	}
}

// TestRawUnreadRefusedAnswersFigures is TestRawUnreadRefusedAnswers's
// attack on the lean server and grpc-go's, with 6,000 and 50,000 calls (78
// and 650 KiB of HEADERS) a connection, for the figures
// (GRPCSERVE_MEASURE=1 go test -run UnreadRefusedAnswersFigures -v): on
// grpc-go's server it holds gigabytes.
func TestRawUnreadRefusedAnswersFigures(t *testing.T) {
	if os.Getenv("GRPCSERVE_MEASURE") == "" {
		t.Skip("a measurement: set GRPCSERVE_MEASURE=1")
	}
	const conns = 8
	for _, calls := range []int{6000, 50000} {
		t.Run(fmt.Sprint("lean/", calls), func(t *testing.T) {
			held, p99 := unreadAttack(t, serve(t, grpcserve.Config{}).addr, conns, calls, readersQuiet)
			t.Logf("lean: %d connections of %d refused calls unread hold %.1f MiB of heap; a bystander's p99 %v before, %v while read, %v after",
				conns, calls, float64(held)/(1<<20), p99[0], p99[1], p99[2])
		})
		t.Run(fmt.Sprint("grpc-go/", calls), func(t *testing.T) {
			addr := serveGRPCGo(t)
			// grpc-go's readers have read all once its heap stops growing.
			var last int64
			var stable int
			settled := func() bool {
				time.Sleep(100 * time.Millisecond) // a measurement, not an assertion
				h := heapAlloc()
				if h > last {
					stable = 0
				} else {
					stable++
				}
				last = max(last, h)
				return stable == 5
			}
			held, p99 := unreadAttack(t, addr, conns, calls, settled)
			t.Logf("grpc-go: %d connections of %d refused calls unread hold %.1f MiB of heap; a bystander's p99 %v before, %v while read, %v after",
				conns, calls, float64(held)/(1<<20), p99[0], p99[1], p99[2])
		})
	}
}

// TestRawIdleTimeout: a connection with no call for IdleTimeout is sent a
// GOAWAY and closed; one whose call stays open over many checks is not,
// until the call ends.
func TestRawIdleTimeout(t *testing.T) {
	var checks atomic.Int64
	t.Cleanup(grpcserve.SetIdleCheckHook(func() { checks.Add(1) }))
	s := serve(t, grpcserve.Config{IdleTimeout: 20 * time.Millisecond})
	c := dialRaw(t, s.addr)
	c.nc.SetDeadline(time.Now().Add(10 * time.Second)) // only catches a hang
	c.headers(1, testgrpc.TestService_UnaryCall_FullMethodName, false)
	c.message(1, &testpb.SimpleRequest{Payload: &testpb.Payload{Body: []byte("hold")}})
	waitFor(t, s.ts.started)
	deadline := time.Now().Add(10 * time.Second)                            // only catches a hang
	for base := checks.Load(); checks.Load() < base+12; runtime.Gosched() { // three IdleTimeouts' checks, and more
		if time.Now().After(deadline) {
			t.Fatalf("%d idle checks in 10 s", checks.Load()-base)
		}
	}
	close(s.ts.release)
	goAway := false
	answered := false
	for {
		f, err := c.fr.ReadFrame()
		if err != nil {
			if !goAway {
				t.Fatalf("the connection ended with no GOAWAY: %v", err)
			}
			break
		}
		switch f := f.(type) {
		case *http2.GoAwayFrame:
			if !answered {
				t.Fatal("GOAWAY while a call was open")
			}
			if f.ErrCode != http2.ErrCodeNo {
				t.Errorf("GOAWAY %v, want NO_ERROR", f.ErrCode)
			}
			goAway = true
		case *http2.MetaHeadersFrame:
			if f.StreamID == 1 && f.StreamEnded() {
				answered = true
			}
		}
	}
}

// serverGoroutines returns the count of goroutines of the lean server's
// connections: their readers and writers.
func serverGoroutines() int {
	buf := make([]byte, 4<<20)
	buf = buf[:runtime.Stack(buf, true)]
	n := 0
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "grpcserve.(*conn).serve") || strings.Contains(g, "grpcserve.(*conn).writeLoop") {
			n++
		}
	}
	return n
}

// TestRawWriteTimeout: a connection whose client reads none of its
// answers is closed once the writer makes no progress for WriteTimeout.
func TestRawWriteTimeout(t *testing.T) {
	s := serve(t, grpcserve.Config{WriteTimeout: 20 * time.Millisecond})
	nc, err := net.Dial("tcp", s.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	nc.(*net.TCPConn).SetReadBuffer(4 << 10)
	var b, hb bytes.Buffer
	fr, he := http2.NewFramer(&b, nil), hpack.NewEncoder(&hb)
	io.WriteString(&b, http2.ClientPreface)
	fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 1 << 30})
	fr.WriteWindowUpdate(0, 1<<30)
	req, _ := proto.Marshal(&testpb.SimpleRequest{ResponseSize: 1 << 20})
	for id := uint32(1); id < 64; id += 2 { // 32 MiB of answers, unread
		callFrames(fr, &hb, he, id, req)
	}
	if _, err := nc.Write(b.Bytes()); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); serverGoroutines() > 0; runtime.Gosched() { // only catches a hang
		if time.Now().After(deadline) {
			t.Fatal("a connection whose client reads nothing is still served")
		}
	}
}

// openIdle opens n connections to addr that send the preface and SETTINGS,
// read the server's frames until the ACK of their SETTINGS, and then
// nothing: the handshake is done on both sides.
func openIdle(t *testing.T, addr string, n int) {
	t.Helper()
	var b bytes.Buffer
	io.WriteString(&b, http2.ClientPreface)
	http2.NewFramer(&b, nil).WriteSettings()
	dialQuiet(t, addr, n, b.Bytes(), http2.FrameSettings, http2.FlagSettingsAck)
}

// dialQuiet opens n connections to addr, each sending hello and reading
// the server's frames until one of type last with flag set; then they
// send nothing. They are closed with t.
func dialQuiet(t *testing.T, addr string, n int, hello []byte, last http2.FrameType, flag http2.Flags) {
	t.Helper()
	for range n {
		nc, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { nc.Close() })
		nc.SetDeadline(time.Now().Add(time.Minute)) // only catches a hang
		if _, err := nc.Write(hello); err != nil {
			t.Fatal(err)
		}
		for {
			var h [9]byte
			if _, err := io.ReadFull(nc, h[:]); err != nil {
				t.Fatal(err)
			}
			if _, err := io.CopyN(io.Discard, nc, int64(h[0])<<16|int64(h[1])<<8|int64(h[2])); err != nil {
				t.Fatal(err)
			}
			if http2.FrameType(h[3]) == last && http2.Flags(h[4]).Has(flag) {
				break
			}
		}
	}
}

// TestRawIdleConnsOpen: a connection past its handshake that sends
// nothing more holds less heap on the lean server than on grpc-go's.
func TestRawIdleConnsOpen(t *testing.T) {
	const n = 1000
	perConn := func(addr string) int64 {
		base := heapAlloc()
		openIdle(t, addr, n)
		return (heapAlloc() - base) / n
	}
	lean := perConn(serve(t, grpcserve.Config{}).addr)
	grpcGo := perConn(serveGRPCGo(t))
	t.Logf("%d idle connections: %d bytes of heap each on the lean server, %d on grpc-go's (the client's included)", n, lean, grpcGo)
	if lean > grpcGo {
		t.Errorf("an idle connection holds %d bytes of heap on the lean server, more than grpc-go's %d", lean, grpcGo)
	}
}

// callThenIdle opens n connections to addr, each taking frames of up to
// 1 MiB, with windows to match, and making one call answered with size
// bytes, which it reads; then they send nothing.
func callThenIdle(t *testing.T, addr string, n, size int) {
	t.Helper()
	var b, hb bytes.Buffer
	fr, he := http2.NewFramer(&b, nil), hpack.NewEncoder(&hb)
	io.WriteString(&b, http2.ClientPreface)
	fr.WriteSettings(http2.Setting{ID: http2.SettingMaxFrameSize, Val: 1 << 20}, http2.Setting{ID: http2.SettingInitialWindowSize, Val: 1 << 30})
	fr.WriteWindowUpdate(0, 1<<30)
	req, _ := proto.Marshal(&testpb.SimpleRequest{ResponseSize: int32(size)})
	callFrames(fr, &hb, he, 1, req)
	dialQuiet(t, addr, n, b.Bytes(), http2.FrameHeaders, http2.FlagHeadersEndStream)
}

// TestRawIdleConnsAfterCall: a connection that made a call answered with
// 30 KiB, in one frame (the client takes frames of 1 MiB), holds no more
// heap once idle than on grpc-go's server. The answer fits the codec's
// pooled buffers of 32 KiB, and the connections are many, so that what
// the servers pool for all counts little in each.
func TestRawIdleConnsAfterCall(t *testing.T) {
	const n, size = 500, 30 << 10
	perConn := func(addr string) int64 {
		base := heapAlloc()
		callThenIdle(t, addr, n, size)
		return (heapAlloc() - base) / n
	}
	lean := perConn(serve(t, grpcserve.Config{}).addr)
	grpcGo := perConn(serveGRPCGo(t))
	t.Logf("%d connections idle after a call of %d KiB: %d bytes of heap each on the lean server, %d on grpc-go's (the client's included)", n, size>>10, lean, grpcGo)
	if lean > grpcGo {
		t.Errorf("a connection idle after a call holds %d bytes of heap on the lean server, more than grpc-go's %d", lean, grpcGo)
	}
}

// smallBufListener accepts connections whose kernel send buffer is small,
// so that a client that reads nothing soon holds up the server's writer.
type smallBufListener struct{ net.Listener }

func (l smallBufListener) Accept() (net.Conn, error) {
	nc, err := l.Listener.Accept()
	if err == nil {
		nc.(*net.TCPConn).SetWriteBuffer(4 << 10)
	}
	return nc, err
}

// TestRawCtrlBytes: the frames queued for a client that reads none are
// capped in bytes, not frames: 4,000 refused calls, whose answers are
// some 200 bytes each, end the connection before they are all answered.
func TestRawCtrlBytes(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpcserve.NewServer(grpcserve.Config{})
	testgrpc.RegisterTestServiceServer(srv, newTestServer())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(smallBufListener{ln}) }()
	t.Cleanup(func() { srv.Stop(); <-done })

	const calls = 4000
	nc, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	nc.(*net.TCPConn).SetReadBuffer(4 << 10)
	nc.SetDeadline(time.Now().Add(time.Minute)) // only catches a hang
	var b, hb bytes.Buffer
	fr, he := http2.NewFramer(&b, nil), hpack.NewEncoder(&hb)
	io.WriteString(&b, http2.ClientPreface)
	fr.WriteSettings()
	for i := range calls {
		hb.Reset()
		for _, f := range [][2]string{{":method", "POST"}, {":scheme", "http"}, {":path", "/" + strings.Repeat("%", 200) + "/m"}, {"content-type", "application/grpc"}} {
			he.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
		}
		fr.WriteHeaders(http2.HeadersFrameParam{StreamID: uint32(2*i + 1), BlockFragment: hb.Bytes(), EndHeaders: true, EndStream: true})
	}
	fr.WritePing(false, [8]byte{1})
	if _, err := nc.Write(b.Bytes()); err != nil {
		t.Fatal(err)
	}
	for !readersQuiet() {
		runtime.Gosched()
	}
	rd := http2.NewFramer(nil, nc)
	answered := 0
	for {
		f, err := rd.ReadFrame()
		if err != nil {
			t.Logf("the connection ended after %d answers of %d: %v", answered, calls, err)
			return
		}
		switch f := f.(type) {
		case *http2.HeadersFrame:
			answered++
		case *http2.PingFrame:
			if f.IsAck() {
				t.Fatalf("all %d refused calls were answered, unread while they were queued", calls)
			}
		}
	}
}

// TestIdlePeriod: a connection checks whether it is idle four times an
// IdleTimeout, and never more often than each millisecond, so that a tiny
// IdleTimeout does not have its timer fire without pause.
func TestIdlePeriod(t *testing.T) {
	cases := []struct {
		give, want time.Duration
	}{
		{5 * time.Minute, 75 * time.Second},
		{20 * time.Millisecond, 5 * time.Millisecond},
		{time.Nanosecond, time.Millisecond},
	}
	for _, c := range cases {
		if got := grpcserve.IdlePeriod(grpcserve.NewServer(grpcserve.Config{IdleTimeout: c.give})); got != c.want {
			t.Errorf("IdleTimeout %v: checked every %v, want %v", c.give, got, c.want)
		}
	}
}
