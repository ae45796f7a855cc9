package daemon

import (
	"bytes"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	rlpb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// TestParseGRPCIdleTimeout: --grpc-idle-timeout is DefaultGRPCIdleTimeout
// by default, comes from its flag or environment variable, 0 turns it
// off, and a negative duration, or the flag with gRPC off, is refused
// naming the flag.
func TestParseGRPCIdleTimeout(t *testing.T) {
	cases := []struct {
		give    []string
		env     map[string]string
		want    time.Duration
		wantErr string
	}{
		{want: DefaultGRPCIdleTimeout},
		{give: []string{"--grpc-idle-timeout", "90s"}, want: 90 * time.Second},
		{env: map[string]string{"HOTKEYD_GRPC_IDLE_TIMEOUT": "1h"}, want: time.Hour},
		{give: []string{"--grpc-idle-timeout", "0"}, want: 0},
		{give: []string{"--grpc-idle-timeout", "-1s"}, wantErr: "--grpc-idle-timeout (HOTKEYD_GRPC_IDLE_TIMEOUT) -1s: want a positive duration"},
		{give: []string{"--grpc-listen", "", "--grpc-idle-timeout", "1m"}, wantErr: "--grpc-idle-timeout (HOTKEYD_GRPC_IDLE_TIMEOUT) applies to gRPC"},
	}
	for _, c := range cases {
		cfg, err := ParseArgs(c.give, env(c.env), nil)
		switch {
		case c.wantErr != "":
			if err == nil || !strings.Contains(err.Error(), c.wantErr) {
				t.Errorf("%q %v: err %v, want it to say %q", c.give, c.env, err, c.wantErr)
			}
		case err != nil:
			t.Errorf("%q %v: %v", c.give, c.env, err)
		case cfg.GRPCIdleTimeout != c.want:
			t.Errorf("%q %v: %v, want %v", c.give, c.env, cfg.GRPCIdleTimeout, c.want)
		}
	}
}

// h2Conn is an HTTP/2 client connection that writes frames as a test
// says.
type h2Conn struct {
	nc net.Conn
	fr *http2.Framer
}

func dialH2(t *testing.T, addr string) *h2Conn {
	t.Helper()
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	nc.SetDeadline(time.Now().Add(time.Minute)) // only catches a hang
	c := &h2Conn{nc: nc, fr: http2.NewFramer(nc, nc)}
	io.WriteString(nc, http2.ClientPreface)
	c.fr.WriteSettings()
	return c
}

// TestGRPCStreamCap: both --grpc-server choices take grpcMaxConcurrentStreams
// calls open at once on a connection, and refuse the rest with
// REFUSED_STREAM.
func TestGRPCStreamCap(t *testing.T) {
	const calls = grpcMaxConcurrentStreams + 500
	for _, server := range []string{GRPCServerLean, GRPCServerGRPCGo} {
		t.Run(server, func(t *testing.T) {
			e := startRLS(t, "memory", "domain: cap\ndescriptors:\n  - key: k\n    rate_limit: {unlimited: true}\n", "--grpc-server", server)
			c := dialH2(t, e.d.GRPCAddr())
			var b, hb bytes.Buffer
			fr, he := http2.NewFramer(&b, nil), hpack.NewEncoder(&hb)
			for i := range calls { // requests begun, never ended: each call stays open
				hb.Reset()
				for _, f := range [][2]string{{":method", "POST"}, {":scheme", "http"}, {":path", rlpb.RateLimitService_ShouldRateLimit_FullMethodName}, {":authority", "x"}, {"content-type", "application/grpc"}} {
					he.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
				}
				fr.WriteHeaders(http2.HeadersFrameParam{StreamID: uint32(2*i + 1), BlockFragment: hb.Bytes(), EndHeaders: true})
			}
			fr.WritePing(false, [8]byte{7}) // answered once every HEADERS before it was
			go c.nc.Write(b.Bytes())
			refused := 0
			for {
				f, err := c.fr.ReadFrame()
				if err != nil {
					t.Fatal(err)
				}
				if rst, ok := f.(*http2.RSTStreamFrame); ok && rst.ErrCode == http2.ErrCodeRefusedStream {
					refused++
				}
				if p, ok := f.(*http2.PingFrame); ok && p.IsAck() {
					break
				}
			}
			if want := calls - grpcMaxConcurrentStreams; refused != want {
				t.Errorf("%d calls opened at once: %d refused, want %d", calls, refused, want)
			}
		})
	}
}

// TestGRPCIdleTimeout: both --grpc-server choices send a connection with
// no call for --grpc-idle-timeout a GOAWAY and close it.
func TestGRPCIdleTimeout(t *testing.T) {
	for _, server := range []string{GRPCServerLean, GRPCServerGRPCGo} {
		t.Run(server, func(t *testing.T) {
			e := startRLS(t, "memory", "domain: idle\ndescriptors:\n  - key: k\n    rate_limit: {unlimited: true}\n",
				"--grpc-server", server, "--grpc-idle-timeout", "50ms")
			c := dialH2(t, e.d.GRPCAddr())
			c.nc.SetDeadline(time.Now().Add(10 * time.Second)) // only catches a hang
			for {
				f, err := c.fr.ReadFrame()
				if err != nil {
					t.Fatalf("the connection ended with no GOAWAY: %v", err)
				}
				if g, ok := f.(*http2.GoAwayFrame); ok {
					if g.ErrCode != http2.ErrCodeNo {
						t.Errorf("GOAWAY %v, want NO_ERROR", g.ErrCode)
					}
					return
				}
			}
		})
	}
}
