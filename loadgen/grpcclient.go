package loadgen

import (
	"context"
	"crypto/tls"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"
)

// GRPCClient is a gRPC client for unary calls over a GRPCConn that it
// replaces when the connection breaks or the server sends GOAWAY (as one
// with a maximum connection age does): the next call dials a new one, and
// the replaced connection is closed once the calls on it have ended. A
// failed dial fails the calls that waited for it with codes.Unavailable,
// and so does every call until the next dial, which waits an exponential
// backoff. It implements grpc.ClientConnInterface for unary calls only,
// and is safe for concurrent use; DialGRPCClient makes one.
type GRPCClient struct {
	addr    string
	tlsConf *tls.Config

	// Fixed once made; tests set them.
	dial        func(ctx context.Context) (*GRPCConn, error)
	now         func() time.Time
	dialTimeout time.Duration
	minBackoff  time.Duration
	maxBackoff  time.Duration

	cur    atomic.Pointer[GRPCConn] // the connection calls are made on; nil when it is to be dialed
	closed atomic.Bool

	mu       sync.Mutex // guards the fields below, and the replacing of cur
	dialing  *grpcDial  // the dial under way; nil for none
	lastErr  error      // the last dial's error; nil after a success
	retryAt  time.Time  // the time before which no dial is made, after a failed one
	backoff  time.Duration
	draining map[*GRPCConn]bool // replaced, to be closed when their calls end
	stop     context.CancelFunc // ends the dial under way, at Close
	stopCtx  context.Context
	wg       sync.WaitGroup // the dial goroutine, and one a draining connection
}

// grpcDial is one dial of a GRPCClient: done is closed when it ends, err
// set before if it failed.
type grpcDial struct {
	done chan struct{}
	err  error
}

var _ grpc.ClientConnInterface = (*GRPCClient)(nil)

// The defaults of a GRPCClient's dials: each is given dialTimeout, and
// after a failed one the next waits minBackoff, doubled after each
// further failure up to maxBackoff, each wait with ±20% of jitter.
const (
	grpcDialTimeout = 5 * time.Second
	grpcMinBackoff  = 100 * time.Millisecond
	grpcMaxBackoff  = time.Second // a load generator wants to see a restarted server soon
	grpcAttempts    = 3           // the tries of a call the server did not take (see Invoke)
)

// DialGRPCClient connects to the gRPC server at addr as DialGRPC does,
// and returns DialGRPC's error if that fails, or else a client that
// redials addr with tlsConf when needed, each dial given 5 s. The client
// is the caller's to Close.
func DialGRPCClient(ctx context.Context, addr string, tlsConf *tls.Config) (*GRPCClient, error) {
	conn, err := DialGRPC(ctx, addr, tlsConf)
	if err != nil {
		return nil, err
	}
	g := &GRPCClient{
		addr:        addr,
		tlsConf:     tlsConf,
		now:         time.Now,
		dialTimeout: grpcDialTimeout,
		minBackoff:  grpcMinBackoff,
		maxBackoff:  grpcMaxBackoff,
		backoff:     grpcMinBackoff,
		draining:    map[*GRPCConn]bool{},
	}
	g.dial = func(ctx context.Context) (*GRPCConn, error) { return DialGRPC(ctx, g.addr, g.tlsConf) }
	g.stopCtx, g.stop = context.WithCancel(context.Background())
	g.cur.Store(conn)
	return g, nil
}

// Invoke makes the unary call of method as GRPCConn.Invoke does, on the
// current connection, dialing one first if needed. A call the connection
// refused before sending it, or the server refused by GOAWAY, is made
// again on the next connection, up to 3 times in all. A call waiting for
// a dial returns when its ctx ends.
func (g *GRPCClient) Invoke(ctx context.Context, method string, args, reply any, opts ...grpc.CallOption) error {
	for try := 1; ; try++ {
		conn, err := g.conn(ctx)
		if err != nil {
			return err
		}
		unsent, err := conn.invoke(ctx, method, args, reply, opts...)
		if !unsent || try == grpcAttempts {
			return err
		}
	}
}

// NewStream returns ErrStreamsUnsupported.
func (g *GRPCClient) NewStream(context.Context, *grpc.StreamDesc, string, ...grpc.CallOption) (grpc.ClientStream, error) {
	return nil, ErrStreamsUnsupported
}

// Close ends the dial under way, closes the current connection and those
// draining, failing their calls with codes.Canceled as GRPCConn.Close
// does, and waits for their goroutines to end. Every later call fails
// the same way. It may be called more than once.
func (g *GRPCClient) Close() error {
	g.mu.Lock()
	g.closed.Store(true)
	g.stop()
	conns := []*GRPCConn{g.cur.Swap(nil)}
	for c := range g.draining {
		conns = append(conns, c)
	}
	g.mu.Unlock()
	for _, c := range conns {
		if c != nil {
			c.Close()
		}
	}
	g.wg.Wait()
	return nil
}

// conn returns the connection to make a call on: the current one if it
// takes new calls, else the one a dial makes, which it starts or waits
// for.
func (g *GRPCClient) conn(ctx context.Context) (*GRPCConn, error) {
	if c := g.cur.Load(); c != nil && !c.refusing.Load() {
		return c, nil
	}
	if g.closed.Load() {
		return nil, errConnClosing
	}
	g.mu.Lock()
	for {
		if g.closed.Load() {
			g.mu.Unlock()
			return nil, errConnClosing
		}
		c := g.cur.Load()
		if c != nil && !c.refusing.Load() {
			g.mu.Unlock()
			return c, nil
		}
		if c != nil {
			g.retireLocked(c)
		}
		d := g.dialing
		if d == nil {
			if g.lastErr != nil && g.now().Before(g.retryAt) {
				err := g.lastErr
				g.mu.Unlock()
				return nil, g.unavailable(err)
			}
			d = g.dialLocked()
		}
		g.mu.Unlock()
		select {
		case <-d.done:
		case <-ctx.Done():
			return nil, grpcstatus.FromContextError(ctx.Err()).Err()
		}
		if d.err != nil {
			if g.closed.Load() {
				return nil, errConnClosing
			}
			return nil, g.unavailable(d.err)
		}
		g.mu.Lock()
	}
}

// unavailable is the error of a call made when no connection could be.
func (g *GRPCClient) unavailable(err error) error {
	return grpcstatus.Errorf(codes.Unavailable, "no connection to %s: %v", g.addr, err)
}

// retireLocked takes c, which refuses new calls, out of use: it is closed
// once the calls on it have ended, and forgotten once its goroutines
// have.
func (g *GRPCClient) retireLocked(c *GRPCConn) {
	g.cur.Store(nil)
	g.draining[c] = true
	c.drain()
	g.wg.Go(func() {
		c.wg.Wait()
		g.mu.Lock()
		delete(g.draining, c)
		g.mu.Unlock()
	})
}

// dialLocked starts a dial, which makes the connection it makes current,
// or on failure keeps its error and puts off the next dial by the
// backoff.
func (g *GRPCClient) dialLocked() *grpcDial {
	d := &grpcDial{done: make(chan struct{})}
	g.dialing = d
	g.wg.Go(func() {
		ctx, cancel := context.WithTimeout(g.stopCtx, g.dialTimeout)
		conn, err := g.dial(ctx)
		cancel()
		g.mu.Lock()
		g.dialing = nil
		if err == nil && g.closed.Load() {
			// Close came during the dial: the connection is not kept.
			g.mu.Unlock()
			conn.Close()
			d.err = errConnClosing
			close(d.done)
			return
		}
		if err != nil {
			d.err, g.lastErr = err, err
			jitter := g.backoff / 5
			g.retryAt = g.now().Add(g.backoff - jitter + rand.N(2*jitter+1))
			g.backoff = min(2*g.backoff, g.maxBackoff)
		} else {
			g.lastErr, g.backoff = nil, g.minBackoff
			g.cur.Store(conn)
		}
		close(d.done)
		g.mu.Unlock()
	})
	return d
}
