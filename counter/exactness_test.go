package counter

import (
	"fmt"
	"testing"
)

// Tests that no rounding, expiry or stored value hands out more than a
// limit, and that no figure of a Result is out of range.

// sane reports what is wrong with r as a result under lim, if anything.
func sane(r Result, lim Limit) string {
	switch {
	case r.Remaining < 0 || r.Remaining > r.Limit:
		return fmt.Sprintf("remaining %d of %d", r.Remaining, r.Limit)
	case r.Limit != lim.Capacity():
		return fmt.Sprintf("limit %d, want %d", r.Limit, lim.Capacity())
	case r.RetryAfter < 0 || !r.Allowed && r.RetryAfter == 0 || r.Allowed && r.RetryAfter != 0:
		return fmt.Sprintf("retry-after %v when allowed=%v", r.RetryAfter, r.Allowed)
	case r.ResetAfter < 0:
		return fmt.Sprintf("reset-after %v", r.ResetAfter)
	}
	return ""
}

// TestLimitLoweredBehaviour uses up a limit of 100 and lowers it to 50:
// on every store and algorithm, no figure of the Results may leave its
// range (remaining in [0, limit], retry-after and reset-after not negative).
func TestLimitLoweredBehaviour(t *testing.T) {
	for _, h := range harnesses(t) {
		t.Run(h.name, func(t *testing.T) {
			for _, alg := range []Algorithm{TokenBucket, SlidingWindow, FixedWindow, SlidingLog} {
				high := Limit{Algorithm: alg, Rate: 100, Period: longPeriod, Burst: 100}
				low := Limit{Algorithm: alg, Rate: 50, Period: longPeriod, Burst: 50}
				key := uniqueKey(t)
				if got := h.takeAll(t, key, high, 100); got != 100 {
					t.Fatalf("%v: admitted %d of 100", alg, got)
				}
				worst := int64(0)
				for range 3 {
					r := h.take(t, key, low, 1)
					worst = min(worst, r.Remaining)
					if msg := sane(r, low); msg != "" || r.Allowed {
						t.Errorf("%v: after lowering the limit: %+v: %s", alg, r, msg)
					}
				}
				t.Logf("%v: lowest remaining %d", alg, worst)
			}
		})
	}
}
