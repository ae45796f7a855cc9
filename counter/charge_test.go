package counter

import (
	"context"
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

// chargeLimits are limits of every algorithm, some with a rate that does
// not divide its period or a burst apart from the rate.
var chargeLimits = []Limit{
	{Algorithm: TokenBucket, Rate: 10, Period: time.Second},
	{Algorithm: TokenBucket, Rate: 7, Period: time.Second, Burst: 20},
	{Algorithm: SlidingWindow, Rate: 10, Period: time.Second},
	{Algorithm: FixedWindow, Rate: 10, Period: time.Second},
	{Algorithm: SlidingLog, Rate: 10, Period: time.Second},
}

func limitName(l Limit) string {
	return l.Algorithm.String() + "/" + time.Duration(l.Period).String()
}

// TestChargeAsTake: a peer's admitted units, charged to one store, leave
// it deciding exactly as a store that took them: two stores see the same
// seeded run of local takes and peer units (taken by one, charged to the
// other when the taker admitted them), and every local take gets the same
// result from both.
func TestChargeAsTake(t *testing.T) {
	for _, lim := range chargeLimits {
		t.Run(limitName(lim), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(27, uint64(lim.Algorithm)))
			charged := NewMemoryStore(MemoryConfig{})
			took := NewMemoryStore(MemoryConfig{})
			now := t0
			differ, charges := 0, 0
			for i := range 5000 {
				now = now.Add(time.Duration(rng.Int64N(int64(150 * time.Millisecond))))
				if rng.IntN(2) == 0 {
					n := 1 + rng.Int64N(lim.Capacity())
					if took.TakeAt(now, "k", 0, lim, n).Allowed {
						if !charged.ChargeAt(now, "k", 0, lim, n) {
							t.Fatalf("step %d: charge of %d dropped", i, n)
						}
						charges++
						continue
					}
					charged.TakeAt(now, "k", 0, lim, n)
				}
				n := 1 + rng.Int64N(3)
				a, b := charged.TakeAt(now, "k", 0, lim, n), took.TakeAt(now, "k", 0, lim, n)
				if a != b {
					if differ == 0 {
						t.Errorf("step %d: take of %d after charges: %+v, after takes: %+v", i, n, a, b)
					}
					differ++
				}
			}
			if differ > 0 || charges < 100 {
				t.Errorf("%d takes of 5000 decided otherwise after %d charges, want 0 (and ≥ 100 charges)", differ, charges)
			}
		})
	}
}

// TestChargeSaturates: a charge beyond what a counter can admit (up to
// MaxInt64, twice) leaves it empty, never overflowed: from then on it
// admits no more in any instant than a store that took its whole capacity
// at once, and for a log exactly as much. A token bucket owes the units
// past its capacity (see TestChargeDebt), at most maxDebt: it admits
// again once that has passed.
func TestChargeSaturates(t *testing.T) {
	for _, lim := range chargeLimits {
		for _, give := range []int64{lim.Capacity() + 1, MaxCount, math.MaxInt64} {
			t.Run(limitName(lim), func(t *testing.T) {
				charged := NewMemoryStore(MemoryConfig{})
				took := NewMemoryStore(MemoryConfig{})
				if !took.TakeAt(t0, "k", 0, lim, lim.Capacity()).Allowed {
					t.Fatal("a fresh counter refused its capacity")
				}
				charged.ChargeAt(t0, "k", 0, lim, give)
				charged.ChargeAt(t0, "k", 0, lim, give)
				var gotSum, wantSum int
				for step := range 40 {
					at := t0.Add(time.Duration(step) * lim.Period / 10)
					var got, want int
					for range lim.Capacity() + 1 {
						if charged.TakeAt(at, "k", 0, lim, 1).Allowed {
							got++
						}
						if took.TakeAt(at, "k", 0, lim, 1).Allowed {
							want++
						}
					}
					gotSum += got
					wantSum += want
					exact := lim.Algorithm == SlidingLog
					if step == 0 && got != 0 || gotSum > wantSum || exact && got != want {
						t.Fatalf("charge of %d twice: %v in admitted %d (%d since), after taking the capacity %d (%d since)",
							give, at.Sub(t0), got, gotSum, want, wantSum)
					}
				}
				owes := lim.Algorithm == TokenBucket && give >= 3*lim.Capacity()
				if gotSum == 0 && !owes {
					t.Errorf("charge of %d twice: nothing admitted in 4 periods", give)
				}
				if at := t0.Add(maxDebt + 4*lim.Period); lim.Algorithm == TokenBucket && !charged.TakeAt(at, "k", 0, lim, lim.Capacity()).Allowed {
					t.Errorf("charge of %d twice: a take of the capacity %v later denied, want the debt paid by maxDebt", give, at.Sub(t0))
				}
			})
		}
	}
}

// TestChargeFullTable: a charge for a key the table has no room for is
// dropped, reported and counted by Full; a key it holds is charged.
func TestChargeFullTable(t *testing.T) {
	s := NewMemoryStore(MemoryConfig{MaxKeys: 1, Stripes: 1})
	hour := Limit{Rate: 2, Period: time.Hour}
	s.TakeAt(t0, "held", 0, hour, 1)
	if s.ChargeAt(t0, "new", 0, hour, 1) {
		t.Error("charge of a key a full table cannot hold reported charged")
	}
	if got := s.Full(); got != 1 {
		t.Errorf("Full() = %d after a dropped charge, want 1", got)
	}
	if !s.ChargeAt(t0, "held", 0, hour, 1) {
		t.Error("charge of a held key dropped")
	}
	if s.TakeAt(t0, "held", 0, hour, 1).Allowed {
		t.Error("held key admitted a unit past its 1 taken and 1 charged of 2")
	}
	if !s.ChargeAt(t0, "held", 0, Limit{}, 1) || !s.ChargeAt(t0, "held", 0, hour, -1) {
		t.Error("a charge of nothing reported dropped")
	}
}

// TestChargeSlidingWindowOverflow: absurd charges in two windows in a row
// leave a sliding window denying: its estimate, the previous count
// weighted plus the current one, stays within an int64.
func TestChargeSlidingWindowOverflow(t *testing.T) {
	lim := Limit{Algorithm: SlidingWindow, Rate: 10, Period: time.Second}
	s := NewMemoryStore(MemoryConfig{})
	s.ChargeAt(t0, "k", 0, lim, math.MaxInt64)
	s.ChargeAt(t0.Add(time.Second), "k", 0, lim, math.MaxInt64)
	admitted := 0
	for range 10 {
		if s.TakeAt(t0.Add(1500*time.Millisecond), "k", 0, lim, 1).Allowed {
			admitted++
		}
	}
	if admitted != 0 {
		t.Errorf("admitted %d of 10 after two windows charged MaxInt64, want 0", admitted)
	}
}

// TestChargeDebt: units charged past a token bucket's capacity are owed,
// not forgotten: peers that admitted 30 units of a 10-unit bucket at 10 a
// second leave it admitting nothing until the debt is paid, 10 units in
// the next 3 s where a bucket that forgot it admits 30. Gossip needs it:
// under sustained load, every instance's own takes keep its view of the
// bucket empty, and the peers' units arrive on top.
func TestChargeDebt(t *testing.T) {
	lim := Limit{Rate: 10, Period: time.Second}
	s := NewMemoryStore(MemoryConfig{})
	for range 3 {
		if !s.ChargeAt(t0, "k", 0, lim, 10) {
			t.Fatal("charge dropped")
		}
	}
	admitted := 0
	for at := t0; !at.After(t0.Add(3 * time.Second)); at = at.Add(10 * time.Millisecond) {
		if s.TakeAt(at, "k", 0, lim, 1).Allowed {
			admitted++
		}
	}
	if admitted != 10 {
		t.Errorf("admitted %d in the 3 s after 30 units were charged to a 10-unit bucket at 10/s, want 10", admitted)
	}
}

// TestChargeDebtLongBucket: a bucket whose burst takes most of
// MaxTolerance to refill owes its peers' bursts too. Three instances each
// took the burst of 320; one, charged the other two's 640, admits nothing
// until 640 intervals have passed, as one bucket would, and then what
// refilled since: 60 units at 700 intervals. Owing at most MaxTolerance,
// it forgave 285 units and admitted 264 at 300 intervals.
func TestChargeDebtLongBucket(t *testing.T) {
	lim := Limit{Rate: 320, Period: MaxTolerance / 10 * 9, Burst: 320}
	unit := lim.Period / 320
	s := NewMemoryStore(MemoryConfig{})
	if !s.TakeAt(t0, "k", 0, lim, 320).Allowed || !s.ChargeAt(t0, "k", 0, lim, 640) {
		t.Fatal("a fresh bucket refused its burst, or the peers' units")
	}
	for _, c := range []struct {
		give time.Duration // after t0, in intervals
		want int
	}{
		{300 * unit, 0},
		{640*unit - time.Second, 0},
		{700 * unit, 60},
	} {
		got := 0
		for s.TakeAt(t0.Add(c.give), "k", 0, lim, 1).Allowed {
			got++
		}
		if got != c.want {
			t.Errorf("%d intervals after taking 320 and being charged 640: admitted %d, want %d", c.give/unit, got, c.want)
		}
	}
}

// TestLimitMaxAdmitted: the most a limit admits over a span, by algorithm,
// saturating where it passes an int64.
func TestLimitMaxAdmitted(t *testing.T) {
	for _, c := range []struct {
		give Limit
		span time.Duration
		want int64
	}{
		{Limit{Algorithm: TokenBucket, Rate: 10, Period: time.Second}, 0, 10},
		{Limit{Algorithm: TokenBucket, Rate: 10, Period: time.Second}, 100 * time.Millisecond, 11},
		{Limit{Algorithm: TokenBucket, Rate: 10, Period: time.Second}, 101 * time.Millisecond, 12},
		{Limit{Algorithm: TokenBucket, Rate: 7, Period: time.Second, Burst: 20}, 2 * time.Second, 34},
		{Limit{Algorithm: FixedWindow, Rate: 10, Period: time.Second}, 0, 20},
		{Limit{Algorithm: FixedWindow, Rate: 10, Period: time.Second}, 999 * time.Millisecond, 20},
		{Limit{Algorithm: SlidingWindow, Rate: 10, Period: time.Second}, 2500 * time.Millisecond, 40},
		{Limit{Algorithm: SlidingLog, Rate: 10, Period: time.Minute}, time.Second, 20},
		{Limit{Algorithm: TokenBucket, Rate: MaxCount, Period: time.Nanosecond}, time.Duration(math.MaxInt64), math.MaxInt64},
		{Limit{Algorithm: FixedWindow, Rate: MaxCount, Period: time.Nanosecond}, time.Duration(math.MaxInt64), math.MaxInt64},
		{Limit{Algorithm: TokenBucket, Rate: 10, Period: time.Second}, -time.Second, 10},
		{Limit{}, time.Second, 0},
	} {
		if got := c.give.MaxAdmitted(c.span); got != c.want {
			t.Errorf("%+v.MaxAdmitted(%v) = %d, want %d", c.give, c.span, got, c.want)
		}
	}
}

// TestMaxAdmittedBoundsTakes: over any span of a seeded run of takes on one
// counter, the units admitted stay within MaxAdmitted of the span.
func TestMaxAdmittedBoundsTakes(t *testing.T) {
	for _, lim := range chargeLimits {
		t.Run(limitName(lim), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(4, uint64(lim.Algorithm)))
			m := NewMemoryStore(MemoryConfig{})
			type admit struct {
				at time.Time
				n  int64
			}
			var admits []admit
			now := t0
			for range 3000 {
				now = now.Add(time.Duration(rng.Int64N(int64(40 * time.Millisecond))))
				n := 1 + rng.Int64N(3)
				if m.TakeAt(now, "k", 0, lim, n).Allowed {
					admits = append(admits, admit{now, n})
				}
			}
			for i := range admits {
				var sum int64
				for _, a := range admits[i:] {
					sum += a.n
					if span := a.at.Sub(admits[i].at); sum > lim.MaxAdmitted(span) {
						t.Fatalf("%d units admitted in %v, MaxAdmitted %d", sum, span, lim.MaxAdmitted(span))
					}
				}
			}
		})
	}
}

// TestMemoryChargeBatch: the memory store's Charger charges as ChargeAt
// at its clock's now, and a batch as its ops one after the other.
func TestMemoryChargeBatch(t *testing.T) {
	clock := func() time.Time { return t0 }
	s := NewMemoryStore(MemoryConfig{Clock: clock})
	want := NewMemoryStore(MemoryConfig{})
	lim := Limit{Rate: 10, Period: time.Second}
	ops := []ChargeOp{{Key: "a", Limit: lim, N: 3}, {Key: "b", Limit: lim, N: 20}, {Key: "a", Limit: lim, N: 4}, {Key: "a", Limit: lim, N: -1}}
	s.ChargeBatch(context.Background(), ops)
	for i, op := range ops {
		if !op.Charged || op.Err != nil {
			t.Errorf("op %d: %v, %v", i, op.Charged, op.Err)
		}
		want.ChargeAt(t0, op.Key, 0, op.Limit, op.N)
	}
	if ok, err := s.Charge(context.Background(), "b", 0, lim, 1); !ok || err != nil {
		t.Errorf("Charge: %v, %v", ok, err)
	}
	want.ChargeAt(t0, "b", 0, lim, 1)
	for _, key := range []string{"a", "b"} {
		if got, want := s.TakeAt(t0, key, 0, lim, 1), want.TakeAt(t0, key, 0, lim, 1); got != want {
			t.Errorf("%s: %+v after the batch, want %+v", key, got, want)
		}
	}
}
