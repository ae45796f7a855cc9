package loadgen

import (
	"math"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"
)

// h2ctrl is a frame the reader asks the writer to send.
type h2ctrl struct {
	kind  uint8
	table bool // ctrlSettingsAck: val is the server's HEADER_TABLE_SIZE
	id    uint32
	val   uint32
	ping  [8]byte
}

const (
	ctrlSettingsAck = iota
	ctrlPingAck
	ctrlWindowUpdate // of id by val
	ctrlRST          // of id with code val
)

// h2chunk is DATA the flow-control windows let the writer send: n bytes
// of a call's request from off.
type h2chunk struct {
	cl     *h2call
	off, n int
	end    bool
}

// writeLoop sends what is queued, in rounds: it takes everything queued
// under mu, writes it into the buffer without mu, and flushes only when
// nothing more is queued, so that the calls of one round share a write.
// It closes a draining connection once all is written and no call is
// left on it.
func (c *GRPCConn) writeLoop() {
	defer c.wg.Done()
	var ctrl []h2ctrl
	var sends []*h2call
	var chunks []h2chunk
	for {
		c.mu.Lock()
		for c.err == nil && !c.hasWorkLocked() {
			if c.bw.Buffered() > 0 {
				c.mu.Unlock()
				if err := c.bw.Flush(); err != nil {
					c.fail(c.brokenErr(err))
					return
				}
				c.mu.Lock()
				continue
			}
			if c.idleLocked() {
				c.mu.Unlock()
				c.fail(errConnClosing)
				return
			}
			c.work.Wait()
		}
		if c.err != nil {
			c.mu.Unlock()
			return
		}
		ctrl, c.ctrl = c.ctrl, ctrl[:0]
		sends = sends[:0]
		for _, cl := range c.queued {
			if cl.state != callQueued {
				continue
			}
			if c.nextID > math.MaxInt32 {
				if c.goaway == nil {
					c.goaway = grpcstatus.Error(codes.Unavailable, "connection's stream IDs are used up")
					c.refusing.Store(true)
				}
				c.finishLocked(cl, c.goaway)
				continue
			}
			cl.id, cl.state, cl.sendWindow = c.nextID, callSent, c.initWindow
			c.nextID += 2
			c.streams[cl.id] = cl
			sends = append(sends, cl)
			c.blocked = append(c.blocked, cl)
		}
		clear(c.queued)
		c.queued = c.queued[:0]
		chunks = c.planLocked(chunks[:0])
		maxFrame := c.maxFrame
		c.mu.Unlock()
		if err := c.write(ctrl, sends, chunks, maxFrame); err != nil {
			c.fail(c.brokenErr(err))
			return
		}
		clear(sends)
		clear(chunks)
	}
}

// hasWorkLocked reports whether there is a frame the writer may send.
func (c *GRPCConn) hasWorkLocked() bool {
	if len(c.ctrl) > 0 || len(c.queued) > 0 {
		return true
	}
	if c.sendWindow > 0 {
		for _, cl := range c.blocked {
			if cl.state == callSent && cl.sendWindow > 0 {
				return true
			}
		}
	}
	return false
}

// planLocked appends to chunks the DATA the windows let each blocked call
// send, takes it from the windows, and keeps blocked the calls with more
// to send.
func (c *GRPCConn) planLocked(chunks []h2chunk) []h2chunk {
	keep := c.blocked[:0]
	for _, cl := range c.blocked {
		if cl.state != callSent {
			continue
		}
		if n := int(min(int64(len(cl.req)-cl.sent), c.sendWindow, cl.sendWindow)); n > 0 {
			chunks = append(chunks, h2chunk{cl: cl, off: cl.sent, n: n, end: cl.sent+n == len(cl.req)})
			cl.sent += n
			c.sendWindow -= int64(n)
			cl.sendWindow -= int64(n)
		}
		if cl.sent < len(cl.req) {
			keep = append(keep, cl)
		}
	}
	clear(c.blocked[len(keep):])
	c.blocked = keep
	return chunks
}

// write writes one round's frames into the buffer, in the order taken.
func (c *GRPCConn) write(ctrl []h2ctrl, sends []*h2call, chunks []h2chunk, maxFrame int) error {
	for _, f := range ctrl {
		var err error
		switch f.kind {
		case ctrlSettingsAck:
			if f.table {
				c.enc.SetMaxDynamicTableSizeLimit(f.val)
			}
			err = c.fr.WriteSettingsAck()
		case ctrlPingAck:
			err = c.fr.WritePing(true, f.ping)
		case ctrlWindowUpdate:
			err = c.fr.WriteWindowUpdate(f.id, f.val)
		case ctrlRST:
			err = c.fr.WriteRSTStream(f.id, http2.ErrCode(f.val))
		}
		if err != nil {
			return err
		}
	}
	for _, cl := range sends {
		if err := c.writeHeaders(cl, maxFrame); err != nil {
			return err
		}
	}
	for _, ch := range chunks {
		b := ch.cl.req[ch.off : ch.off+ch.n]
		for len(b) > maxFrame {
			if err := c.fr.WriteData(ch.cl.id, false, b[:maxFrame]); err != nil {
				return err
			}
			b = b[maxFrame:]
		}
		if err := c.fr.WriteData(ch.cl.id, ch.end, b); err != nil {
			return err
		}
		if ch.end {
			ch.cl.wdone.Store(true) // the last use of ch.cl here: its caller may reuse it
		}
	}
	return nil
}

// writeHeaders writes cl's HEADERS, and CONTINUATIONs if its header block
// is over maxFrame.
func (c *GRPCConn) writeHeaders(cl *h2call, maxFrame int) error {
	c.hbuf.Reset()
	c.enc.WriteField(hpack.HeaderField{Name: ":method", Value: "POST"})
	c.enc.WriteField(hpack.HeaderField{Name: ":scheme", Value: c.scheme})
	c.enc.WriteField(hpack.HeaderField{Name: ":path", Value: cl.method})
	c.enc.WriteField(hpack.HeaderField{Name: ":authority", Value: c.authority})
	c.enc.WriteField(hpack.HeaderField{Name: "content-type", Value: "application/grpc"})
	c.enc.WriteField(hpack.HeaderField{Name: "te", Value: "trailers"})
	if cl.timeout > 0 {
		// A literal kept out of the dynamic table (RFC 7541 6.2.2), as
		// each call's timeout differs, written here as the encoder would
		// take a string.
		b := append(c.hbuf.AvailableBuffer(), 0, byte(len("grpc-timeout")))
		b = append(b, "grpc-timeout"...)
		b = append(b, 0)
		n := len(b)
		b = appendTimeout(b, cl.timeout)
		b[n-1] = byte(len(b) - n)
		c.hbuf.Write(b)
	}
	block := c.hbuf.Bytes()
	first := min(len(block), maxFrame)
	if err := c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: cl.id, BlockFragment: block[:first], EndHeaders: first == len(block)}); err != nil {
		return err
	}
	for block = block[first:]; len(block) > 0; {
		n := min(len(block), maxFrame)
		if err := c.fr.WriteContinuation(cl.id, n == len(block), block[:n]); err != nil {
			return err
		}
		block = block[n:]
	}
	return nil
}
