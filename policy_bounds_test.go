package hotkey

import (
	"context"
	"errors"
	"math"
	"testing"
	"time"

	"github.com/hotkeyd/hotkey/counter"
	"github.com/hotkeyd/hotkey/internal/testkit"
)

// TestPolicyBeyondBounds: a policy whose limit a store could not enforce
// exactly is refused on every decision with ErrLimitTooLarge; none of its
// requests is admitted.
func TestPolicyBeyondBounds(t *testing.T) {
	clock := testkit.NewClock()
	store := counter.NewMemoryStore(counter.MemoryConfig{Clock: clock.Now})
	e := newEngineOn(t, store, clock)
	for _, c := range []struct {
		lim  Limit
		cost int64
	}{
		{Limit{Algorithm: counter.TokenBucket, Rate: 1, Period: 8760 * time.Hour, Burst: 700}, 400},
		{Limit{Algorithm: counter.FixedWindow, Rate: math.MaxInt64, Period: time.Hour}, 1<<62 + 1},
		{Limit{Algorithm: counter.SlidingWindow, Rate: math.MaxInt64, Period: time.Hour}, 1<<62 + 1},
	} {
		admitted := 0
		for range 10 {
			r, err := e.AllowN(context.Background(), "k", pol(c.lim), c.cost)
			if err != nil && !errors.Is(err, counter.ErrLimitTooLarge) {
				t.Fatalf("%+v: %v, want ErrLimitTooLarge", c.lim, err)
			}
			if err == nil && r.Allowed {
				admitted++
			}
		}
		if admitted != 0 {
			t.Errorf("%+v, cost %d: admitted %d of 10, want every decision refused", c.lim, c.cost, admitted)
		}
	}
}
