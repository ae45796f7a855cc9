package grpcserve

import (
	"errors"
	"net"
	"os"
	"runtime"
	"time"

	"golang.org/x/net/http2"
)

// item is what the writer writes of one stream in one round.
type item struct {
	st      *stream
	headers bool
	data    []byte
	trailer []byte // the trailers, or the whole answer if !st's headers were written before
	rst     bool   // reset the stream after its trailers: the client has not ended it
}

// writeLoop writes the frames queued, those of every stream ready in one
// round and one flush, until the connection closes.
func (c *conn) writeLoop() {
	defer close(c.writerDone)
	var ctrls []ctrl
	var items []item
	for {
		c.mu.Lock()
		for !c.dead && len(c.ctrl) == 0 && !c.closeAfter && !c.readyLocked() {
			c.bw.release()
			c.work.Wait()
		}
		if c.dead {
			c.mu.Unlock()
			return
		}
		if c.running > 0 && !c.closeAfter {
			// Handlers are still running: let them run first, so that
			// their answers share this round's write.
			c.mu.Unlock()
			runtime.Gosched()
			c.mu.Lock()
			if c.dead {
				c.mu.Unlock()
				return
			}
		}
		closing := c.closeAfter
		ctrls, c.ctrl, c.ctrlBlocks = c.ctrl, ctrls[:0], 0
		items = c.planLocked(items[:0])
		maxFrame := c.maxFrame
		c.mu.Unlock()

		err := c.write(ctrls, items, maxFrame)
		if err == nil {
			err = c.bw.Flush()
		}
		c.mu.Lock()
		for i := range items {
			st := items[i].st
			if st.sent == len(st.out) && !st.closed {
				st.out, st.sent = st.out[:0], 0
				select {
				case st.sendWake <- struct{}{}:
				default:
				}
			}
		}
		c.mu.Unlock()
		for i := range items {
			items[i].st.release() // the item's
			items[i] = item{}
		}
		clear(ctrls)
		if err != nil || closing {
			c.close(err)
			return
		}
	}
}

// readyLocked reports whether a pending stream has frames that may be
// written now.
func (c *conn) readyLocked() bool {
	for _, st := range c.pending {
		if st.closed || (!st.hdrSent && st.wantHdr) || st.trailer != nil && st.sent == len(st.out) ||
			st.sent < len(st.out) && c.sendWindow > 0 && st.sendWindow > 0 {
			return true
		}
	}
	return false
}

// planLocked takes the frames of the pending streams that may be
// written now, within the flow-control windows, and keeps pending those
// with more to write.
func (c *conn) planLocked(items []item) []item {
	keep := c.pending[:0]
	for _, st := range c.pending {
		if st.closed {
			st.inPending = false
			st.release() // the connection's, which endStreamLocked left
			continue
		}
		it := item{st: st}
		if !st.hdrSent && (st.wantHdr || len(st.out) > 0) {
			it.headers, st.hdrSent = true, true
		}
		if n := min(int64(len(st.out)-st.sent), c.sendWindow, st.sendWindow); n > 0 {
			it.data = st.out[st.sent : st.sent+int(n)]
			st.sent += int(n)
			c.sendWindow -= n
			st.sendWindow -= n
		}
		if st.trailer != nil && st.sent == len(st.out) {
			it.trailer, st.hdrSent = st.trailer, true
			if it.rst = !st.recvEnded; it.rst {
				c.sentResetLocked(st.id)
			}
		}
		if it.headers || it.data != nil || it.trailer != nil {
			st.refs.Add(1)
			items = append(items, it)
		}
		if it.trailer != nil {
			st.inPending = false
			c.endStreamLocked(st)
			continue
		}
		if st.sent < len(st.out) || !st.hdrSent && st.wantHdr {
			keep = append(keep, st)
		} else {
			st.inPending = false
		}
	}
	clear(c.pending[len(keep):])
	c.pending = keep
	return items
}

// write writes one round's frames into the buffer.
func (c *conn) write(ctrls []ctrl, items []item, maxFrame int) error {
	for _, f := range ctrls {
		var err error
		switch f.kind {
		case ctrlSettingsAck:
			err = c.fr.WriteSettingsAck()
		case ctrlPingAck:
			err = c.fr.WritePing(true, f.ping)
		case ctrlWindowUpdate:
			err = c.fr.WriteWindowUpdate(f.id, f.val)
		case ctrlRST:
			err = c.fr.WriteRSTStream(f.id, http2.ErrCode(f.val))
		case ctrlGoAway:
			err = c.fr.WriteGoAway(f.id, http2.ErrCode(f.val), nil)
		case ctrlHeaders:
			err = c.writeBlock(f.id, f.block, true, maxFrame)
		}
		if err != nil {
			return err
		}
	}
	for _, it := range items {
		id := it.st.id
		if it.headers {
			if err := c.writeBlock(id, respHeaders, false, maxFrame); err != nil {
				return err
			}
		}
		for b := it.data; len(b) > 0; {
			n := min(len(b), maxFrame)
			if err := c.writeFrame(http2.FrameData, 0, id, b[:n]); err != nil {
				return err
			}
			b = b[n:]
		}
		if it.trailer != nil {
			if err := c.writeBlock(id, it.trailer, true, maxFrame); err != nil {
				return err
			}
			if it.rst {
				if err := c.fr.WriteRSTStream(id, http2.ErrCodeNo); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// writeBlock writes a header block as HEADERS, and CONTINUATIONs if it is
// over maxFrame.
func (c *conn) writeBlock(id uint32, block []byte, end bool, maxFrame int) error {
	first := min(len(block), maxFrame)
	var flags http2.Flags
	if end {
		flags |= http2.FlagHeadersEndStream
	}
	if first == len(block) {
		flags |= http2.FlagHeadersEndHeaders
	}
	if err := c.writeFrame(http2.FrameHeaders, flags, id, block[:first]); err != nil {
		return err
	}
	for block = block[first:]; len(block) > 0; {
		n := min(len(block), maxFrame)
		flags = 0
		if n == len(block) {
			flags = http2.FlagContinuationEndHeaders
		}
		if err := c.writeFrame(http2.FrameContinuation, flags, id, block[:n]); err != nil {
			return err
		}
		block = block[n:]
	}
	return nil
}

// writeFrame writes a frame of stream id into the buffer, as the framer
// would without copying payload into a buffer of its own, which would
// keep the size of the largest frame written for the connection's life.
func (c *conn) writeFrame(t http2.FrameType, flags http2.Flags, id uint32, payload []byte) error {
	n := len(payload)
	c.fh = [9]byte{byte(n >> 16), byte(n >> 8), byte(n), byte(t), byte(flags), byte(id >> 24), byte(id >> 16), byte(id >> 8), byte(id)}
	if _, err := c.bw.Write(c.fh[:]); err != nil {
		return err
	}
	_, err := c.bw.Write(payload)
	return err
}

// stallWriter writes to nc, and fails a write that makes no progress for
// timeout (three quarters of it at least): the deadline is moved on only
// once a quarter of it has passed, so that most writes set none.
type stallWriter struct {
	nc      net.Conn
	timeout time.Duration
	set     time.Time // when the deadline was last set
}

func (w *stallWriter) Write(p []byte) (int, error) {
	written := 0
	for {
		if now := time.Now(); now.Sub(w.set) > w.timeout/4 {
			if err := w.nc.SetWriteDeadline(now.Add(w.timeout)); err != nil {
				return written, err
			}
			w.set = now
		}
		n, err := w.nc.Write(p)
		written += n
		if n == 0 || !errors.Is(err, os.ErrDeadlineExceeded) {
			return written, err
		}
		p, w.set = p[n:], time.Time{} // some progress: a deadline anew
	}
}
