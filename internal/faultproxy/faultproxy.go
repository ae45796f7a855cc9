// Package faultproxy is a TCP proxy on loopback for fault tests: it forwards
// connections to a target address and, on command, delays what it forwards
// or cuts the link.
//
// A Proxy listens on 127.0.0.1 with a port the kernel picks. Each accepted
// connection is paired with a new connection to the target, and bytes are
// copied both ways in chunks (whatever one read returns). SetDelay holds
// every chunk read from now on for a while before it is written, in each
// direction, without limiting throughput: it adds latency, as a slow network
// or server would; SetDelayRange draws each chunk's delay from a range, as a
// network with jitter would, and still writes a direction's chunks in the
// order they were read. Cut closes every connection and answers new ones by
// closing them at once (the client sees the connection end, not a timeout),
// until Restore. Close stops the proxy and waits for all its goroutines.
package faultproxy

import (
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// queueLen bounds the chunks held per direction while delayed: a reader
// blocks when its writer is this far behind.
const queueLen = 256

// chunkSize is the largest chunk read at once.
const chunkSize = 32 << 10

// Proxy forwards TCP connections to a target. Its methods are safe for
// concurrent use.
type Proxy struct {
	ln     net.Listener
	target atomic.Pointer[string]

	delay atomic.Pointer[delayRange] // added to every chunk read from now on
	cut   atomic.Bool                // refuse new connections

	mu     sync.Mutex
	conns  map[*pair]struct{}
	closed bool
	wg     sync.WaitGroup // accept loop and every pair's goroutines

	accepted, refused atomic.Int64
}

// New starts a proxy on 127.0.0.1:0 forwarding to target (host:port). An
// empty target refuses connections until SetTarget. The caller must call
// Close.
func New(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("faultproxy: listen: %w", err)
	}
	p := &Proxy{ln: ln, conns: make(map[*pair]struct{})}
	p.target.Store(&target)
	p.delay.Store(&delayRange{})
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr returns the address the proxy listens on, "127.0.0.1:PORT".
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Target returns the address the proxy forwards to.
func (p *Proxy) Target() string { return *p.target.Load() }

// SetTarget makes the proxy forward connections accepted from now on to
// target; open connections keep theirs.
func (p *Proxy) SetTarget(target string) { p.target.Store(&target) }

// SetDelay makes every chunk read from now on, in either direction, wait d
// before it is written (0: none). Chunks already waiting keep their time.
// Order is kept: a chunk is never written before one read earlier.
func (p *Proxy) SetDelay(d time.Duration) { p.SetDelayRange(d, d) }

// SetDelayRange makes every chunk read from now on wait a delay drawn
// uniformly from [lo, hi] (negative bounds count as 0, hi below lo as lo).
// Order is kept: a direction's chunk is written at its own read time plus
// its delay, or right after the chunk read before it, whichever is later.
func (p *Proxy) SetDelayRange(lo, hi time.Duration) {
	lo = max(lo, 0)
	p.delay.Store(&delayRange{lo: lo, hi: max(hi, lo)})
}

// delayRange is the range a chunk's delay is drawn from.
type delayRange struct{ lo, hi time.Duration }

// draw returns a delay drawn uniformly from [lo, hi].
func (r *delayRange) draw() time.Duration {
	if r.hi <= r.lo {
		return r.lo
	}
	return r.lo + rand.N(r.hi-r.lo+1)
}

// Cut closes every open connection, both sides, and closes new ones as soon
// as they are accepted, without dialing the target, until Restore.
func (p *Proxy) Cut() {
	p.cut.Store(true)
	p.mu.Lock()
	open := make([]*pair, 0, len(p.conns))
	for c := range p.conns {
		open = append(open, c)
		delete(p.conns, c) // no longer forwarded, whenever its goroutines end
	}
	p.mu.Unlock()
	for _, c := range open {
		c.close()
	}
}

// Restore ends a Cut: new connections are forwarded again. It leaves the
// delay as it is.
func (p *Proxy) Restore() { p.cut.Store(false) }

// Conns returns the number of connections being forwarded now.
func (p *Proxy) Conns() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.conns)
}

// Accepted returns how many connections the proxy has forwarded, and
// Refused how many it closed at once because it was cut (or the target
// could not be dialed).
func (p *Proxy) Accepted() int64 { return p.accepted.Load() }
func (p *Proxy) Refused() int64  { return p.refused.Load() }

// Close stops listening, closes every connection and waits for the proxy's
// goroutines. Safe to call twice.
func (p *Proxy) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	open := make([]*pair, 0, len(p.conns))
	for c := range p.conns {
		open = append(open, c)
	}
	p.mu.Unlock()
	err := p.ln.Close()
	for _, c := range open {
		c.close()
	}
	p.wg.Wait()
	return err
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		conn, err := p.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			time.Sleep(5 * time.Millisecond) // e.g. out of file descriptors
			continue
		}
		if p.cut.Load() {
			p.refused.Add(1)
			conn.Close()
			continue
		}
		p.wg.Add(1)
		go p.forward(conn)
	}
}

// forward dials the target for conn and copies both ways until both
// directions end, an error, Cut or Close.
func (p *Proxy) forward(client net.Conn) {
	defer p.wg.Done()
	server, err := net.DialTimeout("tcp", p.Target(), 5*time.Second)
	if err != nil {
		p.refused.Add(1)
		client.Close()
		return
	}
	c := &pair{a: client, b: server, done: make(chan struct{})}
	p.mu.Lock()
	if p.closed || p.cut.Load() {
		p.mu.Unlock()
		p.refused.Add(1)
		client.Close()
		server.Close()
		return
	}
	p.conns[c] = struct{}{}
	p.wg.Add(5) // two readers, two writers, the closer
	p.mu.Unlock()
	p.accepted.Add(1)

	var dirs sync.WaitGroup
	dirs.Add(2)
	for _, d := range [2][2]net.Conn{{client, server}, {server, client}} {
		q := make(chan chunk, queueLen)
		go func() { defer p.wg.Done(); p.read(c, d[0], q) }()
		go func() { defer p.wg.Done(); defer dirs.Done(); p.write(c, d[1], q) }()
	}
	go func() {
		defer p.wg.Done()
		dirs.Wait()
		c.close()
		p.mu.Lock()
		delete(p.conns, c)
		p.mu.Unlock()
	}()
}

// chunk is bytes read at one instant, due to be written at due; data nil
// marks the end of the direction (EOF).
type chunk struct {
	data []byte
	due  time.Time
}

// read copies chunks from src into q, each stamped with its due time, and
// closes q at EOF or on an error.
func (p *Proxy) read(c *pair, src net.Conn, q chan<- chunk) {
	defer close(q)
	for {
		buf := make([]byte, chunkSize)
		n, err := src.Read(buf)
		if n > 0 {
			ch := chunk{data: buf[:n], due: time.Now().Add(p.delay.Load().draw())}
			select {
			case q <- ch:
			case <-c.done:
				return
			}
		}
		if err != nil {
			if err != io.EOF {
				c.close() // a reset or Cut: the other direction cannot go on either
			}
			return
		}
	}
}

// write writes q's chunks to dst in order, each at its due time or right
// after the chunk before it, whichever is later, then half-closes dst.
func (p *Proxy) write(c *pair, dst net.Conn, q <-chan chunk) {
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for ch := range q {
		if wait := time.Until(ch.due); wait > 0 {
			if timer == nil {
				timer = time.NewTimer(wait)
			} else {
				timer.Reset(wait)
			}
			select {
			case <-timer.C:
			case <-c.done:
				return
			}
		}
		if _, err := dst.Write(ch.data); err != nil {
			c.close()
			return
		}
	}
	select {
	case <-c.done:
	default:
		if tc, ok := dst.(*net.TCPConn); ok {
			_ = tc.CloseWrite()
		}
	}
}

// pair is one proxied connection: a to the client, b to the target.
type pair struct {
	a, b net.Conn
	once sync.Once
	done chan struct{} // closed by close
}

func (c *pair) close() {
	c.once.Do(func() {
		close(c.done)
		c.a.Close()
		c.b.Close()
	})
}
