package counter

import (
	"context"
	"fmt"
	"math/big"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Tests of the token bucket's state on Redis (gcraGrid, gcraOffset): a TAT
// written on one level's grid is read back exactly on it, and on any other
// level's rounded up, and the forms written before the grid still read.

// gcraStateAt is the state gcraScript writes at now (µs) for a TAT ahead
// units of level k's grid ahead of now under a limit whose interval is iv
// of those units, and the PTTL that a write moving the expiry sets; ahead ≥
// -now. With iv 0 it is the form written before the interval was noted:
// the digits with k-3 blanks after them.
func gcraStateAt(now, ahead, k, iv int64) (string, time.Duration) {
	u := int64(1) << gridBits(k)
	c := 7_000_000_000_000_000 / u
	m := c * u
	pos := ((now%c)*u + ahead%m + m) % m
	state := strconv.FormatInt(2_000_000_000_000_000+pos, 10) + strings.Repeat(" ", int(k)-3)
	if iv > 0 {
		state = fmt.Sprintf("%d:%d:%d", 2_000_000_000_000_000+pos, iv, k)
	}
	span, half := int64(1000)<<k, int64(500)<<k
	at := now + (ahead+u-1)/u
	if ahead < 0 {
		at = now + ahead/u // rounded towards 0: up
	}
	lo := at - at%half
	return state, time.Duration((lo+half+span-now)/1000+1) * time.Millisecond
}

// blankState is the state gcraStateAt gives with no interval: the form
// written before intervals were noted.
func blankState(now, ahead, k int64) string { s, _ := gcraStateAt(now, ahead, k, 0); return s }

// levelLimit is a limit of 1 per 2^k ms: its tolerance is one interval,
// 2^k ms, so its span level is k (k ≥ minSpanLevel).
func levelLimit(k int64) Limit { return Limit{Rate: 1, Period: time.Duration(1<<k) * time.Millisecond} }

// gcraAt runs gcraScript on key at the instant now (µs) with lim's arguments
// for a cost of n, and returns its reply for the key.
func gcraAt(t *testing.T, client redis.UniversalClient, key string, lim Limit, n, now int64) int64 {
	t.Helper()
	src := strings.Replace(gcraScript, "redis.call('TIME')", "{ARGV[#ARGV - 1], ARGV[#ARGV]}", 1)
	var c call
	c.setArgs(lim, n)
	v, err := redis.NewScript(src).Run(context.Background(), client, []string{key}, c.incArg, c.tolArg, c.ivArg, now/1e6, now%1e6).Int64Slice()
	if err != nil || len(v) != 1 {
		t.Fatalf("script: %v %v", v, err)
	}
	return v[0]
}

// TestRedisGCRAStateRoundTrip writes states of random levels, instants and
// TATs (behind now by up to 1.5 spans, the most a live key can be, and
// ahead by up to a span), and takes from them under limits of random
// levels. A state noting its interval must be found holding the units of
// debt written, on any level, each a TAT that many of the reading limit's
// intervals ahead, rounded up (levelLimit's intervals are 1000·2^36 units
// of their own grid, but for the levels whose grid is 1 unit per µs; every
// fifth state notes a random interval instead, for other ratios); one
// written before intervals were noted (every fifth) as the time written,
// exactly on its own level, rounded up on another (where it may be capped
// far beyond the tolerance). A take admitted must write the state of its
// TAT on its level.
func TestRedisGCRAStateRoundTrip(t *testing.T) {
	checkLeaks(t)
	client := newTestClient(t, testRedisAddr)
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(7, 11))
	key := testKey(t)
	for i := range 400 {
		kw := minSpanLevel + rng.Int64N(maxSpanLevel-minSpanLevel+1) // the level written
		kr := kw                                                     // the level read
		if i%2 == 1 {
			kr = minSpanLevel + rng.Int64N(maxSpanLevel-minSpanLevel+1)
		}
		now := 1_700_000_000_000_000 + rng.Int64N(300_000_000_000_000)
		if i%7 == 0 { // at the end of the cycle, so that the TAT wraps
			c := int64(7_000_000_000_000_000) >> gridBits(kw)
			now = now - now%c + c - 1 - rng.Int64N(3)
		}
		spanUnits := (int64(1000) << kw) << gridBits(kw)
		ahead := rng.Int64N(spanUnits+1) - spanUnits*3/2
		if i%3 == 0 {
			ahead = rng.Int64N(spanUnits + 1)
		}
		var w call
		w.setArgs(levelLimit(kw), 1)
		iv := w.ivArg
		switch i % 5 {
		case 0:
			iv = 0
		case 1: // an interval of any size, for any ratio to kr's
			iv = 1 + rng.Int64N(1<<47)
		}
		state, _ := gcraStateAt(now, ahead, kw, iv)
		if err := client.Set(ctx, key, state, 0).Err(); err != nil {
			t.Fatal(err)
		}
		lim := levelLimit(kr)
		var c call
		c.setArgs(lim, 1)
		want := max(0, ahead)
		if iv > 0 && want > 0 { // the units written, in kr's interval, rounded up
			x := new(big.Int).Mul(big.NewInt(want), big.NewInt(c.ivArg))
			x.Add(x, big.NewInt(iv-1)).Quo(x, big.NewInt(iv))
			want = min(x.Int64(), 1<<52)
		}
		if iv == 0 {
			// The TAT found, on kr's grid: ahead scaled, rounded up,
			// and capped at 2^52 units, far beyond kr's tolerance.
			if bw, br := gridBits(kw), gridBits(kr); br >= bw {
				want = min(want, 1<<52>>(br-bw)) << (br - bw)
			} else {
				want = (want + 1<<(bw-br) - 1) >> (bw - br)
			}
		}
		got := gcraAt(t, client, key, lim, 1, now)
		desc := fmt.Sprintf("state %q written at level %d, %d units ahead of %d, read at level %d", state, kw, ahead, now, kr)
		if want > 0 { // the limit's tolerance is one interval: denied
			if got != -1-want {
				t.Fatalf("%s: reply %d, want %d", desc, got, -1-want)
			}
			continue
		}
		if got != 0 {
			t.Fatalf("%s: reply %d, want 0", desc, got)
		}
		wantState, wantTTL := gcraStateAt(now, c.incArg, kr, c.ivArg)
		if s := client.Get(ctx, key).Val(); s != wantState {
			t.Fatalf("%s: wrote %q, want %q", desc, s, wantState)
		}
		if ttl := client.PTTL(ctx, key).Val(); ttl > wantTTL || ttl < wantTTL-time.Minute {
			t.Fatalf("%s: PTTL %v, want %v less the time since", desc, ttl, wantTTL)
		}
	}
}

// TestRedisGCRAStateFormsBeforeGrid reads the states written before the
// grid: a TAT in whole µs, and a pair "w f" of whole µs and 2^-32 µs, with
// blanks after it; and the grid's digits with blanks after them, written
// before intervals were noted. All are read exactly on the grid of level 10
// (2^26 units per µs), a fraction rounded up, as time.
func TestRedisGCRAStateFormsBeforeGrid(t *testing.T) {
	checkLeaks(t)
	client := newTestClient(t, testRedisAddr)
	ctx := context.Background()
	now := t0.UnixMicro()
	lim := levelLimit(10)
	for _, c := range []struct {
		state string
		want  int64 // the TAT found, in units
	}{
		{strconv.FormatInt(now+250_000, 10), 250_000 << 26},
		{strconv.FormatInt(now+250_000, 10) + strings.Repeat(" ", 11), 250_000 << 26},
		{blankState(now, 250_000<<26, 10), 250_000 << 26}, // its own level, as time
		{blankState(now, 250_000<<28, 8), 250_000 << 26},  // another level's
		{fmt.Sprintf("%d %d%s", now+3, 1<<31, strings.Repeat(" ", 11)), 3<<26 + 1<<25},
		{fmt.Sprintf("%d %d ", now+3, 1), 3<<26 + 1}, // 2^-32 µs: a unit, rounded up
		{strconv.FormatInt(now-250_000, 10), 0},
		{fmt.Sprintf("%d %d ", now-1, 1<<31), 0},
	} {
		key := testKey(t)
		client.Set(ctx, key, c.state, 0)
		want := -1 - c.want
		if c.want == 0 {
			want = 0
		}
		if got := gcraAt(t, client, key, lim, 1, now); got != want {
			t.Errorf("state %q: reply %d, want %d", c.state, got, want)
		}
	}
}

// TestRedisGCRAGrid checks the figures redisGCRA hands gcraScript: the
// interval rounded up to the grid of the tolerance's level, a level raised
// when that rounding carries the tolerance past its span, and a tolerance
// beyond the highest span cut to the intervals that fit it.
func TestRedisGCRAGrid(t *testing.T) {
	const year = 365 * 24 * time.Hour
	for _, c := range []struct {
		name     string
		lim      Limit
		level    int64
		unit     int64 // the interval in grid units
		capacity int64
	}{
		{"10M/s", Limit{Rate: 10_000_000, Period: time.Second, Burst: 10_000_000}, 10, 6_710_887, 10_000_000}, // ⌈0.1·2^26⌉
		{"whole µs", Limit{Rate: 1_000_000, Period: time.Second, Burst: 1 << 30}, 21, 1 << 15, 1 << 30},
		{"1 ms: the least level", Limit{Rate: 3, Period: time.Millisecond}, 4, 1_431_655_765_334, 3}, // ⌈1000·2^32/3⌉
		// The interval, 125·2^-30 µs, fits 2^-32 but not the grid of level
		// 10 (2^-26): rounded up, 2^43 of them pass the span of 1.024 s.
		{"carried to the next level", Limit{Rate: 1 << 43, Period: 1024 * time.Millisecond}, 11, 4, 1 << 43},
		{"cut", Limit{Rate: 1, Period: year, Burst: 10}, 37, year.Microseconds(), 4},
	} {
		var call call
		call.setArgs(c.lim, 1)
		b := gridBits(call.level)
		if call.level != c.level || call.unit.units(b) != c.unit || call.capacity != c.capacity {
			t.Errorf("%s: level %d, unit %d, capacity %d; want %d, %d, %d", c.name, call.level, call.unit.units(b), call.capacity, c.level, c.unit, c.capacity)
		}
		exact := float64(c.lim.Period.Microseconds()) / float64(c.lim.Rate) * float64(int64(1)<<b)
		if u := float64(call.unit.units(b)); u < exact || u > exact+1 {
			t.Errorf("%s: unit %.0f, want ⌈%.3f⌉", c.name, u, exact)
		}
		span := fixed{1000 << call.level, 0}
		if span.less(call.tol) || call.tolArg != call.tol.units(b)<<6|call.level || call.tolArg >= 1<<53 {
			t.Errorf("%s: tolerance %v over the span %v, or argument %d", c.name, call.tol, span, call.tolArg)
		}
	}
}
