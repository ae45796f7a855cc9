package counter

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Tests that every limit Validate accepts is enforced exactly at the edges
// of int64 and of a Lua double (2^53), and that the limits that could not
// be are refused.

// overflowAt is the fixed instant the memory store decides these tests at.
var overflowAt = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// takeRun takes first (if positive) and then n k times from a fresh counter
// under lim at one fixed instant, in memory or by the take script on the
// test redis-server, and returns how many of the k takes of n passed.
func takeRun(t *testing.T, store string, lim Limit, first, n int64, k int) int {
	t.Helper()
	key := testKey(t)
	var take func(n int64) bool
	switch store {
	case "memory":
		mem := NewMemoryStore(MemoryConfig{})
		t.Cleanup(func() { mem.Close() })
		take = func(n int64) bool { return mem.TakeAt(overflowAt, key, 0, lim, n).Allowed }
	case "redis":
		client := redis.NewClient(&redis.Options{Addr: testRedisAddr})
		t.Cleanup(func() { client.Close() })
		now := overflowAt.UnixMicro()
		take = func(n int64) bool { return scriptAt(t, client, []string{key}, lim, n, now)[0].Allowed }
	}
	if first > 0 && !take(first) {
		t.Fatalf("%s: the first take of %d under %+v was denied", store, first, lim)
	}
	admitted := 0
	for range k {
		if take(n) {
			admitted++
		}
	}
	return admitted
}

// TestLimitOverflow runs limits whose arithmetic overflowed an int64 or
// went past exact doubles: each is refused by Validate with
// ErrLimitTooLarge, or admits exactly what fits, on every store.
func TestLimitOverflow(t *testing.T) {
	for _, tc := range []struct {
		name  string
		lim   Limit
		first int64 // taken before the run
		n     int64 // the cost of each of the 10 takes
		fits  int   // how many of them the limit admits
	}{
		{"token bucket refilling over 292 years", Limit{Algorithm: TokenBucket, Rate: 1, Period: 8760 * time.Hour, Burst: 700}, 0, 400, 1},
		{"fixed window of MaxInt64", Limit{Algorithm: FixedWindow, Rate: math.MaxInt64, Period: longPeriod}, 0, 1<<62 + 1, 1},
		{"sliding window of MaxInt64", Limit{Algorithm: SlidingWindow, Rate: math.MaxInt64, Period: longPeriod}, 0, 1<<62 + 1, 1},
		{"sliding window of 2^53", Limit{Algorithm: SlidingWindow, Rate: 1 << 53, Period: longPeriod}, 1<<53 - 1, 1, 1},
		{"fixed window of 2^53", Limit{Algorithm: FixedWindow, Rate: 1 << 53, Period: longPeriod}, 1<<53 - 1, 1, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.lim.Validate(); err != nil {
				if !errors.Is(err, ErrLimitTooLarge) {
					t.Fatalf("Validate(%+v) = %v, want ErrLimitTooLarge", tc.lim, err)
				}
				return
			}
			for _, store := range []string{"memory", "redis"} {
				if got := takeRun(t, store, tc.lim, tc.first, tc.n, 10); got != tc.fits {
					t.Errorf("%s: admitted %d of 10, want %d", store, got, tc.fits)
				}
			}
		})
	}
}

// TestLimitBounds checks which limits Validate refuses at the bounds, and
// that the error names the field at fault.
func TestLimitBounds(t *testing.T) {
	span := MaxTolerance // 2^37 ms, a whole number of µs
	for _, tc := range []struct {
		give  Limit
		want  error // nil, or the field's error besides ErrLimitTooLarge
		field error
	}{
		{give: Limit{Algorithm: FixedWindow, Rate: MaxCount, Period: time.Hour}},
		{give: Limit{Algorithm: FixedWindow, Rate: MaxCount + 1, Period: time.Hour}, want: ErrLimitTooLarge},
		{give: Limit{Algorithm: SlidingWindow, Rate: math.MaxInt64, Period: time.Hour}, want: ErrLimitTooLarge},
		{give: Limit{Algorithm: SlidingWindow, Rate: MaxCount, Period: MaxWindowPeriod}},
		{give: Limit{Algorithm: SlidingWindow, Rate: 1, Period: MaxWindowPeriod + 1}, want: ErrLimitTooLarge, field: ErrPeriodTooLong},
		{give: Limit{Algorithm: FixedWindow, Rate: 1, Period: math.MaxInt64}, want: ErrLimitTooLarge, field: ErrPeriodTooLong},
		{give: Limit{Algorithm: SlidingLog, Rate: 1, Period: math.MaxInt64}, want: ErrLimitTooLarge, field: ErrPeriodTooLong},
		{give: Limit{Algorithm: TokenBucket, Rate: 1, Period: time.Hour, Burst: MaxCount + 1}, want: ErrLimitTooLarge, field: ErrBurstTooLarge},
		{give: Limit{Algorithm: TokenBucket, Rate: 1, Period: 8760 * time.Hour, Burst: 4}},
		{give: Limit{Algorithm: TokenBucket, Rate: 1, Period: 8760 * time.Hour, Burst: 5}, want: ErrLimitTooLarge, field: ErrBurstTooLarge},
		{give: Limit{Algorithm: TokenBucket, Rate: 1, Period: 8760 * time.Hour, Burst: 700}, want: ErrLimitTooLarge, field: ErrBurstTooLarge},
		{give: Limit{Algorithm: TokenBucket, Rate: 1, Period: span / 1024, Burst: 1024}},
		{give: Limit{Algorithm: TokenBucket, Rate: 1, Period: span / 1024, Burst: 1025}, want: ErrLimitTooLarge, field: ErrBurstTooLarge},
		{give: Limit{Algorithm: TokenBucket, Rate: 1, Period: span}},
		{give: Limit{Algorithm: TokenBucket, Rate: 1, Period: span + time.Microsecond}, want: ErrLimitTooLarge, field: ErrPeriodTooLong},
		{give: Limit{Algorithm: TokenBucket, Rate: 1, Period: math.MaxInt64}, want: ErrLimitTooLarge, field: ErrPeriodTooLong},
		{give: Limit{Algorithm: TokenBucket, Rate: MaxCount, Period: MaxCount * time.Microsecond, Burst: span.Microseconds()}},
		{give: Limit{Algorithm: TokenBucket, Rate: MaxCount, Period: MaxCount * time.Microsecond, Burst: span.Microseconds() + 1}, want: ErrLimitTooLarge, field: ErrBurstTooLarge},
		{give: Limit{Algorithm: TokenBucket, Rate: MaxCount, Period: time.Second}, want: ErrLimitTooLarge},
	} {
		err := tc.give.Validate()
		switch {
		case tc.want == nil && err != nil:
			t.Errorf("Validate(%+v) = %v, want nil", tc.give, err)
		case tc.want != nil && !errors.Is(err, tc.want):
			t.Errorf("Validate(%+v) = %v, want %v", tc.give, err, tc.want)
		case tc.field != nil && !errors.Is(err, tc.field):
			t.Errorf("Validate(%+v) = %v, want it to wrap %v", tc.give, err, tc.field)
		}
	}
}

// TestLimitEdgesExact runs the largest limits Validate accepts, with costs
// near them, on every store at one instant: each admits exactly what fits.
func TestLimitEdgesExact(t *testing.T) {
	span := MaxTolerance
	for _, tc := range []struct {
		lim   Limit
		first int64
		n     int64
		fits  int
	}{
		{Limit{Algorithm: FixedWindow, Rate: MaxCount, Period: longPeriod}, MaxCount - 1, 1, 1},
		{Limit{Algorithm: FixedWindow, Rate: MaxCount, Period: longPeriod}, 0, MaxCount, 1},
		{Limit{Algorithm: FixedWindow, Rate: MaxCount, Period: longPeriod}, 1, MaxCount - 1, 1},
		{Limit{Algorithm: FixedWindow, Rate: MaxCount, Period: longPeriod}, 2, MaxCount - 1, 0},
		{Limit{Algorithm: SlidingWindow, Rate: MaxCount, Period: longPeriod}, MaxCount - 1, 1, 1},
		{Limit{Algorithm: SlidingWindow, Rate: MaxCount, Period: longPeriod}, 0, MaxCount, 1},
		{Limit{Algorithm: SlidingWindow, Rate: MaxCount, Period: longPeriod}, 2, MaxCount - 1, 0},
		{Limit{Algorithm: SlidingWindow, Rate: MaxCount, Period: MaxWindowPeriod}, MaxCount - 3, 2, 1},
		{Limit{Algorithm: FixedWindow, Rate: MaxCount, Period: MaxWindowPeriod}, MaxCount - 3, 2, 1},
		{Limit{Algorithm: SlidingLog, Rate: MaxLogRate, Period: MaxWindowPeriod}, MaxLogRate - 3, 2, 1},
		// The longest tolerances accepted, taken whole or to the last unit.
		{Limit{Algorithm: TokenBucket, Rate: 1, Period: span / 1024, Burst: 1024}, 0, 1024, 1},
		{Limit{Algorithm: TokenBucket, Rate: 1, Period: span / 1024, Burst: 1024}, 1023, 1, 1},
		{Limit{Algorithm: TokenBucket, Rate: 1, Period: 8760 * time.Hour, Burst: 4}, 0, 4, 1},
		{Limit{Algorithm: TokenBucket, Rate: 1, Period: 8760 * time.Hour, Burst: 4}, 2, 1, 2},
		{Limit{Algorithm: TokenBucket, Rate: 1, Period: span}, 0, 1, 1},
		{Limit{Algorithm: TokenBucket, Rate: MaxCount, Period: MaxCount * time.Microsecond, Burst: span.Microseconds()}, span.Microseconds() - 1, 1, 1},
		{Limit{Algorithm: TokenBucket, Rate: MaxCount, Period: MaxCount * time.Microsecond, Burst: span.Microseconds()}, 0, span.Microseconds(), 1},
	} {
		t.Run(fmt.Sprintf("%v/%d/%v/%d/%d+%d", tc.lim.Algorithm, tc.lim.Rate, tc.lim.Period, tc.lim.Burst, tc.first, tc.n), func(t *testing.T) {
			if err := tc.lim.Validate(); err != nil {
				t.Fatalf("Validate: %v", err)
			}
			for _, store := range []string{"memory", "redis"} {
				if got := takeRun(t, store, tc.lim, tc.first, tc.n, 10); got != tc.fits {
					t.Errorf("%s: admitted %d of 10, want %d", store, got, tc.fits)
				}
			}
		})
	}
}

// TestSlidingWindowWeightedExact checks that the Redis sliding window
// weighs a previous window's count the memory store's exact way where
// count·left passes 2^53: at seeded instants of the next window, a take of
// exactly what is left passes and one more unit does not, on both stores.
func TestSlidingWindowWeightedExact(t *testing.T) {
	client := redis.NewClient(&redis.Options{Addr: testRedisAddr})
	t.Cleanup(func() { client.Close() })
	lim := Limit{Algorithm: SlidingWindow, Rate: MaxCount, Period: longPeriod}
	p := longPeriod.Microseconds()
	start := overflowAt.UnixMicro() / p * p // window w0
	rng := rand.New(rand.NewPCG(1, 2))
	wrong := 0
	const runs = 40
	for range runs {
		key := testKey(t)
		mem := NewMemoryStore(MemoryConfig{})
		t0, t1 := start+rng.Int64N(p), start+p+1+rng.Int64N(p-1)
		prev := MaxCount - rng.Int64N(1<<40)
		left := p - (t1 - start - p)
		fit := MaxCount - weighted(prev, left*1000, p*1000)
		var got [2][2]bool // store, take
		for i, take := range []func(int64, int64) bool{
			func(at, n int64) bool { return mem.TakeAt(time.UnixMicro(at), key, 0, lim, n).Allowed },
			func(at, n int64) bool { return scriptAt(t, client, []string{key}, lim, n, at)[0].Allowed },
		} {
			if !take(t0, prev) {
				t.Fatalf("the take of %d in the first window was denied", prev)
			}
			got[i] = [2]bool{take(t1, fit), take(t1, 1)}
		}
		mem.Close()
		if got[0] != [2]bool{true, false} {
			t.Fatalf("memory: took %d of what is left, then 1: %v, want [true false]", fit, got[0])
		}
		if got[1] != got[0] {
			wrong++
		}
	}
	if wrong > 0 {
		t.Errorf("redis decided %d of %d runs unlike memory's exact weighting", wrong, runs)
	}
}

// TestToleranceWithinHalf: the quick check that spares the exact one on
// the decision path never passes a token bucket the exact check refuses.
func TestToleranceWithinHalf(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	passed := 0
	for range 200_000 {
		l := Limit{Algorithm: TokenBucket, Rate: 1 + rng.Int64N(1<<uint(rng.IntN(54))), Period: time.Duration(1 + rng.Int64N(1<<uint(rng.IntN(63))))}
		if rng.IntN(2) == 0 {
			l.Burst = 1 + rng.Int64N(1<<uint(rng.IntN(54)))
		}
		l.Rate, l.Burst = min(l.Rate, MaxCount), min(l.Burst, MaxCount)
		if !toleranceWithinHalf(l) {
			continue
		}
		passed++
		if err := l.checkToleranceExact(); err != nil {
			t.Fatalf("%+v: passed the quick check, refused by the exact one: %v", l, err)
		}
	}
	if passed < 1000 {
		t.Fatalf("only %d limits passed the quick check: the test checks too little", passed)
	}
	t.Logf("%d limits passed the quick check, all within the exact one", passed)
}
