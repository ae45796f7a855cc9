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

func (h *harness) lease(t *testing.T, key string, lim Limit, n int64) Lease {
	t.Helper()
	l, err := h.store.(Leaser).Lease(context.Background(), key, Hash(key), lim, n)
	if err != nil {
		t.Fatalf("%s: Lease(%q, %d): %v", h.name, key, n, err)
	}
	return l
}

func (h *harness) giveBack(t *testing.T, key string, lim Limit, r int64, token Token) int64 {
	t.Helper()
	back, err := h.store.(Leaser).Return(context.Background(), key, Hash(key), lim, r, token)
	if err != nil {
		t.Fatalf("%s: Return(%q, %d): %v", h.name, key, r, err)
	}
	return back
}

// TestLease: on every store and algorithm, a lease grants min(n, the
// units the counter admits), a denied one charges nothing, and a return
// gives units back to the next lease; a return to a counter of another
// algorithm or limit gives nothing back. The period is one no test outlives,
// so that nothing refills; on Redis the time a lease was held takes a
// token bucket's return down by up to one unit.
func TestLease(t *testing.T) {
	for _, h := range patientHarnesses(t) {
		t.Run(h.name, func(t *testing.T) {
			for alg := range numAlgorithms {
				t.Run(alg.String(), func(t *testing.T) {
					key := uniqueKey(t)
					lim := Limit{Algorithm: alg, Rate: 10, Period: longPeriod}
					first := h.lease(t, key, lim, 4)
					if first.Granted != 4 || !first.Result.Allowed || first.Result.Remaining != 6 {
						t.Fatalf("lease of 4 of a fresh 10: %+v, want 4 granted, 6 left", first)
					}
					if l := h.lease(t, key, lim, 10); l.Granted != 6 || !l.Result.Allowed || l.Result.Remaining != 0 {
						t.Fatalf("lease of 10 with 6 left: %+v, want 6 granted, 0 left", l)
					}
					for range 3 {
						l := h.lease(t, key, lim, 3)
						if l.Granted != 0 || l.Result.Allowed || l.Result.RetryAfter <= 0 || (alg == TokenBucket) != (l.Result.NextAfter > 0) {
							t.Fatalf("lease of 3 with none left: %+v, want denied with a retry for a unit", l)
						}
					}
					back := h.giveBack(t, key, lim, 2, first.Token)
					want := int64(2)
					if alg == TokenBucket && !h.exact {
						want = 1 // a few µs held: 2 intervals less that are short of 2 units
					}
					if back < want || back > 2 {
						t.Fatalf("return of 2: %d went back, want %d to 2", back, want)
					}
					if l := h.lease(t, key, lim, 10); l.Granted != back {
						t.Fatalf("lease of 10 after %d returned: %+v, want %d granted", back, l, back)
					}
					if got := h.giveBack(t, uniqueKey(t), lim, 2, first.Token); got != 0 {
						t.Errorf("return on a key without a counter: %d went back, want 0", got)
					}
					other := lim
					other.Rate = 20
					if alg == TokenBucket {
						if got := h.giveBack(t, key, other, 2, first.Token); got != 0 {
							t.Errorf("return under another limit: %d went back, want 0", got)
						}
					}
					for alg2 := range numAlgorithms {
						other := Limit{Algorithm: alg2, Rate: 10, Period: longPeriod}
						if h.exact && windowAlg(alg) && windowAlg(alg2) {
							continue // one state in memory, which a Take of either reads too
						}
						if got := h.giveBack(t, key, other, 2, first.Token); alg2 != alg && got != 0 {
							t.Errorf("return as %v on a %v counter: %d went back, want 0", alg2, alg, got)
						}
					}
				})
			}
		})
	}
}

// windowAlg reports whether a is a window algorithm.
func windowAlg(a Algorithm) bool { return a == SlidingWindow || a == FixedWindow }

// scriptSrcAt returns src with TIME replaced by its last two arguments, as
// TestRedisScriptsMatchMemory does.
func scriptSrcAt(src string) *redis.Script {
	return redis.NewScript(strings.Replace(src, "redis.call('TIME')", "{ARGV[#ARGV - 1], ARGV[#ARGV]}", 1))
}

// openLease is a lease not yet returned, in both stores.
type openLease struct {
	memTok, redisTok Token
	left             int64 // units that may still go back
}

// TestLeaseMatchesMemory: the lease and return scripts answer as the
// memory store does on one random sequence of takes, leases and returns at
// the same instants, TIME replaced by arguments.
func TestLeaseMatchesMemory(t *testing.T) {
	checkLeaks(t)
	client := newTestClient(t, testRedisAddr)
	ctx := context.Background()
	for _, lim := range []Limit{
		{Algorithm: TokenBucket, Rate: 10, Period: time.Second},
		{Algorithm: TokenBucket, Rate: 6, Period: time.Minute, Burst: 3},
		{Algorithm: TokenBucket, Rate: 1000, Period: time.Second, Burst: 50},
		{Algorithm: TokenBucket, Rate: 7, Period: 3 * time.Second, Burst: 20},
		{Algorithm: SlidingWindow, Rate: 10, Period: time.Second},
		{Algorithm: SlidingWindow, Rate: 7, Period: 3 * time.Hour},
		// A fixed window's key expires at its window's end, in the
		// server's own time: a window of minutes keeps that end beyond the
		// test's steps, which run at instants of their own.
		{Algorithm: FixedWindow, Rate: 10, Period: time.Minute},
		{Algorithm: FixedWindow, Rate: 1000, Period: time.Hour},
		{Algorithm: SlidingLog, Rate: 10, Period: time.Second},
		{Algorithm: SlidingLog, Rate: 60, Period: time.Minute},
	} {
		t.Run(fmt.Sprintf("%v/%d/%v/%d", lim.Algorithm, lim.Rate, lim.Period, lim.Burst), func(t *testing.T) {
			take := scriptSrcAt(scripts[lim.Algorithm])
			lease := scriptSrcAt(leaseSources[lim.Algorithm])
			ret := scriptSrcAt(returnSources[lim.Algorithm])
			mem := NewMemoryStore(MemoryConfig{})
			key := testKey(t)
			rng := rand.New(rand.NewPCG(2, uint64(lim.Algorithm)))
			now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixMicro()
			span := lim.Period.Microseconds() / 6
			if lim.Algorithm == TokenBucket {
				span = lim.Period.Microseconds() * lim.Capacity() / lim.Rate / 6
			}
			var open []openLease
			granted, returned, denied := int64(0), int64(0), 0
			for i := range 300 {
				now += rng.Int64N(span)
				at := time.UnixMicro(now)
				tm := []any{now / 1e6, now % 1e6}
				var c call
				switch op := rng.IntN(3); {
				case op == 0: // a take
					n := 1 + rng.Int64N(lim.Capacity()/2+1)
					c.setArgs(lim, n)
					v, err := take.Run(ctx, client, []string{key}, append(c.appendArgs(nil), tm...)...).Int64Slice()
					if err != nil {
						t.Fatal(err)
					}
					got, want := c.decode(v), mem.TakeAt(at, key, 0, lim, n)
					if got.Allowed != want.Allowed || got.Remaining != want.Remaining {
						t.Fatalf("step %d, take of %d: redis %+v, memory %+v", i, n, got, want)
					}
				case op == 1 || len(open) == 0: // a lease, spending part of it
					n := 1 + rng.Int64N(lim.Capacity())
					c.setArgs(lim, 1)
					v, err := lease.Run(ctx, client, []string{key, genKey(key)}, append(append(c.appendArgs(nil), n), tm...)...).Int64Slice()
					if err != nil {
						t.Fatal(err)
					}
					got, err := decodeLease(lim, v)
					if err != nil {
						t.Fatal(err)
					}
					want := mem.LeaseAt(at, key, lim, n)
					if got.Granted != want.Granted || got.Result.Allowed != want.Result.Allowed || got.Result.Remaining != want.Result.Remaining ||
						!nearMicro(got.Result.RetryAfter, want.Result.RetryAfter) || !nearMicro(got.Result.ResetAfter, want.Result.ResetAfter) ||
						!nearMicro(got.Result.NextAfter, want.Result.NextAfter) {
						t.Fatalf("step %d, lease of %d: redis %+v, memory %+v", i, n, got, want)
					}
					if got.Granted == 0 {
						denied++
						continue
					}
					granted += got.Granted
					open = append(open, openLease{want.Token, got.Token, got.Granted - rng.Int64N(got.Granted+1)})
				default: // a return of part or all of an open lease
					j := rng.IntN(len(open))
					l := open[j]
					r := 1 + rng.Int64N(max(1, l.left))
					if l.left == 0 {
						r = 0
					}
					open = append(open[:j], open[j+1:]...)
					if r == 0 {
						continue
					}
					c.setArgs(lim, 1)
					got, err := ret.Run(ctx, client, []string{key, genKey(key)}, append(append(c.appendArgs(nil), r, l.redisTok.at, l.redisTok.gen), tm...)...).Int64()
					if err != nil {
						t.Fatal(err)
					}
					if want := mem.ReturnAt(at, key, lim, r, l.memTok); got != want {
						t.Fatalf("step %d, return of %d: redis %d went back, memory %d", i, r, got, want)
					}
					returned += got
				}
			}
			if granted == 0 || returned == 0 || denied == 0 {
				t.Errorf("%d granted, %d returned, %d leases denied: want some of each", granted, returned, denied)
			}
		})
	}
}

// admission is units admitted at an instant (ns).
type admission struct{ at, n int64 }

// overLimit returns a description of a span of evs (in time order) that
// admits more than lim allows, or "" if none does: for a token bucket, more
// than Burst + the units refilled over any span; for the window algorithms,
// more than Rate in an aligned window; for the log, more than Rate in any
// period.
func overLimit(lim Limit, evs []admission) string {
	p := int64(lim.Period)
	for i := range evs {
		var sum int64
		for j := i; j < len(evs); j++ {
			sum += evs[j].n
			span := evs[j].at - evs[i].at
			var allowed float64
			switch lim.Algorithm {
			case TokenBucket:
				allowed = float64(lim.Capacity()) + float64(span)*float64(lim.Rate)/float64(p)
			case SlidingLog:
				if span >= p {
					continue
				}
				allowed = float64(lim.Rate)
			default:
				if evs[i].at/p != evs[j].at/p {
					continue
				}
				allowed = float64(lim.Rate)
			}
			if float64(sum) > allowed+1e-9 {
				return fmt.Sprintf("%d units admitted in [%d, %d] ns, at most %.2f allowed", sum, evs[i].at, evs[j].at, allowed)
			}
		}
	}
	return ""
}

// TestLeaseReturnNoMoreRoom: world A leases blocks, admits part of each
// at once and returns the rest later, several leases open at a time; world
// B takes only the units A admitted, at the same instants, and the same
// other traffic A admitted. After every step A has no more room than B
// (Peek's Remaining), B admits everything A admits, and A's admissions keep
// to the limit over every window. Memory stores on one injected clock.
func TestLeaseReturnNoMoreRoom(t *testing.T) {
	for _, lim := range []Limit{
		{Algorithm: TokenBucket, Rate: 10, Period: time.Second},
		{Algorithm: TokenBucket, Rate: 1, Period: time.Second, Burst: 10},
		{Algorithm: TokenBucket, Rate: 1000, Period: time.Second, Burst: 100},
		{Algorithm: TokenBucket, Rate: 7, Period: 3 * time.Second, Burst: 5},
		{Algorithm: SlidingWindow, Rate: 10, Period: time.Second},
		{Algorithm: SlidingWindow, Rate: 100, Period: time.Second},
		{Algorithm: FixedWindow, Rate: 10, Period: time.Second},
		{Algorithm: FixedWindow, Rate: 100, Period: time.Second},
		{Algorithm: SlidingLog, Rate: 10, Period: time.Second},
		{Algorithm: SlidingLog, Rate: 100, Period: time.Second},
	} {
		t.Run(fmt.Sprintf("%v/%d/%v/%d", lim.Algorithm, lim.Rate, lim.Period, lim.Burst), func(t *testing.T) {
			for seed := range uint64(20) {
				worldsAB(t, lim, seed)
			}
		})
	}
}

func worldsAB(t *testing.T, lim Limit, seed uint64) {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, uint64(lim.Algorithm)))
	clock := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	now := func() time.Time { return clock }
	a := NewMemoryStore(MemoryConfig{Clock: now})
	b := NewMemoryStore(MemoryConfig{Clock: now})
	const key = "k"
	ctx := context.Background()
	type held struct {
		tok  Token
		left int64
	}
	var open []held
	var evs []admission
	var leased, returned int64
	step := int64(lim.Period) / 8
	if lim.Algorithm == TokenBucket {
		step = int64(lim.Period) * lim.Capacity() / lim.Rate / 8
	}
	c := lim.Capacity()
	for i := range 400 {
		clock = clock.Add(time.Duration(rng.Int64N(step)))
		t0 := clock.UnixNano()
		admit := func(n int64, what string) {
			if n == 0 {
				return
			}
			evs = append(evs, admission{t0, n})
			if r := b.TakeAt(clock, key, 0, lim, n); !r.Allowed {
				t.Fatalf("seed %d step %d: B denies %d units A admitted (%s): %+v", seed, i, n, what, r)
			}
		}
		switch op := rng.IntN(3); {
		case op == 0:
			n := 1 + rng.Int64N(max(1, c/4))
			if r := a.TakeAt(clock, key, 0, lim, n); r.Allowed {
				admit(n, "a take")
			}
		case op == 1 || len(open) == 0:
			l := a.LeaseAt(clock, key, lim, 1+rng.Int64N(c))
			spent := rng.Int64N(l.Granted + 1)
			admit(spent, "a lease's")
			leased += l.Granted
			if l.Granted > spent {
				open = append(open, held{l.Token, l.Granted - spent})
			}
		default:
			j := rng.IntN(len(open))
			back := a.ReturnAt(clock, key, lim, open[j].left, open[j].tok)
			if back < 0 || back > open[j].left {
				t.Fatalf("seed %d step %d: return of %d: %d went back", seed, i, open[j].left, back)
			}
			returned += back
			open = append(open[:j], open[j+1:]...)
		}
		ra, _ := a.Peek(ctx, key, 0, lim)
		rb, _ := b.Peek(ctx, key, 0, lim)
		if ra.Remaining > rb.Remaining || ra.Allowed && !rb.Allowed {
			t.Fatalf("seed %d step %d: A has more room than B: A %+v, B %+v", seed, i, ra, rb)
		}
	}
	if msg := overLimit(lim, evs); msg != "" {
		t.Fatalf("seed %d: A: %s", seed, msg)
	}
	if leased == 0 || returned == 0 {
		t.Fatalf("seed %d: %d leased, %d returned: want both", seed, leased, returned)
	}
}

// TestTokenBucketReturnFigures: how much a token bucket's return gives
// back, on leases held 100 ms, against world B (the lease of the units
// spent): A's room after the return never passes B's, and equals it when
// B's bucket stayed full or A's refilled.
func TestTokenBucketReturnFigures(t *testing.T) {
	for _, tt := range []struct {
		name              string
		lim               Limit
		used              int64         // units taken before the lease
		lease, spent      int64         // lease n, admit spent of it
		held              time.Duration // until the return
		wantBack          int64
		wantRoomA, wantRB int64
	}{
		{"issue's case: 1/s burst 10, lease 5, one take at 3 s", Limit{Rate: 1, Period: time.Second, Burst: 10}, 0, 5, 0, 3 * time.Second, 2, 9, 9},
		{"10/s full, lease 10, spend 3", PerSecond(10), 0, 10, 3, 100 * time.Millisecond, 6, 7, 8},
		{"10/s full, lease 2, spend 0", PerSecond(10), 0, 2, 0, 100 * time.Millisecond, 1, 10, 10},
		{"10/s busy, lease 2, spend 0", PerSecond(10), 8, 2, 0, 100 * time.Millisecond, 1, 2, 3},
		{"10/s busy, lease 2, spend 1", PerSecond(10), 8, 2, 1, 100 * time.Millisecond, 0, 1, 2},
		{"1000/s full, lease 100, spend 30", PerSecond(1000), 0, 100, 30, 100 * time.Millisecond, 0, 1000, 1000},
		{"1000/s busy, lease 100, spend 30", PerSecond(1000), 800, 100, 30, 100 * time.Millisecond, 0, 200, 270},
		{"1000/s busy, lease 100, spend 30, 10 ms", PerSecond(1000), 800, 100, 30, 10 * time.Millisecond, 60, 170, 180},
	} {
		t.Run(tt.name, func(t *testing.T) {
			clock := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
			now := func() time.Time { return clock }
			a := NewMemoryStore(MemoryConfig{Clock: now})
			b := NewMemoryStore(MemoryConfig{Clock: now})
			for _, s := range []*MemoryStore{a, b} {
				if tt.used > 0 {
					s.TakeAt(clock, "k", 0, tt.lim, tt.used)
				}
			}
			l := a.LeaseAt(clock, "k", tt.lim, tt.lease)
			if l.Granted != tt.lease {
				t.Fatalf("lease: %+v, want %d granted", l, tt.lease)
			}
			if tt.spent > 0 {
				b.TakeAt(clock, "k", 0, tt.lim, tt.spent)
			}
			if tt.name[:5] == "issue" { // one more unit admitted in both at 3 s
				clock = clock.Add(tt.held)
				a.TakeAt(clock, "k", 0, tt.lim, 1)
				b.TakeAt(clock, "k", 0, tt.lim, 1)
			} else {
				clock = clock.Add(tt.held)
			}
			back := a.ReturnAt(clock, "k", tt.lim, tt.lease-tt.spent, l.Token)
			ra, _ := a.Peek(context.Background(), "k", 0, tt.lim)
			rb, _ := b.Peek(context.Background(), "k", 0, tt.lim)
			roomA, roomB := ra.Remaining+1, rb.Remaining+1
			t.Logf("return of %d after %v: %d back; room A %d, B %d", tt.lease-tt.spent, tt.held, back, roomA, roomB)
			if back != tt.wantBack || roomA != tt.wantRoomA || roomB != tt.wantRB {
				t.Errorf("%d back, room A %d, B %d; want %d back, A %d, B %d", back, roomA, roomB, tt.wantBack, tt.wantRoomA, tt.wantRB)
			}
		})
	}
}

// TestLeaseReturnAfterLoss: on every store and algorithm, a counter lost
// while a lease of it is out (deleted: on Redis, what FLUSHALL or a
// restart without persistence does to it) and made again by new traffic
// takes nothing back from that lease's return: the new counter admits its
// limit, not the limit and the units returned.
func TestLeaseReturnAfterLoss(t *testing.T) {
	ctx := context.Background()
	for _, h := range patientHarnesses(t) {
		t.Run(h.name, func(t *testing.T) {
			for alg := range numAlgorithms {
				t.Run(alg.String(), func(t *testing.T) {
					key := uniqueKey(t)
					lim := Limit{Algorithm: alg, Rate: 10, Period: longPeriod}
					l := h.lease(t, key, lim, 4)
					if err := h.store.(Deleter).Delete(ctx, []Shard{{Name: key, Hash: Hash(key)}}); err != nil {
						t.Fatal(err)
					}
					var admitted int64
					take := func() {
						r, err := h.store.Take(ctx, key, Hash(key), lim, 1)
						if err != nil {
							t.Fatal(err)
						}
						if r.Allowed {
							admitted++
						}
					}
					for range lim.Rate {
						take()
					}
					back := h.giveBack(t, key, lim, l.Granted, l.Token)
					for range lim.Rate {
						take()
					}
					t.Logf("after the loss: %d admitted of %d, %d of the lease's %d went back", admitted, lim.Rate, back, l.Granted)
					if back != 0 || admitted != lim.Rate {
						t.Errorf("after the loss: %d admitted, %d went back; want %d, 0", admitted, back, lim.Rate)
					}
				})
			}
		})
	}
}

// TestGenKey: a counter's generation key is in the counter's hash slot, or
// there is none when no name can be.
func TestGenKey(t *testing.T) {
	for _, tt := range []struct {
		give string
		none bool
	}{
		{give: "p:k"},
		{give: "p:{tag}k"},
		{give: "p:{tag}k}"},
		{give: "p:k{"},
		{give: "p:k}", none: true},
		{give: "p:{}k", none: true},
	} {
		g := genKey(tt.give)
		switch {
		case (g == "") != tt.none:
			t.Errorf("genKey(%q) = %q, want none: %v", tt.give, g, tt.none)
		case g != "" && keySlot("", g) != keySlot("", tt.give):
			t.Errorf("genKey(%q) = %q: slot %d, the counter's %d", tt.give, g, keySlot("", g), keySlot("", tt.give))
		}
	}
}
