package grpcserve

import (
	"bufio"
	"io"
	"net"
	"sync"
)

// bufSize is the size of the buffers a connection reads and writes
// through while it has bytes to move.
const bufSize = 32 << 10

// The buffers of the connections that are moving bytes; a connection that
// waits for its client holds none.
var (
	readBufs  = sync.Pool{New: func() any { b := make([]byte, bufSize); return &b }}
	writeBufs = sync.Pool{New: func() any { return bufio.NewWriterSize(nil, bufSize) }}
)

// connReader is the reader's buffered view of nc. It waits for bytes in
// a small buffer of its own, and takes one of bufSize from readBufs only
// after a read filled the buffer it read into (more bytes are likely
// waiting); it gives that back once a read came short and its bytes are
// taken. Not safe for concurrent use.
type connReader struct {
	nc    net.Conn
	big   *[]byte // from readBufs, while held
	b     []byte  // bytes read and not yet taken, in small or *big
	more  bool    // the last read filled its buffer
	small [1 << 10]byte
}

func (cr *connReader) Read(p []byte) (int, error) {
	if len(cr.b) == 0 {
		buf := cr.small[:]
		if cr.more {
			if cr.big == nil {
				cr.big = readBufs.Get().(*[]byte)
			}
			buf = *cr.big
		}
		n, err := cr.nc.Read(buf)
		if n == 0 {
			if err == nil {
				err = io.ErrNoProgress
			}
			return 0, err
		}
		cr.b, cr.more = buf[:n], n == len(buf)
	}
	n := copy(p, cr.b)
	if cr.b = cr.b[n:]; len(cr.b) == 0 && !cr.more {
		cr.release()
	}
	return n, nil
}

// release gives back the buffer of bufSize, if held; its bytes must
// have been taken.
func (cr *connReader) release() {
	if cr.big != nil {
		readBufs.Put(cr.big)
		cr.big = nil
	}
}

// connWriter buffers the writer's frames in a bufio.Writer taken from
// writeBufs at the first frame, and given back by release once flushed.
// Not safe for concurrent use.
type connWriter struct {
	w  io.Writer
	bw *bufio.Writer // while the round's frames are not all flushed
}

func (cw *connWriter) Write(p []byte) (int, error) {
	if cw.bw == nil {
		cw.bw = writeBufs.Get().(*bufio.Writer)
		cw.bw.Reset(cw.w)
	}
	return cw.bw.Write(p)
}

// Flush writes the frames buffered.
func (cw *connWriter) Flush() error {
	if cw.bw == nil {
		return nil
	}
	return cw.bw.Flush()
}

// release gives the buffer back, if held and flushed: the writer calls it
// when it has nothing more to write.
func (cw *connWriter) release() {
	if cw.bw != nil && cw.bw.Buffered() == 0 {
		cw.bw.Reset(nil)
		writeBufs.Put(cw.bw)
		cw.bw = nil
	}
}
