package faultproxy

import (
	"bufio"
	"bytes"
	"errors"
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
