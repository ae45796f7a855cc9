package counter

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/redis/go-redis/v9"
)

// harness runs the behaviour suite on one store. The memory store runs on
// fixed instants (sleep advances its clock); Redis runs on its own clock, so
// sleep really sleeps and periods are long enough to absorb scheduling noise.
type harness struct {
	name   string
	store  Store
	sleep  func(time.Duration)
	now    func() time.Time // the clock that decides (for aligning to windows)
	period time.Duration    // base period of the suite's limits
	exact  bool             // instants are fixed: assert exact figures
}

func (h *harness) take(t *testing.T, key string, lim Limit, n int64) Result {
	t.Helper()
	r, err := h.store.Take(context.Background(), key, xxhash.Sum64String(key), lim, n)
	if err != nil {
		t.Fatalf("%s: Take(%q): %v", h.name, key, err)
	}
	return r
}

// takeAll takes 1 k times and returns how many were admitted.
func (h *harness) takeAll(t *testing.T, key string, lim Limit, k int) int {
	t.Helper()
	admitted := 0
	for range k {
		if h.take(t, key, lim, 1).Allowed {
			admitted++
		}
	}
	return admitted
}

// alignTo sleeps until offset into the next window of length p.
func (h *harness) alignTo(p, offset time.Duration) {
	now := h.now()
	next := now.Truncate(p).Add(p + offset)
	h.sleep(next.Sub(now))
}

func memoryHarness() *harness {
	var clock atomic.Int64
	clock.Store(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano())
	now := func() time.Time { return time.Unix(0, clock.Load()) }
	return &harness{
		name:   "memory",
		store:  NewMemoryStore(MemoryConfig{MaxKeys: 1000, Stripes: 4, Clock: now}),
		sleep:  func(d time.Duration) { clock.Add(int64(d)) },
		now:    now,
		period: time.Second,
		exact:  true,
	}
}

func redisHarness(t *testing.T, name string, client redis.UniversalClient) *harness {
	t.Helper()
	s, err := NewRedisStore(context.Background(), client, RedisConfig{})
	if err != nil {
		t.Fatalf("NewRedisStore: %v", err)
	}
	t.Cleanup(func() { s.Close(); client.Close() })
	return &harness{name: name, store: s, sleep: time.Sleep, now: time.Now, period: time.Second}
}

func harnesses(t *testing.T) []*harness {
	return []*harness{
		memoryHarness(),
		redisHarness(t, "redis", redis.NewClient(&redis.Options{Addr: testRedisAddr})),
		redisHarness(t, "cluster", redis.NewClusterClient(&redis.ClusterOptions{Addrs: testClusterAddrs})),
	}
}

func uniqueKey(t *testing.T) string {
	return fmt.Sprintf("%s:%x", t.Name(), rand.Uint64())
}

// within asserts |got-want| ≤ tol.
func within(t *testing.T, what string, got, want, tol time.Duration) {
	t.Helper()
	if got < want-tol || got > want+tol {
		t.Errorf("%s = %v, want %v ± %v", what, got, want, tol)
	}
}

// TestStoreBehaviour runs one suite against every (algorithm, store) pair.
func TestStoreBehaviour(t *testing.T) {
	for _, h := range harnesses(t) {
		t.Run(h.name, func(t *testing.T) {
			if !h.exact {
				t.Parallel()
			}
			for _, tc := range []struct {
				name string
				run  func(t *testing.T, h *harness)
			}{
				{"TokenBucketBurstThenRate", testTokenBucketBurstThenRate},
				{"FixedWindowBoundaryBurst", testFixedWindowBoundaryBurst},
				{"SlidingWindowEstimate", testSlidingWindowEstimate},
				{"SlidingLogExact", testSlidingLogExact},
				{"Expiry", testExpiry},
				{"RetryAfter", testRetryAfter},
				{"Cost", testCost},
			} {
				t.Run(tc.name, func(t *testing.T) {
					if !h.exact {
						t.Parallel()
					}
					tc.run(t, h)
				})
			}
		})
	}
}

func testTokenBucketBurstThenRate(t *testing.T, h *harness) {
	key := uniqueKey(t)
	lim := Limit{Algorithm: TokenBucket, Rate: 10, Period: h.period, Burst: 5}
	interval := h.period / 10
	if got := h.takeAll(t, key, lim, 5); got != 5 {
		t.Fatalf("burst: admitted %d of 5", got)
	}
	r := h.take(t, key, lim, 1)
	if r.Allowed {
		t.Fatal("6th request of a burst of 5 admitted")
	}
	if h.exact {
		if r.RetryAfter != interval || r.Remaining != 0 || r.Limit != 5 {
			t.Errorf("deny = %+v, want retry-after %v, remaining 0, limit 5", r, interval)
		}
	} else {
		within(t, "retry-after", r.RetryAfter, interval, interval)
	}
	// Sustained: two periods at twice the rate admit one period's worth per
	// period, give or take one interval at each end.
	admitted := 0
	step := interval / 2
	for range int(2 * h.period / step) {
		h.sleep(step)
		if h.take(t, key, lim, 1).Allowed {
			admitted++
		}
	}
	want, tol := 20, 0
	if !h.exact {
		tol = 3
	}
	if admitted < want-tol || admitted > want+tol+1 {
		t.Errorf("sustained: admitted %d over 2 periods at 2× rate, want %d±%d", admitted, want, tol)
	}
}

func testFixedWindowBoundaryBurst(t *testing.T, h *harness) {
	key := uniqueKey(t)
	lim := Limit{Algorithm: FixedWindow, Rate: 5, Period: h.period}
	// End of one window: all 5 pass and the 6th is denied until the boundary.
	h.alignTo(h.period, h.period*7/10)
	if got := h.takeAll(t, key, lim, 5); got != 5 {
		t.Fatalf("end of window: admitted %d of 5", got)
	}
	r := h.take(t, key, lim, 1)
	if r.Allowed {
		t.Fatal("6th request in the window admitted")
	}
	tol := time.Duration(0)
	if !h.exact {
		tol = h.period / 5
	}
	within(t, "retry-after", r.RetryAfter, h.period*3/10, tol)
	// Start of the next: 5 more, so 2× the limit passes within 0.4 periods:
	// the documented weakness of fixed windows.
	h.sleep(r.RetryAfter + h.period/10)
	if got := h.takeAll(t, key, lim, 6); got != 5 {
		t.Errorf("next window: admitted %d of 6, want 5", got)
	}
}

func testSlidingWindowEstimate(t *testing.T, h *harness) {
	key := uniqueKey(t)
	lim := Limit{Algorithm: SlidingWindow, Rate: 10, Period: h.period}
	h.alignTo(h.period, h.period/20)
	if got := h.takeAll(t, key, lim, 10); got != 10 {
		t.Fatalf("first window: admitted %d of 10", got)
	}
	// A quarter into the next window the previous one still weighs 3/4:
	// floor(10·0.75) + k ≤ 10 admits k = 3.
	h.alignTo(h.period, h.period/4)
	if got := h.takeAll(t, key, lim, 5); got != 3 {
		t.Errorf("quarter into the next window: admitted %d, want 3", got)
	}
	r := h.take(t, key, lim, 1)
	if r.Allowed {
		t.Fatal("admitted past the estimate")
	}
	// Now 7 + 3 = 10: one more fits when floor(10·(1-e)) ≤ 6, just past
	// e = 30% into the window, 0.05 periods from now.
	tol := time.Duration(0)
	if !h.exact {
		tol = h.period / 10
	} else {
		tol = time.Nanosecond
	}
	within(t, "retry-after", r.RetryAfter, h.period/20, tol)
}

func testSlidingLogExact(t *testing.T, h *harness) {
	key := uniqueKey(t)
	lim := Limit{Algorithm: SlidingLog, Rate: 5, Period: h.period}
	step := h.period / 10
	for i := range 5 {
		if !h.take(t, key, lim, 1).Allowed {
			t.Fatalf("request %d of 5 denied", i)
		}
		h.sleep(step)
	}
	// 0.5 periods after the first, the log holds 5: deny until the first
	// entry leaves, 0.5 periods from now.
	r := h.take(t, key, lim, 1)
	if r.Allowed {
		t.Fatal("6th request within one period admitted")
	}
	tol := time.Duration(0)
	if !h.exact {
		tol = step
	}
	within(t, "retry-after", r.RetryAfter, h.period/2, tol)
	h.sleep(r.RetryAfter)
	if !h.take(t, key, lim, 1).Allowed {
		t.Fatal("denied after the oldest entry left the window")
	}
	if h.take(t, key, lim, 1).Allowed {
		t.Error("admitted a 6th within the sliding period")
	}
}

func testExpiry(t *testing.T, h *harness) {
	for _, alg := range []Algorithm{TokenBucket, SlidingWindow, FixedWindow, SlidingLog} {
		key := uniqueKey(t) + alg.String()
		lim := Limit{Algorithm: alg, Rate: 4, Period: h.period / 2}
		// Each batch starts a window, so it never spans a boundary.
		h.alignTo(lim.Period, lim.Period/20)
		if got := h.takeAll(t, key, lim, 5); got != 4 {
			t.Fatalf("%v: admitted %d of 5", alg, got)
		}
		h.sleep(2 * lim.Period)
		h.alignTo(lim.Period, lim.Period/20)
		if got := h.takeAll(t, key, lim, 5); got != 4 {
			t.Errorf("%v: after expiry admitted %d of 5, want 4", alg, got)
		}
	}
}

// testRetryAfter checks every algorithm's retry-after: waiting it out admits,
// and it is not more than one emission interval late.
func testRetryAfter(t *testing.T, h *harness) {
	for _, alg := range []Algorithm{TokenBucket, SlidingWindow, FixedWindow, SlidingLog} {
		key := uniqueKey(t) + alg.String()
		lim := Limit{Algorithm: alg, Rate: 8, Period: h.period}
		interval := lim.Period / 8
		h.alignTo(lim.Period, lim.Period/20) // the 9 takes below share a window
		h.takeAll(t, key, lim, 8)
		r := h.take(t, key, lim, 1)
		if r.Allowed || r.RetryAfter <= 0 {
			t.Fatalf("%v: over the limit gave %+v", alg, r)
		}
		if h.exact && r.RetryAfter > interval {
			h.sleep(r.RetryAfter - interval)
			if h.take(t, key, lim, 1).Allowed && alg != SlidingWindow {
				t.Errorf("%v: admitted one interval before retry-after", alg)
			}
			h.sleep(interval)
		} else {
			h.sleep(r.RetryAfter)
		}
		if !h.exact {
			h.sleep(interval / 10) // Redis's clock moved on while we were asked
		}
		if !h.take(t, key, lim, 1).Allowed {
			t.Errorf("%v: denied after waiting out retry-after %v", alg, r.RetryAfter)
		}
	}
}

func testCost(t *testing.T, h *harness) {
	for _, alg := range []Algorithm{TokenBucket, SlidingWindow, FixedWindow, SlidingLog} {
		key := uniqueKey(t) + alg.String()
		lim := Limit{Algorithm: alg, Rate: 10, Period: h.period}
		if alg == TokenBucket {
			lim.Period *= 10 // no refill between the takes
		} else {
			h.alignTo(lim.Period, lim.Period/20) // the takes share a window
		}
		if r := h.take(t, key, lim, 7); !r.Allowed || r.Remaining != 3 {
			t.Errorf("%v: cost 7 of 10 gave %+v, want allowed with 3 remaining", alg, r)
		}
		if r := h.take(t, key, lim, 4); r.Allowed {
			t.Errorf("%v: cost 4 with 3 remaining admitted", alg)
		}
		if r := h.take(t, key, lim, 3); !r.Allowed || r.Remaining != 0 {
			t.Errorf("%v: cost 3 with 3 remaining gave %+v", alg, r)
		}
	}
}
