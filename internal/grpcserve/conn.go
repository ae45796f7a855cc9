package grpcserve

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"
	"unsafe"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/stats"

	"github.com/hotkeyd/hotkey/internal/h2rules"
)

// The windows the server grants a client: the connection's, unless
// MaxRecvMsgSize needs a wider one (Server.window), and each stream's.
const (
	connWindow   = 16 << 20
	streamWindow = 1 << 20
)

// handshakeTimeout bounds the TLS handshake and the client's preface of
// the connections of the servers made from then on; a variable for the
// tests.
var handshakeTimeout = 30 * time.Second

// maxCtrlBytes bounds the bytes of the frames the reader queues for the
// writer (ACKs, resets, window updates, the answers of calls refused
// before a stream opens) while the client does not read them, about
// 10,000 frames with no header block; past it the connection ends with
// ENHANCE_YOUR_CALM, as net/http's server does past 10,000 frames.
const maxCtrlBytes = 512 << 10

// ctrlSize is what a frame queued costs, but its header block.
const ctrlSize = int(unsafe.Sizeof(ctrl{}))

// goAwayWait is how long a connection that sent a GOAWAY for a protocol
// error waits for it to be written before it closes.
const goAwayWait = time.Second

// conn is one HTTP/2 connection: its reader (serve) and its writer
// (writeLoop).
type conn struct {
	s          *Server
	ctx        context.Context // the peer, and what StatsHandler.TagConn added
	br         *connReader     // the reader's
	bw         *connWriter     // the writer's
	fr         *http2.Framer   // written by the writer, read by the reader
	writerDone chan struct{}

	mu         sync.Mutex // guards the fields below, and a stream's fields said to be under conn.mu
	work       sync.Cond  // on mu: something for the writer
	nc         net.Conn
	streams    map[uint32]*stream // open: not reset, trailers not written
	pending    []*stream          // with frames to write
	ctrl       []ctrl
	ctrlBlocks int   // bytes of the header blocks in ctrl
	sendWindow int64 // the connection's
	initWindow int64 // each stream's first send window: the client's SETTINGS_INITIAL_WINDOW_SIZE
	maxFrame   int   // the client's SETTINGS_MAX_FRAME_SIZE
	lastID     uint32
	running    int    // handlers dispatched and not returned
	opening    bool   // the reader took a stream's ID and has not yet opened or answered it
	draining   bool   // a GOAWAY is sent or queued
	goAwayID   uint32 // the last stream served once draining
	closeAfter bool   // close once the frames queued are written
	ready      bool   // the handshake is done
	dead       bool
	ageTimer   *time.Timer
	graceTimer *time.Timer
	idleTimer  *time.Timer
	idleMark   uint32     // lastID at the last idle check
	quiet      int        // idle checks in a row that found no call
	recvAvail  int64      // of the connection's receive window, as the client was told
	recvUnsent int64      // read and no longer held, not yet given back by a WINDOW_UPDATE
	resets     [32]uint32 // the streams the server sent RST_STREAM on last, as a ring
	resetsNext int

	// Owned by the reader.
	dec     *hpack.Decoder
	hdr     reqHeaders // of the header block being read
	refused int        // calls refused before a stream opened, less those served since (tally)

	// Owned by the writer.
	fh [9]byte // the header of the frame being written
}

// ctrl is a frame that is not a stream's answer.
type ctrl struct {
	kind  uint8
	id    uint32
	val   uint32
	ping  [8]byte
	block []byte // ctrlHeaders: a whole answer, ending its stream
}

const (
	ctrlSettingsAck = iota
	ctrlPingAck
	ctrlWindowUpdate
	ctrlRST
	ctrlGoAway
	ctrlHeaders
)

func newConn(s *Server, nc net.Conn) *conn {
	c := &conn{
		s:          s,
		nc:         nc,
		streams:    map[uint32]*stream{},
		sendWindow: 65535,
		initWindow: 65535,
		maxFrame:   16384,
		recvAvail:  s.window,
		writerDone: make(chan struct{}),
	}
	c.work.L = &c.mu
	return c
}

// serve serves c: the handshake, then the reader, until the connection
// ends.
func (c *conn) serve() {
	defer c.s.connDone(c)
	if err := c.handshake(); err != nil {
		c.close(err)
		return
	}
	go c.writeLoop()
	sh := c.s.cfg.StatsHandler
	if sh != nil {
		sh.HandleConn(c.ctx, &stats.ConnBegin{})
	}
	c.mu.Lock()
	if c.s.cfg.MaxConnectionAge > 0 {
		c.ageTimer = time.AfterFunc(c.s.age(), c.ageOut)
	}
	if c.s.cfg.IdleTimeout > 0 {
		c.idleTimer = time.AfterFunc(c.s.idlePeriod, c.idleCheck)
	}
	c.mu.Unlock()
	err := c.readLoop()
	c.br.release()
	if errors.Is(err, errGoAway) {
		t := time.AfterFunc(goAwayWait, func() { c.close(err) })
		<-c.writerDone
		t.Stop()
	}
	c.close(err)
	<-c.writerDone
	c.mu.Lock()
	for _, t := range []*time.Timer{c.ageTimer, c.graceTimer, c.idleTimer} {
		if t != nil {
			t.Stop()
		}
	}
	c.mu.Unlock()
	if sh != nil {
		sh.HandleConn(c.ctx, &stats.ConnEnd{})
	}
}

// handshake sets up TLS if configured, reads the client's preface and
// SETTINGS, and sends the server's.
func (c *conn) handshake() error {
	c.mu.Lock()
	nc := c.nc
	c.mu.Unlock()
	nc.SetDeadline(time.Now().Add(c.s.handshakeTimeout))
	p := &peer.Peer{Addr: nc.RemoteAddr(), LocalAddr: nc.LocalAddr()}
	if cfg := c.s.cfg.TLS; cfg != nil {
		tc := tls.Server(nc, cfg)
		c.mu.Lock()
		if c.dead {
			c.mu.Unlock()
			return errors.New("closed")
		}
		c.nc = tc
		c.mu.Unlock()
		if err := tc.Handshake(); err != nil {
			return err
		}
		st := tc.ConnectionState()
		if st.NegotiatedProtocol != "h2" {
			return fmt.Errorf("ALPN %q, not h2", st.NegotiatedProtocol)
		}
		p.AuthInfo = credentials.TLSInfo{State: st, CommonAuthInfo: credentials.CommonAuthInfo{SecurityLevel: credentials.PrivacyAndIntegrity}}
		nc = tc
	}
	c.ctx = peer.NewContext(context.Background(), p)
	if sh := c.s.cfg.StatsHandler; sh != nil {
		c.ctx = sh.TagConn(c.ctx, &stats.ConnTagInfo{RemoteAddr: p.Addr, LocalAddr: p.LocalAddr})
	}
	// The framer and decoder are made once the preface came, so that
	// connections that send nothing cost little.
	var preface [len(http2.ClientPreface)]byte
	if _, err := io.ReadFull(nc, preface[:]); err != nil {
		return err
	}
	if string(preface[:]) != http2.ClientPreface {
		linger(nc)
		return errors.New("not an HTTP/2 client preface")
	}
	c.br = &connReader{nc: nc}
	c.bw = &connWriter{w: &stallWriter{nc: nc, timeout: c.s.cfg.WriteTimeout}}
	c.fr = http2.NewFramer(c.bw, c.br)
	c.fr.SetReuseFrames()
	c.fr.SetMaxReadFrameSize(16384) // the default the server's SETTINGS leave
	c.dec = hpack.NewDecoder(4096, c.onField)
	c.dec.SetMaxStringLength(int(c.s.cfg.MaxHeaderListSize))
	c.fr.WriteSettings(
		http2.Setting{ID: http2.SettingMaxConcurrentStreams, Val: c.s.cfg.MaxConcurrentStreams},
		http2.Setting{ID: http2.SettingInitialWindowSize, Val: streamWindow},
		http2.Setting{ID: http2.SettingMaxHeaderListSize, Val: c.s.cfg.MaxHeaderListSize})
	c.fr.WriteWindowUpdate(0, uint32(c.s.window-65535))
	if err := c.bw.Flush(); err != nil {
		return err
	}
	c.bw.release()
	f, err := c.fr.ReadFrame()
	if err != nil {
		return err
	}
	sf, ok := f.(*http2.SettingsFrame)
	if !ok || sf.IsAck() {
		return errors.New("client preface without SETTINGS")
	}
	if err := c.onSettings(sf); err != nil {
		return err
	}
	c.mu.Lock()
	c.ready = true
	c.mu.Unlock()
	return nc.SetReadDeadline(time.Time{}) // the writes' is stallWriter's
}

// linger ends the server's side of nc and reads on what the client sent,
// up to 64 KiB for at most a second, before nc is closed: a close with
// bytes unread resets the connection, and the client may read the reset
// rather than the end of the stream.
func linger(nc net.Conn) {
	if cw, ok := nc.(interface{ CloseWrite() error }); ok {
		cw.CloseWrite()
	}
	nc.SetReadDeadline(time.Now().Add(time.Second))
	io.CopyN(io.Discard, nc, 64<<10)
}

// errGoAway is readLoop's error once it queued a GOAWAY for a protocol
// error.
var errGoAway = errors.New("GOAWAY sent")

// readLoop reads frames and acts on each until the connection fails or
// the client breaks the protocol.
func (c *conn) readLoop() error {
	for {
		fh, err := c.fr.ReadFrameHeader()
		var f http2.Frame
		if err == nil {
			f, err = c.fr.ReadFrameForHeader(fh)
		}
		if err == nil {
			err = c.onFrame(f)
		}
		if err == nil {
			c.mu.Lock()
			flood := len(c.ctrl)*ctrlSize+c.ctrlBlocks > maxCtrlBytes
			c.mu.Unlock()
			if !flood {
				continue
			}
			err = http2.ConnectionError(http2.ErrCodeEnhanceYourCalm)
		}
		if se, ok := errors.AsType[http2.StreamError](err); ok && fh.Type == http2.FrameHeaders {
			// A HEADERS whose padding is longer than it: its block is
			// lost, and the HPACK table's step with it (RFC 9113 6.2).
			err = errProtocol
		} else if ok {
			c.mu.Lock()
			if se.StreamID > c.lastID && se.StreamID%2 == 1 {
				c.lastID = se.StreamID
			}
			c.mu.Unlock()
			c.resetStream(se.StreamID, se.Code)
			continue
		}
		code := http2.ErrCodeProtocol
		if ce, ok := errors.AsType[http2.ConnectionError](err); ok {
			code = http2.ErrCode(ce)
		} else if errors.Is(err, http2.ErrFrameTooLarge) {
			code = http2.ErrCodeFrameSize
		} else if !errors.Is(err, errProtocol) {
			return err // the connection broke
		}
		c.mu.Lock()
		if !c.dead {
			c.ctrl = append(c.ctrl, ctrl{kind: ctrlGoAway, id: c.lastID, val: uint32(code)})
			c.closeAfter, c.draining = true, true
			c.work.Signal()
		}
		c.mu.Unlock()
		return errGoAway
	}
}

// errClosed is the reader's error once the connection was closed under
// it.
var errClosed = errors.New("connection closed")

// errProtocol is an error of the client's that ends the connection with
// GOAWAY PROTOCOL_ERROR.
var errProtocol = errors.New("protocol error")

// onFrame acts on a frame the reader read; an error ends the connection.
func (c *conn) onFrame(f http2.Frame) error {
	switch f := f.(type) {
	case *http2.DataFrame:
		return c.onData(f)
	case *http2.HeadersFrame:
		// A stream cannot depend on itself (RFC 9113 5.3.1).
		selfDep := f.HasPriority() && f.Priority.StreamDep == f.StreamID
		c.hdr = reqHeaders{id: f.StreamID, end: f.StreamEnded(), contentLength: -1, malformed: selfDep}
		return c.onHeaderBlock(f.HeaderBlockFragment(), f.HeadersEnded())
	case *http2.ContinuationFrame:
		return c.onHeaderBlock(f.HeaderBlockFragment(), f.HeadersEnded())
	case *http2.RSTStreamFrame:
		c.mu.Lock()
		defer c.mu.Unlock()
		st := c.streams[f.StreamID]
		if st == nil {
			if f.StreamID > c.lastID {
				return errProtocol // RST_STREAM on an idle stream
			}
			return nil
		}
		st.ctx.cancel(errCanceled)
		c.endStreamLocked(st)
	case *http2.SettingsFrame:
		if !f.IsAck() {
			return c.onSettings(f)
		}
	case *http2.PingFrame:
		if !f.IsAck() {
			c.mu.Lock()
			c.ctrl = append(c.ctrl, ctrl{kind: ctrlPingAck, ping: f.Data})
			c.work.Signal()
			c.mu.Unlock()
		}
	case *http2.WindowUpdateFrame:
		return c.onWindowUpdate(f)
	case *http2.PriorityFrame:
		if f.StreamDep == f.StreamID {
			return http2.StreamError{StreamID: f.StreamID, Code: http2.ErrCodeProtocol}
		}
	case *http2.PushPromiseFrame:
		return errProtocol
	}
	return nil
}

// onSettings applies the client's SETTINGS and queues their ACK. The
// streams' windows are changed once a frame, for its last
// INITIAL_WINDOW_SIZE, under c.mu: a frame costs at most one walk of them.
func (c *conn) onSettings(f *http2.SettingsFrame) error {
	set, err := h2rules.ReadSettings(f)
	if err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if v, ok := set.Value(http2.SettingInitialWindowSize); ok && int64(v) != c.initWindow {
		delta := int64(v) - c.initWindow
		c.initWindow = int64(v)
		for _, st := range c.streams {
			if st.sendWindow += delta; st.sendWindow > 1<<31-1 {
				return http2.ConnectionError(http2.ErrCodeFlowControl)
			}
		}
	}
	if v, ok := set.Value(http2.SettingMaxFrameSize); ok {
		c.maxFrame = int(v)
	}
	c.ctrl = append(c.ctrl, ctrl{kind: ctrlSettingsAck})
	c.work.Signal()
	return nil
}

func (c *conn) onWindowUpdate(f *http2.WindowUpdateFrame) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if f.StreamID == 0 {
		if c.sendWindow += int64(f.Increment); c.sendWindow > 1<<31-1 {
			return http2.ConnectionError(http2.ErrCodeFlowControl)
		}
	} else if st := c.streams[f.StreamID]; st != nil {
		if st.sendWindow += int64(f.Increment); st.sendWindow > 1<<31-1 {
			c.resetLocked(st.id, http2.ErrCodeFlowControl)
		}
	} else if f.StreamID > c.lastID {
		return errProtocol // WINDOW_UPDATE on an idle stream
	}
	c.work.Signal()
	return nil
}

// resetStream sends RST_STREAM code for stream id, and ends the stream.
func (c *conn) resetStream(id uint32, code http2.ErrCode) {
	c.mu.Lock()
	c.resetLocked(id, code)
	c.mu.Unlock()
}

func (c *conn) resetLocked(id uint32, code http2.ErrCode) {
	if c.dead {
		return
	}
	c.ctrl = append(c.ctrl, ctrl{kind: ctrlRST, id: id, val: uint32(code)})
	c.sentResetLocked(id)
	c.work.Signal()
	if st := c.streams[id]; st != nil {
		st.ctx.cancel(errCanceled)
		c.endStreamLocked(st)
	}
}

// sentResetLocked notes that RST_STREAM is queued for stream id: DATA
// that comes on it after is dropped, as RFC 9113 5.1 says of frames on a
// stream the endpoint reset, since the client may have sent it before it
// read the reset. Only the last len(c.resets) streams are kept: DATA on
// one reset before is answered STREAM_CLOSED, which the client ignores.
func (c *conn) sentResetLocked(id uint32) {
	c.resets[c.resetsNext] = id
	c.resetsNext = (c.resetsNext + 1) % len(c.resets)
}

// endStreamLocked closes st, if open: it leaves the connection's streams,
// the request bytes it holds are given back and its unread messages
// dropped, its deadline timer is stopped, and the connection's reference
// is given back unless the writer still holds it pending. A draining
// connection with no stream left is closed.
func (c *conn) endStreamLocked(st *stream) {
	if st.closed {
		return
	}
	st.closed = true
	delete(c.streams, st.id)
	c.creditLocked(st.held)
	st.held, st.msgs, st.queued = 0, nil, 0
	if st.timed && st.timer.Stop() {
		st.timed = false
		st.release() // the timer's
	}
	st.wakeRecv()
	select {
	case st.sendWake <- struct{}{}:
	default:
	}
	if !st.inPending {
		st.release()
	}
	c.closeIfDoneLocked()
}

// closeIfDoneLocked has a draining connection closed once the frames
// queued are written, if no stream is open or being opened: a stream
// whose ID the reader took before the GOAWAY is counted in its last
// stream ID, so the client waits for its answer.
func (c *conn) closeIfDoneLocked() {
	if c.draining && len(c.streams) == 0 && !c.opening {
		c.closeAfter = true
		c.work.Signal()
	}
}

// creditLocked gives the client back n bytes of the connection's window,
// bytes that no stream holds any more, in a WINDOW_UPDATE sent once what
// is to be given back is half the window or as much as the client has
// left, whichever is less.
func (c *conn) creditLocked(n int64) {
	c.recvUnsent += n
	if c.recvUnsent == 0 || c.recvUnsent < c.recvAvail && c.recvUnsent < c.s.window/2 || c.dead {
		return
	}
	c.ctrl = append(c.ctrl, ctrl{kind: ctrlWindowUpdate, val: uint32(c.recvUnsent)})
	c.recvAvail += c.recvUnsent
	c.recvUnsent = 0
	c.work.Signal()
}

// dropLocked gives back the bytes st holds but those of the messages
// queued for its handler.
func (c *conn) dropLocked(st *stream) {
	if keep := int64(st.queued + 5*len(st.msgs)); st.held > keep {
		c.creditLocked(st.held - keep)
		st.held = keep
	}
}

// drain sends a GOAWAY: the streams opened so far are served, later ones
// refused, and the connection closes once none is left. A connection
// still in its handshake is closed.
func (c *conn) drain() {
	c.mu.Lock()
	if !c.ready {
		c.mu.Unlock()
		c.close(errors.New("server stopped before the handshake ended"))
		return
	}
	c.mu.Unlock()
	c.goAway(http2.ErrCodeNo)
}

// goAway sends a GOAWAY code, unless one was sent: the streams opened so
// far are served, later ones refused, and the connection closes once
// none is left.
func (c *conn) goAway(code http2.ErrCode) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.dead || c.draining {
		return
	}
	c.draining, c.goAwayID = true, c.lastID
	c.ctrl = append(c.ctrl, ctrl{kind: ctrlGoAway, id: c.lastID, val: uint32(code)})
	c.work.Signal()
	c.closeIfDoneLocked()
}

// ageOut drains c at its MaxConnectionAge, and closes it after the grace.
func (c *conn) ageOut() {
	c.drain()
	if g := c.s.cfg.MaxConnectionAgeGrace; g > 0 {
		c.mu.Lock()
		if !c.dead {
			c.graceTimer = time.AfterFunc(g, func() { c.close(errors.New("max connection age grace elapsed")) })
		}
		c.mu.Unlock()
	}
}

// idleChecks is how many times in an IdleTimeout a connection checks
// whether it has a call.
const idleChecks = 4

// idleCheck drains c once idleChecks checks in a row found no call open
// and none opened since the check before.
func (c *conn) idleCheck() {
	c.mu.Lock()
	if c.dead || c.draining {
		c.mu.Unlock()
		return
	}
	if len(c.streams) == 0 && c.running == 0 && !c.opening && c.lastID == c.idleMark {
		c.quiet++
	} else {
		c.quiet, c.idleMark = 0, c.lastID
	}
	idle := c.quiet >= idleChecks
	if !idle {
		c.idleTimer.Reset(c.s.idlePeriod)
	}
	c.mu.Unlock()
	if idleCheckHook != nil {
		idleCheckHook()
	}
	if idle {
		c.drain()
	}
}

// idleCheckHook, if set (by tests), runs after each idle check.
var idleCheckHook func()

// close closes the connection, if open, and cancels its calls.
func (c *conn) close(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.dead {
		return
	}
	c.dead = true
	for _, st := range c.pending {
		st.inPending = false
		if st.closed {
			st.release()
		}
	}
	c.pending = nil
	for _, st := range c.streams {
		st.ctx.cancel(errCanceled)
		c.endStreamLocked(st)
	}
	c.work.Broadcast()
	c.nc.Close()
}
