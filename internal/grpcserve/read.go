package grpcserve

import (
	"encoding/binary"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hotkeyd/hotkey/internal/h2rules"
)

// reqHeaders is what the server reads of a header block.
type reqHeaders struct {
	id                                           uint32
	end                                          bool // the HEADERS ended the stream
	size                                         int  // of the header list, as SETTINGS_MAX_HEADER_LIST_SIZE counts
	encoded                                      int  // bytes of the header block read
	method, path, contentType, encoding, timeout string
	hasTimeout                                   bool
	contentLength                                int64 // -1: none
	malformed                                    bool  // a field RFC 9113 8.2 and 8.3 say makes a request malformed (see onField), or a dependency on its own stream
	pseudo                                       uint8 // the pseudo-headers read, as bits: hasMethod...
	regular                                      bool  // a field not a pseudo-header was read
}

// The bits of reqHeaders.pseudo.
const (
	hasMethod = 1 << iota
	hasPath
	hasScheme
	hasAuthority
	hasRequired = hasMethod | hasPath | hasScheme
)

// onHeaderBlock decodes a fragment of a header block into c.hdr, and at
// the block's end acts on it. Every block is decoded, to keep the HPACK
// table in step with the client's; one of over twice MaxHeaderListSize
// bytes, which no client encodes for a list the server takes, ends the
// connection rather than be read to its end.
func (c *conn) onHeaderBlock(frag []byte, end bool) error {
	if c.hdr.encoded += len(frag); c.hdr.encoded > 2*int(c.s.cfg.MaxHeaderListSize) {
		return http2.ConnectionError(http2.ErrCodeEnhanceYourCalm)
	}
	if _, err := c.dec.Write(frag); err != nil {
		return http2.ConnectionError(http2.ErrCodeCompression)
	}
	if !end {
		return nil
	}
	if err := c.dec.Close(); err != nil {
		return http2.ConnectionError(http2.ErrCodeCompression)
	}
	return c.onHeaders(&c.hdr)
}

// onField is the HPACK decoder's: it keeps the fields a call reads, and
// finds the request malformed for a name or value not well formed, a
// connection-specific field, a te other than trailers, a content-length
// not a number or given twice, a pseudo-header not of a request, twice,
// or after a regular field.
func (c *conn) onField(f hpack.HeaderField) {
	h := &c.hdr
	if h.size += len(f.Name) + len(f.Value) + 32; h.size > int(c.s.cfg.MaxHeaderListSize) {
		return
	}
	if !h2rules.ValidFieldValue(f.Value) {
		h.malformed = true
	}
	var bit uint8
	switch f.Name {
	case ":method":
		h.method, bit = f.Value, hasMethod
	case ":path":
		h.path, bit = f.Value, hasPath
	case ":scheme":
		bit = hasScheme
	case ":authority":
		bit = hasAuthority
	case "content-type":
		h.contentType = f.Value
	case "grpc-encoding":
		h.encoding = f.Value
	case "grpc-timeout":
		h.timeout, h.hasTimeout = f.Value, true
	case "te":
		if f.Value != "trailers" {
			h.malformed = true
		}
	case "content-length":
		n, err := strconv.ParseUint(f.Value, 10, 63)
		if err != nil || h.contentLength >= 0 {
			h.malformed = true
		}
		h.contentLength = int64(n)
	case "connection", "keep-alive", "proxy-connection", "transfer-encoding", "upgrade":
		h.malformed = true
	default:
		if f.IsPseudo() {
			h.malformed = true
			return
		}
		if !h2rules.ValidFieldName(f.Name) {
			h.malformed = true
		}
	}
	if bit == 0 {
		h.regular = true
		return
	}
	if h.regular || h.pseudo&bit != 0 {
		h.malformed = true
	}
	h.pseudo |= bit
}

// onHeaders opens a stream for a call, or answers it at once when it
// cannot be made, and tallies which it did; a header block on an open
// stream, its trailers, ends the client's side, or resets the stream if
// it is malformed or does not end it.
func (c *conn) onHeaders(h *reqHeaders) error {
	id, end := h.id, h.end
	c.mu.Lock()
	st := c.streams[id]
	if st != nil {
		st.refs.Add(1) // the reader's
	}
	c.mu.Unlock()
	if st != nil {
		defer st.release()
		if !end || h.malformed {
			c.resetStream(id, http2.ErrCodeProtocol)
			return nil
		}
		c.endOfStream(st)
		return nil
	}
	if id%2 == 0 || id <= c.lastID {
		return errProtocol
	}
	o, err := c.open(h)
	if err != nil {
		return err
	}
	return c.tally(o)
}

// callOutcome is what became of a call whose HEADERS opened a new stream
// ID.
type callOutcome uint8

const (
	callServed     callOutcome = iota // a stream opened
	callRefused                       // answered or reset at once: the call cannot be made
	callTurnedAway                    // reset REFUSED_STREAM: the stream cap is reached, or a GOAWAY sent
)

// maxRefused is how far a connection's calls refused before a stream
// opens may outrun the calls it served: each refused call counts one up,
// each served call one down, never below 0. Past maxRefused the client is
// sent a GOAWAY ENHANCE_YOUR_CALM, and the connection closes once its
// streams end; past twice maxRefused it is closed at once. So a client
// that sends calls no stream is opened for, each read, decoded and
// answered at its pace, cannot take more of the server's time than the
// calls it has served did; one with a refused call now and then among
// its served ones keeps its connection. Calls turned away count only
// past maxRefused: a client that respects the stream cap may still meet
// it while the handlers of the calls it cancelled run.
const maxRefused = 100

// tally counts a call's outcome against maxRefused; an error ends the
// connection.
func (c *conn) tally(o callOutcome) error {
	switch {
	case o == callServed:
		c.refused = max(c.refused-1, 0)
		return nil
	case o == callTurnedAway && c.refused <= maxRefused:
		return nil
	}
	switch c.refused++; {
	case c.refused > 2*maxRefused:
		return http2.ConnectionError(http2.ErrCodeEnhanceYourCalm)
	case c.refused > maxRefused:
		c.goAway(http2.ErrCodeEnhanceYourCalm)
	}
	return nil
}

// open opens a stream for the call h, whose ID is new, or answers it at
// once when it cannot be made, and says which it did.
func (c *conn) open(h *reqHeaders) (callOutcome, error) {
	id, end := h.id, h.end
	c.mu.Lock()
	c.lastID, c.opening = id, true
	max := int(c.s.cfg.MaxConcurrentStreams)
	refuse := c.draining || len(c.streams) >= max || c.running >= max
	c.mu.Unlock()
	defer c.opened()
	if openingHook != nil {
		openingHook()
	}
	switch {
	case refuse:
		c.resetStream(id, http2.ErrCodeRefusedStream)
		return callTurnedAway, nil
	case h.size > int(c.s.cfg.MaxHeaderListSize):
		c.resetStream(id, http2.ErrCodeFrameSize)
		return callRefused, nil
	case h.malformed || h.pseudo&hasRequired != hasRequired || h.path == "":
		c.resetStream(id, http2.ErrCodeProtocol)
		return callRefused, nil
	}
	httpMethod, path, contentType, encoding, timeout, hasTimeout := h.method, h.path, h.contentType, h.encoding, h.timeout, h.hasTimeout
	if !isGRPC(contentType) {
		c.abort(id, http.StatusUnsupportedMediaType, status.Newf(codes.InvalidArgument, "invalid gRPC request content-type %q", clip(contentType)), end)
		return callRefused, nil
	}
	if httpMethod != http.MethodPost {
		c.abort(id, http.StatusMethodNotAllowed, status.Newf(codes.Internal, "Received a HEADERS frame with :method %q which should be POST", clip(httpMethod)), end)
		return callRefused, nil
	}
	var d time.Duration
	if hasTimeout {
		var err error
		if d, err = parseTimeout(timeout); err != nil {
			c.abort(id, http.StatusBadRequest, status.Newf(codes.Internal, "malformed grpc-timeout: %q", clip(timeout)), end)
			return callRefused, nil
		}
	}
	m, msg := c.s.lookup(path)
	if m == nil {
		c.abort(id, http.StatusOK, status.New(codes.Unimplemented, msg), end)
		return callRefused, nil
	}
	if encoding != "" && encoding != "identity" {
		c.abort(id, http.StatusOK, status.Newf(codes.Unimplemented, "grpc: Decompressor is not installed for grpc-encoding %q", clip(encoding)), end)
		return callRefused, nil
	}
	st := c.s.newStream(c, id, m)
	st.refs.Add(1) // the reader's
	defer st.release()
	c.mu.Lock()
	if c.dead {
		// Closed since the frame was read: close cancelled the streams
		// it found, and would not cancel this one.
		c.mu.Unlock()
		st.release() // the connection's
		return callRefused, errClosed
	}
	st.sendWindow = c.initWindow
	st.dataLeft = h.contentLength
	c.streams[id] = st
	if hasTimeout {
		st.ctx.deadline = st.begin.Add(d)
		st.refs.Add(1)
		st.timed = true
		st.tc.Store(c)
		if st.timer == nil {
			st.timer = time.AfterFunc(d, st.expire)
		} else {
			st.timer.Reset(d)
		}
	}
	c.mu.Unlock()
	if m.stream != nil {
		c.dispatch(st)
	}
	if end {
		c.endOfStream(st)
	}
	return callServed, nil
}

// opened ends what onHeaders took on with a stream's ID: the stream is
// open, or its answer or reset queued.
func (c *conn) opened() {
	c.mu.Lock()
	c.opening = false
	c.closeIfDoneLocked()
	c.mu.Unlock()
}

// openingHook, if set (by tests), runs while the reader has taken a
// stream's ID and not yet opened it.
var openingHook func()

// isGRPC reports whether ct is a gRPC content-type: application/grpc,
// alone or with a subtype after '+' or ';'.
func isGRPC(ct string) bool {
	rest, ok := strings.CutPrefix(ct, "application/grpc")
	return ok && (rest == "" || rest[0] == '+' || rest[0] == ';')
}

// abort answers stream id with s alone, under HTTP status code, and
// resets the stream unless the client ended it.
func (c *conn) abort(id uint32, code int, s *status.Status, ended bool) {
	var b []byte
	if code == http.StatusOK {
		b = append(b, respHeaders...)
	} else {
		b = appendLiteral(b, 8, "", strconv.Itoa(code))
		b = appendLiteral(b, 31, "", "application/grpc")
	}
	b = appendStatus(b, s)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.dead {
		return
	}
	c.ctrl = append(c.ctrl, ctrl{kind: ctrlHeaders, id: id, block: b})
	c.ctrlBlocks += len(b)
	if !ended {
		c.ctrl = append(c.ctrl, ctrl{kind: ctrlRST, id: id, val: uint32(http2.ErrCodeNo)})
		c.sentResetLocked(id)
	}
	c.work.Signal()
}

// expire ends st at its deadline: its context is done, and it is
// answered DEADLINE_EXCEEDED unless it was answered before.
func (st *stream) expire() {
	c := st.tc.Load()
	c.mu.Lock()
	st.timed = false
	if !st.closed {
		st.ctx.cancel(errDeadline)
		if st.trailer == nil {
			c.finishLocked(st, status.New(codes.DeadlineExceeded, errDeadline.Error()))
		}
	}
	c.mu.Unlock()
	st.release() // the timer's
}

// dispatch runs st's handler on a worker, unless st was closed (reset,
// expired, or its connection closed). The handlers running count against
// the stream cap, so that a client that resets its calls as it makes them
// cannot have more handlers run than it may open streams.
func (c *conn) dispatch(st *stream) {
	st.dispatched = true
	c.mu.Lock()
	closed := st.closed
	if !closed {
		c.running++
	}
	// A unary call's request is its handler's now; a stream's DATA has
	// not come yet.
	c.creditLocked(st.held)
	st.held = 0
	c.mu.Unlock()
	if !closed {
		st.refs.Add(1) // the handler's
		c.s.run(st)
	}
}

// endOfStream acts on the client's end of st: a unary call is run.
func (c *conn) endOfStream(st *stream) {
	c.mu.Lock()
	if st.recvEnded {
		c.mu.Unlock()
		c.resetStream(st.id, http2.ErrCodeStreamClosed)
		return
	}
	if st.dataLeft > 0 {
		c.resetLocked(st.id, http2.ErrCodeProtocol)
		c.mu.Unlock()
		return
	}
	st.recvEnded = true
	switch {
	case st.recvErr != nil:
	case st.prefixN > 0:
		st.recvErr = status.Errorf(codes.Internal, "grpc: the request's last message is truncated: %d of %d bytes", len(st.msg), st.want)
	case st.m.unary != nil && !st.got:
		st.recvErr = status.Error(codes.Internal, "grpc: the request has no message")
	}
	c.recvDone(st)
}

// recvDone wakes st's reader, unlocks c.mu, and runs st's call if it is
// a unary one not run yet: its request is whole, or failed.
func (c *conn) recvDone(st *stream) {
	st.wakeRecv()
	c.mu.Unlock()
	if st.m.unary != nil && !st.dispatched {
		c.dispatch(st)
	}
}

// onData adds f's bytes to their stream's messages. The connection's
// window is given back only for bytes no longer held: dropped (padding,
// a stream reset or in error, a unary call's once its handler runs), or,
// for a message kept, once its call's handler has it; so the request
// bytes a connection holds are bounded by the window. The stream's
// window is given back as the bytes are read, once half of it is used.
func (c *conn) onData(f *http2.DataFrame) error {
	n, data := int64(f.Length), f.Data()
	c.mu.Lock()
	if n > c.recvAvail {
		c.mu.Unlock()
		return http2.ConnectionError(http2.ErrCodeFlowControl)
	}
	c.recvAvail -= n
	st := c.streams[f.StreamID]
	if st == nil {
		idle := f.StreamID > c.lastID
		c.creditLocked(n)
		if !idle && !slices.Contains(c.resets[:], f.StreamID) {
			// A stream error STREAM_CLOSED (RFC 9113 5.1), once: the
			// reset is noted, and later DATA on the stream dropped.
			c.resetLocked(f.StreamID, http2.ErrCodeStreamClosed)
		}
		c.mu.Unlock()
		if idle {
			return errProtocol
		}
		return nil
	}
	if st.recvEnded {
		c.creditLocked(n)
		c.resetLocked(st.id, http2.ErrCodeStreamClosed)
		c.mu.Unlock()
		return nil
	}
	st.refs.Add(1) // the reader's, while it reads into st unlocked
	defer st.release()
	if st.recvAvail -= n; st.recvAvail < 0 {
		c.creditLocked(n)
		c.resetLocked(st.id, http2.ErrCodeFlowControl)
		c.mu.Unlock()
		return nil
	}
	if st.dataLeft >= 0 {
		if st.dataLeft -= int64(len(data)); st.dataLeft < 0 {
			c.creditLocked(n)
			c.resetLocked(st.id, http2.ErrCodeProtocol)
			c.mu.Unlock()
			return nil
		}
	}
	if st.discard || st.dispatched && st.m.unary != nil {
		c.creditLocked(n)
	} else {
		st.held += int64(len(data))
		c.creditLocked(n - int64(len(data)))
	}
	if !f.StreamEnded() {
		if st.recvUnsent += n; st.recvUnsent >= streamWindow/2 {
			c.ctrl = append(c.ctrl, ctrl{kind: ctrlWindowUpdate, id: st.id, val: uint32(st.recvUnsent)})
			st.recvAvail += st.recvUnsent
			st.recvUnsent = 0
			c.work.Signal()
		}
	}
	c.mu.Unlock()
	if !st.discard {
		if err := c.read(st, data); err != nil {
			st.discard = true
			c.mu.Lock()
			if st.recvErr == nil {
				st.recvErr = err
			}
			st.msg = nil
			c.dropLocked(st)
			c.recvDone(st)
		}
	}
	if f.StreamEnded() {
		c.endOfStream(st)
	}
	return nil
}

// read adds b, bytes of a request's DATA, to st's messages.
func (c *conn) read(st *stream, b []byte) error {
	for len(b) > 0 {
		if st.prefixN < 5 {
			k := copy(st.prefix[st.prefixN:], b)
			st.prefixN += k
			b = b[k:]
			if st.prefixN < 5 {
				return nil
			}
			if st.got && st.m.unary != nil {
				return status.Error(codes.Internal, "grpc: a unary call's request has more than one message")
			}
			switch st.prefix[0] {
			case 0:
			case 1:
				return status.Error(codes.Internal, "grpc: compressed flag set with identity or empty encoding")
			default:
				return status.Errorf(codes.Internal, "grpc: received unexpected payload format %d", st.prefix[0])
			}
			st.want = int(binary.BigEndian.Uint32(st.prefix[1:]))
			if st.want > c.s.cfg.MaxRecvMsgSize {
				return status.Errorf(codes.ResourceExhausted, "grpc: received message larger than max (%d vs. %d)", st.want, c.s.cfg.MaxRecvMsgSize)
			}
			st.msg = st.msg[:0]
		}
		k := min(len(b), st.want-len(st.msg))
		if len(st.msg)+k > cap(st.msg) {
			st.msg = grow(st.msg, len(st.msg)+k, st.want)
		}
		st.msg = append(st.msg, b[:k]...)
		b = b[k:]
		if len(st.msg) == st.want {
			c.gotMessage(st)
		}
	}
	return nil
}

// grow returns b, with its bytes, in a buffer of room for n bytes or
// more: twice b's, or 512 bytes, if more, but never more than size, the
// message's. So a message's buffer is at most about twice the bytes that
// came of it, whatever its prefix announced.
func grow(b []byte, n, size int) []byte {
	nb := make([]byte, len(b), min(size, max(n, 2*cap(b), 512)))
	copy(nb, b)
	return nb
}

// gotMessage keeps st's message, whole: a unary call's for its handler, a
// stream's in its queue for RecvMsg.
func (c *conn) gotMessage(st *stream) {
	st.prefixN = 0
	if st.m.unary != nil {
		st.got = true
		return
	}
	c.mu.Lock()
	if st.discard || st.queued+len(st.msg) > c.s.cfg.MaxRecvMsgSize {
		// Dropped, and so is the rest of the stream's DATA: a handler
		// that does not read must not let its client fill the memory.
		st.discard = true
		if st.recvErr == nil {
			st.recvErr = status.Error(codes.ResourceExhausted, fmt.Sprintf("grpc: over %d bytes of messages received and not read", c.s.cfg.MaxRecvMsgSize))
		}
		st.msg = nil
		c.dropLocked(st)
	} else {
		st.msgs = append(st.msgs, st.msg)
		st.queued += len(st.msg)
		st.msg = nil
	}
	st.wakeRecv()
	c.mu.Unlock()
}
