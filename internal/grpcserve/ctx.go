package grpcserve

import (
	"context"
	"sync"
	"time"
)

// callCtx is a call's context: the connection's values, the call's
// deadline, done when the call is reset or ends, its deadline passes or
// its connection closes. It is cheap to make: its channel is made only
// if Done is called, and contexts derived from it are told through
// AfterFunc, with no goroutine each.
type callCtx struct {
	vals     context.Context
	deadline time.Time // zero: none; set before the call is run

	mu     sync.Mutex // guards the fields below
	done   chan struct{}
	err    error
	afters map[*func()]struct{}
}

func (c *callCtx) Deadline() (time.Time, bool) { return c.deadline, !c.deadline.IsZero() }
func (c *callCtx) Value(k any) any             { return c.vals.Value(k) }

func (c *callCtx) Done() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.done == nil {
		c.done = make(chan struct{})
		if c.err != nil {
			close(c.done)
		}
	}
	return c.done
}

func (c *callCtx) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// cancel ends c with err, if not ended.
func (c *callCtx) cancel(err error) {
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return
	}
	c.err = err
	if c.done != nil {
		close(c.done)
	}
	afters := c.afters
	c.afters = nil
	c.mu.Unlock()
	for f := range afters {
		go (*f)()
	}
}

// AfterFunc arranges to call f in its own goroutine once c is done, as
// context.AfterFunc does; stop reports whether it kept f from being
// called. The context package ends the contexts derived from c through
// it.
func (c *callCtx) AfterFunc(f func()) (stop func() bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		go f()
		return func() bool { return false }
	}
	if c.afters == nil {
		c.afters = map[*func()]struct{}{}
	}
	c.afters[&f] = struct{}{}
	return func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		_, ok := c.afters[&f]
		delete(c.afters, &f)
		return ok
	}
}
