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
	ctx   *deadlineCtx
	until time.Time // the last instant it is handed out at (exclusive)
}

// at returns a context, not cancelled before its deadline, whose
// deadline is natsDecisionTimeout to natsDecisionTimeout+deadlineStep
// after now.
func (d *deadlines) at(now time.Time) context.Context {
	cur := d.cur.Load()
	if cur != nil && now.Before(cur.until) && !now.Before(cur.until.Add(-deadlineStep)) {
		return cur.ctx
	}
	next := &deadline{ctx: newDeadlineCtx(now.Add(natsDecisionTimeout + deadlineStep)), until: now.Add(deadlineStep)}
	// A lost race leaves the other's in place: this request keeps its own.
	d.cur.CompareAndSwap(cur, next)
	return next.ctx
}

// deadlineCtx is a context with no values that is done at its deadline,
// with context.DeadlineExceeded, and not before: its timer ends it, and
// nothing else can, so it has no CancelFunc for its holders to keep.
// Contexts derived from it end with it, with no goroutine each (AfterFunc).
type deadlineCtx struct {
	deadline time.Time
	ended    context.Context // cancelled by the timer at deadline
}

// newDeadlineCtx returns a deadlineCtx done at deadline, by the clock.
func newDeadlineCtx(deadline time.Time) *deadlineCtx {
	ended, end := context.WithCancel(context.Background())
	time.AfterFunc(time.Until(deadline), end)
	return &deadlineCtx{deadline: deadline, ended: ended}
}

func (c *deadlineCtx) Deadline() (time.Time, bool) { return c.deadline, true }
func (c *deadlineCtx) Done() <-chan struct{}       { return c.ended.Done() }
func (c *deadlineCtx) Value(any) any               { return nil }

// Err is context.DeadlineExceeded once c is done, nil before.
func (c *deadlineCtx) Err() error {
	if c.ended.Err() != nil {
		return context.DeadlineExceeded
	}
	return nil
}

// AfterFunc arranges to call f in its own goroutine once c is done, as
// context.AfterFunc does; stop reports whether it kept f from being called.
// The context package ends the contexts derived from c through it.
func (c *deadlineCtx) AfterFunc(f func()) (stop func() bool) {
	return context.AfterFunc(c.ended, f)
}
