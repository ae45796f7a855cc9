package hotkey

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/hotkeyd/hotkey/counter"
	"github.com/hotkeyd/hotkey/internal/testkit"
	"github.com/hotkeyd/hotkey/shard"
	"github.com/hotkeyd/hotkey/split"
)

// peekStores returns a memory store and a store on the test binary's
// redis-server, each with the name of its case.
func peekStores(t *testing.T, clock *testkit.Clock) []struct {
	name  string
	store counter.Store
} {
	t.Helper()
	client := redis.NewClient(&redis.Options{Addr: env.Server.Addr})
	t.Cleanup(func() { client.Close() })
	rs, err := counter.NewRedisStore(context.Background(), client, counter.RedisConfig{Prefix: fmt.Sprintf("pk%x:", rand.Uint64())})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rs.Close() })
	return []struct {
		name  string
		store counter.Store
	}{
		{"memory", counter.NewMemoryStore(counter.MemoryConfig{Clock: clock.Now})},
		{"redis", rs},
	}
}

var allAlgorithms = []counter.Algorithm{counter.TokenBucket, counter.SlidingWindow, counter.FixedWindow, counter.SlidingLog}

// TestPeekChargesNothing: on every algorithm and store, unsplit and split
// 4 and 16 ways, a fresh key's peek allows with all but the unit left, and
// many peeks leave the key its whole limit: decisions admit exactly it.
func TestPeekChargesNothing(t *testing.T) {
	clock := testkit.NewClock()
	for _, st := range peekStores(t, clock) {
		for _, alg := range allAlgorithms {
			for _, level := range []shard.Level{shard.Level1, shard.Level4, shard.Level16} {
				t.Run(fmt.Sprintf("%s/%v/%d", st.name, alg, level), func(t *testing.T) {
					p := &Policy{Name: fmt.Sprintf("p%x", rand.Uint64()), Limit: Limit{Algorithm: alg, Rate: 160, Period: longPeriod}}
					e := newSplitEngine(t, st.store, clock, nameOf(p.Name, "k"), level)
					key := "k"
					ctx := context.Background()
					for range 30 {
						r, err := e.Peek(ctx, key, p)
						if err != nil || !r.Allowed || r.Remaining != 159 || r.Shards != level {
							t.Fatalf("peek of a fresh key: %+v, %v; want allowed, 159 left, %d shards", r, err, level)
						}
					}
					admitted := 0
					for range 320 {
						r, err := e.Allow(ctx, key, p)
						if err != nil {
							t.Fatal(err)
						}
						if r.Allowed {
							admitted++
						}
						if r.Shards != level {
							t.Fatalf("decided on %d counters, want %d", r.Shards, level)
						}
					}
					if admitted != 160 {
						t.Errorf("admitted %d of 320 after 30 peeks, want the limit, 160", admitted)
					}
					if r, err := e.Peek(ctx, key, p); err != nil || r.Allowed || r.Remaining != 0 || r.RetryAfter <= 0 {
						t.Errorf("peek of a full key: %+v, %v; want denied with a retry", r, err)
					}
				})
			}
		}
	}
}

// TestPeekSplitSum: a split key's peek answers for the whole key: the sum
// of what its subcounters hold less the unit, allowed while one of them
// has room, whichever a decision would pick.
func TestPeekSplitSum(t *testing.T) {
	clock := testkit.NewClock()
	for _, st := range peekStores(t, clock) {
		for _, alg := range allAlgorithms {
			for _, level := range []shard.Level{shard.Level4, shard.Level16} {
				t.Run(fmt.Sprintf("%s/%v/%d", st.name, alg, level), func(t *testing.T) {
					p := &Policy{Name: fmt.Sprintf("p%x", rand.Uint64()), Limit: Limit{Algorithm: alg, Rate: 160, Period: longPeriod}}
					name := nameOf(p.Name, "k")
					e := newSplitEngine(t, st.store, clock, name, level)
					ctx := context.Background()
					ent := split.NewEntry(name, hashKey(name), level, level, nil)
					take := func(i int, n int64) {
						t.Helper()
						sub, hash := ent.Sub(level, i, nil)
						if r, err := st.store.Take(ctx, sub, hash, subLimit(p.Limit, level, i), n); err != nil || !r.Allowed {
							t.Fatalf("take of %d on subcounter %d: %+v, %v", n, i, r, err)
						}
					}
					peek := func(what string, allowed bool, remaining int64) {
						t.Helper()
						r, err := e.Peek(ctx, "k", p)
						if err != nil || r.Allowed != allowed || r.Remaining != remaining || r.Shards != level || !allowed && r.RetryAfter <= 0 {
							t.Errorf("%s: %+v, %v; want allowed %v, %d left", what, r, err, allowed, remaining)
						}
					}
					// The first two subcounters spend their share, the
					// others 3 units each past the third, up to all but one.
					share := 160 / int64(level)
					spent := func(i int) int64 {
						if i < 2 {
							return share
						}
						return min(share-1, int64(i-2)*3)
					}
					left := int64(0)
					for i := range int(level) {
						if spent(i) > 0 {
							take(i, spent(i))
						}
						left += share - spent(i)
					}
					peek("spent unevenly", true, left-1)
					// All spent but one unit of the last subcounter.
					for i := 2; i < int(level); i++ {
						if rest := share - spent(i) - boolInt(i == int(level)-1); rest > 0 {
							take(i, rest)
						}
					}
					for range 3 {
						peek("one unit left, on one subcounter", true, 0)
					}
					take(int(level)-1, 1)
					peek("all spent", false, 0)
				})
			}
		}
	}
}

func boolInt(b bool) int64 {
	if b {
		return 1
	}
	return 0
}

// newSplitEngine returns an engine on store, closed at the end of the
// test, with counter name split at level (level 1: not split) and its usage
// held there.
func newSplitEngine(t *testing.T, store counter.Store, clock *testkit.Clock, name string, level shard.Level) *Engine {
	t.Helper()
	e, err := New(store, withClock(clock.Now), WithoutDetector())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	if level > shard.Level1 && !e.table.Set(name, hashKey(name), level, level, nil) {
		t.Fatal("split table full")
	}
	return e
}
