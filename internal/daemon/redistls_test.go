package daemon

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/hotkeyd/hotkey/internal/redistest"
	"github.com/hotkeyd/hotkey/internal/testkit"
)

// redisClient is a plain client of addr for a test's own checks.
func redisClient(t *testing.T, addr string) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr, Protocol: 2, DisableIdentity: true})
	t.Cleanup(func() { c.Close() })
	return c
}

// allow asks the daemon d for one decision on key of the default policy,
// or of policy if given, and returns the HTTP status.
func allow(t *testing.T, d *Daemon, body string) int {
	t.Helper()
	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()
	resp, err := client.Post("http://"+d.Addr()+"/v1/allow", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// TestRedisClientCert: against a redis-server that requires client
// certificates (tls-auth-clients yes), a daemon with --redis-ca,
// --redis-cert and --redis-key decides, and its counters are in that
// Redis; without --redis-cert, --require-store stops the start with an
// error that names the TLS failure, and without it /readyz says degraded.
func TestRedisClientCert(t *testing.T) {
	ca := testkit.NewCA(t, "hotkey test CA")
	scert, skey := ca.Server(t, "redis", "127.0.0.1")
	ccert, ckey := ca.Client(t, "hotkeyd")
	srv, err := redistest.StartTLS(t.TempDir(), redistest.TLS{Cert: scert, Key: skey, CA: ca.File(t), AuthClients: true})
	if errors.Is(err, redistest.ErrNotInstalled) {
		t.Fatal("redis-server is not installed (make test installs it)")
	}
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	base := []string{"--listen", "127.0.0.1:0", "--nats", "none", "--redis", "rediss://" + srv.TLSAddr, "--redis-ca", ca.File(t)}

	d, err := StartArgs(context.Background(), append(base, "--redis-cert", ccert, "--redis-key", ckey, "--require-store")...)
	if err != nil {
		t.Fatalf("start with a client certificate: %v", err)
	}
	if got := allow(t, d, `{"key":"tls-user"}`); got != http.StatusOK {
		t.Errorf("POST /v1/allow with a client certificate: %d, want 200", got)
	}
	shutdown(t, d)
	keys, err := redisClient(t, srv.Addr).Keys(context.Background(), "*tls-user*").Result()
	if err != nil || len(keys) == 0 {
		t.Errorf("counters in Redis: %v, %v; want the key's", keys, err)
	}

	_, err = StartArgs(context.Background(), append(base, "--require-store")...)
	if err == nil || !strings.Contains(err.Error(), "tls: certificate required") ||
		!strings.Contains(err.Error(), "rediss://"+srv.TLSAddr) || !strings.Contains(err.Error(), "give --redis-cert (HOTKEYD_REDIS_CERT)") {
		t.Errorf("start without a client certificate, --require-store: %v; want an error naming the Redis, the TLS failure and --redis-cert", err)
	}
	t.Logf("refused: %v", err)

	d, err = StartArgs(context.Background(), base...)
	if err != nil {
		t.Fatalf("start without a client certificate: %v", err)
	}
	defer shutdown(t, d)
	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()
	resp, err := client.Get("http://" + d.Addr() + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), `"status":"degraded"`) || !strings.Contains(string(body), "certificate") {
		t.Errorf("/readyz without a client certificate: %d %s; want 200 degraded, saying why", resp.StatusCode, body)
	}
	t.Logf("/readyz: %s", body)
}
