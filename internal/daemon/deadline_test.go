package daemon

import (
	"testing"
	"time"
)

// TestDeadlines: requests within a step share a context; each one's
// deadline is natsDecisionTimeout to natsDecisionTimeout+deadlineStep
// away, also when the clock steps back.
func TestDeadlines(t *testing.T) {
	var d deadlines
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	first := d.at(t0)
	for _, tt := range []struct {
		give time.Duration // after t0
		same bool          // the first request's context
	}{
		{0, true},
		{deadlineStep / 2, true},
		{deadlineStep - 1, true},
		{deadlineStep, false},
		{time.Hour, false},
		{-time.Second, false},
	} {
		now := t0.Add(tt.give)
		ctx := d.at(now)
		if (ctx == first) != tt.same {
			t.Errorf("at t0%+v: shares the first context %v, want %v", tt.give, ctx == first, tt.same)
		}
		dl, ok := ctx.Deadline()
		if lo, hi := now.Add(natsDecisionTimeout), now.Add(natsDecisionTimeout+deadlineStep); !ok || dl.Before(lo) || dl.After(hi) {
			t.Errorf("at t0%+v: deadline t0%+v, want t0%+v to t0%+v", tt.give, dl.Sub(t0), lo.Sub(t0), hi.Sub(t0))
		}
	}
}
