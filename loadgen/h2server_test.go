package loadgen_test

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"io"
	"net"
	"testing"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// h2Server is a bare HTTP/2 server on loopback for GRPCConn's tests,
// where grpc-go's server cannot be made to misbehave or to allocate
// nothing: each request, once its stream ends, is given to answer, which
// writes what it likes. It reads frames into one buffer and writes them
// with one Framer and HPACK encoder a connection, so that a canned answer
// costs it no allocation. RST_STREAMs received go to rsts, when there is
// room; with fields set, each request's header fields go to it.
type h2Server struct {
	addr     string
	settings []http2.Setting
	answer   func(r *h2Reply) // nil: never answer
	fields   func(id uint32, f hpack.HeaderField)
	rsts     chan h2RST
}

// h2RST is an RST_STREAM a client sent.
type h2RST struct {
	id   uint32
	code http2.ErrCode
}

// h2Reply is what answer writes a request's answer with.
type h2Reply struct {
	id   uint32
	nc   net.Conn
	fr   *http2.Framer
	enc  *hpack.Encoder
	hbuf bytes.Buffer
}

// headers writes a header block of fields on r's stream, ending it with
// end.
func (r *h2Reply) headers(end bool, fields []hpack.HeaderField) {
	r.hbuf.Reset()
	for _, f := range fields {
		r.enc.WriteField(f)
	}
	r.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: r.id, BlockFragment: r.hbuf.Bytes(), EndHeaders: true, EndStream: end})
}

// reply writes a gRPC answer: headers, msg (with its 5-byte prefix) in
// DATA frames of at most 16 KiB, and trailers.
func (r *h2Reply) reply(msg []byte, trailers []hpack.HeaderField) {
	r.headers(false, grpcHeaders)
	for len(msg) > 16384 {
		r.fr.WriteData(r.id, false, msg[:16384])
		msg = msg[16384:]
	}
	r.fr.WriteData(r.id, false, msg)
	r.headers(true, trailers)
}

var (
	grpcHeaders = []hpack.HeaderField{{Name: ":status", Value: "200"}, {Name: "content-type", Value: "application/grpc"}}
	grpcOK      = []hpack.HeaderField{{Name: "grpc-status", Value: "0"}}
)

// grpcMessage is b with gRPC's 5-byte prefix.
func grpcMessage(b []byte) []byte {
	return append(binary.BigEndian.AppendUint32([]byte{0}, uint32(len(b))), b...)
}

// start serves s on 127.0.0.1 until the test ends.
func (s *h2Server) start(t testing.TB) {
	t.Helper()
	s.addr = serveLoopback(t, s.serve)
}

// serve speaks HTTP/2 on nc until it fails.
func (s *h2Server) serve(nc net.Conn) {
	defer nc.Close()
	br := bufio.NewReaderSize(nc, 64<<10)
	bw := bufio.NewWriterSize(nc, 64<<10)
	r := &h2Reply{nc: nc, fr: http2.NewFramer(bw, nil)}
	r.enc = hpack.NewEncoder(&r.hbuf)
	var id uint32
	var dec *hpack.Decoder
	if s.fields != nil {
		dec = hpack.NewDecoder(4096, func(f hpack.HeaderField) { s.fields(id, f) })
	}
	preface := make([]byte, len(http2.ClientPreface))
	if _, err := io.ReadFull(br, preface); err != nil || string(preface) != http2.ClientPreface {
		return
	}
	r.fr.WriteSettings(s.settings...)
	r.fr.WriteWindowUpdate(0, 1<<20)
	if bw.Flush() != nil {
		return
	}
	var hdr [9]byte
	unsent := 0
	buf := make([]byte, 16384)
	for {
		if _, err := io.ReadFull(br, hdr[:]); err != nil {
			return
		}
		n := int(hdr[0])<<16 | int(hdr[1])<<8 | int(hdr[2])
		typ, flags := http2.FrameType(hdr[3]), http2.Flags(hdr[4])
		id = binary.BigEndian.Uint32(hdr[5:]) & (1<<31 - 1)
		if n > len(buf) {
			buf = make([]byte, n)
		}
		p := buf[:n]
		if _, err := io.ReadFull(br, p); err != nil {
			return
		}
		r.id = id
		switch typ {
		case http2.FrameData:
			// The window given back in bulk, as servers do, so that the
			// client reads no frame a call besides its answer.
			if unsent += n; unsent >= 1<<20 {
				r.fr.WriteWindowUpdate(0, uint32(unsent))
				unsent = 0
			}
			if flags.Has(http2.FlagDataEndStream) && s.answer != nil {
				s.answer(r)
			}
		case http2.FrameHeaders, http2.FrameContinuation:
			if dec != nil {
				dec.Write(p)
			}
			if flags.Has(http2.FlagHeadersEndStream) && s.answer != nil {
				s.answer(r)
			}
		case http2.FrameSettings:
			if !flags.Has(http2.FlagSettingsAck) {
				r.fr.WriteSettingsAck()
			}
		case http2.FramePing:
			if !flags.Has(http2.FlagPingAck) {
				r.fr.WritePing(true, [8]byte(p))
			}
		case http2.FrameRSTStream:
			select {
			case s.rsts <- h2RST{id, http2.ErrCode(binary.BigEndian.Uint32(p))}:
			default:
			}
		}
		if br.Buffered() == 0 && bw.Flush() != nil {
			return
		}
	}
}
