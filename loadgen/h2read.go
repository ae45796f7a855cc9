package loadgen

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"strings"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"

	"github.com/hotkeyd/hotkey/internal/h2rules"
)

// readLoop reads frames and hands each to its call until the connection
// fails or is closed.
func (c *GRPCConn) readLoop() {
	defer c.wg.Done()
	for {
		f, err := c.fr.ReadFrame()
		if err == nil {
			err = c.dispatch(f)
		} else if se, ok := errors.AsType[http2.StreamError](err); ok {
			c.mu.Lock()
			cl := c.streams[se.StreamID]
			c.mu.Unlock()
			if cl != nil {
				c.end(cl, grpcstatus.Errorf(codes.Internal, "HTTP/2 stream error: %v", se), true)
			}
			continue
		}
		if err != nil {
			c.fail(c.brokenErr(err))
			return
		}
	}
}

// dispatch acts on a frame the reader read; an error breaks the
// connection.
func (c *GRPCConn) dispatch(f http2.Frame) error {
	switch f := f.(type) {
	case *http2.DataFrame:
		return c.onData(f)
	case *http2.HeadersFrame:
		c.mu.Lock()
		c.hcall = c.streams[f.StreamID]
		c.mu.Unlock()
		c.hEnd = f.StreamEnded()
		return c.onHeaderBlock(f.HeaderBlockFragment(), f.HeadersEnded())
	case *http2.ContinuationFrame:
		return c.onHeaderBlock(f.HeaderBlockFragment(), f.HeadersEnded())
	case *http2.RSTStreamFrame:
		c.mu.Lock()
		if cl := c.streams[f.StreamID]; cl != nil {
			code, ok := rstCodes[f.ErrCode]
			if !ok {
				code = codes.Unknown
			}
			cl.byReader = true
			c.finishLocked(cl, grpcstatus.Errorf(code, "stream terminated by RST_STREAM with error code: %v", f.ErrCode))
		}
		c.mu.Unlock()
	case *http2.SettingsFrame:
		if !f.IsAck() {
			return c.settings(f)
		}
	case *http2.PingFrame:
		if !f.IsAck() {
			c.mu.Lock()
			c.ctrl = append(c.ctrl, h2ctrl{kind: ctrlPingAck, ping: f.Data})
			c.work.Signal()
			c.mu.Unlock()
		}
	case *http2.WindowUpdateFrame:
		c.mu.Lock()
		defer c.mu.Unlock()
		if f.StreamID == 0 {
			if c.sendWindow += int64(f.Increment); c.sendWindow > math.MaxInt32 {
				return errors.New("server overflowed the connection's send window")
			}
		} else if cl := c.streams[f.StreamID]; cl != nil {
			cl.sendWindow += int64(f.Increment)
		}
		c.work.Signal()
	case *http2.GoAwayFrame:
		c.onGoAway(f)
	case *http2.PushPromiseFrame:
		return errors.New("server sent PUSH_PROMISE, which this client's SETTINGS disabled")
	}
	return nil
}

// settings applies the server's SETTINGS, and queues their ACK.
func (c *GRPCConn) settings(f *http2.SettingsFrame) error {
	set, err := h2rules.ReadSettings(f)
	if err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	ack := h2ctrl{kind: ctrlSettingsAck}
	if v, ok := set.Value(http2.SettingMaxConcurrentStreams); ok {
		c.maxStreams = int(min(v, math.MaxInt32))
	}
	if v, ok := set.Value(http2.SettingInitialWindowSize); ok && int64(v) != c.initWindow {
		delta := int64(v) - c.initWindow
		c.initWindow = int64(v)
		for _, cl := range c.streams {
			cl.sendWindow += delta
		}
	}
	if v, ok := set.Value(http2.SettingMaxFrameSize); ok {
		c.maxFrame = int(v)
	}
	if v, ok := set.Value(http2.SettingHeaderTableSize); ok {
		ack.table, ack.val = true, v
	}
	for len(c.waiting) > 0 && c.active < c.maxStreams && c.goaway == nil {
		cl := c.waiting[0]
		c.waiting = c.waiting[1:]
		c.active++
		c.queueLocked(cl)
		cl.done <- struct{}{}
	}
	c.ctrl = append(c.ctrl, ack)
	c.work.Signal()
	return nil
}

// onGoAway refuses new calls, and fails those the server will not answer:
// the ones waiting or queued, and those on streams above its last.
func (c *GRPCConn) onGoAway(f *http2.GoAwayFrame) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.goaway == nil {
		c.goaway = grpcstatus.Errorf(codes.Unavailable, "server %s is going away (GOAWAY %v)", c.authority, f.ErrCode)
		c.refusing.Store(true)
	}
	for _, cl := range c.waiting {
		cl.state, cl.err = callDone, c.goaway
		cl.done <- struct{}{}
	}
	c.waiting = nil
	for _, cl := range c.queued {
		c.finishLocked(cl, c.goaway)
	}
	for id, cl := range c.streams {
		if id > f.LastStreamID {
			cl.byReader = true
			c.finishLocked(cl, c.goaway)
		}
	}
}

// onData adds f's message bytes to its call, and gives the windows back
// once half of one is used.
func (c *GRPCConn) onData(f *http2.DataFrame) error {
	n := int64(f.Length)
	if n > c.recvAvail {
		return errors.New("server overflowed the connection's flow-control window")
	}
	c.recvAvail -= n
	c.recvUnsent += n
	c.mu.Lock()
	if c.recvUnsent >= h2ConnWindow/2 {
		c.ctrl = append(c.ctrl, h2ctrl{kind: ctrlWindowUpdate, val: uint32(c.recvUnsent)})
		c.recvAvail += c.recvUnsent
		c.recvUnsent = 0
		c.work.Signal()
	}
	cl := c.streams[f.StreamID]
	if cl != nil && !f.StreamEnded() {
		if cl.recvUnsent += n; cl.recvUnsent >= h2StreamWindow/2 {
			c.ctrl = append(c.ctrl, h2ctrl{kind: ctrlWindowUpdate, id: f.StreamID, val: uint32(cl.recvUnsent)})
			cl.recvUnsent = 0
			c.work.Signal()
		}
	}
	c.mu.Unlock()
	switch {
	case cl == nil:
	case !cl.headers:
		c.end(cl, grpcstatus.Error(codes.Internal, "server sent DATA before HEADERS"), !f.StreamEnded())
	default:
		if err := cl.read(f.Data()); err != nil {
			c.end(cl, err, !f.StreamEnded())
		} else if f.StreamEnded() {
			c.end(cl, grpcstatus.Error(codes.Internal, "server closed the stream without sending trailers"), false)
		}
	}
	return nil
}

// onHeaderBlock decodes a fragment of a header block into c.hcall, and
// at the block's end acts on it. Every block is decoded, a call's or not,
// to keep the HPACK table in step with the server's.
func (c *GRPCConn) onHeaderBlock(frag []byte, end bool) error {
	if _, err := c.dec.Write(frag); err != nil {
		return fmt.Errorf("decoding headers: %w", err)
	}
	if !end {
		return nil
	}
	if err := c.dec.Close(); err != nil {
		return fmt.Errorf("decoding headers: %w", err)
	}
	cl := c.hcall
	c.hcall = nil
	if cl == nil {
		return nil
	}
	if cl.malformed {
		c.end(cl, grpcstatus.Error(codes.Internal, "malformed header field: a name or value RFC 9113 8.2.1 forbids"), !c.hEnd)
		return nil
	}
	if !cl.headers {
		if len(cl.httpStatus) == 3 && cl.httpStatus[0] == '1' && !c.hEnd {
			cl.httpStatus = "" // informational: the answer's headers follow
			return nil
		}
		cl.headers = true
		if err := headerErr(cl.httpStatus, cl.contentType); err != nil {
			c.end(cl, err, !c.hEnd)
			return nil
		}
		if !c.hEnd {
			return nil
		}
	} else if !c.hEnd {
		c.end(cl, grpcstatus.Error(codes.Internal, "a HEADERS frame cannot appear in the middle of a stream"), true)
		return nil
	}
	c.end(cl, cl.trailerErr(), false)
	return nil
}

// onField is the HPACK decoder's: it keeps what a call reads of its
// headers and trailers, and whether a field is not well formed.
func (c *GRPCConn) onField(f hpack.HeaderField) {
	cl := c.hcall
	if cl == nil {
		return
	}
	if !h2rules.ValidFieldValue(f.Value) || !f.IsPseudo() && !h2rules.ValidFieldName(f.Name) {
		cl.malformed = true
	}
	switch f.Name {
	case ":status":
		cl.httpStatus = f.Value
	case "content-type":
		cl.contentType = f.Value
	case "grpc-status":
		cl.grpcStatus = f.Value
	case "grpc-message":
		cl.grpcMessage = f.Value
	case "grpc-encoding":
		cl.encoding = f.Value
	}
}

// end ends cl, from the reader, with err (nil for its answer); rst
// resets its stream, which the server has not ended, as does a request
// not all sent.
func (c *GRPCConn) end(cl *h2call, err error, rst bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if cl.state != callSent {
		return
	}
	if rst || cl.sent < len(cl.req) {
		c.ctrl = append(c.ctrl, h2ctrl{kind: ctrlRST, id: cl.id, val: uint32(http2.ErrCodeCancel)})
		c.work.Signal()
	}
	cl.byReader = true
	c.finishLocked(cl, err)
}

// read adds b, bytes of the answer's DATA, to the message.
func (cl *h2call) read(b []byte) error {
	for len(b) > 0 {
		if cl.prefixN < 5 {
			n := copy(cl.prefix[cl.prefixN:], b)
			cl.prefixN += n
			b = b[n:]
			if cl.prefixN < 5 {
				return nil
			}
			if cl.got {
				return grpcstatus.Error(codes.Internal, "cardinality violation: expected <EOF> for non server-streaming RPCs, but received another message")
			}
			switch cl.prefix[0] {
			case 0:
			case 1:
				return grpcstatus.Errorf(codes.Internal, "grpc: compressed message (grpc-encoding %q): this client takes uncompressed messages only", cl.encoding)
			default:
				return grpcstatus.Errorf(codes.Internal, "grpc: message flag %d is neither 0 nor 1", cl.prefix[0])
			}
			cl.want = int(binary.BigEndian.Uint32(cl.prefix[1:]))
			if cl.want > h2MaxRecvMsg {
				return grpcstatus.Errorf(codes.ResourceExhausted, "grpc: received message larger than max (%d vs. %d)", cl.want, h2MaxRecvMsg)
			}
			cl.resp = cl.resp[:0]
			if cap(cl.resp) < cl.want && cl.want <= 64<<10 {
				cl.resp = make([]byte, 0, cl.want)
			}
		}
		n := min(len(b), cl.want-len(cl.resp))
		cl.resp = append(cl.resp, b[:n]...)
		b = b[n:]
		if len(cl.resp) == cl.want {
			cl.got, cl.prefixN = true, 0
		}
	}
	if cl.prefixN == 5 && cl.want == 0 {
		cl.got, cl.prefixN = true, 0
	}
	return nil
}

// trailerErr is the error of cl's trailers: nil for grpc-status 0 with
// one whole message read.
func (cl *h2call) trailerErr() error {
	code := codes.Unknown
	if cl.grpcStatus != "" {
		n, err := strconv.ParseUint(cl.grpcStatus, 10, 32)
		if err != nil {
			return grpcstatus.Errorf(codes.Unknown, "transport: malformed grpc-status: %v", err)
		}
		code = codes.Code(n)
	}
	switch {
	case code != codes.OK:
		return grpcstatus.Error(code, decodeGRPCMessage(cl.grpcMessage))
	case !cl.got || cl.prefixN != 0:
		return grpcstatus.Error(codes.Internal, "cardinality violation: expected <Message> for non server-streaming RPCs, but received <EOF>")
	}
	return nil
}

// headerErr is the error of an answer's first header block, as grpc-go
// gives it: nil for a gRPC content-type.
func headerErr(httpStatus, contentType string) error {
	if ct, ok := strings.CutPrefix(contentType, "application/grpc"); ok && (ct == "" || ct[0] == '+' || ct[0] == ';') {
		return nil
	}
	code := codes.Internal
	var errs []string
	if httpStatus == "" {
		errs = append(errs, "malformed header: missing HTTP status")
	} else if n, err := strconv.Atoi(httpStatus); err != nil {
		return grpcstatus.Errorf(codes.Internal, "transport: malformed http-status: %v", err)
	} else {
		var ok bool
		if code, ok = httpCodes[n]; !ok {
			code = codes.Unknown
		}
		errs = append(errs, fmt.Sprintf("unexpected HTTP status code received from server: %d (%s)", n, http.StatusText(n)))
	}
	if contentType == "" {
		errs = append(errs, "malformed header: missing HTTP content-type")
	} else {
		errs = append(errs, fmt.Sprintf("transport: received unexpected content-type %q", contentType))
	}
	return grpcstatus.Error(code, strings.Join(errs, "; "))
}

// httpCodes are grpc-go's codes of an HTTP status in a non-gRPC answer.
var httpCodes = map[int]codes.Code{
	http.StatusBadRequest:         codes.Internal,
	http.StatusUnauthorized:       codes.Unauthenticated,
	http.StatusForbidden:          codes.PermissionDenied,
	http.StatusNotFound:           codes.Unimplemented,
	http.StatusTooManyRequests:    codes.Unavailable,
	http.StatusBadGateway:         codes.Unavailable,
	http.StatusServiceUnavailable: codes.Unavailable,
	http.StatusGatewayTimeout:     codes.Unavailable,
}

// rstCodes are grpc-go's codes of an RST_STREAM's error code.
var rstCodes = map[http2.ErrCode]codes.Code{
	http2.ErrCodeNo:                 codes.Internal,
	http2.ErrCodeProtocol:           codes.Internal,
	http2.ErrCodeInternal:           codes.Internal,
	http2.ErrCodeFlowControl:        codes.ResourceExhausted,
	http2.ErrCodeSettingsTimeout:    codes.Internal,
	http2.ErrCodeStreamClosed:       codes.Internal,
	http2.ErrCodeFrameSize:          codes.Internal,
	http2.ErrCodeRefusedStream:      codes.Unavailable,
	http2.ErrCodeCancel:             codes.Canceled,
	http2.ErrCodeCompression:        codes.Internal,
	http2.ErrCodeConnect:            codes.Internal,
	http2.ErrCodeEnhanceYourCalm:    codes.ResourceExhausted,
	http2.ErrCodeInadequateSecurity: codes.PermissionDenied,
	http2.ErrCodeHTTP11Required:     codes.Internal,
}

// decodeGRPCMessage percent-decodes a grpc-message.
func decodeGRPCMessage(m string) string {
	if !strings.Contains(m, "%") {
		return m
	}
	var b strings.Builder
	for i := 0; i < len(m); i++ {
		if m[i] == '%' && i+2 < len(m) {
			if v, err := strconv.ParseUint(m[i+1:i+3], 16, 8); err == nil {
				b.WriteByte(byte(v))
				i += 2
				continue
			}
		}
		b.WriteByte(m[i])
	}
	return b.String()
}
