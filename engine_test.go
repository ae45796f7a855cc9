package hotkey

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hotkeyd/hotkey/counter"
	"github.com/hotkeyd/hotkey/detector"
	"github.com/hotkeyd/hotkey/internal/redistest"
	"github.com/hotkeyd/hotkey/internal/testkit"
	"github.com/hotkeyd/hotkey/shard"
)

var env *redistest.Env

// longPeriod is a period no test outlives, for tests on the real clock: no
// token refills, and no window starts (windows start at multiples of their
// period from the Unix epoch), while one runs.
const longPeriod = 1000 * time.Hour

func TestMain(m *testing.M) { os.Exit(redistest.Main(m, 3, &env)) }

// pol returns an unnamed policy of lim, with the default fallback.
func pol(lim Limit) *Policy { return &Policy{Limit: lim} }

// newMemoryEngine returns an engine on a memory store that counts its
// Takes and fails while down, both on clock, without the detector.
func newMemoryEngine(t testing.TB, clock *testkit.Clock, opts ...Option) (*Engine, *testkit.Store) {
	t.Helper()
	store := &testkit.Store{Store: counter.NewMemoryStore(counter.MemoryConfig{Clock: clock.Now})}
	e, err := New(store, append([]Option{withClock(clock.Now), WithoutDetector()}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e, store
}

func TestBadInput(t *testing.T) {
	e, _ := newMemoryEngine(t, testkit.NewClock())
	ok := PerSecond(10)
	tests := []struct {
		name string
		key  string
		lim  Limit
		n    int64
		want error
	}{
		{"empty key", "", ok, 1, ErrEmptyKey},
		{"key too long", strings.Repeat("k", 513), ok, 1, ErrKeyTooLong},
		{"zero cost", "k", ok, 0, ErrInvalidCost},
		{"negative cost", "k", ok, -5, ErrInvalidCost},
		{"cost over burst", "k", Limit{Rate: 10, Period: time.Second, Burst: 3}, 4, ErrCostExceedsBurst},
		{"cost over window limit", "k", Limit{Algorithm: FixedWindow, Rate: 10, Period: time.Second}, 11, ErrCostExceedsBurst},
		{"zero limit", "k", Limit{Period: time.Second}, 1, counter.ErrInvalidRate},
		{"negative limit", "k", Limit{Rate: -1, Period: time.Second}, 1, counter.ErrInvalidRate},
		{"zero period", "k", Limit{Rate: 1}, 1, counter.ErrInvalidPeriod},
		{"negative period", "k", Limit{Rate: 1, Period: -time.Second}, 1, counter.ErrInvalidPeriod},
		{"negative burst", "k", Limit{Rate: 1, Period: time.Second, Burst: -1}, 1, counter.ErrInvalidBurst},
		{"unknown algorithm", "k", Limit{Algorithm: 9, Rate: 1, Period: time.Second}, 1, counter.ErrUnknownAlgorithm},
		{"sliding log too large", "k", Limit{Algorithm: SlidingLog, Rate: counter.MaxLogRate + 1, Period: time.Second}, 1, counter.ErrLimitTooLarge},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := e.AllowN(context.Background(), tt.key, pol(tt.lim), tt.n)
			if !errors.Is(err, tt.want) {
				t.Errorf("err = %v, want %v", err, tt.want)
			}
		})
	}
	if _, err := e.Allow(context.Background(), strings.Repeat("k", 512), pol(ok)); err != nil {
		t.Errorf("key of exactly the max length: %v", err)
	}
	if _, err := New(nil); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("New(nil store): %v, want ErrInvalidConfig", err)
	}
	for _, opt := range []Option{withSplitAll(3), WithSplitKeys(1, nil, "a"), WithMaxKeyLen(0), withMinShare(0), withDenyCache(-1), withClock(nil), WithMaxHotKeys(0), withSelection(9), WithDetector(detector.Config{Threshold: -1})} {
		if _, err := New(counter.NewMemoryStore(counter.MemoryConfig{}), opt); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("New with an invalid option: %v, want ErrInvalidConfig", err)
		}
	}
}

func TestClosed(t *testing.T) {
	e, _ := newMemoryEngine(t, testkit.NewClock())
	e.Close()
	if _, err := e.Allow(context.Background(), "k", pol(PerSecond(1))); !errors.Is(err, ErrClosed) {
		t.Errorf("after Close: %v", err)
	}
}

func TestUnsplitResult(t *testing.T) {
	e, _ := newMemoryEngine(t, testkit.NewClock())
	lim := Limit{Rate: 10, Period: time.Second, Burst: 4}
	for i := range 4 {
		r, err := e.Allow(context.Background(), "k", pol(lim))
		if err != nil || !r.Allowed || r.Remaining != int64(3-i) || r.Shards != 1 || r.Limit != 4 {
			t.Fatalf("request %d: %+v, %v", i, r, err)
		}
	}
	r, _ := e.Allow(context.Background(), "k", pol(lim))
	if r.Allowed || r.RetryAfter != 100*time.Millisecond {
		t.Errorf("over burst: %+v", r)
	}
}

func TestSplitAllAdmitsTheLimit(t *testing.T) {
	clock := testkit.NewClock()
	e, store := newMemoryEngine(t, clock, withSplitAll(16))
	lim := PerSecond(1600) // 100 per subcounter
	admitted := 0
	for range 2000 {
		r, err := e.Allow(context.Background(), "k", pol(lim))
		if err != nil {
			t.Fatal(err)
		}
		if r.Shards != 16 {
			t.Fatalf("shards = %d, want 16", r.Shards)
		}
		if r.Allowed {
			admitted++
		}
	}
	if admitted != 1600 {
		t.Errorf("admitted %d, want the burst of 1600", admitted)
	}
	if n := store.Store.(*counter.MemoryStore).Len(); n != 16 {
		t.Errorf("store holds %d counters, want 16", n)
	}
}

// TestAllowDoesNotAllocate: a decision on a key the memory store holds
// allocates nothing, whole or split, admitted or denied.
func TestAllowDoesNotAllocate(t *testing.T) {
	e, _ := newMemoryEngine(t, testkit.NewClock(), WithSplitKeys(4, nil, "hot"))
	ctx := context.Background()
	for _, tt := range []struct {
		key string
		lim Limit
	}{
		{"cold", PerSecond(1 << 30)},
		{"hot", PerSecond(1 << 30)},
		{"cold-denied", Limit{Rate: 1, Period: time.Hour, Burst: 1}},
	} {
		p := pol(tt.lim)
		e.Allow(ctx, tt.key, p)
		if n := testing.AllocsPerRun(100, func() { e.Allow(ctx, tt.key, p) }); n != 0 {
			t.Errorf("%s: %v allocations a decision, want 0", tt.key, n)
		}
	}
	// A batch of one on a store that batches, as the daemon's Envoy
	// answers make them.
	b, err := New(loopBatcher{counter.NewMemoryStore(counter.MemoryConfig{})}, WithoutDetector())
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	reqs := []Request{{Key: "k", Policy: pol(PerSecond(1 << 30)), Cost: 1}}
	out := make([]Decision, 1)
	b.AllowBatch(ctx, reqs, out)
	if n := testing.AllocsPerRun(100, func() { b.AllowBatch(ctx, reqs, out) }); n != 0 || out[0].Err != nil {
		t.Errorf("a batch of one: %v allocations, %v; want 0, nil", n, out[0].Err)
	}
	// Its answer in the caller's own array, which AllowBatch must not
	// make escape to the heap.
	if n := testing.AllocsPerRun(100, func() {
		var own [1]Decision
		b.AllowBatch(ctx, reqs, own[:])
	}); n != 0 {
		t.Errorf("a batch of one into the caller's array: %v allocations, want 0", n)
	}
}

// loopBatcher is a memory store that batches: each take of a batch in turn.
type loopBatcher struct{ *counter.MemoryStore }

func (s loopBatcher) TakeBatch(ctx context.Context, ops []counter.Op) {
	for i := range ops {
		op := &ops[i]
		op.Result, op.Err = s.Take(ctx, op.Key, op.Hash, op.Limit, op.N)
	}
}

func TestSplitKeysOnlyThoseKeys(t *testing.T) {
	e, _ := newMemoryEngine(t, testkit.NewClock(), WithSplitKeys(4, nil, "hot"))
	ctx := context.Background()
	if r, _ := e.Allow(ctx, "hot", pol(PerSecond(100))); r.Shards != 4 {
		t.Errorf("hot key: %d shards", r.Shards)
	}
	if r, _ := e.Allow(ctx, "cold", pol(PerSecond(100))); r.Shards != 1 {
		t.Errorf("cold key: %d shards", r.Shards)
	}
	// A limit too small to split 4 ways at the min share stays whole.
	if r, _ := e.Allow(ctx, "hot", pol(PerSecond(39))); r.Shards != 1 {
		t.Errorf("hot key, small limit: %d shards", r.Shards)
	}
}

// TestKeyLikeSubcounter: under a policy, the key "bob|4|0" has a counter of
// its own, not subcounter 0 of the split key "bob": one user spending all
// of its limit (in a batch, then alone) leaves the other all of its own. On
// the memory store and on Redis.
func TestKeyLikeSubcounter(t *testing.T) {
	client := redis.NewClient(&redis.Options{Addr: env.Server.Addr})
	defer client.Close()
	rs, err := counter.NewRedisStore(context.Background(), client, counter.RedisConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer rs.Close()
	clock := testkit.NewClock()
	for _, st := range []struct {
		name  string
		store counter.Store
	}{
		{"memory", counter.NewMemoryStore(counter.MemoryConfig{Clock: clock.Now})},
		{"redis", rs},
	} {
		t.Run(st.name, func(t *testing.T) {
			p := &Policy{Name: fmt.Sprintf("p%d", time.Now().UnixNano()), Limit: Limit{Rate: 400, Period: longPeriod}}
			e, err := New(st.store, withClock(clock.Now), WithoutDetector(), WithSplitKeys(4, p, "bob"))
			if err != nil {
				t.Fatal(err)
			}
			defer e.Close()
			ctx := context.Background()
			out := make([]Decision, 1)
			e.AllowBatch(ctx, []Request{{Key: "bob|4|0", Policy: p, Cost: 400}}, out)
			if out[0].Err != nil || !out[0].Result.Allowed {
				t.Fatalf("bob|4|0 takes its whole limit: %+v", out[0])
			}
			if r, err := e.Allow(ctx, "bob|4|0", p); err != nil || r.Allowed {
				t.Fatalf("bob|4|0 once more: %+v %v, want denied (the batch took its limit)", r, err)
			}
			admitted := 0
			for range 400 {
				r, err := e.Allow(ctx, "bob", p)
				if err != nil {
					t.Fatal(err)
				}
				if r.Shards != 4 {
					t.Fatalf("bob decided on %d counters, want 4", r.Shards)
				}
				if r.Allowed {
					admitted++
				}
			}
			if admitted != 400 {
				t.Errorf("bob admitted %d of 400, want 400: bob|4|0 spent part of bob's limit", admitted)
			}
		})
	}
}

func TestDenyCacheSavesStoreCalls(t *testing.T) {
	clock := testkit.NewClock()
	e, store := newMemoryEngine(t, clock)
	ctx := context.Background()
	lim := Limit{Rate: 1, Period: time.Second}
	if r, _ := e.Allow(ctx, "k", pol(lim)); !r.Allowed {
		t.Fatal("first request denied")
	}
	r, _ := e.Allow(ctx, "k", pol(lim))
	if r.Allowed {
		t.Fatal("second request admitted")
	}
	before := store.Takes.Load()
	for range 100 {
		clock.Advance(time.Millisecond)
		r2, _ := e.Allow(ctx, "k", pol(lim))
		if r2.Allowed || r2.RetryAfter <= 0 || r2.RetryAfter >= r.RetryAfter {
			t.Fatalf("cached deny: %+v", r2)
		}
	}
	if got := store.Takes.Load() - before; got != 0 {
		t.Errorf("%d store calls for known-denied requests", got)
	}
	// A raised limit is a different cache entry: it takes effect at once.
	if r, _ := e.Allow(ctx, "k", pol(Limit{Rate: 100, Period: time.Second})); !r.Allowed {
		t.Error("raised limit still denied from the cache")
	}
	clock.Advance(time.Second)
	if r, _ := e.Allow(ctx, "k", pol(lim)); !r.Allowed {
		t.Error("denied after retry-after passed")
	}
}

func TestSecondChance(t *testing.T) {
	for _, tt := range []struct {
		probe bool
		want  int
	}{{true, 4}, {false, 3}} {
		clock := testkit.NewClock()
		e, store := newMemoryEngine(t, clock, WithSplitKeys(4, nil, "k"), withSecondChance(tt.probe), withMinShare(1))
		lim := Limit{Rate: 8, Period: time.Hour}
		// Drain one subcounter behind the engine's back; the others keep 2 each.
		names := e.table.Lookup("k", hashKey("k")).Names(4, nil)
		sub := subLimit(lim, 4, 0)
		for range 2 {
			store.Take(context.Background(), names[0], shard.NameHash(names[0]), sub, 1)
		}
		admitted := 0
		for range 4 { // round robin visits every subcounter once
			if r, _ := e.Allow(context.Background(), "k", pol(lim)); r.Allowed {
				admitted++
			}
		}
		if admitted != tt.want {
			t.Errorf("probe=%v: admitted %d of 4, want %d", tt.probe, admitted, tt.want)
		}
	}
}

func TestRedisErrorComesBackWrapped(t *testing.T) {
	srv, err := redistest.Start(env.Dir)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	client := redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: -1})
	defer client.Close()
	store, err := counter.NewRedisStore(context.Background(), client, counter.RedisConfig{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	e, err := New(store, WithBreaker(3, 50*time.Millisecond, 500*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	ctx := context.Background()
	p := &Policy{Limit: PerSecond(10), OnStoreFailure: FallbackError}
	if _, err := e.Allow(ctx, "k", p); err != nil {
		t.Fatalf("with the server up: %v", err)
	}
	if err := srv.Kill(); err != nil {
		t.Fatal(err)
	}
	r, err := e.Allow(ctx, "k", p)
	if err == nil || r.Allowed {
		t.Fatalf("with the server down: %+v, %v; want an error", r, err)
	}
	if !errors.Is(err, ErrStoreUnavailable) || !strings.Contains(err.Error(), "redis take") {
		t.Errorf("error %q does not say where it came from", err)
	}
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	// The pool redials and scripts are reloaded on NOSCRIPT; the breaker,
	// open after the failures, lets a probe through within its interval.
	var lastErr error
	for start := time.Now(); time.Since(start) < patience; time.Sleep(20 * time.Millisecond) {
		if _, lastErr = e.Allow(ctx, "k", p); lastErr == nil {
			return
		}
	}
	t.Errorf("after the server came back: %v", lastErr)
}
