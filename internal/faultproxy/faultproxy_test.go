package faultproxy

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// echoServer echoes every connection until closed.
type echoServer struct {
	ln net.Listener
	wg sync.WaitGroup
	mu sync.Mutex
	cs []net.Conn
}

func startEcho(t *testing.T) *echoServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &echoServer{ln: ln}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s.mu.Lock()
			s.cs = append(s.cs, c)
			s.mu.Unlock()
			s.wg.Add(1)
			go func() {
				defer s.wg.Done()
				io.Copy(c, c)
				c.Close()
			}()
		}
	}()
	t.Cleanup(s.close)
	return s
}

func (s *echoServer) close() {
	s.ln.Close()
	s.mu.Lock()
	for _, c := range s.cs {
		c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
}

func newProxy(t *testing.T, target string) *Proxy {
	t.Helper()
	p, err := New(target)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

func dial(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// roundTrip sends a line and reads it back, and says how long it took.
func roundTrip(t *testing.T, c net.Conn, r *bufio.Reader, line string) time.Duration {
	t.Helper()
	start := time.Now()
	c.SetDeadline(time.Now().Add(time.Minute))
	if _, err := io.WriteString(c, line+"\n"); err != nil {
		t.Fatal(err)
	}
	got, err := r.ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	if got != line+"\n" {
		t.Fatalf("echo %q, want %q", got, line)
	}
	return time.Since(start)
}

func TestForward(t *testing.T) {
	echo := startEcho(t)
	p := newProxy(t, echo.ln.Addr().String())
	if !strings.HasPrefix(p.Addr(), "127.0.0.1:") || p.Target() != echo.ln.Addr().String() {
		t.Fatalf("addr %s, target %s", p.Addr(), p.Target())
	}
	c := dial(t, p.Addr())
	r := bufio.NewReader(c)
	for i := range 10 {
		roundTrip(t, c, r, strings.Repeat("x", i*1000))
	}
	// A large write crosses in many chunks, in order.
	big := bytes.Repeat([]byte("0123456789abcdef"), 1<<16) // 1 MiB
	go c.Write(big)
	got := make([]byte, len(big))
	c.SetDeadline(time.Now().Add(time.Minute))
	if _, err := io.ReadFull(r, got); err != nil || !bytes.Equal(got, big) {
		t.Fatalf("1 MiB echo: %v, equal %v", err, bytes.Equal(got, big))
	}
	if p.Conns() != 1 || p.Accepted() != 1 {
		t.Fatalf("%d open, %d accepted; want 1, 1", p.Conns(), p.Accepted())
	}
	// Half-close: the client's EOF reaches the server, whose close comes
	// back as EOF, and the pair is gone.
	c.(*net.TCPConn).CloseWrite()
	if _, err := r.ReadByte(); err != io.EOF {
		t.Fatalf("after half-close: %v, want EOF", err)
	}
	deadline := time.Now().Add(time.Minute)
	for p.Conns() != 0 {
		if time.Now().After(deadline) {
			t.Fatal("pair still open after both directions ended")
		}
		time.Sleep(time.Millisecond)
	}
}

func TestDelay(t *testing.T) {
	echo := startEcho(t)
	p := newProxy(t, echo.ln.Addr().String())
	c := dial(t, p.Addr())
	r := bufio.NewReader(c)
	base := roundTrip(t, c, r, "warm")
	const d = 500 * time.Millisecond
	p.SetDelay(d)
	took := roundTrip(t, c, r, "slow")
	t.Logf("round trip %v undelayed, %v with %v each way", base, took, d)
	if took < 2*d {
		t.Fatalf("round trip %v with a delay of %v each way, want at least %v", took, d, 2*d)
	}
	// Latency, not throughput: 50 lines written one by one come back after
	// about 2d, not one 2d after another (50 s; the bound leaves a loaded
	// machine 25 s).
	start := time.Now()
	c.SetDeadline(time.Now().Add(time.Minute))
	for i := range 50 {
		if _, err := io.WriteString(c, strings.Repeat("y", i)+"\n"); err != nil {
			t.Fatal(err)
		}
	}
	for range 50 {
		if _, err := r.ReadString('\n'); err != nil {
			t.Fatal(err)
		}
	}
	all := time.Since(start)
	t.Logf("50 lines pipelined: %v", all)
	if all < 2*d || all >= 50*2*d/2 {
		t.Fatalf("50 pipelined lines took %v with %v each way, want at least %v and well under 50 × %v", all, d, 2*d, 2*d)
	}
	p.SetDelay(0)
	if took := roundTrip(t, c, r, "fast"); took >= 2*d {
		t.Logf("round trip %v after SetDelay(0): slow machine?", took)
	}
}

func TestCutRestore(t *testing.T) {
	echo := startEcho(t)
	p := newProxy(t, echo.ln.Addr().String())
	c := dial(t, p.Addr())
	r := bufio.NewReader(c)
	roundTrip(t, c, r, "before")
	p.Cut()
	c.SetDeadline(time.Now().Add(time.Minute))
	if _, err := r.ReadByte(); err == nil {
		t.Fatal("read on a cut connection succeeded")
	} else if errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatal("a cut connection was not closed")
	}
	// New connections are accepted and closed at once.
	for range 3 {
		n := dial(t, p.Addr())
		n.SetDeadline(time.Now().Add(time.Minute))
		io.WriteString(n, "hello\n")
		if _, err := bufio.NewReader(n).ReadByte(); err == nil {
			t.Fatal("a connection made while cut was forwarded")
		} else if errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatal("a connection made while cut was left open")
		}
	}
	if p.Refused() < 3 || p.Conns() != 0 {
		t.Fatalf("%d refused, %d open; want at least 3 and 0", p.Refused(), p.Conns())
	}
	p.Restore()
	n := dial(t, p.Addr())
	roundTrip(t, n, bufio.NewReader(n), "after")
}

func TestCloseWithDelayedData(t *testing.T) {
	echo := startEcho(t)
	p, err := New(echo.ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	c := dial(t, p.Addr())
	p.SetDelay(time.Hour)
	io.WriteString(c, "stuck\n")
	time.Sleep(20 * time.Millisecond)
	start := time.Now()
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	t.Logf("Close took %v with data held for an hour", took)
	if took >= time.Minute {
		t.Fatalf("Close took %v: it waited for data held for an hour", took)
	}
	if err := p.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := net.DialTimeout("tcp", p.Addr(), time.Second); err == nil {
		t.Fatal("dial after Close succeeded")
	}
}

func TestDelayRangeDraw(t *testing.T) {
	for _, tt := range []struct {
		name           string
		giveLo, giveHi time.Duration
		wantLo, wantHi time.Duration
	}{
		{"range", 50 * time.Millisecond, 200 * time.Millisecond, 50 * time.Millisecond, 200 * time.Millisecond},
		{"fixed", 30 * time.Millisecond, 30 * time.Millisecond, 30 * time.Millisecond, 30 * time.Millisecond},
		{"hi below lo", 30 * time.Millisecond, 10 * time.Millisecond, 30 * time.Millisecond, 30 * time.Millisecond},
		{"negative", -time.Second, -time.Millisecond, 0, 0},
		{"none", 0, 0, 0, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			p := newProxy(t, "")
			p.SetDelayRange(tt.giveLo, tt.giveHi)
			r := p.delay.Load()
			if r.lo != tt.wantLo || r.hi != tt.wantHi {
				t.Fatalf("range [%v, %v], want [%v, %v]", r.lo, r.hi, tt.wantLo, tt.wantHi)
			}
			mid := tt.wantLo + (tt.wantHi-tt.wantLo)/2
			var below, above int
			for range 2000 {
				d := r.draw()
				if d < tt.wantLo || d > tt.wantHi {
					t.Fatalf("drew %v, outside [%v, %v]", d, tt.wantLo, tt.wantHi)
				}
				if d < mid {
					below++
				} else {
					above++
				}
			}
			// Uniform: each half of a real range gets about 1000 of 2000
			// draws; fewer than 500 in one would take a broken draw.
			if tt.wantHi > tt.wantLo && (below < 500 || above < 500) {
				t.Fatalf("%d draws below %v and %d above: not spread over [%v, %v]", below, mid, above, tt.wantLo, tt.wantHi)
			}
		})
	}
}

// TestDelayRangeOrder: with each chunk held for a delay drawn from a range
// far wider than the gap between writes, lines written one at a time still
// come back in order, none sooner than the least delay each way.
func TestDelayRangeOrder(t *testing.T) {
	echo := startEcho(t)
	p := newProxy(t, echo.ln.Addr().String())
	c := dial(t, p.Addr())
	r := bufio.NewReader(c)
	roundTrip(t, c, r, "warm")
	const lo, hi, lines = 100 * time.Millisecond, 300 * time.Millisecond, 50
	p.SetDelayRange(lo, hi)
	c.SetDeadline(time.Now().Add(time.Minute))
	sent := make(chan time.Time, lines)
	errc := make(chan error, 1)
	go func() {
		for i := range lines {
			sent <- time.Now()
			if _, err := fmt.Fprintf(c, "line %d\n", i); err != nil {
				errc <- err
				return
			}
			time.Sleep(2 * time.Millisecond) // a chunk of its own, most likely
		}
		errc <- nil
	}()
	var least time.Duration
	for i := range lines {
		got, err := r.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		if want := fmt.Sprintf("line %d\n", i); got != want {
			t.Fatalf("read %q, want %q: chunks reordered", got, want)
		}
		took := time.Since(<-sent)
		if i == 0 || took < least {
			least = took
		}
		if took < 2*lo {
			t.Fatalf("line %d came back after %v, want at least %v (%v each way)", i, took, 2*lo, lo)
		}
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	t.Logf("%d lines in order; shortest round trip %v with [%v, %v] each way", lines, least, lo, hi)
}

func TestSetTarget(t *testing.T) {
	p := newProxy(t, "")
	n := dial(t, p.Addr())
	n.SetDeadline(time.Now().Add(time.Minute))
	if _, err := n.Read(make([]byte, 1)); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read through a proxy with no target: %v, want the connection closed", err)
	}
	echo := startEcho(t)
	p.SetTarget(echo.ln.Addr().String())
	if p.Target() != echo.ln.Addr().String() {
		t.Fatalf("target %q after SetTarget(%q)", p.Target(), echo.ln.Addr())
	}
	c := dial(t, p.Addr())
	roundTrip(t, c, bufio.NewReader(c), "after")
	if p.Refused() != 1 || p.Accepted() != 1 {
		t.Fatalf("%d refused, %d accepted; want 1, 1", p.Refused(), p.Accepted())
	}
}
