package grpcserve_test

import (
	"bytes"
	"testing"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	testpb "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/protobuf/proto"

	"github.com/hotkeyd/hotkey/internal/grpcserve"
)

// callScript writes the frames of a client's calls, in order, to a
// buffer sent at once; a refused call asks for an unknown service.
type callScript struct {
	b, hb bytes.Buffer
	fr    *http2.Framer
	he    *hpack.Encoder
	next  uint32
}

func newCallScript() *callScript {
	s := &callScript{next: 1}
	s.fr, s.he = http2.NewFramer(&s.b, nil), hpack.NewEncoder(&s.hb)
	return s
}

// open sends the HEADERS of a new call to path, ending the stream if end,
// and returns its stream ID.
func (s *callScript) open(path string, end bool) uint32 {
	id := s.next
	s.next += 2
	s.hb.Reset()
	for _, f := range [][2]string{{":method", "POST"}, {":scheme", "http"}, {":path", path}, {":authority", "x"}, {"content-type", "application/grpc"}} {
		s.he.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
	}
	s.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: s.hb.Bytes(), EndHeaders: true, EndStream: end})
	return id
}

func (s *callScript) refused(n int) {
	for range n {
		s.open("/no.Such/Service", true)
	}
}

// served sends a whole call that is served.
func (s *callScript) served() uint32 {
	id := s.open(testgrpc.TestService_UnaryCall_FullMethodName, false)
	s.data(id)
	return id
}

// data sends a served call's request, ending its stream.
func (s *callScript) data(id uint32) {
	req, _ := proto.Marshal(&testpb.SimpleRequest{ResponseSize: 1})
	s.fr.WriteData(id, true, grpcFrame(req))
}

// outcome is what a client read of its calls' answers.
type outcome struct {
	status  map[uint32]string // grpc-status of each call answered, or "RST " and the code of each reset
	goAway  string            // the GOAWAY's code; "" if none
	pingAck bool              // the PING sent after the calls was answered
}

// run sends the script and a PING after it, and reads the answers until
// the connection's end, or the PING's ACK and an answer to every call.
func (s *callScript) run(t *testing.T, addr string) outcome {
	t.Helper()
	c := dialRaw(t, addr)
	s.fr.WritePing(false, [8]byte{7})
	go c.nc.Write(s.b.Bytes()) // fails once the server closes the connection
	o := outcome{status: map[uint32]string{}}
	for {
		f, err := c.fr.ReadFrame()
		if err != nil {
			return o
		}
		switch f := f.(type) {
		case *http2.MetaHeadersFrame:
			if f.StreamEnded() {
				o.status[f.StreamID] = f.PseudoValue("status")
				for _, hf := range f.Fields {
					if hf.Name == "grpc-status" {
						o.status[f.StreamID] = hf.Value
					}
				}
			}
		case *http2.RSTStreamFrame:
			if _, ok := o.status[f.StreamID]; !ok {
				o.status[f.StreamID] = "RST " + f.ErrCode.String()
			}
		case *http2.GoAwayFrame:
			o.goAway = f.ErrCode.String()
		case *http2.PingFrame:
			o.pingAck = o.pingAck || f.IsAck()
		}
		if o.pingAck && len(o.status) == int(s.next/2) {
			return o
		}
	}
}

// TestRawRefusedRun: a client whose calls refused before a stream opens
// outrun its served ones by grpcserve.MaxRefused, in a row or over time,
// is sent a GOAWAY ENHANCE_YOUR_CALM: its open call is still served, and
// the connection is closed after at most twice MaxRefused refused calls
// were answered, however many it sent.
func TestRawRefusedRun(t *testing.T) {
	const n = grpcserve.MaxRefused
	s := serve(t, grpcserve.Config{})

	t.Run("open call", func(t *testing.T) {
		sc := newCallScript()
		id := sc.open(testgrpc.TestService_UnaryCall_FullMethodName, false)
		sc.refused(n + 1)
		sc.data(id)
		o := sc.run(t, s.addr)
		if o.goAway != "ENHANCE_YOUR_CALM" || o.status[id] != "0" {
			t.Errorf("%d calls refused with one open: GOAWAY %q, the open call's grpc-status %q; want ENHANCE_YOUR_CALM and 0", n+1, o.goAway, o.status[id])
		}
	})

	t.Run("two refused a served call", func(t *testing.T) {
		sc := newCallScript()
		for range 2 * n {
			sc.served()
			sc.refused(2)
		}
		o := sc.run(t, s.addr)
		if o.goAway != "ENHANCE_YOUR_CALM" {
			t.Errorf("%d calls served, each followed by two refused: GOAWAY %q, want ENHANCE_YOUR_CALM", 2*n, o.goAway)
		}
	})

	t.Run("flood", func(t *testing.T) {
		sc := newCallScript()
		sc.served()
		sc.refused(20 * n)
		o := sc.run(t, s.addr)
		if o.goAway != "ENHANCE_YOUR_CALM" || o.pingAck || len(o.status)-1 > 2*n+1 {
			t.Errorf("%d calls refused after one served: GOAWAY %q, %d answered, the PING after answered %v; want ENHANCE_YOUR_CALM, at most %d answered, the connection closed first",
				20*n, o.goAway, len(o.status)-1, o.pingAck, 2*n+1)
		}
	})
}

// TestRawRefusedMixed: a client with as many refused calls in a row as
// grpcserve.MaxRefused allows, then one refused call for each served one,
// keeps its connection, and each call is answered.
func TestRawRefusedMixed(t *testing.T) {
	const n = grpcserve.MaxRefused
	s := serve(t, grpcserve.Config{})
	sc := newCallScript()
	sc.refused(n)
	var served []uint32
	for range 5 * n {
		served = append(served, sc.served())
		sc.refused(1)
	}
	o := sc.run(t, s.addr)
	if o.goAway != "" || !o.pingAck || len(o.status) != n+10*n {
		t.Fatalf("GOAWAY %q, the PING after the calls answered %v, %d calls of %d answered; want no GOAWAY and all answered", o.goAway, o.pingAck, len(o.status), 11*n)
	}
	for _, id := range served {
		if o.status[id] != "0" {
			t.Fatalf("served call %d: grpc-status %q, want 0", id, o.status[id])
		}
	}
}

// TestRawTurnedAway: calls turned away at the stream cap do not count
// as refused: a client past the cap keeps its connection.
func TestRawTurnedAway(t *testing.T) {
	const n = grpcserve.MaxRefused
	s := serve(t, grpcserve.Config{MaxConcurrentStreams: 1})
	sc := newCallScript()
	id := sc.open(testgrpc.TestService_UnaryCall_FullMethodName, false)
	for range 3 * n {
		sc.open(testgrpc.TestService_UnaryCall_FullMethodName, true)
	}
	sc.data(id)
	o := sc.run(t, s.addr)
	if o.goAway != "" || o.status[id] != "0" || o.status[id+2] != "RST REFUSED_STREAM" {
		t.Errorf("%d calls past a stream cap of 1: GOAWAY %q, the open call's grpc-status %q, the next call's %q; want no GOAWAY, 0 and RST REFUSED_STREAM", 3*n, o.goAway, o.status[id], o.status[id+2])
	}
}
