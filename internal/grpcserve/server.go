// Package grpcserve is a lean gRPC server over HTTP/2, for the daemon's
// rate-limit service, where grpc-go's server transport took ~40% of the
// CPU of a call. It serves the services registered on it as a
// grpc.Server does (unary methods, and streams well enough for the
// health service's Watch and reflection) over cleartext HTTP/2 with prior
// knowledge (h2c) or TLS with ALPN "h2".
//
// Each connection has one reader goroutine, which decodes frames and
// hands each call to a pool of reused goroutines, and one writer
// goroutine, which writes the frames of every answer ready in one flush.
// A call's state is pooled; the header blocks of a successful answer are
// encoded once, with no HPACK dynamic table. Flow control follows RFC
// 9113: the server grants large windows; it gives a stream's credit back
// as it reads the data, and the connection's only for request bytes it no
// longer holds: handed to their handler (a unary call run, a stream's
// message taken by RecvMsg) or dropped (padding, a stream reset or ended,
// a request in error). It never sends past the client's windows, and
// queues what does not fit until a WINDOW_UPDATE.
//
// What a client may hold is bounded: a connection that sends no preface
// is closed after 30 seconds, holding about 2 KiB of heap and a goroutine
// meanwhile; one past its handshake holds its read and write buffers (32
// KiB each, pooled) only while it moves bytes, about 5 KiB of heap and
// two goroutines while it waits; an open one holds at most MaxConcurrentStreams calls, with
// at most 16 MiB (or MaxRecvMsgSize and 1 MiB, if more) of request bytes
// not yet handed to a handler, all its streams together, at most
// MaxRecvMsgSize of request for each call its handlers run, their
// answers, and at most 512 KiB of control frames and answers of calls
// refused before they open unread (ENHANCE_YOUR_CALM past it), each error
// quoting at most 64 bytes of what the client sent. A connection whose
// calls refused before a stream opens (an unknown method, a bad
// content-type, a malformed header list) outnumber the calls it served
// by 100, counting one down for each served call and never below 0, is
// sent a GOAWAY ENHANCE_YOUR_CALM and closes once its open calls end; by
// 200, it is closed at once. Streams that together
// hold that window wait until other calls end or they are reset; one
// message of MaxRecvMsgSize always fits. A connection whose client reads
// nothing for WriteTimeout while the server has frames for it is closed,
// and so is one with no call for IdleTimeout. A header block of over
// twice MaxHeaderListSize bytes ends the connection. Frames
// that cost only the time to read them (empty DATA, PRIORITY, frames of
// unknown types) are not counted. A HEADERS on a stream the server has
// reset ends the connection, as in grpc-go and net/http, though RFC 9113
// 5.1 asks that it be ignored.
//
// It does not support compression, interceptors, incoming metadata in the
// context (metadata.FromIncomingContext), or stats handlers beyond
// TagRPC, Begin and End.
package grpcserve

import (
	"crypto/tls"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	_ "google.golang.org/grpc/encoding/proto" // registers the default codec
	"google.golang.org/grpc/stats"
)

// ErrServerStopped is Serve's error when the server was stopped before it
// was called.
var ErrServerStopped = errors.New("grpcserve: the server has been stopped")

// Config is what a Server is built with. The zero value of a field is its
// documented default.
type Config struct {
	// Codec encodes and decodes messages; nil: grpc-go's "proto" codec. If
	// it implements AppendMarshaler, answers are marshalled through it; if
	// BorrowUnmarshaler, requests are unmarshalled through it.
	Codec encoding.CodecV2
	// MaxRecvMsgSize bounds a request message; a longer one is answered
	// RESOURCE_EXHAUSTED. It bounds too the messages a stream's handler
	// has not read: past it, the stream's further messages are dropped
	// and RecvMsg returns RESOURCE_EXHAUSTED. Over 15 MiB, it widens the
	// connection's window, the request bytes a connection holds, to it
	// and 1 MiB. 0: 4 MiB, as grpc-go.
	MaxRecvMsgSize int
	// StatsHandler, if set, tags each call (TagRPC) and sees its
	// *stats.Begin and *stats.End; connections are tagged too (TagConn).
	// The *stats.RPCTagInfo, *stats.Begin and *stats.End it is given are
	// reused once the call ends: it must not keep them.
	StatsHandler stats.Handler
	// MaxConnectionAge, if positive, is how long a connection serves new
	// calls (±10%, so that connections made together do not all end
	// together): then it is sent a GOAWAY and closes once its calls end.
	MaxConnectionAge time.Duration
	// MaxConnectionAgeGrace, if positive, is how long after
	// MaxConnectionAge a connection is closed, with its calls cancelled;
	// 0: never.
	MaxConnectionAgeGrace time.Duration
	// TLS, if set, serves TLS only; NextProtos must offer "h2".
	TLS *tls.Config
	// MaxConcurrentStreams is the count of calls one connection may have
	// open (SETTINGS_MAX_CONCURRENT_STREAMS); more are refused with
	// RST_STREAM REFUSED_STREAM. 0: 1000.
	MaxConcurrentStreams uint32
	// MaxHeaderListSize bounds the header list of a call
	// (SETTINGS_MAX_HEADER_LIST_SIZE); a longer one is reset. 0: 16 KiB.
	MaxHeaderListSize uint32
	// Workers is the count of idle goroutines kept to run calls, whose
	// stacks have grown to what a call needs. 0: 256.
	Workers int
	// IdleTimeout, if positive, is how long a connection may have no
	// call open, and open none, before it is sent a GOAWAY and closed, as
	// grpc-go's MaxConnectionIdle; it checks every quarter of it (every
	// millisecond at most), so up to a quarter more. 0: never.
	IdleTimeout time.Duration
	// WriteTimeout is how long a write to a client may go without
	// progress, the client reading nothing, before its connection is
	// closed. 0: 30 seconds.
	WriteTimeout time.Duration
}

// AppendMarshaler is a codec's fast path for answers: AppendMarshal
// appends v's wire data to b and returns it, or returns ok false for a
// value it leaves to Marshal. The Server owns b and reuses it once the
// answer is written.
type AppendMarshaler interface {
	AppendMarshal(b []byte, v any) (out []byte, ok bool, err error)
}

// BorrowUnmarshaler is a codec's fast path for requests:
// UnmarshalBorrowed decodes b into v, and v may keep b until the call's
// handler returns, when the server reuses it; ok false leaves v to
// Unmarshal.
type BorrowUnmarshaler interface {
	UnmarshalBorrowed(b []byte, v any) (ok bool, err error)
}

// Server serves gRPC services. Register them before Serve; its other
// methods are safe for concurrent use. NewServer makes one.
type Server struct {
	cfg     Config
	app     AppendMarshaler   // cfg.Codec's, if any
	bu      BorrowUnmarshaler // cfg.Codec's, if any
	methods map[string]*method
	info    map[string]grpc.ServiceInfo

	handshakeTimeout time.Duration
	window           int64         // the connection's receive window: the request bytes a connection holds
	idlePeriod       time.Duration // how often a connection checks whether it is idle, if IdleTimeout is set

	mu       sync.Mutex // guards the fields below
	lns      map[net.Listener]bool
	conns    map[*conn]bool
	serving  bool
	stopped  bool // Stop or GracefulStop was called
	connsWG  sync.WaitGroup
	quit     chan struct{} // closed when the workers are to end
	work     chan *stream  // to an idle worker
	idle     atomic.Int32
	workerWG sync.WaitGroup
}

// method is a registered method: a unary handler or a stream's.
type method struct {
	srv    any
	unary  grpc.MethodHandler
	stream *grpc.StreamDesc
	name   string // "/service/method"
}

var _ grpc.ServiceRegistrar = (*Server)(nil)

// NewServer returns a Server of cfg, serving nothing yet.
func NewServer(cfg Config) *Server {
	if cfg.Codec == nil {
		cfg.Codec = encoding.GetCodecV2("proto")
	}
	if cfg.MaxRecvMsgSize <= 0 {
		cfg.MaxRecvMsgSize = 4 << 20
	}
	if cfg.MaxConcurrentStreams == 0 {
		cfg.MaxConcurrentStreams = 1000
	}
	if cfg.MaxHeaderListSize == 0 {
		cfg.MaxHeaderListSize = 16 << 10
	}
	if cfg.Workers <= 0 {
		cfg.Workers = 256
	}
	if cfg.WriteTimeout <= 0 {
		cfg.WriteTimeout = 30 * time.Second
	}
	s := &Server{
		cfg:     cfg,
		methods: map[string]*method{},
		info:    map[string]grpc.ServiceInfo{},
		lns:     map[net.Listener]bool{},
		conns:   map[*conn]bool{},
		quit:    make(chan struct{}),
		work:    make(chan *stream),

		handshakeTimeout: handshakeTimeout,
	}
	// One message of MaxRecvMsgSize must fit in the window with room to
	// spare, or its call could never be read whole.
	s.window = max(connWindow, min(int64(cfg.MaxRecvMsgSize)+streamWindow, 1<<31-1))
	s.idlePeriod = max(cfg.IdleTimeout/idleChecks, time.Millisecond)
	s.app, _ = cfg.Codec.(AppendMarshaler)
	s.bu, _ = cfg.Codec.(BorrowUnmarshaler)
	return s
}

// RegisterService registers the methods of sd served by impl, as
// grpc.Server.RegisterService does. It panics if impl does not implement
// sd.HandlerType, if the service is registered already, or if Serve was
// called.
func (s *Server) RegisterService(sd *grpc.ServiceDesc, impl any) {
	if impl != nil && sd.HandlerType != nil {
		ht := reflect.TypeOf(sd.HandlerType).Elem()
		if !reflect.TypeOf(impl).Implements(ht) {
			panic(fmt.Sprintf("grpcserve: RegisterService of %s: the handler of type %v does not implement %v", sd.ServiceName, reflect.TypeOf(impl), ht))
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.serving {
		panic("grpcserve: RegisterService of " + sd.ServiceName + " after Serve")
	}
	if _, ok := s.info[sd.ServiceName]; ok {
		panic("grpcserve: service " + sd.ServiceName + " registered twice")
	}
	info := grpc.ServiceInfo{Metadata: sd.Metadata}
	for i := range sd.Methods {
		m := &sd.Methods[i]
		name := "/" + sd.ServiceName + "/" + m.MethodName
		s.methods[name] = &method{srv: impl, unary: m.Handler, name: name}
		info.Methods = append(info.Methods, grpc.MethodInfo{Name: m.MethodName})
	}
	for i := range sd.Streams {
		d := &sd.Streams[i]
		name := "/" + sd.ServiceName + "/" + d.StreamName
		s.methods[name] = &method{srv: impl, stream: d, name: name}
		info.Methods = append(info.Methods, grpc.MethodInfo{Name: d.StreamName, IsClientStream: d.ClientStreams, IsServerStream: d.ServerStreams})
	}
	s.info[sd.ServiceName] = info
}

// GetServiceInfo returns the registered services by name, as
// grpc.Server.GetServiceInfo does (reflection reads it).
func (s *Server) GetServiceInfo() map[string]grpc.ServiceInfo {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := make(map[string]grpc.ServiceInfo, len(s.info))
	for k, v := range s.info {
		m[k] = v
	}
	return m
}

// lookup returns the method of path, or the gRPC error message of an
// unknown one.
func (s *Server) lookup(path string) (*method, string) {
	if m := s.methods[path]; m != nil {
		return m, ""
	}
	svc, name, ok := strings.Cut(strings.TrimPrefix(path, "/"), "/")
	if !ok {
		return nil, fmt.Sprintf("malformed method name: %q", clip(path))
	}
	if _, known := s.info[svc]; known {
		return nil, fmt.Sprintf("unknown method %v for service %v", clip(name), svc)
	}
	return nil, fmt.Sprintf("unknown service %v", clip(svc))
}

// maxEcho bounds the bytes of a client's value that an error message
// quotes, so that an answer costs little more than the request that
// asked for it.
const maxEcho = 64

// clip returns v, or its first maxEcho bytes and "...".
func clip(v string) string {
	if len(v) <= maxEcho {
		return v
	}
	return v[:maxEcho] + "..."
}

// Serve accepts connections on ln and serves them until Stop or
// GracefulStop, then returns nil; ln is closed when it returns. It returns
// ErrServerStopped if the server was stopped before, and an accept error
// that is not temporary.
func (s *Server) Serve(ln net.Listener) error {
	s.mu.Lock()
	if s.stopped {
		s.mu.Unlock()
		ln.Close()
		return ErrServerStopped
	}
	s.serving = true
	s.lns[ln] = true
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		if s.lns[ln] {
			delete(s.lns, ln)
			ln.Close()
		}
		s.mu.Unlock()
	}()
	var backoff time.Duration
	for {
		nc, err := ln.Accept()
		if err != nil {
			s.mu.Lock()
			stopped := s.stopped
			s.mu.Unlock()
			if stopped {
				return nil
			}
			if ne, ok := err.(interface{ Temporary() bool }); ok && ne.Temporary() {
				backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
				t := time.NewTimer(backoff)
				select {
				case <-t.C:
				case <-s.quit:
					t.Stop()
				}
				continue
			}
			return err
		}
		backoff = 0
		s.mu.Lock()
		if s.stopped {
			s.mu.Unlock()
			nc.Close()
			return nil
		}
		c := newConn(s, nc)
		s.conns[c] = true
		s.connsWG.Add(1)
		s.mu.Unlock()
		go c.serve()
	}
}

// connDone forgets c, whose goroutines are ending.
func (s *Server) connDone(c *conn) {
	s.mu.Lock()
	delete(s.conns, c)
	s.mu.Unlock()
	s.connsWG.Done()
}

// age is how long a new connection serves calls: MaxConnectionAge ±10%.
func (s *Server) age() time.Duration {
	a := s.cfg.MaxConnectionAge
	return a + time.Duration((rand.Float64()-0.5)*0.2*float64(a))
}

// Stop closes the listeners and the connections at once, cancels the
// calls in flight, and waits for their handlers to return.
func (s *Server) Stop() {
	s.mu.Lock()
	s.stopLocked()
	for c := range s.conns {
		c.close(errors.New("server stopped"))
	}
	s.mu.Unlock()
	s.wait()
}

// GracefulStop closes the listeners, sends each connection a GOAWAY, lets
// the calls in flight finish, and returns once every connection is
// closed. Stop, called meanwhile, ends it at once.
func (s *Server) GracefulStop() {
	s.mu.Lock()
	s.stopLocked()
	for c := range s.conns {
		c.drain()
	}
	s.mu.Unlock()
	s.wait()
}

func (s *Server) stopLocked() {
	if !s.stopped {
		s.stopped = true
		close(s.quit)
	}
	for ln := range s.lns {
		ln.Close()
		delete(s.lns, ln)
	}
}

// wait waits for the connections, then the workers, to end.
func (s *Server) wait() {
	s.connsWG.Wait()
	s.workerWG.Wait()
}

// run runs st's call on an idle worker, or on a new one.
func (s *Server) run(st *stream) {
	select {
	case s.work <- st:
		return
	default:
	}
	s.workerWG.Add(1)
	go s.worker(st)
}

// worker runs st's call, then others as long as at most Workers are idle
// and the server is not stopped.
func (s *Server) worker(st *stream) {
	defer s.workerWG.Done()
	for {
		st.call()
		if int(s.idle.Add(1)) > s.cfg.Workers {
			s.idle.Add(-1)
			return
		}
		select {
		case st = <-s.work:
			s.idle.Add(-1)
		case <-s.quit:
			s.idle.Add(-1)
			return
		}
	}
}
