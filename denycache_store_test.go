package hotkey

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/hotkeyd/hotkey/counter"
	"github.com/hotkeyd/hotkey/internal/testkit"
)

// TestDenyCacheAgreesWithStore empties a token bucket through an engine
// with the deny cache and through one without, then asks both once for one
// unit a little later: the cache must deny exactly what the store denies,
// for rates whose interval is not a whole tick as well.
func TestDenyCacheAgreesWithStore(t *testing.T) {
	ctx := context.Background()
	disagreed := 0
	for _, lim := range []Limit{
		{Rate: 700_000, Period: time.Second},
		{Rate: 1_500_000, Period: time.Second},
		{Rate: 3, Period: time.Second},
		{Rate: 300, Period: time.Second, Burst: 20_000},
	} {
		clock := testkit.NewClock()
		cached, _ := newMemoryEngine(t, clock)
		plain, _ := newMemoryEngine(t, clock, withDenyCache(0))
		interval := time.Duration(int64(lim.Period) / lim.Rate)
		for i := range 16 {
			key := fmt.Sprintf("k%d", i)
			for _, e := range []*Engine{cached, plain} {
				if r, err := e.AllowN(ctx, key, pol(lim), lim.Capacity()); err != nil || !r.Allowed {
					t.Fatalf("emptying: %+v, %v", r, err)
				}
			}
			// Instants around the first unit's, and past it.
			wait := interval*time.Duration(i)/8 + time.Duration(i%3)
			clock.Advance(wait)
			rc, err := cached.Allow(ctx, key, pol(lim))
			if err != nil {
				t.Fatal(err)
			}
			rp, err := plain.Allow(ctx, key, pol(lim))
			if err != nil {
				t.Fatal(err)
			}
			if rc.Allowed != rp.Allowed {
				disagreed++
				t.Errorf("%d per %v: %v after emptying, the deny cache says allowed=%v (retry-after %v), the store %v",
					lim.Rate, lim.Period, wait, rc.Allowed, rc.RetryAfter, rp.Allowed)
			}
			clock.Advance(time.Hour) // refills every bucket
		}
	}
	t.Logf("%d of 64 decisions disagreed", disagreed)
}

// TestDenyCacheClockStep: a remembered denial covers the instants from the
// deny to its end, not a clock stepped back before the deny.
func TestDenyCacheClockStep(t *testing.T) {
	c := newDenyCache(16)
	at := time.Date(2026, 1, 1, 0, 1, 0, 0, time.UTC)
	c.add(7, 1, at, counter.Result{RetryAfter: time.Second})
	for _, tt := range []struct {
		give time.Duration // from the deny
		want bool
	}{
		{0, true},
		{999 * time.Millisecond, true},
		{time.Second, false},
		{-time.Nanosecond, false},
		{-time.Minute, false},
	} {
		if _, got := c.lookup(7, 1, func() time.Time { return at.Add(tt.give) }); got != tt.want {
			t.Errorf("%v from the deny: covered %v, want %v", tt.give, got, tt.want)
		}
	}
}
