package hotkey

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hotkeyd/hotkey/counter"
	"github.com/hotkeyd/hotkey/internal/faultproxy"
	"github.com/hotkeyd/hotkey/shard"
)

// TestClusterStoreSetUpLate: an engine on a Redis Cluster store that cannot
// reach its seed at start (counter.RedisConfig.SetupRetry) decides by the
// fallback, its breaker closed; once the store is set up, a key split in 16
// from the start is decided on subcounters named by the Cluster's real
// slot map (spread over its masters), not the placeholder's, and admits
// its limit, never more.
func TestClusterStoreSetUpLate(t *testing.T) {
	checkLeaks(t)
	proxy, err := faultproxy.New(env.Cluster.Addrs[0])
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	proxy.Cut()
	client := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{proxy.Addr()}, MaxRetries: -1, DialerRetries: 1})
	defer client.Close()
	ctx := context.Background()
	store, err := counter.NewRedisStore(ctx, client, counter.RedisConfig{SetupRetry: 20 * time.Millisecond, Timeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	if store.Ready() == nil {
		t.Fatal("the store is set up through a cut proxy")
	}
	key := fmt.Sprintf("late-%x", rand.Uint64()) // the servers outlive a run
	e, err := New(store, WithoutDetector(), WithSplitKeys(shard.Level16, &Policy{Name: "late"}, key))
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	p := &Policy{Name: "late", Limit: Limit{Algorithm: SlidingWindow, Rate: 160, Period: longPeriod}, OnStoreFailure: FallbackOpen}
	for i := range 20 {
		r, err := e.Allow(ctx, key, p)
		if err != nil || !r.Allowed || !r.Degraded {
			t.Fatalf("decision %d before setup: %+v, %v; want the open fallback", i, r, err)
		}
	}
	if s := e.brk.State(); s != BreakerClosed {
		t.Errorf("breaker %v before setup, want closed: a store not set up is no failure", s)
	}

	proxy.Restore()
	for deadline := time.Now().Add(time.Minute); store.Ready() != nil; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("not set up a minute after the proxy was restored: %v", store.Ready())
		}
	}
	admitted := 0
	for range 400 {
		r, err := e.Allow(ctx, key, p)
		if err != nil || r.Degraded {
			t.Fatalf("a decision once set up: %+v, %v", r, err)
		}
		if r.Allowed {
			admitted++
		}
	}
	// Within one window, the key split in 16 admits its 160 at most.
	if admitted > 160 || admitted < 150 {
		t.Errorf("admitted %d of 400 once set up, want 160 at most (150 or more)", admitted)
	}

	// The subcounters are named as the Cluster's slot map names them, not
	// the placeholder's one node.
	refClient := redis.NewClusterClient(&redis.ClusterOptions{Addrs: env.Cluster.Addrs})
	defer refClient.Close()
	ref, err := counter.NewRedisStore(ctx, refClient, counter.RedisConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer ref.Close()
	name := nameOf("late", key)
	want := map[string]bool{}
	for _, n := range shard.Names(name, hashKey(name), shard.Level16, ref.Placement()) {
		want["hk:"+n] = true
	}
	var mu sync.Mutex // ForEachMaster runs on each master at once
	got := map[string]bool{}
	err = client.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
		keys, err := c.Keys(ctx, "*"+key+"*").Result()
		if err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		for _, k := range keys {
			got[k] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for k := range got {
		if !want[k] {
			t.Errorf("counter %s: not a subcounter of the slot map's names %v", k, want)
		}
	}
	if len(got) != 16 {
		t.Errorf("%d counters of the key, want its 16 subcounters", len(got))
	}
}
