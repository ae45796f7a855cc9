package hotkey

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/hotkeyd/hotkey/counter"
	"github.com/hotkeyd/hotkey/internal/testkit"
)

// holdCount is what a simulated run of one key counted.
type holdCount struct {
	admitted, denied int64
	cacheDenied      int64 // denials the deny caches answered
	storeDenied      int64 // denials the store answered
}

// simulateHold runs requests at the instants at (sorted, from the clock's
// start), dealt in turn to engines engines with deny caches of their own
// that hold denials if held (as store mode does), on one memory store that answers each Take
// half a round trip rtt after it is asked, the answer arriving rtt after.
// Requests are concurrent: those asked before an answer arrives do not see
// it, as under load on a real store.
func simulateHold(t *testing.T, lim Limit, at []time.Duration, engines int, rtt time.Duration, held bool) holdCount {
	t.Helper()
	clock := testkit.NewClock()
	start := clock.Now()
	storeNow := start
	st := counter.NewMemoryStore(counter.MemoryConfig{Clock: func() time.Time { return storeNow }})
	t.Cleanup(func() { st.Close() })
	es := make([]*Engine, engines)
	for i := range es {
		es[i], _ = newMemoryEngine(t, clock)
	}
	type answer struct {
		e     *Engine
		at    time.Time // when it arrives
		asked time.Time
		r     counter.Result
	}
	var h holding
	if held {
		h = holdFor(lim, rtt)
	}
	var pending []answer // in order of arrival
	var c holdCount
	id := denyID(hashKey("k"), lim)
	deliver := func(upTo time.Time) {
		for len(pending) > 0 && !pending[0].at.After(upTo) {
			a := pending[0]
			pending = pending[1:]
			clock.Set(a.at)
			a.e.rememberID(id, 1, a.r, a.asked, h)
		}
	}
	for i, d := range at {
		now := start.Add(d)
		deliver(now)
		clock.Set(now)
		e := es[i%engines]
		if _, ok := e.knownDeniedID(id, 1); ok {
			c.denied++
			c.cacheDenied++
			continue
		}
		storeNow = now.Add(rtt / 2)
		r, err := st.Take(context.Background(), "k", 0, lim, 1)
		if err != nil {
			t.Fatal(err)
		}
		if r.Allowed {
			c.admitted++
		} else {
			c.denied++
			c.storeDenied++
		}
		pending = append(pending, answer{e: e, at: now.Add(rtt), asked: now, r: r})
	}
	return c
}

// evenly returns n instants every gap.
func evenly(n int, gap time.Duration) []time.Duration {
	at := make([]time.Duration, n)
	for i := range at {
		at[i] = time.Duration(i) * gap
	}
	return at
}

// TestDenyHoldOverLimit: a key asked at 10× its limit from two engines,
// on a store a round trip of two units away, costs at most 0.05 store
// calls per denied decision for every algorithm the hold applies to, and
// is admitted what the limit allows (less at most one hold, which the run
// ends inside).
func TestDenyHoldOverLimit(t *testing.T) {
	const rate = 2000
	for _, alg := range []Algorithm{TokenBucket, SlidingWindow, SlidingLog} {
		lim := Limit{Algorithm: alg, Rate: rate, Period: time.Second}
		unit := lim.Period / rate
		h := holdFor(lim, 2*unit)
		const seconds = 9
		at := evenly(seconds*rate*10, unit/10)
		held := simulateHold(t, lim, at, 2, 2*unit, true)
		plain := simulateHold(t, lim, at, 2, 2*unit, false)
		perDenied := func(c holdCount) float64 { return float64(c.storeDenied) / float64(c.denied) }
		t.Logf("%v: store calls per denied decision %.4f held (admitted %d), %.4f not (admitted %d)",
			alg, perDenied(held), held.admitted, perDenied(plain), plain.admitted)
		if got := perDenied(held); got > 0.05 {
			t.Errorf("%v: %.4f store calls per denied decision, want ≤ 0.05", alg, got)
		}
		// The run may end inside a hold, and the round trip after it (3 units, 2 down to the store).
		if lost := h.most + 3 + 1; held.admitted < plain.admitted-lost {
			t.Errorf("%v: admitted %d held, %d not: the hold lost more than %d units", alg, held.admitted, plain.admitted, lost)
		}
	}
}

// TestDenyHoldUnderLimit: a key asked at 50 to 90% of its limit, evenly or
// at random (seeded), is not denied by a held cache more than by one that
// holds nothing, a token bucket's burst small enough that it runs dry.
func TestDenyHoldUnderLimit(t *testing.T) {
	const rate = 2000
	for _, lim := range []Limit{
		{Rate: rate, Period: time.Second, Burst: 16},
		{Algorithm: SlidingWindow, Rate: rate, Period: time.Second},
		{Algorithm: SlidingLog, Rate: rate, Period: time.Second},
	} {
		testDenyHoldUnderLimit(t, lim)
	}
}

func testDenyHoldUnderLimit(t *testing.T, lim Limit) {
	unit := lim.Period / time.Duration(lim.Rate)
	rng := rand.New(rand.NewPCG(1, 2))
	for _, load := range []float64{0.5, 0.7, 0.9} {
		gap := time.Duration(float64(unit) / load)
		n := int(2 * time.Second / gap)
		random := make([]time.Duration, n)
		var now time.Duration
		for i := range random {
			random[i] = now
			now += time.Duration(rng.ExpFloat64() * float64(gap))
		}
		for name, at := range map[string][]time.Duration{"evenly": evenly(n, gap), "at random": random} {
			for _, engines := range []int{1, 2} {
				for _, rtt := range []time.Duration{0, unit} {
					held := simulateHold(t, lim, at, engines, rtt, true)
					plain := simulateHold(t, lim, at, engines, rtt, false)
					if held.cacheDenied > plain.cacheDenied || held.admitted < plain.admitted {
						t.Errorf("%v: %.0f%% of the limit %s, %d engines, round trip %v: the cache denied %d, admitted %d held; %d, %d not",
							lim.Algorithm, 100*load, name, engines, rtt, held.cacheDenied, held.admitted, plain.cacheDenied, plain.admitted)
					}
				}
			}
		}
	}
}

// TestDenyHoldEpochs: a key refused at least twice per unit due over an
// epoch has its hold doubled; a store answer a live denial covers leaves
// it in place; a key that rests longer than its last denial lasted, and
// than its hold and restUnits more, starts again at one unit.
func TestDenyHoldEpochs(t *testing.T) {
	lim := Limit{Rate: 2000, Period: time.Second}
	h := holdFor(lim, time.Millisecond)
	c := newDenyCache(16)
	slot := &c.slots[7&c.mask]
	at := time.Unix(1000, 0)
	deny := counter.Result{RetryAfter: h.unit}
	for range 5 { // a store denial and 3 lookups a unit: 4 refusals per unit
		c.addHeld(7, 1, at, deny, h, 1)
		for range 3 {
			if _, ok := c.lookup(7, 1, func() time.Time { return at }); !ok {
				t.Fatal("a fresh denial did not deny")
			}
		}
		at = at.Add(h.unit)
	}
	d := slot.Load()
	if d.hold != 2 {
		t.Fatalf("after an epoch refused 4 times a unit: hold %d, want 2", d.hold)
	}
	c.addHeld(7, 1, time.Unix(0, d.until).Add(-h.unit), deny, h, 1) // ends with d
	if slot.Load() != d {
		t.Fatalf("a covered answer replaced the live denial")
	}
	at = time.Unix(0, d.until).Add(max(time.Duration(d.until-d.at), time.Duration(d.hold+restUnits)*h.unit) + time.Nanosecond)
	c.addHeld(7, 1, at, deny, h, 1)
	if got := slot.Load().hold; got != 1 {
		t.Fatalf("after the key rested: hold %d, want 1", got)
	}
}

func TestNextHold(t *testing.T) {
	tests := []struct {
		hold, refused, units int64
		want                 int64
	}{
		{1, 8, 4, 2},
		{32, 200, 64, 64}, // capped at most
		{8, 10, 8, 8},     // as many refusals as units: kept
		{8, 7, 8, 4},      // fewer: halved
		{1, 0, 4, 1},
	}
	for _, tt := range tests {
		if got := nextHold(tt.hold, tt.refused, tt.units, 64); got != tt.want {
			t.Errorf("nextHold(%d, %d, %d, 64) = %d, want %d", tt.hold, tt.refused, tt.units, got, tt.want)
		}
	}
}

// TestDenyHoldLookupAllocs: a lookup that a held denial answers does not
// allocate.
func TestDenyHoldLookupAllocs(t *testing.T) {
	lim := Limit{Rate: 2000, Period: time.Second}
	h := holdFor(lim, 0)
	c := newDenyCache(16)
	at := time.Unix(1000, 0)
	c.addHeld(7, 1, at, counter.Result{RetryAfter: time.Second}, h, 1)
	clock := func() time.Time { return at }
	if n := testing.AllocsPerRun(100, func() {
		if _, ok := c.lookup(7, 1, clock); !ok {
			t.Fatal("the held denial did not deny")
		}
	}); n != 0 {
		t.Errorf("a lookup allocated %v times", n)
	}
}
