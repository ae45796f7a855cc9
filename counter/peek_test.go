package counter

import (
	"context"
	"testing"
	"time"
)

// TestPeek: on every store and algorithm, Peek answers what a take of one
// unit would, and charges nothing. The period is one no test outlives, so
// that nothing refills.
func TestPeek(t *testing.T) {
	for _, h := range harnesses(t) {
		t.Run(h.name, func(t *testing.T) {
			p, ok := h.store.(Peeker)
			if !ok {
				t.Fatalf("%T is no Peeker", h.store)
			}
			for _, alg := range []Algorithm{TokenBucket, SlidingWindow, FixedWindow, SlidingLog} {
				t.Run(alg.String(), func(t *testing.T) {
					key := uniqueKey(t)
					lim := Limit{Algorithm: alg, Rate: 3, Period: 1000 * time.Hour}
					peek := func() Result {
						t.Helper()
						r, err := p.Peek(context.Background(), key, Hash(key), lim)
						if err != nil {
							t.Fatal(err)
						}
						return r
					}
					for range 5 {
						if r := peek(); !r.Allowed || r.Remaining != 2 || r.Limit != 3 {
							t.Fatalf("peek of a fresh counter of 3: %+v, want allowed with 2 left", r)
						}
					}
					if got := h.takeAll(t, key, lim, 1); got != 1 {
						t.Fatalf("take after peeks: admitted %d of 1", got)
					}
					if r := peek(); !r.Allowed || r.Remaining != 1 {
						t.Fatalf("peek with 2 left: %+v, want allowed with 1 left", r)
					}
					if got := h.takeAll(t, key, lim, 5); got != 2 {
						t.Fatalf("takes after peeks: admitted %d of 5, want 2", got)
					}
					for range 3 {
						if r := peek(); r.Allowed || r.Remaining != 0 || r.RetryAfter <= 0 {
							t.Fatalf("peek of a full counter: %+v, want denied with a retry", r)
						}
					}
				})
			}
		})
	}
}
