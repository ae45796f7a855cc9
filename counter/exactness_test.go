package counter

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Tests that no rounding, expiry or stored value hands out more than a
// limit, and that no figure of a Result is out of range.

// patient is the configuration of these tests' Redis stores: a round trip
// may take long on a loaded machine, and a timeout is not what they test.
var patient = RedisConfig{Timeout: time.Minute}

// patientHarnesses are harnesses (store_test.go) whose Redis stores are
// patient.
func patientHarnesses(t *testing.T) []*harness {
	hs := []*harness{memoryHarness()}
	for _, c := range []struct {
		name   string
		client redis.UniversalClient
	}{
		{"redis", redis.NewClient(&redis.Options{Addr: testRedisAddr})},
		{"cluster", redis.NewClusterClient(&redis.ClusterOptions{Addrs: testClusterAddrs})},
	} {
		t.Cleanup(func() { c.client.Close() })
		s := newTestStore(t, c.client, patient)
		hs = append(hs, &harness{name: c.name, store: s, sleep: time.Sleep, now: serverNow(c.name, c.client), period: time.Second, tick: time.Microsecond})
	}
	return hs
}

// scriptAt runs lim's take script once on keys at the instant now (µs),
// TIME replaced by arguments as TestRedisScriptsMatchMemory does, taking n
// from each key. The keys must be distinct.
func scriptAt(t *testing.T, client redis.UniversalClient, keys []string, lim Limit, n, now int64) []Result {
	t.Helper()
	src := strings.Replace(scripts[lim.Algorithm], "redis.call('TIME')", "{ARGV[#ARGV - 1], ARGV[#ARGV]}", 1)
	calls := make([]call, len(keys))
	var args []any
	for i := range calls {
		calls[i].setArgs(lim, n)
		if lim.Algorithm != TokenBucket || i == 0 {
			args = calls[i].appendArgs(args)
		}
	}
	v, err := redis.NewScript(src).Run(context.Background(), client, keys, append(args, now/1e6, now%1e6)...).Int64Slice()
	if err != nil {
		t.Fatalf("script: %v", err)
	}
	w := replyWidth[lim.Algorithm]
	if len(v) != w*len(keys) {
		t.Fatalf("reply %v: want %d integers", v, w*len(keys))
	}
	out := make([]Result, len(keys))
	for i := range calls {
		out[i] = calls[i].decode(v[i*w : (i+1)*w])
	}
	return out
}

// TestTokenBucketFullBurstResetAfter checks the emission interval of rates
// that do not divide the period: a full burst taken from a fresh bucket
// must take one period to refill, on every store, give or take two ticks
// (ns in memory, µs on Redis). The check holds whatever time passes, since
// one Take is decided at one instant.
func TestTokenBucketFullBurstResetAfter(t *testing.T) {
	for _, h := range patientHarnesses(t) {
		t.Run(h.name, func(t *testing.T) {
			for _, lim := range []Limit{
				{Rate: 700_000, Period: time.Second},
				{Rate: 1_500_000, Period: time.Second},
				{Rate: 3, Period: time.Second},
				{Rate: 7, Period: time.Minute},
				{Rate: 999_999, Period: time.Second},
				{Rate: 300, Period: time.Second, Burst: 20_000},
			} {
				r := h.take(t, uniqueKey(t), lim, lim.Capacity())
				want := time.Duration(float64(lim.Period) * float64(lim.Capacity()) / float64(lim.Rate))
				tick := time.Duration(2)
				if !h.exact {
					tick = 2 * time.Microsecond
				}
				if !r.Allowed || r.ResetAfter < want || r.ResetAfter > want+tick {
					t.Errorf("%d per %v, burst %d: a full burst gave %+v, want refilled in %v (+%v)",
						lim.Rate, lim.Period, lim.Capacity(), r, want, tick)
				}
			}
		})
	}
}

// TestTokenBucketEmptiedBucketRefill empties a bucket of 700k/s and finds
// the largest cost admitted 100 ms later, on fixed instants: 70,000 units
// were emitted, less a hair of the interval rounded up, so 69,999 and not
// one more, on both stores alike.
func TestTokenBucketEmptiedBucketRefill(t *testing.T) {
	checkLeaks(t)
	client := newTestClient(t, testRedisAddr)
	lim := Limit{Rate: 700_000, Period: time.Second}
	const later = 100 * time.Millisecond
	mem := NewMemoryStore(MemoryConfig{})
	stores := []struct {
		name string
		take func(key string, n int64, at time.Time) Result
	}{
		{"memory", func(key string, n int64, at time.Time) Result { return mem.TakeAt(at, key, 0, lim, n) }},
		{"redis", func(key string, n int64, at time.Time) Result {
			return scriptAt(t, client, []string{key}, lim, n, at.UnixMicro())[0]
		}},
	}
	for _, s := range stores {
		admits := func(n int64) bool {
			key := testKey(t)
			if r := s.take(key, lim.Capacity(), t0); !r.Allowed || r.Remaining != 0 {
				t.Fatalf("%s: emptying a fresh bucket gave %+v", s.name, r)
			}
			return s.take(key, n, t0.Add(later)).Allowed
		}
		lo, hi := int64(0), lim.Capacity() // admits(lo), !admits(hi+1) unknown
		if admits(hi) {
			lo = hi
		}
		for lo < hi {
			mid := (lo + hi + 1) / 2
			if admits(mid) {
				lo = mid
			} else {
				hi = mid - 1
			}
		}
		t.Logf("%s: %d admitted %v after emptying", s.name, lo, later)
		if lo != 69_999 {
			t.Errorf("%s: the largest cost admitted %v after emptying a bucket of %d/s is %d, want 69999",
				s.name, later, lim.Rate, lo)
		}
	}
}

// TestRedisTokenBucketTTLAfterToleranceGrows raises a key's tolerance
// (burst 10 → 1000 at 1000/s) and checks that its TTL covers its TAT plus
// the new tolerance: a TTL left from the small tolerance would let the key
// expire with its TAT ahead, and a full burst pass again. It runs 50 times,
// the script's clock (faked, as in scriptAt) 20 ms further each time so
// that the TATs fall at every phase of the store's expiry spans. An expiry
// is set relative to the script's clock, so the PTTL read after the Take
// is the TTL the Take left, less the real time the two took.
func TestRedisTokenBucketTTLAfterToleranceGrows(t *testing.T) {
	checkLeaks(t)
	client := newTestClient(t, testRedisAddr)
	ctx := context.Background()
	small := Limit{Rate: 1000, Period: time.Second, Burst: 10}
	large := Limit{Rate: 1000, Period: time.Second, Burst: 1000}
	tol := time.Second // large's
	short, worst := 0, time.Duration(1<<62)
	for i := range 50 {
		key := testKey(t)
		now := t0.UnixMicro() + int64(i)*20_000
		scriptAt(t, client, []string{key}, small, 10, now)
		start := time.Now()
		r := scriptAt(t, client, []string{key}, large, 500, now)[0]
		ttl, err := client.PTTL(ctx, key).Result()
		if err != nil {
			t.Fatal(err)
		}
		elapsed := time.Since(start)
		if !r.Allowed {
			t.Fatalf("500 of a fresh burst of 1000 denied: %+v", r)
		}
		if margin := ttl - (r.ResetAfter + tol - elapsed); margin < -time.Millisecond {
			short++
			worst = min(worst, ttl)
		}
	}
	t.Logf("%d of 50 keys got a TTL short of TAT + tolerance", short)
	if short > 0 {
		t.Errorf("%d of 50 keys got a TTL short of TAT + tolerance (shortest %v, TAT about 510 ms ahead)", short, worst)
	}
}

// sane reports what is wrong with r as a result under lim, if anything.
func sane(r Result, lim Limit) string {
	switch {
	case r.Remaining < 0 || r.Remaining > r.Limit:
		return fmt.Sprintf("remaining %d of %d", r.Remaining, r.Limit)
	case r.Limit != lim.Capacity():
		return fmt.Sprintf("limit %d, want %d", r.Limit, lim.Capacity())
	case r.RetryAfter < 0 || !r.Allowed && r.RetryAfter == 0 || r.Allowed && r.RetryAfter != 0:
		return fmt.Sprintf("retry-after %v when allowed=%v", r.RetryAfter, r.Allowed)
	case r.ResetAfter < 0:
		return fmt.Sprintf("reset-after %v", r.ResetAfter)
	}
	return ""
}

// TestLimitLoweredBehaviour uses up a limit of 100 and lowers it to 50:
// on every store and algorithm, no figure of the Results may leave its
// range (remaining in [0, limit], retry-after and reset-after not negative).
func TestLimitLoweredBehaviour(t *testing.T) {
	for _, h := range patientHarnesses(t) {
		t.Run(h.name, func(t *testing.T) {
			for _, alg := range []Algorithm{TokenBucket, SlidingWindow, FixedWindow, SlidingLog} {
				high := Limit{Algorithm: alg, Rate: 100, Period: longPeriod, Burst: 100}
				low := Limit{Algorithm: alg, Rate: 50, Period: longPeriod, Burst: 50}
				key := uniqueKey(t)
				if got := h.takeAll(t, key, high, 100); got != 100 {
					t.Fatalf("%v: admitted %d of 100", alg, got)
				}
				worst := int64(0)
				for range 3 {
					r := h.take(t, key, low, 1)
					worst = min(worst, r.Remaining)
					if msg := sane(r, low); msg != "" || r.Allowed {
						t.Errorf("%v: after lowering the limit: %+v: %s", alg, r, msg)
					}
				}
				t.Logf("%v: lowest remaining %d", alg, worst)
			}
		})
	}
}

// TestRedisTokenBucketMatchesMemory runs the token-bucket script on fixed
// instants against the memory store, as TestRedisScriptsMatchMemory does,
// for rates that do not divide their period, some faster than a unit per
// µs: the decisions and Remaining must be the same, the durations within a
// µs (the stores' ticks differ), NextAfter included. Keys expire on the
// server's clock, not the faked one, so every burst lasts 2 s or more: no
// key expires while the test runs, however loaded the machine.
func TestRedisTokenBucketMatchesMemory(t *testing.T) {
	checkLeaks(t)
	client := newTestClient(t, testRedisAddr)
	for _, lim := range []Limit{
		{Rate: 700_000, Period: time.Second, Burst: 1_400_000},
		{Rate: 1_500_000, Period: time.Second, Burst: 3_000_000},
		{Rate: 3, Period: time.Second, Burst: 6},
		{Rate: 7, Period: time.Minute, Burst: 5},
		{Rate: 300, Period: time.Second, Burst: 20_000},
	} {
		t.Run(fmt.Sprintf("%d/%v/%d", lim.Rate, lim.Period, lim.Burst), func(t *testing.T) {
			mem := NewMemoryStore(MemoryConfig{})
			counters := []string{testKey(t), testKey(t)}
			rng := rand.New(rand.NewPCG(7, uint64(lim.Rate)))
			now := t0.UnixMicro()
			span := lim.Period.Microseconds() * lim.Capacity() / lim.Rate / 4
			allowed, takes, next := 0, 0, 0
			for i := range 300 {
				now += rng.Int64N(span + 1)
				n := []int64{1, 1 + rng.Int64N(lim.Capacity()), lim.Capacity()}[rng.IntN(3)]
				keys := counters[:1+rng.IntN(len(counters))]
				got := scriptAt(t, client, keys, lim, n, now)
				for j, key := range keys {
					want := mem.TakeAt(time.UnixMicro(now), key, 0, lim, n)
					if got[j].Allowed != want.Allowed || got[j].Remaining != want.Remaining ||
						!nearMicro(got[j].RetryAfter, want.RetryAfter) || !nearMicro(got[j].ResetAfter, want.ResetAfter) ||
						!nearMicro(got[j].NextAfter, want.NextAfter) {
						t.Fatalf("step %d, key %d (n=%d): redis %+v, memory %+v", i, j, n, got[j], want)
					}
					if takes++; want.Allowed {
						allowed++
					}
					if want.NextAfter > 0 {
						next++
					}
				}
			}
			if allowed < takes/10 || allowed > takes*9/10 || next == 0 {
				t.Errorf("%d of %d allowed, %d with a next unit due: want a mix of decisions", allowed, takes, next)
			}
		})
	}
}

// TestRedisTokenBucketExpiryCovers takes from keys under limits whose
// tolerance goes up and down, and checks after every admission that the
// key's expiry covers its TAT plus the tolerance and exceeds it by at most
// 1.5 expiry spans (see gcraScript), however the key was written before.
// It runs on the server's clock, pausing now and then so that TATs fall
// behind it too; the checks hold whatever time passes between the Take
// and the PTTL read, since both figures run down together.
func TestRedisTokenBucketExpiryCovers(t *testing.T) {
	checkLeaks(t)
	client := newTestClient(t, testRedisAddr)
	s := newTestStore(t, client, patient)
	ctx := context.Background()
	lims := []Limit{
		{Rate: 1000, Period: time.Second, Burst: 10},
		{Rate: 1000, Period: time.Second, Burst: 1000},
		{Rate: 700_000, Period: time.Second, Burst: 35_000},
		{Rate: 3, Period: time.Second},
		{Rate: 100, Period: 10 * time.Second, Burst: 20},
	}
	rng := rand.New(rand.NewPCG(3, 4))
	keys := []string{testKey(t), testKey(t), testKey(t)}
	checked := 0
	for i := range 300 {
		if i%2 == 1 {
			time.Sleep(time.Duration(rng.Int64N(int64(10 * time.Millisecond))))
		}
		lim := lims[rng.IntN(len(lims))]
		n := 1 + rng.Int64N(lim.Capacity()/20+1)
		key := keys[rng.IntN(len(keys))]
		start := time.Now()
		r := mustTake(t, s, key, lim, n)
		ttl, err := client.PTTL(ctx, s.cfg.Prefix+key).Result()
		if err != nil {
			t.Fatal(err)
		}
		elapsed := time.Since(start)
		if !r.Allowed {
			continue
		}
		checked++
		var c call
		c.setArgs(lim, n)
		tol := time.Duration(c.tol.ceil()) * time.Microsecond
		span := time.Millisecond << c.level
		if lo, hi := r.ResetAfter+tol-elapsed-time.Millisecond, r.ResetAfter+span*3/2+time.Millisecond; ttl < lo || ttl > hi {
			t.Fatalf("step %d: %d per %v, burst %d: TTL %v with the TAT %v ahead: want between %v and %v",
				i, lim.Rate, lim.Period, lim.Capacity(), ttl, r.ResetAfter, lo, hi)
		}
	}
	t.Logf("%d admissions checked", checked)
	if checked < 30 {
		t.Errorf("only %d admissions checked", checked)
	}
}

// TestTokenBucketLimitChangeCarriesUnits changes a key's token-bucket limit
// at fixed instants, on both stores, and counts what the new limit admits:
// the debt left under the old limit must count in units under the new one.
// Carried as time, 160 units taken at 640/s (burst 160) read as 80 at 320/s
// (burst 320), and the key admitted 240 more where 160 fit.
func TestTokenBucketLimitChangeCarriesUnits(t *testing.T) {
	checkLeaks(t)
	client := newTestClient(t, testRedisAddr)
	fast := Limit{Rate: 640, Period: time.Second, Burst: 160}
	slow := Limit{Rate: 320, Period: time.Second, Burst: 320}
	perMinute := Limit{Rate: 19_200, Period: time.Minute, Burst: 320} // slow's interval, another period
	type step struct {
		after  time.Duration // since the start
		lim    Limit
		n      int64 // each take's cost
		admits int64 // takes admitted before the first denial (at most 1000)
	}
	for _, tc := range []struct {
		name  string
		steps []step
	}{
		{"to a slower rate and a larger burst", []step{{0, fast, 1, 160}, {0, slow, 1, 160}}},
		{"to a faster rate and a smaller burst", []step{{0, slow, 1, 320}, {0, fast, 1, 0}, {700 * time.Millisecond, fast, 1, 64}}},
		{"in large costs", []step{{0, fast, 100, 1}, {0, slow, 221, 0}, {0, slow, 220, 1}, {0, slow, 1, 0}}},
		{"to another period", []step{{0, fast, 1, 160}, {0, perMinute, 1, 160}}},
		{"and back", []step{{0, fast, 1, 160}, {0, slow, 1, 160}, {0, fast, 1, 0}, {time.Second, fast, 1, 160}}},
	} {
		takers := map[string]func(t *testing.T, key string, lim Limit, n, at int64) Result{
			"memory": func() func(*testing.T, string, Limit, int64, int64) Result {
				mem := NewMemoryStore(MemoryConfig{})
				return func(_ *testing.T, key string, lim Limit, n, at int64) Result {
					return mem.TakeAt(time.UnixMicro(at), key, 0, lim, n)
				}
			}(),
			"redis": func(t *testing.T, key string, lim Limit, n, at int64) Result {
				return scriptAt(t, client, []string{key}, lim, n, at)[0]
			},
		}
		for store, take := range takers {
			t.Run(store+"/"+tc.name, func(t *testing.T) {
				key := testKey(t)
				start := t0.UnixMicro()
				for i, s := range tc.steps {
					var admitted int64
					for admitted < 1000 {
						if r := take(t, key, s.lim, s.n, start+s.after.Microseconds()); !r.Allowed {
							break
						}
						admitted++
					}
					if admitted != s.admits {
						t.Fatalf("step %d (%d/%v burst %d, cost %d, at +%v): admitted %d takes, want %d",
							i, s.lim.Rate, s.lim.Period, s.lim.Burst, s.n, s.after, admitted, s.admits)
					}
				}
			})
		}
	}
}

// TestMemoryReshardReadsWrittenInterval: a token-bucket counter written
// under one limit and moved under another (the limit changed between the
// key's last decision and the move) carries its usage in the units it was
// taken in: 160 units at 640/s read as 160 under 320/s, not as 80.
func TestMemoryReshardReadsWrittenInterval(t *testing.T) {
	fast := Limit{Rate: 640, Period: time.Second, Burst: 160}
	slow := Limit{Rate: 320, Period: time.Second, Burst: 320}
	s := NewMemoryStore(MemoryConfig{})
	for i := range 160 {
		if !s.TakeAt(t0, "from", 0, fast, 1).Allowed {
			t.Fatalf("take %d of the fast burst denied", i+1)
		}
	}
	if err := s.ReshardAt(t0, []Shard{{Name: "from", Limit: slow}}, []Shard{{Name: "to", Limit: slow}}); err != nil {
		t.Fatal(err)
	}
	var admitted int
	for s.TakeAt(t0, "to", 0, slow, 1).Allowed {
		admitted++
	}
	if admitted != 160 {
		t.Errorf("the moved counter admitted %d under the slow limit, want 160 (320 less the 160 taken)", admitted)
	}
}
