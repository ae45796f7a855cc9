package hotkey

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"

	"github.com/hotkeyd/hotkey/counter"
	"github.com/hotkeyd/hotkey/internal/faultproxy"
	"github.com/hotkeyd/hotkey/internal/redistest"
	"github.com/hotkeyd/hotkey/internal/testkit"
	"github.com/hotkeyd/hotkey/shard"
)

// TestReserveEngines: three engines, each with a Redis client of its own,
// decide one hot key under a SyncReserve policy: Redis runs at most one
// script per 10 decisions (INFO commandstats, before and after), the
// token bucket admits within burst + rate × (time + one lease), and a
// fixed window holds its limit in every window (its blocks end with it).
func TestReserveEngines(t *testing.T) {
	for _, c := range []struct {
		name string
		lim  Limit
	}{
		{"token-bucket", Limit{Rate: 1_000_000, Period: time.Second, Burst: 100_000}},
		{"fixed-window", Limit{Algorithm: FixedWindow, Rate: 20_000, Period: time.Second}},
	} {
		t.Run(c.name, func(t *testing.T) {
			admin := redis.NewClient(&redis.Options{Addr: env.Server.Addr})
			defer admin.Close()
			var engines [3]*Engine
			for i := range engines {
				client := redis.NewClient(&redis.Options{Addr: env.Server.Addr})
				defer client.Close()
				store, err := counter.NewRedisStore(context.Background(), client, counter.RedisConfig{Prefix: "reserve-engines:" + c.name + ":"})
				if err != nil {
					t.Fatal(err)
				}
				defer store.Close()
				e, err := New(store, WithoutDetector())
				if err != nil {
					t.Fatal(err)
				}
				defer e.Close()
				engines[i] = e
			}
			p := &Policy{Name: "reserve", Limit: c.lim, Sync: SyncReserve}
			key := c.name + time.Now().Format("150405.000000")
			calls0 := evalCalls(t, admin)
			var mu sync.Mutex
			perWindow := map[int64]int64{}
			var admitted, decisions atomic.Int64
			start := time.Now()
			var wg sync.WaitGroup
			for _, e := range engines {
				wg.Go(func() {
					for range 20_000 {
						r, err := e.Allow(context.Background(), key, p)
						if err != nil {
							t.Error(err)
							return
						}
						decisions.Add(1)
						if r.Allowed {
							admitted.Add(1)
							mu.Lock()
							perWindow[time.Now().UnixNano()/int64(time.Second)]++
							mu.Unlock()
						}
					}
				})
			}
			wg.Wait()
			elapsed := time.Since(start)
			calls := evalCalls(t, admin) - calls0
			perDecision := float64(calls) / float64(decisions.Load())
			t.Logf("%d decisions in %v, %d admitted, %d scripts run (%.4f per decision), by window %v", decisions.Load(), elapsed, admitted.Load(), calls, perDecision, perWindow)
			if perDecision > 0.1 {
				t.Errorf("%.3f scripts per decision, want at most 0.1", perDecision)
			}
			switch c.lim.Algorithm {
			case TokenBucket:
				if bound := c.lim.Burst + int64(float64(c.lim.Rate)*(elapsed+counter.DefaultLease).Seconds()); admitted.Load() > bound {
					t.Errorf("admitted %d, over burst + rate × (time + lease) = %d", admitted.Load(), bound)
				}
			case FixedWindow:
				// An admission is read on the clock after its decision:
				// at a window's end, each engine's one in flight may
				// read the next window's.
				for w, n := range perWindow {
					if n > c.lim.Rate+int64(len(engines)) {
						t.Errorf("window %d: %d admitted, over %d", w, n, c.lim.Rate)
					}
				}
			}
		})
	}
}

// TestReserveCloseReturns: an engine's Close gives its blocks' unused
// units back, so another instance can admit them.
func TestReserveCloseReturns(t *testing.T) {
	clock := testkit.NewClock()
	store := counter.NewMemoryStore(counter.MemoryConfig{Clock: clock.Now})
	e, err := New(store, WithoutDetector(), withClock(clock.Now))
	if err != nil {
		t.Fatal(err)
	}
	lim := Limit{Algorithm: FixedWindow, Rate: 100, Period: time.Hour}
	p := &Policy{Name: "r", Limit: lim, Sync: SyncReserve}
	for range 20 { // enough, fast enough, to lease a block
		if r, err := e.Allow(context.Background(), "k", p); err != nil || !r.Allowed {
			t.Fatalf("%+v %v", r, err)
		}
		clock.Advance(time.Microsecond)
	}
	name := nameOf("r", "k")
	// The store's view while the block is out: the block's unspent
	// units count as used.
	if r, err := store.Peek(context.Background(), name, 0, lim); err != nil || r.Remaining >= lim.Rate-20 {
		t.Fatalf("the store's view with the block out: %+v, %v; want fewer than %d left", r, err, lim.Rate-20)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	r, err := store.Peek(context.Background(), name, 0, lim)
	t.Logf("after Close: %+v", r)
	if want := lim.Rate - 20 - 1; err != nil || r.Remaining != want { // the 20 decisions are all that is charged; a peek reads as a Take of 1
		t.Errorf("after Close: %+v, %v; want %d left: the block's unused units not all back", r, err, want)
	}
}

// TestReserveNeedsLeases: a SyncReserve policy on a store that cannot
// lease is refused, never decided as SyncStore.
func TestReserveNeedsLeases(t *testing.T) {
	store := struct{ counter.Store }{counter.NewMemoryStore(counter.MemoryConfig{})}
	e, err := New(store, WithoutDetector())
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	p := &Policy{Name: "r", Limit: PerSecond(10), Sync: SyncReserve}
	if _, err := e.Allow(context.Background(), "k", p); !errors.Is(err, errors.ErrUnsupported) {
		t.Errorf("Allow = %v, want errors.ErrUnsupported", err)
	}
	out := make([]Decision, 2)
	e.AllowBatch(context.Background(), []Request{{Key: "a", Policy: p, Cost: 1}, {Key: "b", Policy: p, Cost: 1}}, out)
	for i, d := range out {
		if !errors.Is(d.Err, errors.ErrUnsupported) {
			t.Errorf("batch %d: %v, want errors.ErrUnsupported", i, d.Err)
		}
	}
}

// TestReserveRefusesSlidingLog: SyncReserve does not keep a sliding log
// (Sync.Keeps), and a decision under such a policy says so.
func TestReserveRefusesSlidingLog(t *testing.T) {
	e, err := New(counter.NewMemoryStore(counter.MemoryConfig{}), WithoutDetector())
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	p := &Policy{Name: "r", Limit: Limit{Algorithm: SlidingLog, Rate: 10, Period: time.Second}, Sync: SyncReserve}
	if _, err := e.Allow(context.Background(), "k", p); !errors.Is(err, errors.ErrUnsupported) || !strings.Contains(err.Error(), "sliding_log") {
		t.Errorf("Allow = %v, want errors.ErrUnsupported naming the sliding_log", err)
	}
	for _, a := range []Algorithm{TokenBucket, FixedWindow, SlidingWindow} {
		if err := SyncReserve.Keeps(a); err != nil {
			t.Errorf("SyncReserve.Keeps(%v) = %v", a, err)
		}
	}
	if err := SyncStore.Keeps(SlidingLog); err != nil {
		t.Errorf("SyncStore.Keeps(sliding_log) = %v", err)
	}
}

// TestReserveNotSplit: a SyncReserve key is decided on its one counter,
// even where every key is split: its store calls follow its leases, so it
// makes no hot shard, and a split would multiply them.
func TestReserveNotSplit(t *testing.T) {
	clock := testkit.NewClock()
	e, err := New(counter.NewMemoryStore(counter.MemoryConfig{Clock: clock.Now}), WithoutDetector(), withClock(clock.Now), withSplitAll(shard.Level4), withoutReserveSweep())
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	ctx := context.Background()
	for _, p := range []*Policy{{Name: "store", Limit: PerSecond(1000)}, {Name: "reserve", Limit: PerSecond(1000), Sync: SyncReserve}} {
		var shards shard.Level
		for range 200 {
			r, err := e.Allow(ctx, "k", p)
			if err != nil || !r.Allowed {
				t.Fatalf("%s: %+v, %v", p.Name, r, err)
			}
			shards = max(shards, r.Shards)
			clock.Advance(100 * time.Microsecond)
		}
		want := shard.Level4
		if p.Sync == SyncReserve {
			want = shard.Level1
		}
		if shards != want {
			t.Errorf("%s: decided on %d counters, want %d", p.Name, shards, want)
		}
		if pr, err := e.Peek(ctx, "k", p); err != nil || pr.Shards != want {
			t.Errorf("%s: peek %+v, %v: want %d counters", p.Name, pr, err, want)
		}
	}
	if st, _ := e.reserveStats(); st.Leases == 0 || st.Leases > 20 {
		t.Errorf("reserve: %+v, want a few leases", st)
	}
}

// TestReserveStoreCut: when Redis stops answering while a block is out,
// cut off by a proxy or its redis-server killed, the block is spent first,
// undegraded, then the policy's fallback decides.
func TestReserveStoreCut(t *testing.T) {
	for _, tt := range []struct {
		name string
		// start returns the address engines reach Redis at, and a func
		// that takes it away.
		start func(t *testing.T) (string, func())
	}{
		{"cut", func(t *testing.T) (string, func()) {
			proxy, err := faultproxy.New(env.Server.Addr)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { proxy.Close() })
			return proxy.Addr(), proxy.Cut
		}},
		{"killed", func(t *testing.T) (string, func()) {
			srv, err := redistest.Start(env.Dir)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { srv.Close() })
			return srv.Addr, func() {
				if err := srv.Kill(); err != nil {
					t.Fatal(err)
				}
			}
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			checkLeaks(t)
			addr, fail := tt.start(t)
			testReserveStoreGone(t, addr, fail)
		})
	}
}

func testReserveStoreGone(t *testing.T, addr string, fail func()) {
	store := chaosStore(t, chaosClient(t, addr))
	e, err := New(store, WithoutDetector(), WithBreaker(3, chaosProbe, chaosMaxProbe), WithReserveLease(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	p := &Policy{Name: "cut", Limit: Limit{Rate: 1_000_000, Period: time.Second, Burst: 100_000}, Sync: SyncReserve}
	key := fmt.Sprintf("cut-%x", rand.Uint64())
	ctx := context.Background()
	for range 200 {
		if r, err := e.Allow(ctx, key, p); err != nil || !r.Allowed || r.Degraded {
			t.Fatalf("store up: %+v, %v", r, err)
		}
	}
	if e.reserve.Load().Stats().Leases == 0 {
		t.Fatal("no block leased")
	}
	reg := prometheus.NewRegistry()
	if err := reg.Register(engineCollector{e}); err != nil {
		t.Fatal(err)
	}
	if n, err := testutil.GatherAndCount(reg, "hotkey_reserve_total", "hotkey_reserve_returned_units_total"); err != nil || n != 7 {
		t.Errorf("reserve metrics: %d series, %v; want 7", n, err)
	}
	fail()
	var fromBlock, degraded int
	for range 100_000 {
		r, err := e.Allow(ctx, key, p)
		if err != nil {
			t.Fatal(err)
		}
		if r.Degraded {
			degraded++
			if degraded == 100 {
				break
			}
			continue
		}
		if degraded > 0 {
			t.Fatalf("an undegraded decision after %d degraded ones: %+v", degraded, r)
		}
		fromBlock++
	}
	t.Logf("after the store went: %d decisions from the block, then the fallback (%d degraded)", fromBlock, degraded)
	if fromBlock == 0 || degraded < 100 {
		t.Errorf("%d decisions from the block, %d degraded: want the block spent, then the fallback", fromBlock, degraded)
	}
}
