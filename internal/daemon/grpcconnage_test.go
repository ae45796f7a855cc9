package daemon

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	ratelimit "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlpb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/hotkeyd/hotkey/internal/testkit"
)

// TestParseGRPCMaxConnectionAge: the connection age and its grace are off
// (0) by default, come from their flags or environment variables, and a
// negative duration, a grace without an age, or either with gRPC off is
// refused naming the flag.
func TestParseGRPCMaxConnectionAge(t *testing.T) {
	cases := []struct {
		give      []string
		env       map[string]string
		wantAge   time.Duration
		wantGrace time.Duration
		wantErr   string
	}{
		{give: nil},
		{give: []string{"--grpc-max-connection-age", "5m", "--grpc-max-connection-age-grace", "30s"}, wantAge: 5 * time.Minute, wantGrace: 30 * time.Second},
		{give: []string{"--grpc-max-connection-age", "5m"}, wantAge: 5 * time.Minute},
		{env: map[string]string{"HOTKEYD_GRPC_MAX_CONNECTION_AGE": "90s", "HOTKEYD_GRPC_MAX_CONNECTION_AGE_GRACE": "1s"}, wantAge: 90 * time.Second, wantGrace: time.Second},
		{give: []string{"--grpc-max-connection-age", "2m"}, env: map[string]string{"HOTKEYD_GRPC_MAX_CONNECTION_AGE": "90s"}, wantAge: 2 * time.Minute},
		{give: []string{"--grpc-max-connection-age", "0"}, wantAge: 0},
		{give: []string{"--grpc-max-connection-age", "-1s"}, wantErr: "--grpc-max-connection-age (HOTKEYD_GRPC_MAX_CONNECTION_AGE) -1s: want a positive duration"},
		{env: map[string]string{"HOTKEYD_GRPC_MAX_CONNECTION_AGE_GRACE": "-5s", "HOTKEYD_GRPC_MAX_CONNECTION_AGE": "1m"}, wantErr: "--grpc-max-connection-age-grace (HOTKEYD_GRPC_MAX_CONNECTION_AGE_GRACE) -5s: want a positive duration"},
		{give: []string{"--grpc-max-connection-age", "5"}, wantErr: "want a duration with its unit"},
		{env: map[string]string{"HOTKEYD_GRPC_MAX_CONNECTION_AGE": "soon"}, wantErr: `HOTKEYD_GRPC_MAX_CONNECTION_AGE="soon": want a duration with its unit`},
		{give: []string{"--grpc-max-connection-age-grace", "30s"}, wantErr: "--grpc-max-connection-age-grace (HOTKEYD_GRPC_MAX_CONNECTION_AGE_GRACE) follows --grpc-max-connection-age"},
		{give: []string{"--grpc-listen", "", "--grpc-max-connection-age", "5m"}, wantErr: "--grpc-max-connection-age (HOTKEYD_GRPC_MAX_CONNECTION_AGE) applies to gRPC, which an empty --grpc-listen"},
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
		case cfg.GRPCMaxConnectionAge != c.wantAge || cfg.GRPCMaxConnectionAgeGrace != c.wantGrace:
			t.Errorf("%q %v: age %v, grace %v; want %v, %v", c.give, c.env, cfg.GRPCMaxConnectionAge, cfg.GRPCMaxConnectionAgeGrace, c.wantAge, c.wantGrace)
		}
	}
}

// TestGRPCMaxConnectionAge: a daemon whose gRPC connections live 200 ms
// sends its client a GOAWAY, and the client dials again, as Envoy would to
// a daemon it finds anew; every request is answered meanwhile, those in
// flight when the GOAWAY comes included.
func TestGRPCMaxConnectionAge(t *testing.T) {
	e := startRLS(t, "memory", "domain: age\ndescriptors:\n  - key: k\n    rate_limit: {unlimited: true}\n",
		"--grpc-max-connection-age", "200ms", "--grpc-max-connection-age-grace", "100ms")
	var dials atomic.Int64
	conn, err := grpc.NewClient(e.d.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			dials.Add(1)
			var d net.Dialer
			return d.DialContext(ctx, "tcp", addr)
		}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	c := rlpb.NewRateLimitServiceClient(conn)
	req := &rlpb.RateLimitRequest{Domain: "age", Descriptors: []*ratelimit.RateLimitDescriptor{{Entries: []*ratelimit.RateLimitDescriptor_Entry{{Key: "k", Value: "v"}}}}}

	// Four callers, so that requests are in flight when a GOAWAY comes,
	// until the client has dialed 3 times; bounded by count, and by a
	// deadline that only catches a hang.
	const (
		callers     = 4
		maxRequests = 50000
		wantDials   = 3
	)
	ctx, cancel := context.WithTimeout(context.Background(), testkit.Patience)
	defer cancel()
	var sent, failed atomic.Int64
	var errMu sync.Mutex // guards firstErr
	var firstErr error
	var wg sync.WaitGroup
	for range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for dials.Load() < wantDials && sent.Add(1) <= maxRequests && ctx.Err() == nil {
				resp, err := c.ShouldRateLimit(ctx, req)
				if err == nil && resp.GetOverallCode() != rlpb.RateLimitResponse_OK {
					err = errors.New(resp.GetOverallCode().String())
				}
				if err != nil {
					if failed.Add(1) == 1 {
						errMu.Lock()
						firstErr = err
						errMu.Unlock()
					}
				}
			}
		}()
	}
	wg.Wait()
	n := min(sent.Load(), maxRequests)
	t.Logf("%d dials over %d requests, %d failed", dials.Load(), n, failed.Load())
	if f := failed.Load(); f > 0 {
		errMu.Lock()
		t.Errorf("%d of %d requests failed, one of them: %v", f, n, firstErr)
		errMu.Unlock()
	}
	if d := dials.Load(); d < wantDials {
		t.Errorf("%d dials over %d requests, want %d or more: the daemon never closed the connection", d, n, wantDials)
	}
}

// TestParseGRPCServer: --grpc-server is lean by default, grpc-go when
// asked (flag or environment), and anything else, or either with gRPC
// off, is refused naming the flag.
func TestParseGRPCServer(t *testing.T) {
	cases := []struct {
		give    []string
		env     map[string]string
		want    string
		wantErr string
	}{
		{want: GRPCServerLean},
		{give: []string{"--grpc-server", "grpc-go"}, want: GRPCServerGRPCGo},
		{env: map[string]string{"HOTKEYD_GRPC_SERVER": "grpc-go"}, want: GRPCServerGRPCGo},
		{give: []string{"--grpc-server", "lean"}, env: map[string]string{"HOTKEYD_GRPC_SERVER": "grpc-go"}, want: GRPCServerLean},
		{give: []string{"--grpc-server", "netty"}, wantErr: `--grpc-server (HOTKEYD_GRPC_SERVER) "netty": want lean or grpc-go`},
		{give: []string{"--grpc-listen", "", "--grpc-server", "lean"}, wantErr: "--grpc-server (HOTKEYD_GRPC_SERVER) applies to gRPC"},
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
		case cfg.GRPCServer != c.want:
			t.Errorf("%q %v: %q, want %q", c.give, c.env, cfg.GRPCServer, c.want)
		}
	}
}
