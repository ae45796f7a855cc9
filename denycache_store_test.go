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
	c.add(7, 1, at, counter.Result{RetryAfter: time.Second}, time.Hour)
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

// lateStore is a store whose answers arrive late: each Take advances the
// clock by delay after the store decided, as a round trip does.
type lateStore struct {
	*testkit.Store
	clock *testkit.Clock
	delay time.Duration
}

func (s *lateStore) Take(ctx context.Context, key string, hash uint64, lim counter.Limit, n int64) (counter.Result, error) {
	r, err := s.Store.Take(ctx, key, hash, lim, n)
	s.clock.Advance(s.delay)
	return r, err
}

// TestDenyCacheEndsWithTheWindow: a denial remembered from a store that
// answers late ends when the store's window does, not a round trip after,
// so the next window's first requests are asked of the store and admitted.
func TestDenyCacheEndsWithTheWindow(t *testing.T) {
	ctx := context.Background()
	lim := Limit{Algorithm: FixedWindow, Rate: 2, Period: time.Second}
	var denied int
	const windows = 20
	for i := range windows {
		clock := testkit.NewClock()
		store := &lateStore{Store: &testkit.Store{Store: counter.NewMemoryStore(counter.MemoryConfig{Clock: clock.Now})}, clock: clock, delay: 40 * time.Millisecond}
		e, err := New(store, withClock(clock.Now), WithoutDetector())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { e.Close() })
		// Spend the window 100 ms before its end, then ask again i ms
		// after it ended: within the round trip the cache would add.
		end := clock.Now().Truncate(time.Second).Add(time.Second)
		clock.Advance(end.Sub(clock.Now()) - 100*time.Millisecond)
		for range lim.Rate + 1 {
			if _, err := e.Allow(ctx, "k", pol(lim)); err != nil {
				t.Fatal(err)
			}
		}
		clock.Advance(end.Add(time.Duration(i) * time.Millisecond).Sub(clock.Now()))
		r, err := e.Allow(ctx, "k", pol(lim))
		if err != nil {
			t.Fatal(err)
		}
		if !r.Allowed {
			denied++
		}
	}
	t.Logf("the next window's first request denied in %d of %d", denied, windows)
	if denied > 0 {
		t.Errorf("the next window's first request denied in %d of %d: the deny cache outlived the window by the store's round trip", denied, windows)
	}
}

// TestDenyCacheHold: a denial remembered for a hold shorter than its
// retry-after is forgotten at the hold's end, and answers the store's
// retry-after while remembered.
func TestDenyCacheHold(t *testing.T) {
	c := newDenyCache(16)
	at := time.Date(2026, 1, 1, 0, 1, 0, 0, time.UTC)
	c.add(7, 1, at, counter.Result{RetryAfter: time.Minute}, 100*time.Millisecond)
	clock := func(d time.Duration) func() time.Time { return func() time.Time { return at.Add(d) } }
	if r, ok := c.lookup(7, 1, clock(99*time.Millisecond)); !ok || r.RetryAfter != time.Minute-99*time.Millisecond {
		t.Errorf("within the hold: %+v %v, want covered, retry-after %v", r, ok, time.Minute-99*time.Millisecond)
	}
	if _, ok := c.lookup(7, 1, clock(100*time.Millisecond)); ok {
		t.Error("at the hold's end: still covered")
	}
}
