package hotkey

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hotkeyd/hotkey/counter"
	"github.com/hotkeyd/hotkey/internal/testkit"
	"github.com/hotkeyd/hotkey/shard"
)

// TestReset: a key filled at levels 4, 16 and 1 in turn (its usage left
// on the counters of each), then reset, admits its whole limit again on
// every algorithm and store, while another key stays full; on Redis no
// counter of the key is left.
func TestReset(t *testing.T) {
	clock := testkit.NewClock()
	client := redis.NewClient(&redis.Options{Addr: env.Server.Addr})
	defer client.Close()
	for _, st := range peekStores(t, clock) {
		for _, alg := range allAlgorithms {
			t.Run(fmt.Sprintf("%s/%v", st.name, alg), func(t *testing.T) {
				p := &Policy{Name: fmt.Sprintf("p%x", rand.Uint64()), Limit: Limit{Algorithm: alg, Rate: 160, Period: longPeriod}}
				e := newSplitEngine(t, st.store, clock, "", shard.Level1)
				ctx := context.Background()
				name := nameOf(p.Name, "k")
				decide := func(key string, n int) (admitted int) {
					t.Helper()
					for range n {
						r, err := e.Allow(ctx, key, p)
						if err != nil {
							t.Fatal(err)
						}
						if r.Allowed {
							admitted++
						}
					}
					return admitted
				}
				for _, level := range []shard.Level{shard.Level4, shard.Level16, shard.Level1} {
					handler{e}.SetLevel(name, hashKey(name), level)
					decide("k", 60)
				}
				handler{e}.SetLevel(name, hashKey(name), shard.Level4)
				if got := decide("k", 320); got != 0 {
					t.Fatalf("filled: admitted %d of 320, want 0", got)
				}
				if got := decide("other", 320); got != 160 {
					t.Fatalf("other key: admitted %d of 320, want 160", got)
				}
				if st.name == "redis" {
					if n := redisKeys(t, client, name); n < 1+4+16 {
						t.Fatalf("%d counters of the key on Redis before the reset, want those of levels 1, 4 and 16", n)
					}
				}
				if err := e.Reset(ctx, "k", p); err != nil {
					t.Fatal(err)
				}
				if st.name == "redis" {
					if n := redisKeys(t, client, name); n != 0 {
						t.Errorf("%d counters of the key on Redis after the reset, want 0", n)
					}
				}
				if got := decide("k", 320); got != 160 {
					t.Errorf("after the reset: admitted %d of 320, want the limit, 160", got)
				}
				if got := decide("other", 320); got != 0 {
					t.Errorf("other key after the reset: admitted %d of 320, want 0", got)
				}
			})
		}
	}
}

// redisKeys counts the keys on client's server that are counters of the
// counter name, unsplit or split.
func redisKeys(t *testing.T, client *redis.Client, name string) int {
	t.Helper()
	var n int
	iter := client.Scan(context.Background(), 0, "*", 1000).Iterator()
	for iter.Next(context.Background()) {
		k := iter.Val()
		if i := strings.IndexByte(k, ':'); i >= 0 && (k[i+1:] == name || strings.HasPrefix(k[i+1:], name+"|")) {
			n++
		}
	}
	if err := iter.Err(); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestResetInput: Reset refuses bad input as a decision does, and a store
// that cannot delete says so.
func TestResetInput(t *testing.T) {
	clock := testkit.NewClock()
	e := newEngineOn(t, counter.NewMemoryStore(counter.MemoryConfig{Clock: clock.Now}), clock)
	ctx := context.Background()
	p := &Policy{Name: "p", Limit: PerSecond(10)}
	for _, c := range []struct {
		key  string
		p    *Policy
		want error
	}{
		{"", p, ErrEmptyKey},
		{strings.Repeat("x", DefaultMaxKeyLen+1), p, ErrKeyTooLong},
		{"k", nil, ErrNilPolicy},
		{"k", &Policy{Name: "a|b", Limit: PerSecond(1)}, ErrInvalidPolicyName},
	} {
		if err := e.Reset(ctx, c.key, c.p); !errors.Is(err, c.want) {
			t.Errorf("Reset(%.10q, %v): %v, want %v", c.key, c.p, err, c.want)
		}
	}
	e = newEngineOn(t, &testkit.Store{Store: counter.NewMemoryStore(counter.MemoryConfig{})}, clock)
	if err := e.Reset(ctx, "k", p); !errors.Is(err, errors.ErrUnsupported) {
		t.Errorf("reset on a store that cannot: %v, want errors.ErrUnsupported", err)
	}
}

// TestResetSyncModes: under SyncReserve, a reset drops this engine's block
// of the key, so the key admits its limit again and not a unit more (a
// peek while the block is out reads the store, where its units count as
// used);
// under SyncGossip it empties this instance's view.
func TestResetSyncModes(t *testing.T) {
	ctx := context.Background()
	lim := Limit{Algorithm: FixedWindow, Rate: 100, Period: time.Hour}
	for _, sync := range []Sync{SyncReserve, SyncGossip} {
		t.Run(sync.String(), func(t *testing.T) {
			clock := testkit.NewClock()
			e, err := New(counter.NewMemoryStore(counter.MemoryConfig{Clock: clock.Now}), WithoutDetector(), withClock(clock.Now), withoutReserveSweep())
			if err != nil {
				t.Fatal(err)
			}
			defer e.Close()
			p := &Policy{Name: "r", Limit: lim, Sync: sync}
			decide := func(n int) (admitted int) {
				for range n {
					r, err := e.Allow(ctx, "k", p)
					if err != nil {
						t.Fatal(err)
					}
					if r.Allowed {
						admitted++
					}
					clock.Advance(time.Microsecond)
				}
				return admitted
			}
			if got := decide(20); got != 20 {
				t.Fatalf("admitted %d of 20", got)
			}
			if sync == SyncReserve {
				if st, _ := e.reserveStats(); st.Leases == 0 {
					t.Fatal("no block leased: the test needs one")
				}
				if r, err := e.Peek(ctx, "k", p); err != nil || r.Remaining >= lim.Rate-20 {
					t.Errorf("peek with the block out: %+v, %v; want fewer than %d remaining (the block's unspent units count as used)", r, err, lim.Rate-20)
				}
			}
			if err := e.Reset(ctx, "k", p); err != nil {
				t.Fatal(err)
			}
			if got := decide(150); got != 100 {
				t.Errorf("after the reset: admitted %d of 150, want the limit, 100", got)
			}
		})
	}
}

// TestResetCluster: on a Redis Cluster, where a split key's subcounters
// are named for the nodes they go to, a reset leaves none of the key's
// counters on any node.
func TestResetCluster(t *testing.T) {
	client := redis.NewClusterClient(&redis.ClusterOptions{Addrs: env.Cluster.Addrs})
	defer client.Close()
	ctx := context.Background()
	prefix := fmt.Sprintf("rc%x:", rand.Uint64())
	store, err := counter.NewRedisStore(ctx, client, counter.RedisConfig{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	clock := testkit.NewClock()
	e := newSplitEngine(t, store, clock, "", shard.Level1)
	p := &Policy{Name: "p", Limit: Limit{Algorithm: SlidingLog, Rate: 640, Period: longPeriod}}
	name := nameOf(p.Name, "k")
	for _, level := range []shard.Level{shard.Level16, shard.Level64, shard.Level4} {
		handler{e}.SetLevel(name, hashKey(name), level)
		for range 100 {
			if _, err := e.Allow(ctx, "k", p); err != nil {
				t.Fatal(err)
			}
		}
	}
	if _, err := e.Allow(ctx, "other", p); err != nil {
		t.Fatal(err)
	}
	count := func() (mine, others int) {
		var m, o atomic.Int64
		err := client.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
			iter := c.Scan(ctx, 0, prefix+"*", 1000).Iterator()
			for iter.Next(ctx) {
				switch rest := strings.TrimPrefix(strings.TrimPrefix(iter.Val(), prefix), "{}"); {
				case rest == name || strings.HasPrefix(rest, name+"|"):
					m.Add(1)
				default:
					o.Add(1)
				}
			}
			return iter.Err()
		})
		if err != nil {
			t.Fatal(err)
		}
		return int(m.Load()), int(o.Load())
	}
	if mine, others := count(); mine < 4+16+64 || others != 1 {
		t.Fatalf("before the reset: %d counters of the key, %d others; want those of levels 4 to 64, and 1", mine, others)
	}
	if err := e.Reset(ctx, "k", p); err != nil {
		t.Fatal(err)
	}
	if mine, others := count(); mine != 0 || others != 1 {
		t.Errorf("after the reset: %d counters of the key, %d others; want 0 and 1", mine, others)
	}
}
