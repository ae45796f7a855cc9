package grpcserve

import (
	"context"
	"encoding/binary"
	"io"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/stats"
	"google.golang.org/grpc/status"
)

// stream is one call. It is pooled: the connection, its handler, its
// deadline timer and each writer round that holds it count a reference
// (refs), and the last to let go puts it back.
type stream struct {
	c     *conn
	m     *method
	id    uint32
	ctx   *callCtx // not pooled: a handler may keep it
	begin time.Time
	refs  atomic.Int32
	timer *time.Timer          // ends the call at its deadline (expire); made once, reset for each call
	timed bool                 // under conn.mu: timer is set for this call
	tc    atomic.Pointer[conn] // c, for expire

	// Owned by the reader.
	dispatched bool  // its handler was run
	discard    bool  // a request error was found: its DATA is dropped
	got        bool  // unary: the message is whole
	dataLeft   int64 // of the request's content-length, the bytes of DATA yet to come; -1: none was given
	recvAvail  int64
	recvUnsent int64
	prefix     [5]byte
	prefixN    int
	want       int
	msg        []byte // the message being read; a unary call's for its handler once run

	// Under conn.mu.
	recvEnded  bool // the client ended its side
	recvErr    error
	msgs       [][]byte // a stream's messages not yet received
	queued     int      // bytes in msgs
	held       int64    // bytes of DATA counted against the connection's window, not yet given back
	closed     bool
	inPending  bool
	sendWindow int64
	wantHdr    bool // SendHeader was called
	hdrSent    bool
	out        []byte // messages to send, with their prefixes
	sent       int    // bytes of out written or planned
	trailer    []byte // set when the call has ended
	tbuf       []byte // the trailers, unless okTrailers or okAlone

	recvWake chan struct{} // a message, an error or the end came
	sendWake chan struct{} // out was written

	// Owned by the handler.
	tag     stats.RPCTagInfo
	statBeg stats.Begin
	statEnd stats.End
	dec     func(any) error // decode, made once
	bs      mem.BufferSlice
	rbuf    []byte // a unary call's answer, until finish swaps it with out
}

var _ grpc.ServerStream = (*serverStream)(nil)

var streams = sync.Pool{New: func() any {
	st := &stream{recvWake: make(chan struct{}, 1), sendWake: make(chan struct{}, 1), bs: make(mem.BufferSlice, 1)}
	st.dec = st.decode
	return st
}}

// newStream returns stream id of c for a call of m, holding the
// connection's reference.
func (s *Server) newStream(c *conn, id uint32, m *method) *stream {
	st := streams.Get().(*stream)
	st.c, st.m, st.id = c, m, id
	st.begin = time.Now()
	st.ctx = &callCtx{vals: c.ctx}
	st.refs.Store(1)
	st.timed = false
	st.dispatched, st.discard, st.got = false, false, false
	st.recvAvail, st.recvUnsent = streamWindow, 0
	st.prefixN, st.want, st.msg = 0, 0, st.msg[:0]
	st.recvEnded, st.recvErr, st.msgs, st.queued, st.held = false, nil, nil, 0, 0
	st.closed, st.inPending, st.wantHdr, st.hdrSent = false, false, false, false
	st.out, st.sent, st.trailer = st.out[:0], 0, nil
	select {
	case <-st.recvWake:
	default:
	}
	select {
	case <-st.sendWake:
	default:
	}
	return st
}

// release lets go of a reference to st, and puts it back if it was the
// last.
func (st *stream) release() {
	if st.refs.Add(-1) != 0 {
		return
	}
	if cap(st.msg) > 64<<10 {
		st.msg = nil
		st.bs[0] = nil
	}
	if cap(st.out) > 64<<10 {
		st.out = nil
	}
	if cap(st.rbuf) > 64<<10 {
		st.rbuf = nil
	}
	st.c, st.m, st.ctx, st.recvErr, st.msgs = nil, nil, nil, nil, nil
	streams.Put(st)
}

// call runs st's handler on a worker, then writes its status.
func (st *stream) call() {
	s := st.c.s
	var ctx context.Context = st.ctx
	sh := s.cfg.StatsHandler
	if sh != nil {
		st.tag = stats.RPCTagInfo{FullMethodName: st.m.name}
		ctx = sh.TagRPC(ctx, &st.tag)
		st.statBeg = stats.Begin{BeginTime: st.begin, IsClientStream: st.m.stream != nil && st.m.stream.ClientStreams, IsServerStream: st.m.stream != nil && st.m.stream.ServerStreams}
		sh.HandleRPC(ctx, &st.statBeg)
	}
	var err error
	if st.m.unary != nil {
		var reply any
		if reply, err = st.m.unary(st.m.srv, ctx, st.dec, nil); err == nil {
			err = st.reply(reply)
		}
	} else {
		err = st.m.stream.Handler(st.m.srv, &serverStream{st: st, ctx: ctx})
	}
	st.finish(err)
	if sh != nil {
		st.statEnd = stats.End{BeginTime: st.begin, EndTime: time.Now(), Error: err}
		sh.HandleRPC(ctx, &st.statEnd)
		st.statEnd.Error = nil
	}
	st.ctx.cancel(errCanceled)
	st.release() // the handler's
}

// decode is a unary handler's dec: it unmarshals the request into v.
func (st *stream) decode(v any) error {
	if st.recvErr != nil {
		return st.recvErr
	}
	return st.unmarshal(st.msg, v)
}

func (st *stream) unmarshal(b []byte, v any) error {
	if bu := st.c.s.bu; bu != nil {
		if ok, err := bu.UnmarshalBorrowed(b, v); ok {
			if err != nil {
				return status.Errorf(codes.Internal, "grpc: error unmarshalling request: %v", err)
			}
			return nil
		}
	}
	if sb, _ := st.bs[0].(mem.SliceBuffer); st.bs[0] == nil || len(sb) != len(b) || len(b) > 0 && &sb[0] != &b[0] {
		st.bs[0] = mem.SliceBuffer(b)
	}
	if err := st.c.s.cfg.Codec.Unmarshal(st.bs, v); err != nil {
		return status.Errorf(codes.Internal, "grpc: error unmarshalling request: %v", err)
	}
	return nil
}

// reply marshals a unary call's answer into st.rbuf, with its prefix.
func (st *stream) reply(v any) error {
	b, err := st.c.s.marshal(st.rbuf[:0], v)
	st.rbuf = b
	return err
}

// marshal appends v with its 5-byte prefix to b.
func (s *Server) marshal(b []byte, v any) ([]byte, error) {
	b = append(b, 0, 0, 0, 0, 0)
	ok := false
	var err error
	if s.app != nil {
		b, ok, err = s.app.AppendMarshal(b, v)
	}
	if !ok && err == nil {
		var data mem.BufferSlice
		if data, err = s.cfg.Codec.Marshal(v); err == nil {
			for _, d := range data {
				b = append(b, d.ReadOnlyData()...)
			}
			data.Free()
		}
	}
	if err != nil {
		return b[:0], status.Errorf(codes.Internal, "grpc: error while marshaling: %v", err)
	}
	n := len(b) - 5
	if n > math.MaxUint32 {
		return b[:0], status.Errorf(codes.ResourceExhausted, "grpc: message of %d bytes is over gRPC's largest", n)
	}
	binary.BigEndian.PutUint32(b[1:5], uint32(n))
	return b, nil
}

// finish queues st's status, err's, and a unary call's answer, for the
// writer, unless the call ended before. Its handler has returned.
func (st *stream) finish(err error) {
	c := st.c
	c.mu.Lock()
	defer c.mu.Unlock()
	c.running-- // before the trailers can be written, and the client open another stream
	if st.closed || c.dead || st.trailer != nil {
		return
	}
	if err == nil && st.m.unary != nil {
		st.out, st.rbuf = st.rbuf, st.out[:0]
	}
	c.finishLocked(st, status.Convert(err))
}

// finishLocked queues st's status s, its trailers, for the writer: alone
// (trailers-only) if nothing was written or is to be written before.
func (c *conn) finishLocked(st *stream, s *status.Status) {
	ok := s.Code() == codes.OK
	alone := !st.hdrSent && !st.wantHdr && (len(st.out) == 0 || !ok)
	if !ok && !st.hdrSent {
		st.out, st.sent = st.out[:0], 0
	}
	switch {
	case ok && !alone:
		st.trailer = okTrailers
	case ok:
		st.trailer = okAlone
	case alone:
		st.tbuf = appendStatus(append(st.tbuf[:0], respHeaders...), s)
		st.trailer = st.tbuf
	default:
		st.tbuf = appendStatus(st.tbuf[:0], s)
		st.trailer = st.tbuf
	}
	c.queueLocked(st)
}

// okAlone is the answer of a call that succeeded with no message.
var okAlone = append(append([]byte(nil), respHeaders...), okTrailers...)

// queueLocked hands st to the writer.
func (c *conn) queueLocked(st *stream) {
	if !st.inPending {
		st.inPending = true
		c.pending = append(c.pending, st)
	}
	c.work.Signal()
}

var (
	errCanceled = context.Canceled
	errDeadline = context.DeadlineExceeded
)

// sendBuffered bounds the bytes a stream's SendMsg queues before it
// waits for the writer.
const sendBuffered = 64 << 10

// serverStream is the grpc.ServerStream of a streaming call's handler.
// Metadata is not sent: SetHeader, SendHeader and SetTrailer only mark
// the headers to be sent.
type serverStream struct {
	st  *stream
	ctx context.Context
}

func (ss *serverStream) Context() context.Context { return ss.ctx }

func (ss *serverStream) SetHeader(metadata.MD) error { return nil }

func (ss *serverStream) SendHeader(metadata.MD) error {
	c := ss.st.c
	c.mu.Lock()
	defer c.mu.Unlock()
	if ss.st.wantHdr || ss.st.hdrSent {
		return status.Error(codes.Internal, "transport: the stream is done or SendHeader was already called")
	}
	ss.st.wantHdr = true
	c.queueLocked(ss.st)
	return nil
}

func (ss *serverStream) SetTrailer(metadata.MD) {}

// SendMsg queues m, and waits while over sendBuffered bytes are queued.
func (ss *serverStream) SendMsg(m any) error {
	st, c := ss.st, ss.st.c
	b, err := c.s.marshal(nil, m)
	if err != nil {
		return err
	}
	c.mu.Lock()
	for !st.closed && !c.dead && len(st.out)-st.sent > sendBuffered && st.ctx.Err() == nil {
		c.mu.Unlock()
		select {
		case <-st.sendWake:
		case <-st.ctx.Done():
		}
		c.mu.Lock()
	}
	if st.closed || c.dead || st.ctx.Err() != nil {
		c.mu.Unlock()
		return status.Error(codes.Canceled, "grpc: the stream is closed")
	}
	st.out = append(st.out, b...)
	c.queueLocked(st)
	c.mu.Unlock()
	return nil
}

// RecvMsg reads the next message into m; io.EOF once the client ended its
// side.
func (ss *serverStream) RecvMsg(m any) error {
	st, c := ss.st, ss.st.c
	for {
		c.mu.Lock()
		if len(st.msgs) > 0 {
			b := st.msgs[0]
			st.msgs[0] = nil
			st.msgs = st.msgs[1:]
			st.queued -= len(b)
			k := min(st.held, int64(5+len(b)))
			st.held -= k
			c.creditLocked(k)
			c.mu.Unlock()
			return st.unmarshal(b, m)
		}
		err := st.recvErr
		ended, closed := st.recvEnded, st.closed
		c.mu.Unlock()
		switch {
		case err != nil:
			return err
		case ended:
			return io.EOF
		case closed:
			return status.Error(codes.Canceled, "grpc: the stream is closed")
		}
		select {
		case <-st.recvWake:
		case <-st.ctx.Done():
		}
	}
}

// wakeRecv tells st's reader, if waiting, that a message, an error or the
// end of the request came. The caller holds conn.mu.
func (st *stream) wakeRecv() {
	select {
	case st.recvWake <- struct{}{}:
	default:
	}
}
