package hotkey

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hotkeyd/hotkey/counter"
)

// Breaker defaults.
const (
	// DefaultBreakerFailures is how many store calls in a row must fail
	// for the breaker to open.
	DefaultBreakerFailures = 3
	// DefaultBreakerProbe is how long an open breaker waits before it lets
	// one call through to probe the store; each failed probe doubles the
	// wait, up to DefaultBreakerMaxProbe.
	DefaultBreakerProbe    = 10 * time.Second
	DefaultBreakerMaxProbe = 2 * time.Minute
)

// BreakerState is the state of the engine's circuit breaker around its
// store.
type BreakerState int32

const (
	// BreakerClosed: decisions go to the store.
	BreakerClosed BreakerState = iota
	// BreakerOpen: the store failed; decisions follow their policy's
	// fallback, and one call now and then probes the store.
	BreakerOpen
)

func (s BreakerState) String() string {
	if s == BreakerOpen {
		return "open"
	}
	return "closed"
}

// breaker is a circuit breaker: it opens after failures store calls in a row
// fail, then lets one call through every probe interval (doubling after each
// failed probe, up to maxProbe) until one succeeds and closes it. A closed
// breaker costs two atomic operations per call.
type breaker struct {
	state    atomic.Int32 // BreakerState
	fails    atomic.Int32 // consecutive failures while closed
	failures int32
	probe    time.Duration
	maxProbe time.Duration
	clock    func() time.Time
	onChange func(BreakerState, error) // called outside mu, on each change

	mu      sync.Mutex // guards the fields below
	wait    time.Duration
	next    time.Time // when the next probe may go
	probing bool      // a probe is in flight
}

func newBreaker(failures int, probe, maxProbe time.Duration, clock func() time.Time, onChange func(BreakerState, error)) *breaker {
	return &breaker{failures: int32(failures), probe: probe, maxProbe: maxProbe, clock: clock, onChange: onChange}
}

// State returns the breaker's state.
func (b *breaker) State() BreakerState { return BreakerState(b.state.Load()) }

// allow reports whether a call may go to the store, and whether it is the
// probe of an open breaker (whose outcome must be reported with probe set).
func (b *breaker) allow() (ok, probe bool) {
	if b.state.Load() == int32(BreakerClosed) {
		return true, false
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.state.Load() == int32(BreakerClosed) {
		return true, false
	}
	if b.probing || b.clock().Before(b.next) {
		return false, false
	}
	b.probing = true
	return true, true
}

// success reports a call that reached the store and got an answer.
func (b *breaker) success(probe bool) {
	if !probe {
		if b.fails.Load() != 0 {
			b.fails.Store(0)
		}
		return
	}
	b.mu.Lock()
	b.probing = false
	b.fails.Store(0)
	b.state.Store(int32(BreakerClosed))
	b.mu.Unlock()
	b.onChange(BreakerClosed, nil)
}

// failure reports a call that failed for the store's sake (not the
// caller's cancellation).
func (b *breaker) failure(probe bool, err error) {
	if !probe {
		if b.fails.Add(1) < b.failures || b.state.Load() == int32(BreakerOpen) {
			return
		}
		b.mu.Lock()
		if b.state.Load() == int32(BreakerOpen) {
			b.mu.Unlock()
			return
		}
		b.state.Store(int32(BreakerOpen))
		b.wait = b.probe
		b.next = b.clock().Add(b.wait)
		b.mu.Unlock()
		b.onChange(BreakerOpen, err)
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.probing = false
	b.wait = min(2*b.wait, b.maxProbe)
	b.next = b.clock().Add(b.wait)
}

// report reports the outcome of a store call allowed with probe: err nil is
// a success; an error after the caller cancelled ctx is no verdict on the
// store, nor is a store not set up yet (counter.ErrNotReady: it failed at
// once, without a round trip, and is ready as soon as its server answers,
// not a probe interval later); any other error is a failure, a call cut by the caller's deadline
// included: the store did not answer within the time callers allow, and
// callers with deadlines shorter than the store's timeout would otherwise
// never open the breaker, however stalled the store.
func (b *breaker) report(ctx context.Context, probe bool, err error) {
	switch {
	case err == nil:
		b.success(probe)
	case errors.Is(ctx.Err(), context.Canceled), errors.Is(err, counter.ErrNotReady):
		b.abandon(probe)
	default:
		b.failure(probe, err)
	}
}

// abandon reports a probe that ended with no verdict (the caller left):
// the next call may probe.
func (b *breaker) abandon(probe bool) {
	if probe {
		b.mu.Lock()
		b.probing = false
		b.mu.Unlock()
	}
}
