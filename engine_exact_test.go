package hotkey

import (
	"context"
	"testing"
	"time"

	"github.com/hotkeyd/hotkey/counter"
	"github.com/hotkeyd/hotkey/shard"
)

// admitAll sends cost-n decisions for key until one is denied (or limit
// decisions went by) and returns the units admitted.
func admitAll(t *testing.T, e *Engine, key string, lim Limit, n int64, limit int) int64 {
	t.Helper()
	var units int64
	for range limit {
		r, err := e.AllowN(context.Background(), key, lim, n)
		if err != nil {
			t.Fatal(err)
		}
		if !r.Allowed {
			break
		}
		units += n
	}
	return units
}

// TestSplitAllPromotion: under WithSplitAll(4) a key's usage sits on its 4
// subcounters; a promotion to 16 moves it from there, not from the unsplit
// counter, which holds none of it.
func TestSplitAllPromotion(t *testing.T) {
	checkLeaks(t)
	clock := newFakeClock()
	store := counter.NewMemoryStore(counter.MemoryConfig{Clock: clock.Now})
	e, err := New(store, WithClock(clock.Now), WithoutDetector(), WithSplitAll(shard.Level4))
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	for _, alg := range []Algorithm{TokenBucket, SlidingWindow, FixedWindow, SlidingLog} {
		t.Run(alg.String(), func(t *testing.T) {
			key := "promoted:" + alg.String()
			lim := Limit{Algorithm: alg, Rate: 1600, Period: time.Hour}
			before := admitAll(t, e, key, lim, 1, 10_000)
			handler{e}.SetLevel(key, hashKey(key), shard.Level16)
			after := admitAll(t, e, key, lim, 1, 10_000)
			t.Logf("admitted %d at the static level 4, then %d at 16 with no time passing", before, after)
			if before != 1600 || after != 0 {
				t.Errorf("admitted %d at level 4 and %d after the promotion to 16, want 1600 and 0", before, after)
			}
		})
	}
}
