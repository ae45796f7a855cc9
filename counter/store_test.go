package counter

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// harness runs the behaviour suite on one store. The memory store runs on
// fixed instants (sleep advances its clock) and the suite asserts exact
// figures. Redis runs on its own clock (TIME): sleep really sleeps, and a
// take is decided at some instant between the server's TIME read just
// before and just after it. The suite's checks hold
// whatever instant in that span the server chose, so a slow machine widens
// what they accept instead of failing them; where a check needs the takes to
// fall in one window or interval and they did not, the scenario runs again
// (untilDecided).
type harness struct {
	name  string
	store Store
	sleep func(time.Duration)
	// now reads the clock that decides: the memory store's, or the Redis
	// server's TIME. Spans on the server's own clock keep a step of the
	// host's wall clock (which Redis reads) out of the checks, as spans on
	// the test's monotonic clock would not.
	now    func(t *testing.T) time.Time
	period time.Duration // base period of the suite's limits
	exact  bool          // instants are fixed: assert exact figures
	// tick is the store's time resolution: a Redis script reads TIME in
	// whole µs, so the instant it decides at may lie up to a tick before
	// the span's start; 0 for the memory store.
	tick time.Duration
}

func (h *harness) take(t *testing.T, key string, lim Limit, n int64) Result {
	t.Helper()
	r, err := h.store.Take(context.Background(), key, Hash(key), lim, n)
	if err != nil {
		t.Fatalf("%s: Take(%q): %v", h.name, key, err)
	}
	return r
}

// span holds the instants a take may have been decided at: the store's
// clock read just before and just after it (equal for the memory store).
type span struct{ from, to time.Time }

// timedTake is take, with the span it was decided in.
func (h *harness) timedTake(t *testing.T, key string, lim Limit, n int64) (Result, span) {
	t.Helper()
	from := h.now(t)
	r := h.take(t, key, lim, n)
	return r, span{from, h.now(t)}
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
func (h *harness) alignTo(t *testing.T, p, offset time.Duration) {
	now := h.now(t)
	next := now.Truncate(p).Add(p + offset)
	h.sleep(next.Sub(now))
}

// between asserts lo ≤ got ≤ hi, widened by a tick each way for the
// store's rounding.
func (h *harness) between(t *testing.T, what string, got, lo, hi time.Duration) {
	t.Helper()
	if got < lo-h.tick || got > hi+h.tick {
		t.Errorf("%s: %s = %v, want in [%v, %v]", h.name, what, got, lo, hi)
	}
}

// untilDecided runs one attempt of a scenario after another until one
// returns true: its takes fell in the windows or intervals its checks need
// (each attempt makes whatever checks its timing allows). On a loaded
// machine an attempt may be too slow; it gives up after a minute. The
// memory store's attempts always decide.
func (h *harness) untilDecided(t *testing.T, attempt func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for n := 1; ; n++ {
		if attempt() || t.Failed() {
			return
		}
		if h.exact {
			t.Fatalf("%s: an attempt on fixed instants did not decide", h.name)
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %d attempts in a minute, none fast enough to decide its checks", h.name, n)
		}
		t.Logf("%s: attempt %d was too slow to decide its checks; again", h.name, n)
	}
}

// windowOf returns the index of the window of length p holding at and the
// time from the window's start to at.
func windowOf(at time.Time, p time.Duration) (int64, time.Duration) {
	ns := at.UnixNano()
	return ns / int64(p), time.Duration(ns % int64(p))
}

// oneWindow reports whether every take decided between from and to falls
// in the same window of length p.
func (h *harness) oneWindow(from, to time.Time, p time.Duration) bool {
	a, _ := windowOf(from.Add(-h.tick), p)
	b, _ := windowOf(to, p)
	return a == b
}

// noRefill reports whether takes decided between from and to all see the
// same capacity under lim: within one emission interval for a token
// bucket, one window for the window algorithms, one period for a log.
func (h *harness) noRefill(lim Limit, from, to time.Time) bool {
	switch lim.Algorithm {
	case TokenBucket:
		return to.Sub(from)+h.tick < lim.Period/time.Duration(lim.Rate)
	case SlidingLog:
		return to.Sub(from)+h.tick < lim.Period
	}
	return h.oneWindow(from, to, lim.Period)
}

func memoryHarness() *harness {
	var clock atomic.Int64
	clock.Store(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano())
	now := func() time.Time { return time.Unix(0, clock.Load()) }
	return &harness{
		name:   "memory",
		store:  NewMemoryStore(MemoryConfig{MaxKeys: 1000, Stripes: 4, Clock: now}),
		sleep:  func(d time.Duration) { clock.Add(int64(d)) },
		now:    func(*testing.T) time.Time { return now() },
		period: time.Second,
		exact:  true,
	}
}

func redisHarness(t *testing.T, name string, client redis.UniversalClient) *harness {
	t.Helper()
	s, err := NewRedisStore(context.Background(), client, RedisConfig{Timeout: testTimeout})
	if err != nil {
		t.Fatalf("NewRedisStore: %v", err)
	}
	t.Cleanup(func() { s.Close(); client.Close() })
	return &harness{name: name, store: s, sleep: time.Sleep, now: serverNow(name, client), period: time.Second, tick: time.Microsecond}
}

// serverNow returns a reader of client's server TIME. The servers of a
// cluster here run on this host, so any node's TIME is the clock every node
// decides by.
func serverNow(name string, client redis.UniversalClient) func(t *testing.T) time.Time {
	return func(t *testing.T) time.Time {
		t.Helper()
		tm, err := client.Time(context.Background()).Result()
		if err != nil {
			t.Fatalf("%s: TIME: %v", name, err)
		}
		return tm
	}
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
	first := h.now(t)
	if got := h.takeAll(t, key, lim, 5); got != 5 {
		t.Fatalf("burst: admitted %d of 5", got)
	}
	// A token comes back one interval after the first take: the 6th is
	// denied unless it was decided that late.
	r, sixth := h.timedTake(t, key, lim, 1)
	total := 5
	switch since := sixth.to.Sub(first) + h.tick; {
	case r.Allowed && since < interval:
		t.Fatalf("6th request of a burst of 5 admitted %v after the first", since)
	case r.Allowed:
		total++
	case r.Remaining != 0 || r.Limit != 5:
		t.Errorf("deny = %+v, want remaining 0, limit 5", r)
	default:
		h.between(t, "retry-after", r.RetryAfter, interval-since, interval)
	}
	// Sustained: two periods at twice the rate. Whatever the pace of the
	// takes, a denial's retry-after is at most one interval, a take decided
	// a full interval after the last admission is admitted, and no more
	// than the burst plus one per interval since the first take pass.
	admitted, last := 0, sixth.to // the last admission was decided by then
	step := interval / 2
	for i := range int(2 * h.period / step) {
		h.sleep(step)
		r, sp := h.timedTake(t, key, lim, 1)
		switch {
		case r.Allowed:
			admitted++
			last = sp.to
		case sp.from.Sub(last) >= interval+h.tick:
			t.Errorf("sustained take %d denied %v after the last admission, an interval being %v", i, sp.from.Sub(last), interval)
		case r.RetryAfter <= 0 || r.RetryAfter > interval:
			t.Errorf("sustained take %d denied with retry-after %v, want in (0, %v]", i, r.RetryAfter, interval)
		}
	}
	elapsed := h.now(t).Sub(first)
	t.Logf("%s: sustained: admitted %d over %v at 2× rate", h.name, admitted, elapsed)
	if bound := 5 + int((elapsed+h.tick)/interval); total+admitted > bound {
		t.Errorf("admitted %d in %v: more than the burst of 5 and one per %v (%d)", total+admitted, elapsed, interval, bound)
	}
	if h.exact && admitted != 20 {
		t.Errorf("sustained: admitted %d over 2 periods at 2× rate, want 20", admitted)
	}
}

func testFixedWindowBoundaryBurst(t *testing.T, h *harness) {
	lim := Limit{Algorithm: FixedWindow, Rate: 5, Period: h.period}
	h.untilDecided(t, func() bool {
		key := uniqueKey(t)
		// End of one window: all 5 pass and the 6th is denied until the boundary.
		h.alignTo(t, h.period, h.period*7/10)
		first := h.now(t)
		if got := h.takeAll(t, key, lim, 5); got != 5 {
			t.Fatalf("end of window: admitted %d of 5", got) // whatever windows they fell in
		}
		r, sixth := h.timedTake(t, key, lim, 1)
		if !h.oneWindow(first, sixth.to, h.period) {
			return false
		}
		if r.Allowed {
			t.Fatal("6th request in the window admitted")
		}
		w, _ := windowOf(first, h.period)
		end := time.Unix(0, (w+1)*int64(h.period))
		h.between(t, "retry-after", r.RetryAfter, end.Sub(sixth.to), end.Sub(sixth.from))
		// Start of the next: 5 more, so 2× the limit passes within 0.4 periods:
		// the documented weakness of fixed windows.
		h.sleep(r.RetryAfter + h.period/10)
		from := h.now(t)
		got := h.takeAll(t, key, lim, 6)
		if !h.oneWindow(from, h.now(t), h.period) {
			return false
		}
		if got != 5 {
			t.Errorf("next window: admitted %d of 6, want 5", got)
		}
		return true
	})
}

func testSlidingWindowEstimate(t *testing.T, h *harness) {
	lim := Limit{Algorithm: SlidingWindow, Rate: 10, Period: h.period}
	p := int64(h.period)
	h.untilDecided(t, func() bool {
		key := uniqueKey(t)
		h.alignTo(t, h.period, h.period/20)
		first := h.now(t)
		if got := h.takeAll(t, key, lim, 10); got != 10 {
			t.Fatalf("first window: admitted %d of 10", got)
		}
		w, _ := windowOf(first, h.period)
		if !h.oneWindow(first, h.now(t), h.period) {
			return false
		}
		// A quarter into the next window the previous one still weighs 3/4:
		// floor(10·0.75) + k ≤ 10 admits k = 3. The weight falls as time
		// passes, so a take must be admitted if it fits at the earliest
		// instant it may have been decided at, and denied if it does not
		// fit at the latest.
		h.alignTo(t, h.period, h.period/4)
		cur, denied := int64(0), false
		for i := range 6 {
			r, sp := h.timedTake(t, key, lim, 1)
			wa, early := windowOf(sp.from.Add(-h.tick), h.period)
			wb, late := windowOf(sp.to, h.period)
			if wa != w+1 || wb != w+1 {
				return false
			}
			fitsEarly := weighted(10, p-int64(early), p)+cur < 10
			fitsLate := weighted(10, p-int64(late), p)+cur < 10
			switch {
			case r.Allowed && !fitsLate:
				t.Fatalf("take %d, %v to %v into the window with %d admitted in it: admitted past the estimate", i, early, late, cur)
			case !r.Allowed && fitsEarly:
				t.Fatalf("take %d, %v to %v into the window with %d admitted in it: denied, want admitted", i, early, late, cur)
			case r.Allowed:
				cur++
				continue
			}
			if i < 5 {
				continue
			}
			denied = true
			// The 6th, denied: one more fits once floor(10·(1-e)) ≤ 9-cur,
			// at e = firstAfter(10, 9-cur, period) into the window.
			at := time.Duration(firstAfter(10, 9-cur, p))
			h.between(t, "retry-after", r.RetryAfter, max(1, at-late), max(1, at-early))
		}
		t.Logf("%s: a quarter into the next window: admitted %d", h.name, cur)
		if h.exact && cur != 3 {
			t.Errorf("quarter into the next window: admitted %d, want 3", cur)
		}
		return denied
	})
}

func testSlidingLogExact(t *testing.T, h *harness) {
	lim := Limit{Algorithm: SlidingLog, Rate: 5, Period: h.period}
	step := h.period / 10
	h.untilDecided(t, func() bool {
		key := uniqueKey(t)
		var log []span // when the admitted takes were decided
		for i := range 5 {
			r, sp := h.timedTake(t, key, lim, 1)
			if !r.Allowed {
				t.Fatalf("request %d of 5 denied", i)
			}
			log = append(log, sp)
			h.sleep(step)
		}
		// 0.5 periods after the first, the log holds 5: deny until the first
		// entry leaves, 0.5 periods from now.
		r, sixth := h.timedTake(t, key, lim, 1)
		if !h.checkLog(t, "6th request", lim, log, sixth, r) || r.Allowed {
			return false
		}
		h.between(t, "retry-after", r.RetryAfter, log[0].from.Add(h.period).Sub(sixth.to), log[0].to.Add(h.period).Sub(sixth.from))
		// Waiting it out from the denial's reply, the oldest entry has left.
		h.sleep(r.RetryAfter)
		r, sp := h.timedTake(t, key, lim, 1)
		if !r.Allowed {
			t.Fatal("denied after the oldest entry left the window")
		}
		log = append(log[1:], sp)
		r, sp = h.timedTake(t, key, lim, 1)
		return h.checkLog(t, "a 6th within the sliding period", lim, log, sp, r)
	})
}

// checkLog checks a sliding log's decision r, decided in at, against the
// admitted entries log (when each was decided) that may still be in the
// window: it must deny if the entries certainly in it leave no room, and
// admit if those that may be in it leave room. It reports whether the
// timing decided which.
func (h *harness) checkLog(t *testing.T, what string, lim Limit, log []span, at span, r Result) bool {
	t.Helper()
	var surely, maybe int64
	for _, e := range log {
		if e.from.Add(-h.tick).After(at.to.Add(-lim.Period)) {
			surely++
		}
		if e.to.After(at.from.Add(-h.tick - lim.Period)) {
			maybe++
		}
	}
	switch {
	case surely+1 > lim.Rate && r.Allowed:
		t.Errorf("%s admitted with %d entries in the window", what, surely)
	case maybe+1 <= lim.Rate && !r.Allowed:
		t.Errorf("%s denied with at most %d entries in the window", what, maybe)
	}
	return surely+1 > lim.Rate || maybe+1 <= lim.Rate
}

func testExpiry(t *testing.T, h *harness) {
	for _, alg := range []Algorithm{TokenBucket, SlidingWindow, FixedWindow, SlidingLog} {
		lim := Limit{Algorithm: alg, Rate: 4, Period: h.period / 2}
		h.untilDecided(t, func() bool {
			key := uniqueKey(t) + alg.String()
			decided := true
			for _, when := range []string{"fresh", "after expiry"} {
				if when != "fresh" {
					h.sleep(2 * lim.Period)
				}
				h.alignTo(t, lim.Period, lim.Period/20)
				first := h.now(t)
				// A counter with no state admits 4 however slow the takes,
				// and the 5th is denied unless a unit came back meanwhile.
				if got := h.takeAll(t, key, lim, 4); got != 4 {
					t.Fatalf("%v: %s: admitted %d of 4", alg, when, got)
				}
				r, fifth := h.timedTake(t, key, lim, 1)
				switch {
				case !h.noRefill(lim, first, fifth.to):
					decided = false
				case r.Allowed:
					t.Errorf("%v: %s: admitted the 5th of a limit of 4", alg, when)
				}
			}
			return decided
		})
	}
}

// testRetryAfter checks every algorithm's retry-after: waiting it out admits,
// and it is not more than one emission interval late.
func testRetryAfter(t *testing.T, h *harness) {
	for _, alg := range []Algorithm{TokenBucket, SlidingWindow, FixedWindow, SlidingLog} {
		lim := Limit{Algorithm: alg, Rate: 8, Period: h.period}
		interval := lim.Period / 8
		h.untilDecided(t, func() bool {
			key := uniqueKey(t) + alg.String()
			h.alignTo(t, lim.Period, lim.Period/20) // the 9 takes below share a window
			first := h.now(t)
			if got := h.takeAll(t, key, lim, 8); got != 8 {
				t.Fatalf("%v: admitted %d of 8", alg, got)
			}
			r, ninth := h.timedTake(t, key, lim, 1)
			if r.Allowed {
				if h.noRefill(lim, first, ninth.to) {
					t.Fatalf("%v: over the limit gave %+v", alg, r)
				}
				return false
			}
			if r.RetryAfter <= 0 {
				t.Fatalf("%v: denied with retry-after %v", alg, r.RetryAfter)
			}
			// The retry instant is RetryAfter after the denial was decided,
			// so after ninth.from + RetryAfter.
			if r.RetryAfter > interval {
				h.sleep(r.RetryAfter - interval)
				early, sp := h.timedTake(t, key, lim, 1)
				if early.Allowed && alg != SlidingWindow {
					if sp.to.Add(h.tick).Before(ninth.from.Add(r.RetryAfter)) {
						t.Errorf("%v: admitted before retry-after %v", alg, r.RetryAfter)
					}
					return false
				}
				h.sleep(interval)
			} else {
				h.sleep(r.RetryAfter)
			}
			// The sleep began after the denial's reply: the next take is
			// decided at least RetryAfter after the denial.
			if !h.take(t, key, lim, 1).Allowed {
				t.Errorf("%v: denied after waiting out retry-after %v", alg, r.RetryAfter)
			}
			return true
		})
	}
}

// testCost needs no time to pass: a period no test outlives.
func testCost(t *testing.T, h *harness) {
	for _, alg := range []Algorithm{TokenBucket, SlidingWindow, FixedWindow, SlidingLog} {
		key := uniqueKey(t) + alg.String()
		lim := Limit{Algorithm: alg, Rate: 10, Period: longPeriod}
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
