package daemon

import (
	"context"
	"errors"
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

// TestDeadlinesRetire: a deadline replaced by the next step's is done at
// its own deadline, with context.DeadlineExceeded, and so is a context
// derived from it before then; the current one is not done.
func TestDeadlinesRetire(t *testing.T) {
	var d deadlines
	// Handed out a step ago, with 10ms of its deadline left by the clock.
	now := time.Now().Add(-natsDecisionTimeout - deadlineStep + 10*time.Millisecond)
	old := d.at(now)
	child, cancel := context.WithCancel(old)
	defer cancel()
	cur := d.at(now.Add(deadlineStep))
	if cur == old {
		t.Fatal("the next step shares the retired context")
	}
	for _, ctx := range []context.Context{old, child} {
		select {
		case <-ctx.Done():
		case <-time.After(10 * time.Second): // a bound, far past the deadline
			t.Fatal("a retired deadline's context is not done 10s after its deadline")
		}
		if err := ctx.Err(); !errors.Is(err, context.DeadlineExceeded) || !errors.Is(context.Cause(ctx), context.DeadlineExceeded) {
			t.Errorf("retired: %v (cause %v), want context.DeadlineExceeded", err, context.Cause(ctx))
		}
	}
	if err := d.at(time.Now()).Err(); err != nil {
		t.Errorf("a current deadline's context is done: %v", err)
	}
}
