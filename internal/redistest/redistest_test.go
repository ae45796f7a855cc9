package redistest

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"
)

func skipIfMissing(t *testing.T, err error) {
	t.Helper()
	if errors.Is(err, ErrNotInstalled) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
}

func TestServer(t *testing.T) {
	defer goleak.VerifyNone(t)
	ctx := context.Background()

	s, err := Start(t.TempDir())
	skipIfMissing(t, err)
	defer s.Close()

	// No retries: the PING after Kill must fail fast and quietly.
	c := redis.NewClient(&redis.Options{Addr: s.Addr, DisableIdentity: true, MaxRetries: -1, DialerRetries: 1})
	defer c.Close()
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatalf("SET: %v", err)
	}
	if got, err := c.Get(ctx, "k").Result(); err != nil || got != "v" {
		t.Fatalf("GET = %q, %v; want v", got, err)
	}

	if err := s.Kill(); err != nil {
		t.Fatalf("Kill: %v", err)
	}
	if err := c.Ping(ctx).Err(); err == nil {
		t.Fatal("PING after Kill succeeded")
	}
	if err := s.Kill(); err != nil {
		t.Fatalf("second Kill: %v", err)
	}
	if err := s.Restart(); err != nil {
		t.Fatalf("Restart: %v", err)
	}
	if err := s.Restart(); err == nil {
		t.Fatal("Restart of running server succeeded")
	}
	// No persistence: the restarted server is empty.
	if err := c.Get(ctx, "k").Err(); err != redis.Nil {
		t.Fatalf("GET after Restart: %v; want redis.Nil", err)
	}
	if err := c.Set(ctx, "k", "v2", 0).Err(); err != nil {
		t.Fatalf("SET after Restart: %v", err)
	}
	c.Close()

	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if err := s.Restart(); err == nil {
		t.Fatal("Restart after Close succeeded")
	}
}

func TestCluster(t *testing.T) {
	defer goleak.VerifyNone(t)
	ctx := context.Background()

	c, err := StartCluster(t.TempDir(), 3)
	skipIfMissing(t, err)
	defer c.Close()
	if len(c.Addrs) != 3 || len(c.Servers) != 3 {
		t.Fatalf("got %d addrs, %d servers; want 3", len(c.Addrs), len(c.Servers))
	}

	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs, DisableIdentity: true})
	defer cc.Close()
	for i := range 100 {
		k := fmt.Sprintf("key:%d", i)
		if err := cc.Set(ctx, k, i, 0).Err(); err != nil {
			t.Fatalf("SET %s: %v", k, err)
		}
	}
	for i := range 100 {
		k := fmt.Sprintf("key:%d", i)
		if got, err := cc.Get(ctx, k).Int(); err != nil || got != i {
			t.Fatalf("GET %s = %d, %v; want %d", k, got, err, i)
		}
	}
	// The keys must really be spread: every master holds some.
	err = cc.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
		n, err := m.DBSize(ctx).Result()
		if err != nil {
			return err
		}
		if n == 0 {
			return fmt.Errorf("master %s holds no keys", m.Options().Addr)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	cc.Close()

	n0 := redis.NewClient(&redis.Options{Addr: c.Addrs[0], DisableIdentity: true})
	defer n0.Close()
	slots, err := n0.ClusterSlots(ctx).Result()
	if err != nil {
		t.Fatalf("CLUSTER SLOTS: %v", err)
	}
	var seen [16384]bool
	owners := map[string]bool{}
	for _, r := range slots {
		for i := r.Start; i <= r.End; i++ {
			if seen[i] {
				t.Fatalf("slot %d listed twice", i)
			}
			seen[i] = true
		}
		if len(r.Nodes) != 1 {
			t.Errorf("slots %d-%d: %d nodes; want 1 master, no replicas", r.Start, r.End, len(r.Nodes))
		}
		owners[r.Nodes[0].ID] = true
	}
	for i, ok := range seen {
		if !ok {
			t.Fatalf("slot %d not covered", i)
		}
	}
	if len(owners) != 3 {
		t.Fatalf("%d distinct masters; want 3", len(owners))
	}
	n0.Close()

	if err := c.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := c.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}
