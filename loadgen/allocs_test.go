package loadgen_test

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/hotkeyd/hotkey/loadgen"
)

// maxClientAllocs is the most allocations a decision costs the client of
// an HTTP target (HTTP or Endpoint) given no *http.Client: what
// TestHTTPClientAllocs holds it to. Under the race detector pooled
// requests and answers are allocated again now and then.
func maxClientAllocs() float64 {
	if raceEnabled {
		return 25
	}
	return 4
}

// cannedServer is an HTTP/1.1 server on loopback that answers every
// request with answer, over keep-alive connections, allocating nothing per
// request, so that what a request allocates in this process is the
// client's. With once, it closes each connection after its first answer,
// saying nothing of it, as a server closes a connection idle too long. It
// is closed with the test.
func cannedServer(t *testing.T, answer string, once bool) string {
	t.Helper()
	return serveLoopback(t, func(c net.Conn) { serveCanned(c, []byte(answer), once) })
}

// serveLoopback listens on a loopback port, runs serve on each connection
// accepted on a goroutine of its own, and returns the address. The
// listener and every connection are closed, and the goroutines waited
// for, when the test ends.
func serveLoopback(t testing.TB, serve func(net.Conn)) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex // guards conns
	var conns []net.Conn
	t.Cleanup(func() {
		l.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Go(func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Go(func() { serve(c) })
		}
	})
	return l.Addr().String()
}

// serveCanned reads requests on c (a header, then Content-Length bytes of
// body) and writes answer to each, until c fails or, with once, after the
// first.
func serveCanned(c net.Conn, answer []byte, once bool) {
	defer c.Close()
	r := bufio.NewReader(c)
	contentLength := []byte("content-length:")
	for {
		n := 0
		for {
			line, err := r.ReadSlice('\n')
			if err != nil {
				return
			}
			if len(bytes.TrimSpace(line)) == 0 {
				break
			}
			if len(line) > len(contentLength) && bytes.EqualFold(line[:len(contentLength)], contentLength) {
				n, _ = strconv.Atoi(string(bytes.TrimSpace(line[len(contentLength):])))
			}
		}
		if _, err := r.Discard(n); err != nil {
			return
		}
		if _, err := c.Write(answer); err != nil {
			return
		}
		if once {
			// Closed for writing, then read until the client closes, so
			// a request it sends on c meets the end of c, not a reset.
			c.(*net.TCPConn).CloseWrite()
			io.Copy(io.Discard, c)
			return
		}
	}
}

// hotkeydAnswer is hotkeyd's answer to an admitted decision.
const hotkeydAnswer = `{"allowed":true,"shards":1,"limit":100,"remaining":99,"reset_after_ms":10,"retry_after_ms":0}`

// canned is an HTTP/1.1 answer of status line, headers and body.
func canned(status, headers, body string) string {
	return "HTTP/1.1 " + status + "\r\n" + headers + "Content-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body
}

// TestHTTPClientAllocs: a decision of HTTP (hotkeyd's POST /v1/allow) and
// of Endpoint (a GET, the key in a header, RateLimit headers read from
// the answer) costs their own client at most maxClientAllocs allocations,
// the server here allocating none.
func TestHTTPClientAllocs(t *testing.T) {
	hk := cannedServer(t, canned("200 OK", "Content-Type: application/json\r\n",
		hotkeydAnswer), false)
	gw := cannedServer(t, canned("200 OK", "X-RateLimit-Limit: 100\r\nX-RateLimit-Remaining: 99\r\n", "ok"), false)
	endpoint, err := loadgen.Endpoint("http://"+gw+"/api", loadgen.EndpointConfig{KeyHeader: "X-Api-Key"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute) // only catches a hang
	defer cancel()
	for _, tc := range []struct {
		name   string
		target loadgen.Target
	}{
		{"hotkeyd", loadgen.HTTP("http://"+hk, "", nil)},
		{"endpoint", endpoint},
	} {
		t.Run(tc.name, func(t *testing.T) {
			allocs := testing.AllocsPerRun(1000, func() {
				out, err := tc.target.Decide(ctx, "user_123", 1)
				if err != nil || !out.Allowed || out.Quota.Limit != 100 || out.Quota.Remaining != 99 {
					t.Fatalf("Decide: %+v, %v; want admitted, limit 100, 99 remaining", out, err)
				}
			})
			t.Logf("%.1f allocations per decision", allocs)
			if allocs > maxClientAllocs() {
				t.Errorf("%.1f allocations per decision, want at most %.0f", allocs, maxClientAllocs())
			}
		})
	}
}
