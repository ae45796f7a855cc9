package daemon

import (
	"context"
	"sync/atomic"
	"time"
)

// deadlineStep is how long the requests on hotkey.allow share a deadline:
// each gets one natsDecisionTimeout to natsDecisionTimeout+deadlineStep
// away, and a timer is set once a step rather than once a request.
const deadlineStep = 100 * time.Millisecond

// deadlines hands out the contexts that bound the decisions asked over
// NATS. The zero value is ready; safe for concurrent use.
type deadlines struct {
	cur atomic.Pointer[deadline]
}

type deadline struct {
	ctx    context.Context
	cancel context.CancelFunc // unused: the timer frees the context at its deadline
	until  time.Time          // the last instant it is handed out at (exclusive)
}

// at returns a context, not cancelled before its deadline, whose
// deadline is natsDecisionTimeout to natsDecisionTimeout+deadlineStep
// after now.
func (d *deadlines) at(now time.Time) context.Context {
	cur := d.cur.Load()
	if cur != nil && now.Before(cur.until) && !now.Before(cur.until.Add(-deadlineStep)) {
		return cur.ctx
	}
	ctx, cancel := context.WithDeadline(context.Background(), now.Add(natsDecisionTimeout+deadlineStep))
	next := &deadline{ctx: ctx, cancel: cancel, until: now.Add(deadlineStep)}
	// A lost race leaves the other's in place: this request keeps its own.
	d.cur.CompareAndSwap(cur, next)
	return ctx
}
