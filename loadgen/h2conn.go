package loadgen

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/encoding"
	_ "google.golang.org/grpc/encoding/proto" // registers the "proto" codec Invoke defaults to
	"google.golang.org/grpc/mem"
	grpcstatus "google.golang.org/grpc/status"
)

// GRPCConn is a gRPC client for unary calls over one HTTP/2 connection,
// lean where grpc-go's ClientConn is general: one writer goroutine that
// sends the frames of all calls queued in one write, one reader goroutine
// that hands each answer to its call, and per-call state reused, so that
// a load generator takes little of the CPU it shares with the server it
// measures. It implements grpc.ClientConnInterface for unary calls only,
// and never redials: once its connection breaks, or the server sends
// GOAWAY, every new call fails with codes.Unavailable (GRPCClient
// redials). It is safe for concurrent use; DialGRPC makes one.
type GRPCConn struct {
	nc        net.Conn
	authority string // :authority of each call, the address dialed
	scheme    string // http or https
	bw        *bufio.Writer
	fr        *http2.Framer // written by the writer, read by the reader

	mu         sync.Mutex // guards the fields below, and the state, id and sendWindow of each call
	work       sync.Cond  // on mu: frames to write, or err set
	err        error      // why no call can be made any more; nil while the connection serves
	goaway     error      // why no new stream may be opened: the server's GOAWAY, or drain; nil before
	draining   bool       // close once no call holds a stream or waits for one
	streams    map[uint32]*h2call
	active     int // calls holding a stream: queued, sent, or just handed one
	maxStreams int // the server's MAX_CONCURRENT_STREAMS
	waiting    []*h2call
	queued     []*h2call
	blocked    []*h2call // sent, with DATA left to send
	ctrl       []h2ctrl
	sendWindow int64 // the connection's
	initWindow int64 // each new stream's send window, the server's INITIAL_WINDOW_SIZE
	maxFrame   int   // the server's MAX_FRAME_SIZE
	nextID     uint32

	// Owned by the reader.
	dec        *hpack.Decoder
	hcall      *h2call // the call whose header block is being decoded; nil for none
	hEnd       bool    // the block being decoded ends its stream
	recvAvail  int64   // of the connection's receive window
	recvUnsent int64   // received but not yet given back by a WINDOW_UPDATE

	// Owned by the writer.
	enc  *hpack.Encoder
	hbuf bytes.Buffer

	refusing atomic.Bool // err or goaway is set: no new call may start

	calls sync.Pool // of *h2call
	wg    sync.WaitGroup
}

var _ grpc.ClientConnInterface = (*GRPCConn)(nil)

// The windows this client grants the server, and the largest answer it
// takes (grpc-go's default).
const (
	h2ConnWindow   = 16 << 20
	h2StreamWindow = 1 << 20
	h2MaxRecvMsg   = 4 << 20
)

// ErrStreamsUnsupported is NewStream's error: a GRPCConn makes unary calls
// only.
var ErrStreamsUnsupported = errors.New("loadgen: GRPCConn makes unary calls only, not streams")

// errConnClosing fails the calls in flight when Close is called, as
// grpc-go fails them when its ClientConn closes.
var errConnClosing = grpcstatus.Error(codes.Canceled, "grpc: the client connection is closing")

// DialGRPC connects to the gRPC server at addr (host:port) over one TCP
// connection: with tlsConf nil over cleartext HTTP/2 with prior knowledge
// (h2c, as grpc-go's insecure credentials), else over TLS (a copy of
// tlsConf asking for ALPN "h2", its ServerName addr's host if unset). It
// returns once the server's HTTP/2 preface has been read, or fails when
// ctx ends before. The connection is the caller's to Close.
func DialGRPC(ctx context.Context, addr string, tlsConf *tls.Config) (*GRPCConn, error) {
	var d net.Dialer
	nc, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", addr, err)
	}
	stop := context.AfterFunc(ctx, func() { nc.SetDeadline(time.Unix(1, 0)) })
	c, err := handshake(ctx, nc, addr, tlsConf)
	if !stop() || err != nil {
		nc.Close()
		if err == nil {
			err = ctx.Err()
		}
		return nil, fmt.Errorf("gRPC connection to %s: %w", addr, err)
	}
	if err := nc.SetDeadline(time.Time{}); err != nil {
		nc.Close()
		return nil, err
	}
	c.wg.Add(2)
	go c.readLoop()
	go c.writeLoop()
	return c, nil
}

// handshake sets up TLS if asked, sends the client preface and reads the
// server's SETTINGS.
func handshake(ctx context.Context, nc net.Conn, addr string, tlsConf *tls.Config) (*GRPCConn, error) {
	c := &GRPCConn{
		authority:  addr,
		scheme:     "http",
		streams:    map[uint32]*h2call{},
		maxStreams: math.MaxInt32,
		sendWindow: 65535,
		initWindow: 65535,
		maxFrame:   16384,
		nextID:     1,
		recvAvail:  h2ConnWindow,
	}
	if tlsConf != nil {
		cfg := tlsConf.Clone()
		cfg.NextProtos = []string{"h2"}
		if cfg.ServerName == "" {
			cfg.ServerName, _, _ = net.SplitHostPort(addr)
		}
		tc := tls.Client(nc, cfg)
		if err := tc.HandshakeContext(ctx); err != nil {
			return nil, err
		}
		if p := tc.ConnectionState().NegotiatedProtocol; p != "h2" {
			return nil, fmt.Errorf("server negotiated ALPN %q, not h2", p)
		}
		nc, c.scheme = tc, "https"
	}
	c.nc = nc
	c.bw = bufio.NewWriterSize(nc, 32<<10)
	c.fr = http2.NewFramer(c.bw, bufio.NewReaderSize(nc, 32<<10))
	c.fr.SetReuseFrames()
	c.fr.SetMaxReadFrameSize(16384) // the default this client's SETTINGS leave
	c.work.L = &c.mu
	c.enc = hpack.NewEncoder(&c.hbuf)
	c.dec = hpack.NewDecoder(4096, c.onField)
	c.dec.SetMaxStringLength(64 << 10)
	c.calls.New = func() any { return &h2call{done: make(chan struct{}, 2), bs: make(mem.BufferSlice, 1)} }

	c.bw.WriteString(http2.ClientPreface)
	c.fr.WriteSettings(http2.Setting{ID: http2.SettingEnablePush, Val: 0},
		http2.Setting{ID: http2.SettingInitialWindowSize, Val: h2StreamWindow})
	c.fr.WriteWindowUpdate(0, h2ConnWindow-65535)
	if err := c.bw.Flush(); err != nil {
		return nil, err
	}
	f, err := c.fr.ReadFrame()
	if err != nil {
		return nil, fmt.Errorf("reading the server's preface: %w", err)
	}
	sf, ok := f.(*http2.SettingsFrame)
	if !ok || sf.IsAck() {
		return nil, fmt.Errorf("server's preface is a %v frame, not SETTINGS: is it an HTTP/2 server?", f.Header().Type)
	}
	if err := c.settings(sf); err != nil {
		return nil, err
	}
	return c, nil
}

// Close closes the connection, fails the calls in flight with
// codes.Canceled and any later call, and waits for the connection's
// goroutines to end. It may be called more than once.
func (c *GRPCConn) Close() error {
	c.fail(errConnClosing)
	c.wg.Wait()
	return nil
}

// NewStream returns ErrStreamsUnsupported.
func (c *GRPCConn) NewStream(context.Context, *grpc.StreamDesc, string, ...grpc.CallOption) (grpc.ClientStream, error) {
	return nil, ErrStreamsUnsupported
}

// Invoke makes the unary call of method with args and reads its answer
// into reply, as grpc.ClientConn.Invoke does: the codec is that of a
// grpc.ForceCodecV2CallOption in opts, else the registered "proto" one;
// other options are ignored. It blocks until a stream is free under the
// server's MAX_CONCURRENT_STREAMS, then until the answer; when ctx ends
// first, the stream is reset and the error is ctx's as a status
// (codes.Canceled or codes.DeadlineExceeded). A call the server fails
// returns status.Error of its grpc-status and grpc-message.
func (c *GRPCConn) Invoke(ctx context.Context, method string, args, reply any, opts ...grpc.CallOption) error {
	_, err := c.invoke(ctx, method, args, reply, opts...)
	return err
}

// invoke is Invoke, and reports with unsent whether the call failed
// before the server took it: refused by the connection before it was
// given a stream ID, or refused by the server's GOAWAY. Such a call may
// be made again on another connection.
func (c *GRPCConn) invoke(ctx context.Context, method string, args, reply any, opts ...grpc.CallOption) (unsent bool, err error) {
	codec := protoCodec
	for _, o := range opts {
		if f, ok := o.(grpc.ForceCodecV2CallOption); ok {
			codec = f.CodecV2
		}
	}
	var timeout time.Duration
	if dl, ok := ctx.Deadline(); ok {
		if timeout = time.Until(dl); timeout <= 0 {
			return false, grpcstatus.Error(codes.DeadlineExceeded, context.DeadlineExceeded.Error())
		}
	}
	if err := ctx.Err(); err != nil {
		return false, grpcstatus.FromContextError(err).Err()
	}
	data, err := codec.Marshal(args)
	if err != nil {
		return false, grpcstatus.Errorf(codes.Internal, "grpc: error while marshaling: %v", err)
	}
	n := data.Len()
	if n > math.MaxInt32 {
		data.Free()
		return false, grpcstatus.Errorf(codes.ResourceExhausted, "grpc: message of %d bytes is over gRPC's largest", n)
	}
	cl := c.calls.Get().(*h2call)
	cl.reset(method, timeout)
	cl.req = binary.BigEndian.AppendUint32(append(cl.req[:0], 0), uint32(n))
	for _, b := range data {
		cl.req = append(cl.req, b.ReadOnlyData()...)
	}
	data.Free()

	if err := c.start(ctx, cl); err != nil {
		return ctx.Err() == nil && c.unsent(cl, err), err
	}
	select {
	case <-cl.done:
	case <-ctx.Done():
		if c.cancel(cl) {
			return false, grpcstatus.FromContextError(ctx.Err()).Err()
		}
		<-cl.done // the answer came first
	}
	err = cl.err
	if err != nil {
		unsent = c.unsent(cl, err)
	}
	if err == nil {
		// The reader is done with cl: the codec reads its answer here, on
		// the caller's goroutine.
		if sb, _ := cl.bs[0].(mem.SliceBuffer); len(sb) != len(cl.resp) || len(sb) == 0 || &sb[0] != &cl.resp[0] {
			cl.bs[0] = mem.SliceBuffer(cl.resp)
		}
		if uerr := codec.Unmarshal(cl.bs, reply); uerr != nil {
			err = grpcstatus.Errorf(codes.Internal, "grpc: failed to unmarshal the received message: %v", uerr)
		}
	}
	if cl.byReader && cl.wdone.Load() && cap(cl.resp) <= 64<<10 && cap(cl.req) <= 64<<10 {
		c.calls.Put(cl)
	}
	return unsent, err
}

// unsent reports whether cl, which failed with err, failed before the
// server took it: with no stream ID, or refused by GOAWAY.
func (c *GRPCConn) unsent(cl *h2call, err error) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return cl.id == 0 || err == c.goaway
}

var protoCodec = encoding.GetCodecV2("proto")

// start waits for a stream for cl and queues it to be sent.
func (c *GRPCConn) start(ctx context.Context, cl *h2call) error {
	c.mu.Lock()
	if err := cmp.Or(c.err, c.goaway); err != nil {
		c.mu.Unlock()
		return err
	}
	if c.active < c.maxStreams {
		c.active++
		c.queueLocked(cl)
		c.mu.Unlock()
		return nil
	}
	cl.state = callWaiting
	c.waiting = append(c.waiting, cl)
	c.mu.Unlock()
	select {
	case <-cl.done:
	case <-ctx.Done():
		c.mu.Lock()
		switch cl.state {
		case callWaiting:
			for i, w := range c.waiting {
				if w == cl {
					c.waiting = append(c.waiting[:i], c.waiting[i+1:]...)
					break
				}
			}
			cl.state = callDone
		case callQueued, callSent: // handed a stream as ctx ended
			c.cancelLocked(cl)
		}
		c.mu.Unlock()
		return grpcstatus.FromContextError(ctx.Err()).Err()
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return cl.err // nil when handed a stream, or answered already
}

// queueLocked queues cl, which holds a stream, for the writer.
func (c *GRPCConn) queueLocked(cl *h2call) {
	cl.state = callQueued
	c.queued = append(c.queued, cl)
	c.work.Signal()
}

// releaseLocked gives back a stream: to the first call waiting, or to
// the count, waking the writer to close a draining connection its last
// call has left.
func (c *GRPCConn) releaseLocked() {
	if len(c.waiting) > 0 && c.active <= c.maxStreams {
		cl := c.waiting[0]
		c.waiting = c.waiting[1:]
		c.queueLocked(cl)
		cl.done <- struct{}{}
		return
	}
	c.active--
	if c.active == 0 && c.draining {
		c.work.Signal()
	}
}

// drain refuses new calls, as GOAWAY does, and closes c, as Close does,
// once the calls holding a stream have ended: at once if none does.
func (c *GRPCConn) drain() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.goaway == nil {
		c.goaway = errConnClosing
		c.refusing.Store(true)
	}
	c.draining = true
	c.work.Signal()
}

// idleLocked reports whether c drains and no call is left on it.
func (c *GRPCConn) idleLocked() bool {
	return c.draining && c.active == 0 && len(c.waiting) == 0
}

// cancel ends cl, whose ctx ended, and resets its stream if sent. It
// reports false if the answer had already ended cl.
func (c *GRPCConn) cancel(cl *h2call) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.cancelLocked(cl)
}

func (c *GRPCConn) cancelLocked(cl *h2call) bool {
	if cl.state == callDone {
		return false
	}
	if cl.state == callSent {
		delete(c.streams, cl.id)
		c.ctrl = append(c.ctrl, h2ctrl{kind: ctrlRST, id: cl.id, val: uint32(http2.ErrCodeCancel)})
		c.work.Signal()
	}
	cl.state = callDone
	c.releaseLocked()
	return true
}

// finishLocked ends cl, a sent or queued call, with err (nil for its
// answer) and wakes its caller.
func (c *GRPCConn) finishLocked(cl *h2call, err error) {
	if cl.state == callDone {
		return
	}
	if cl.state == callSent {
		delete(c.streams, cl.id)
	}
	cl.state, cl.err = callDone, err
	c.releaseLocked()
	cl.done <- struct{}{}
}

// fail makes the connection unusable with err: every call in flight or
// waiting fails with it, as does every later one, and the goroutines end.
func (c *GRPCConn) fail(err error) {
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return
	}
	c.err = err
	c.refusing.Store(true)
	for _, cl := range c.waiting {
		cl.state, cl.err = callDone, err
		cl.done <- struct{}{}
	}
	c.waiting = nil
	for _, cl := range c.queued {
		if cl.state == callQueued {
			cl.state, cl.err = callDone, err
			cl.done <- struct{}{}
		}
	}
	c.queued = nil
	for _, cl := range c.streams {
		cl.state, cl.err = callDone, err
		cl.done <- struct{}{}
	}
	clear(c.streams)
	c.work.Broadcast()
	c.mu.Unlock()
	c.nc.Close()
}

// brokenErr is the error of the calls a broken connection fails.
func (c *GRPCConn) brokenErr(err error) error {
	return grpcstatus.Errorf(codes.Unavailable, "connection to %s broken: %v", c.authority, err)
}

// The states of a call, under GRPCConn.mu.
const (
	callIdle    = iota
	callWaiting // for a stream
	callQueued  // holds a stream, for the writer to send
	callSent    // its HEADERS are the writer's, it is in streams
	callDone    // its caller is or will be woken
)

// h2call is one unary call: its request, and its answer as the reader
// assembles it. After its caller is woken (done), only the caller touches
// it, unless the reader or writer may still hold it: then it is not
// reused (see Invoke).
type h2call struct {
	done    chan struct{} // one signal when handed a stream, one when done: room for both
	method  string
	timeout time.Duration
	req     []byte // the message with its 5-byte prefix
	bs      mem.BufferSlice

	// Under GRPCConn.mu.
	state      int
	id         uint32
	sendWindow int64
	sent       int // bytes of req sent or planned
	err        error
	byReader   bool // ended by the reader, which is done with it

	wdone atomic.Bool // the writer is done with req

	// Set by the reader.
	recvUnsent  int64 // received on the stream, not yet given back
	headers     bool  // the first header block was read
	malformed   bool  // a field of the header block being read is not well formed
	httpStatus  string
	contentType string
	grpcStatus  string
	grpcMessage string
	encoding    string
	prefix      [5]byte
	prefixN     int
	want        int // the length of the message being read
	resp        []byte
	got         bool // a whole message was read
}

func (cl *h2call) reset(method string, timeout time.Duration) {
	cl.method, cl.timeout = method, timeout
	cl.state, cl.id, cl.sent, cl.err, cl.byReader = callIdle, 0, 0, nil, false
	cl.wdone.Store(false)
	cl.recvUnsent, cl.headers, cl.malformed = 0, false, false
	cl.httpStatus, cl.contentType, cl.grpcStatus, cl.grpcMessage, cl.encoding = "", "", "", "", ""
	cl.prefixN, cl.want, cl.resp, cl.got = 0, 0, cl.resp[:0], false
}

var timeoutUnits = [...]struct {
	d    time.Duration
	unit byte
}{{time.Nanosecond, 'n'}, {time.Microsecond, 'u'}, {time.Millisecond, 'm'}, {time.Second, 'S'}, {time.Minute, 'M'}, {time.Hour, 'H'}}

// appendTimeout appends d as a grpc-timeout value, as grpc-go writes it:
// at most 8 digits and a unit, rounded up.
func appendTimeout(b []byte, d time.Duration) []byte {
	for _, u := range timeoutUnits {
		v := int64(d / u.d)
		if d%u.d > 0 {
			v++
		}
		if v <= 99999999 || u.unit == 'H' {
			return append(strconv.AppendInt(b, v, 10), u.unit)
		}
	}
	return b
}
