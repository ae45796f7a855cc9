package hotkey

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hotkeyd/hotkey/counter"
	"github.com/hotkeyd/hotkey/internal/testkit"
	"github.com/hotkeyd/hotkey/shard"
)

// admitAll sends cost-n decisions for key until one is denied (or limit
// decisions went by) and returns the units admitted.
func admitAll(t *testing.T, e *Engine, key string, lim Limit, n int64, limit int) int64 {
	t.Helper()
	var units int64
	for range limit {
		r, err := e.AllowN(context.Background(), key, pol(lim), n)
		if err != nil {
			t.Fatal(err)
		}
		if !r.Allowed {
			break
		}
		units += n
	}
	return units
}

// TestSplitAllPromotion: under withSplitAll(4) a key's usage sits on its 4
// subcounters; a promotion to 16 moves it from there, not from the unsplit
// counter, which holds none of it.
func TestSplitAllPromotion(t *testing.T) {
	checkLeaks(t)
	clock := testkit.NewClock()
	store := counter.NewMemoryStore(counter.MemoryConfig{Clock: clock.Now})
	e, err := New(store, withClock(clock.Now), WithoutDetector(), withSplitAll(shard.Level4))
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	for _, alg := range []Algorithm{TokenBucket, SlidingWindow, FixedWindow, SlidingLog} {
		t.Run(alg.String(), func(t *testing.T) {
			key := "promoted:" + alg.String()
			lim := Limit{Algorithm: alg, Rate: 1600, Period: time.Hour}
			before := admitAll(t, e, key, lim, 1, 10_000)
			handler{e}.SetLevel(key, hashKey(key), shard.Level16)
			after := admitAll(t, e, key, lim, 1, 10_000)
			if r, err := e.Allow(context.Background(), key, pol(lim)); err != nil || r.Shards != shard.Level16 {
				t.Fatalf("after the promotion: %+v, %v; want a decision on 16 subcounters", r, err)
			}
			t.Logf("admitted %d at the static level 4, then %d at 16 with no time passing", before, after)
			if before != 1600 || after != 0 {
				t.Errorf("admitted %d at level 4 and %d after the promotion to 16, want 1600 and 0", before, after)
			}
		})
	}
}

// testPlacement maps names over nodes by hash; its version says which map
// it is.
type testPlacement struct {
	nodes   int
	version uint64
}

func (p *testPlacement) Nodes() int                   { return p.nodes }
func (p *testPlacement) Node(name string) int         { return int(hashKey(name) % uint64(p.nodes)) }
func (p *testPlacement) Version() uint64              { return p.version }
func (p *testPlacement) String() string               { return fmt.Sprintf("%d nodes, v%d", p.nodes, p.version) }
func newPlacement(nodes int, v uint64) *testPlacement { return &testPlacement{nodes, v} }

// placedStore is a memory store whose node map the test changes, as a
// failover or a slot move changes a Redis Cluster's.
type placedStore struct {
	*counter.MemoryStore
	p atomic.Pointer[testPlacement]
}

func (s *placedStore) Placement() counter.Placement { return s.p.Load() }

// newPlacedStore returns a memory store on clock whose node map is 3 nodes,
// version 1, holding maxKeys counters in 4 stripes (0: the default store).
func newPlacedStore(clock *testkit.Clock, maxKeys int) *placedStore {
	cfg := counter.MemoryConfig{Clock: clock.Now}
	if maxKeys > 0 {
		cfg.MaxKeys, cfg.Stripes = maxKeys, 4
	}
	s := &placedStore{MemoryStore: counter.NewMemoryStore(cfg)}
	s.p.Store(newPlacement(3, 1))
	return s
}

// TestPlacementChangeBetweenVisits: instance a takes at level 4 what
// instance b never sees decided there; the store's node map changes; the
// key goes back to 16, where b decides first. b's move must read level 4
// under the node map a wrote it under, not the new one, which names
// counters that hold nothing: before, a and b admitted 405 to 420 units
// of 320.
// Mixed costs, and two policies on the key.
func TestPlacementChangeBetweenVisits(t *testing.T) {
	checkLeaks(t)
	for _, alg := range []Algorithm{TokenBucket, SlidingWindow, FixedWindow, SlidingLog} {
		t.Run(alg.String(), func(t *testing.T) {
			clock := testkit.NewClock()
			store := newPlacedStore(clock, 0)
			a, b := newEngineOn(t, store, clock), newEngineOn(t, store, clock)
			lim := Limit{Algorithm: alg, Rate: 320, Period: time.Hour}
			if alg == TokenBucket {
				lim.Burst = 320
			}
			pols := []*Policy{{Name: "p", Limit: lim}, {Name: "q", Limit: Limit{Algorithm: SlidingLog, Rate: 320, Period: time.Hour}}}
			key, ctx := "k", context.Background()
			admitted := map[string]int64{}
			allow := func(e *Engine, n int, costs ...int64) {
				t.Helper()
				for i := range n {
					for _, p := range pols {
						cost := costs[i%len(costs)]
						r, err := e.AllowN(ctx, key, p, cost)
						if err != nil {
							t.Fatal(err)
						}
						if r.Allowed {
							admitted[p.Name] += cost
						}
					}
				}
			}
			set := func(l shard.Level) {
				for _, e := range []*Engine{a, b} {
					for _, p := range pols {
						name := nameOf(p.Name, key)
						handler{e}.SetLevel(name, hashKey(name), l)
					}
					e.settle()
				}
			}
			set(16)
			allow(a, 1, 1)
			allow(b, 1, 1)
			set(4)
			allow(a, 50, 2)
			store.p.Store(newPlacement(2, 2))
			set(16)
			allow(b, 200, 1, 3)
			allow(a, 200, 1, 3)
			for _, p := range pols {
				if admitted[p.Name] > 320 {
					t.Errorf("%s admitted %d units, limit 320", p.Name, admitted[p.Name])
				}
				if admitted[p.Name] < 300 {
					t.Errorf("%s admitted %d units: want the key nearly full (300 or more)", p.Name, admitted[p.Name])
				}
			}
		})
	}
}

// TestPlacementSeenOnAnotherKey: b takes on a split key under a node map
// that a only sees on another key; the node map changes again, a moves
// the key's usage to it, and the key merges. a's move must read the key's
// counters under the node map it saw on the other key, where b wrote:
// before, the merge carried the larger of a's and b's units, not both, and
// the key admitted 375 of 320.
func TestPlacementSeenOnAnotherKey(t *testing.T) {
	checkLeaks(t)
	for _, alg := range []Algorithm{TokenBucket, SlidingWindow, FixedWindow, SlidingLog} {
		t.Run(alg.String(), func(t *testing.T) {
			clock := testkit.NewClock()
			store := newPlacedStore(clock, 0)
			a, b := newEngineOn(t, store, clock), newEngineOn(t, store, clock)
			lim := Limit{Algorithm: alg, Rate: 320, Period: time.Hour}
			if alg == TokenBucket {
				lim.Burst = 320
			}
			p := &Policy{Name: "p", Limit: lim}
			ctx := context.Background()
			var admitted int64
			allow := func(e *Engine, key string, n int) {
				t.Helper()
				for range n {
					r, err := e.Allow(ctx, key, p)
					if err != nil {
						t.Fatal(err)
					}
					if r.Allowed && key == "k" {
						admitted++
					}
				}
			}
			set := func(key string, l shard.Level) {
				name := nameOf(p.Name, key)
				for _, e := range []*Engine{a, b} {
					handler{e}.SetLevel(name, hashKey(name), l)
					e.settle()
				}
			}
			set("k", 4)
			set("other", 4)
			allow(a, "k", 1)
			allow(b, "k", 1)
			store.p.Store(newPlacement(2, 2))
			allow(b, "k", 100)
			allow(a, "other", 1) // a sees node map 2, but not on k
			store.p.Store(newPlacement(4, 3))
			allow(a, "k", 100)
			store.p.Store(newPlacement(3, 4))
			set("k", 1)
			allow(a, "k", 320)
			allow(b, "k", 320)
			if admitted > 320 || admitted < 300 {
				t.Errorf("k admitted %d units of 320; want the key full (300 or more), not over", admitted)
			}
		})
	}
}

// TestPlacementChange: when the store's node map changes, a split key's
// subcounters get new names; its usage moves to them, so the change hands
// out no quota.
func TestPlacementChange(t *testing.T) {
	checkLeaks(t)
	for _, alg := range []Algorithm{TokenBucket, SlidingWindow, FixedWindow, SlidingLog} {
		t.Run(alg.String(), func(t *testing.T) {
			clock := testkit.NewClock()
			store := newPlacedStore(clock, 0)
			e, err := New(store, withClock(clock.Now), WithoutDetector())
			if err != nil {
				t.Fatal(err)
			}
			defer e.Close()
			key := "placed"
			lim := Limit{Algorithm: alg, Rate: 1600, Period: time.Hour}
			handler{e}.SetLevel(key, hashKey(key), shard.Level16)
			before := admitAll(t, e, key, lim, 1, 10_000)
			if r, err := e.Allow(context.Background(), key, pol(lim)); err != nil || r.Shards != shard.Level16 {
				t.Fatalf("%+v, %v; want a decision on 16 subcounters", r, err)
			}
			store.p.Store(newPlacement(4, 2)) // a node joins
			after := admitAll(t, e, key, lim, 1, 10_000)
			store.p.Store(newPlacement(3, 3)) // and leaves
			again := admitAll(t, e, key, lim, 1, 10_000)
			t.Logf("admitted %d, then %d after a node joined, %d after it left, with no time passing", before, after, again)
			if before != 1600 || after != 0 || again != 0 {
				t.Errorf("admitted %d, %d after a node joined, %d after it left; want 1600, 0, 0", before, after, again)
			}
		})
	}
}

// TestRefusedSplitApplied: with the table full, a key ranked after the one
// it holds (at a lower level) has its split refused; once a merged key has
// left the table, the refused key is split. A merged key no decision comes
// for has its usage moved back all the same, so a long period keeps it.
func TestRefusedSplitApplied(t *testing.T) {
	checkLeaks(t)
	clock := testkit.NewClock()
	store := counter.NewMemoryStore(counter.MemoryConfig{Clock: clock.Now})
	e, err := New(store, withClock(clock.Now), WithoutDetector(), WithMaxHotKeys(1))
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	h := handler{e}
	lim := Limit{Rate: 1600, Period: time.Hour}
	h.SetLevel("a", hashKey("a"), shard.Level64)
	if got := admitAll(t, e, "a", lim, 1, 10_000); got != 1600 {
		t.Fatalf("a admitted %d at level 64, want 1600", got)
	}
	h.SetLevel("b", hashKey("b"), shard.Level16) // no room, and a ranks first: refused
	if e.levelOf("b") != 1 {
		t.Fatalf("b at level %d with the table full", e.levelOf("b"))
	}
	h.SetLevel("a", hashKey("a"), shard.Level1) // a cools: no decision comes for it
	took := testkit.For(t, patience, "b split once a left the table", func() bool { return e.levelOf("b") == shard.Level16 })
	t.Logf("b split %v after a merged", took)
	if e.levelOf("a") != 1 || e.table.Lookup("a", hashKey("a")) != nil {
		t.Fatalf("a at level %d, in the table: %v", e.levelOf("a"), e.table.Lookup("a", hashKey("a")) != nil)
	}
	if got := admitAll(t, e, "a", lim, 1, 10_000); got != 0 {
		t.Errorf("a admitted %d more on its unsplit counter with no time passing, want 0: its usage was not moved back", got)
	}
	if r, err := e.Allow(context.Background(), "b", pol(lim)); err != nil || r.Shards != shard.Level16 {
		t.Errorf("b decided on %d shards (%v), want 16", r.Shards, err)
	}
}

// TestFullTableRanks: engines whose tables are full hold the same keys
// whatever the order they heard the levels in (the higher level first, then
// the lower hash), so no key is split on one and unsplit on another, where
// the two would admit its limit twice. A key that makes room comes back when
// room returns, and its usage moves each time.
func TestFullTableRanks(t *testing.T) {
	checkLeaks(t)
	clock := testkit.NewClock()
	store := counter.NewMemoryStore(counter.MemoryConfig{Clock: clock.Now})
	var engines [2]*Engine
	for i := range engines {
		e, err := New(store, withClock(clock.Now), WithoutDetector(), WithMaxHotKeys(1))
		if err != nil {
			t.Fatal(err)
		}
		defer e.Close()
		engines[i] = e
	}
	// x and y at the same level: the lower hash ranks first.
	x, y := "x", "y"
	if hashKey(x) > hashKey(y) {
		x, y = y, x
	}
	set := func(e *Engine, key string, level shard.Level) {
		handler{e}.SetLevel(key, hashKey(key), level)
		e.settle()
	}
	lim := Limit{Rate: 1600, Period: time.Hour}
	set(engines[0], y, shard.Level16)
	if got := admitAll(t, engines[0], y, lim, 1, 10_000); got != 1600 {
		t.Fatalf("%s admitted %d at level 16, want 1600", y, got)
	}
	set(engines[0], x, shard.Level16) // y makes room for x
	set(engines[1], x, shard.Level16)
	set(engines[1], y, shard.Level16) // refused: x ranks first
	for i, e := range engines {
		if e.levelOf(x) != shard.Level16 || e.levelOf(y) != shard.Level1 {
			t.Errorf("engine %d: %s at level %d, %s at %d; want 16 and 1", i, x, e.levelOf(x), y, e.levelOf(y))
		}
	}
	if got := admitAll(t, engines[1], y, lim, 1, 10_000); got != 0 {
		t.Errorf("%s admitted %d more once unsplit, want 0: its usage did not move back", y, got)
	}
	// A higher level outranks a lower hash, in either order.
	set(engines[0], y, shard.Level64)
	set(engines[1], y, shard.Level64)
	for i, e := range engines {
		if e.levelOf(x) != shard.Level1 || e.levelOf(y) != shard.Level64 {
			t.Errorf("engine %d: %s at level %d, %s at %d; want 1 and 64", i, x, e.levelOf(x), y, e.levelOf(y))
		}
	}
	if got := admitAll(t, engines[0], y, lim, 1, 10_000); got != 0 {
		t.Errorf("%s admitted %d more at level 64, want 0: its usage did not move", y, got)
	}
	// y cools: x comes back.
	for _, e := range engines {
		set(e, y, shard.Level1)
	}
	for i, e := range engines {
		if e.levelOf(x) != shard.Level16 || e.levelOf(y) != shard.Level1 {
			t.Errorf("engine %d: %s at level %d, %s at %d; want 16 and 1", i, x, e.levelOf(x), y, e.levelOf(y))
		}
	}
	if got := admitAll(t, engines[0], y, lim, 1, 10_000); got != 0 {
		t.Errorf("%s admitted %d more once merged, want 0", y, got)
	}
}

// TestPoliciesIndependent: two policies on one key have a counter each. A
// request under another policy (another algorithm, a shorter period) neither
// resets nor shortens the first one's state: 5 login attempts a minute stay
// 5, however default requests for the same key come between them.
func TestPoliciesIndependent(t *testing.T) {
	checkLeaks(t)
	login := &Policy{Name: "login", Limit: Limit{Algorithm: SlidingLog, Rate: 5, Period: time.Minute}}
	other := &Policy{Name: "default", Limit: PerSecond(100)}
	run := func(t *testing.T, e *Engine, pause func()) (loginAdmitted, defaultAdmitted int) {
		ctx := context.Background()
		key := fmt.Sprintf("user:%x", rand.Uint64())
		for range 10 {
			for range 5 {
				if r, err := e.AllowN(ctx, key, login, 1); err != nil {
					t.Fatal(err)
				} else if r.Allowed {
					loginAdmitted++
				}
			}
			if r, err := e.AllowN(ctx, key, other, 1); err != nil {
				t.Fatal(err)
			} else if r.Allowed {
				defaultAdmitted++
			}
			pause()
		}
		return loginAdmitted, defaultAdmitted
	}
	t.Run("memory", func(t *testing.T) {
		clock := testkit.NewClock()
		e, err := New(counter.NewMemoryStore(counter.MemoryConfig{Clock: clock.Now}), withClock(clock.Now), WithoutDetector())
		if err != nil {
			t.Fatal(err)
		}
		defer e.Close()
		l, d := run(t, e, func() { clock.Advance(30 * time.Millisecond) })
		t.Logf("login admitted %d of 50 over 300 ms, default %d of 10", l, d)
		if l != 5 || d != 10 {
			t.Errorf("login admitted %d, default %d; want 5 and 10", l, d)
		}
	})
	t.Run("redis", func(t *testing.T) {
		client := redis.NewClient(&redis.Options{Addr: env.Server.Addr})
		defer client.Close()
		store, err := counter.NewRedisStore(context.Background(), client, counter.RedisConfig{})
		if err != nil {
			t.Fatal(err)
		}
		defer store.Close()
		e, err := New(store, WithoutDetector())
		if err != nil {
			t.Fatal(err)
		}
		defer e.Close()
		start := time.Now()
		l, d := run(t, e, func() { time.Sleep(30 * time.Millisecond) })
		// Real time: a minute's 5 plus what refilled meanwhile (none
		// unless the machine took over 12 s).
		bound := 5 + int(5*time.Since(start)/time.Minute)
		t.Logf("login admitted %d of 50 over %v (bound %d), default %d of 10", l, time.Since(start).Round(time.Millisecond), bound, d)
		if l > bound || l < 5 || d != 10 {
			t.Errorf("login admitted %d, default %d; want 5 (at most %d) and 10", l, d, bound)
		}
	})
	t.Run("bad name", func(t *testing.T) {
		e, _ := newMemoryEngine(t, testkit.NewClock())
		if _, err := e.AllowN(context.Background(), "k", &Policy{Name: "a|b", Limit: PerSecond(1)}, 1); !errors.Is(err, ErrInvalidPolicyName) {
			t.Errorf("policy name with '|': %v, want ErrInvalidPolicyName", err)
		}
	})
}

// TestCostBands: on a split key, a cost over one subcounter's share cannot
// be served by the counters that hold the key's usage. It is refused, not
// moved to fewer, larger counters that would start full: whatever mix of
// costs comes, the key admits no more than its limit.
func TestCostBands(t *testing.T) {
	checkLeaks(t)
	for _, alg := range []Algorithm{TokenBucket, SlidingWindow, FixedWindow, SlidingLog} {
		t.Run(alg.String(), func(t *testing.T) {
			clock := testkit.NewClock()
			store := counter.NewMemoryStore(counter.MemoryConfig{Clock: clock.Now})
			e, err := New(store, withClock(clock.Now), WithoutDetector())
			if err != nil {
				t.Fatal(err)
			}
			defer e.Close()
			key := "banded"
			lim := Limit{Algorithm: alg, Rate: 6400, Period: time.Hour}
			handler{e}.SetLevel(key, hashKey(key), shard.Level64) // shares of 100
			var units, refused int64
			for range 200 {
				for _, n := range []int64{1, 101, 401, 1601} {
					r, err := e.AllowN(context.Background(), key, pol(lim), n)
					if err != nil {
						t.Fatal(err)
					}
					switch {
					case r.Allowed:
						units += n
					case n > 100 && r.RetryAfter > 0:
						refused++
					}
				}
			}
			t.Logf("costs 1, 101, 401, 1601 × 200 at level 64 with no time passing: %d units admitted (limit 6400), %d over the share refused", units, refused)
			if units > 6400 {
				t.Errorf("admitted %d units, over the limit of 6400", units)
			}
			if units < 200 || refused == 0 {
				t.Errorf("admitted %d units, refused %d: the cost-1 requests should pass, the others be refused", units, refused)
			}
			if r, err := e.Allow(context.Background(), key, pol(lim)); err != nil || r.Shards != shard.Level64 {
				t.Errorf("%+v, %v; want a decision on 64 subcounters", r, err)
			}
		})
	}
}

// TestLimitLoweredBelowLevel: a split key's limit lowered below its level
// (fewer units than subcounters) moves its usage to the counters the new
// limit fits, reading the old ones under the limit that wrote them; it never
// fails decisions nor counts against the store's breaker.
func TestLimitLoweredBelowLevel(t *testing.T) {
	checkLeaks(t)
	clock := testkit.NewClock()
	store := counter.NewMemoryStore(counter.MemoryConfig{Clock: clock.Now})
	e, err := New(store, withClock(clock.Now), WithoutDetector(), WithBreaker(1, time.Hour, time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	key := "lowered"
	handler{e}.SetLevel(key, hashKey(key), shard.Level64)
	high := Limit{Rate: 6400, Period: time.Hour}
	if got := admitAll(t, e, key, high, 1, 100); got != 100 {
		t.Fatalf("admitted %d of 100 under 6400/hour", got)
	}
	low := Limit{Rate: 50, Period: time.Hour}
	r, err := e.Allow(context.Background(), key, pol(low))
	if err != nil || r.Degraded {
		t.Fatalf("under 50/hour: %+v, %v", r, err)
	}
	more := admitAll(t, e, key, low, 1, 100)
	t.Logf("100 of 6400/hour used at level 64; under 50/hour: first %v, then %d more admitted, on %d shards; breaker %v", r.Allowed, more, r.Shards, e.brk.State())
	if e.brk.State() != BreakerClosed {
		t.Error("the breaker opened on a limit change")
	}
	if r.Allowed || more != 0 {
		t.Errorf("under 50/hour after 100 used: admitted %v then %d, want none", r.Allowed, more)
	}
}
