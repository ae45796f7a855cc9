package counter

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hotkeyd/hotkey/internal/redistest"
)

// TestRedisSetupRetry: with SetupRetry, a store whose server is down at
// NewRedisStore is returned not ready; Take, TakeBatch and Reshard fail
// with ErrNotReady, naming the cause, until the server answers; then the
// store sets itself up and decides at once. Without SetupRetry,
// NewRedisStore fails.
func TestRedisSetupRetry(t *testing.T) {
	checkLeaks(t)
	srv, err := redistest.Start(testDir)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	if err := srv.Kill(); err != nil {
		t.Fatal(err)
	}
	// A pool of 2 backs off its dials after 2 refused ones (a default pool
	// after 10 × GOMAXPROCS): the retries must not drive it there, or the
	// first Take once ready gets the pool's remembered dial error.
	client := redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: -1, DialerRetries: 1, PoolSize: 2})
	defer client.Close()
	ctx := context.Background()

	if _, err := NewRedisStore(ctx, client, RedisConfig{}); err == nil {
		t.Fatal("NewRedisStore without SetupRetry, server down: no error")
	}
	s, err := NewRedisStore(ctx, client, RedisConfig{SetupRetry: 10 * time.Millisecond, Timeout: testTimeout})
	if err != nil {
		t.Fatalf("NewRedisStore with SetupRetry, server down: %v", err)
	}
	defer s.Close()
	var dialErr *net.OpError
	if err := s.Ready(); !errors.Is(err, ErrNotReady) || !errors.As(err, &dialErr) {
		t.Errorf("Ready with the server down: %v, want ErrNotReady with the dial error", err)
	}
	lim := Limit{Rate: 10, Period: longPeriod}
	key := testKey(t)
	if _, err := s.Take(ctx, key, Hash(key), lim, 1); !errors.Is(err, ErrNotReady) {
		t.Errorf("Take before setup: %v, want ErrNotReady", err)
	}
	ops := []Op{{Key: key, Limit: lim, N: 1}, {Key: key + "x", Limit: lim, N: 2}}
	s.TakeBatch(ctx, ops)
	for i, op := range ops {
		if !errors.Is(op.Err, ErrNotReady) {
			t.Errorf("TakeBatch before setup, op %d: %v, want ErrNotReady", i, op.Err)
		}
	}
	from := []Shard{{Name: key, Limit: lim}}
	to := []Shard{{Name: key + "a", Limit: Limit{Rate: 5, Period: longPeriod}}, {Name: key + "b", Limit: Limit{Rate: 5, Period: longPeriod}}}
	if err := s.Reshard(ctx, from, to); !errors.Is(err, ErrNotReady) {
		t.Errorf("Reshard before setup: %v, want ErrNotReady", err)
	}
	if p := s.Placement(); p.Nodes() != 1 || p.Version() != 1 {
		t.Errorf("a standalone store's placement before setup: %d nodes, version %d; want the one it will have", p.Nodes(), p.Version())
	}

	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(time.Minute); s.Ready() != nil; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("not set up a minute after the server answered: %v", s.Ready())
		}
	}
	if r := mustTake(t, s, key, lim, 3); !r.Allowed || r.Remaining != 7 {
		t.Errorf("first take once set up: %+v, want 7 left of 10", r)
	}
}

// TestRedisSetupRetryCluster: a Cluster store not set up has a placement
// of its own, version 0, which no node map read from the servers has, so
// that a split key's subcounters are named again once the map is read; it
// closes cleanly while retrying.
func TestRedisSetupRetryCluster(t *testing.T) {
	checkLeaks(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close() // nothing listens there now
	client := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{addr}, MaxRetries: -1, DialerRetries: 1})
	defer client.Close()
	s, err := NewRedisStore(context.Background(), client, RedisConfig{SetupRetry: 10 * time.Millisecond, Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Ready(); !errors.Is(err, ErrNotReady) {
		t.Errorf("Ready: %v, want ErrNotReady", err)
	}
	if p := s.Placement(); p.Nodes() != 1 || p.Version() != 0 {
		t.Errorf("placement before setup: %d nodes, version %d; want 1 node, version 0", p.Nodes(), p.Version())
	}
	time.Sleep(30 * time.Millisecond) // a few retries
	s.Close()
}
