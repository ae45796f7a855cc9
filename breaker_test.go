package hotkey

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/hotkeyd/hotkey/counter"
	"github.com/hotkeyd/hotkey/internal/testkit"
)

// TestBreaker: three failures in a row open the breaker; while open no call
// reaches the store but one probe per interval, the interval doubling after
// each failed probe up to its cap; a good probe closes it.
func TestBreaker(t *testing.T) {
	checkLeaks(t)
	clock := testkit.NewClock()
	store := &testkit.Store{Store: counter.NewMemoryStore(counter.MemoryConfig{Clock: clock.Now})}
	var changes []BreakerState
	e, err := New(store, withClock(clock.Now), WithoutDetector(), withDenyCache(0),
		WithBreaker(3, 10*time.Second, 40*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	e.brk.onChange = func(s BreakerState, _ error) { changes = append(changes, s) }
	ctx := context.Background()
	p := &Policy{Limit: PerSecond(1000), OnStoreFailure: FallbackOpen}
	allow := func() Result {
		t.Helper()
		r, err := e.Allow(ctx, "k", p)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	if r := allow(); !r.Allowed || r.Degraded {
		t.Fatalf("store up: %+v", r)
	}
	store.Down.Store(true)
	for i := range 3 {
		if r := allow(); !r.Degraded || !r.Allowed {
			t.Fatalf("failure %d: %+v, want the open fallback", i+1, r)
		}
	}
	if e.brk.State() != BreakerOpen {
		t.Fatalf("breaker %v after 3 failures, want open", e.brk.State())
	}
	calls := store.Takes.Load()
	for range 100 {
		allow()
	}
	if store.Takes.Load() != calls {
		t.Fatalf("%d store calls while open before the probe interval, want 0", store.Takes.Load()-calls)
	}
	// Failed probes: after 10 s, then 20 s, then 40 s (the cap), then 40 s.
	for _, wait := range []time.Duration{10 * time.Second, 20 * time.Second, 40 * time.Second, 40 * time.Second} {
		clock.Advance(wait - time.Millisecond)
		allow()
		if store.Takes.Load() != calls {
			t.Fatalf("a probe went %v early", time.Millisecond)
		}
		clock.Advance(time.Millisecond)
		allow()
		allow()
		if got := store.Takes.Load() - calls; got != 1 {
			t.Fatalf("%d store calls when a probe was due after %v, want 1", got, wait)
		}
		calls = store.Takes.Load()
	}
	store.Down.Store(false)
	clock.Advance(40 * time.Second)
	if r := allow(); r.Degraded || e.brk.State() != BreakerClosed {
		t.Fatalf("good probe: %+v, breaker %v; want a store decision and the breaker closed", r, e.brk.State())
	}
	if len(changes) != 2 || changes[0] != BreakerOpen || changes[1] != BreakerClosed {
		t.Fatalf("breaker changes %v, want open then closed", changes)
	}
	// Failures that are not in a row do not open it.
	for range 5 {
		store.Down.Store(true)
		allow()
		allow()
		store.Down.Store(false)
		allow()
	}
	if e.brk.State() != BreakerClosed {
		t.Fatal("breaker opened on failures that were not in a row")
	}
}

// TestFallbacks: what each fallback answers while the store is down.
func TestFallbacks(t *testing.T) {
	checkLeaks(t)
	clock := testkit.NewClock()
	e, store := newMemoryEngine(t, clock)
	store.Down.Store(true)
	ctx := context.Background()
	lim := Limit{Rate: 90, Period: time.Second, Burst: 90}
	count := func(p *Policy, key string, n int) (allowed int) {
		for range n {
			r, err := e.AllowN(ctx, key, p, 1)
			if err != nil {
				t.Fatalf("%v: %v", p.OnStoreFailure, err)
			}
			if !r.Degraded {
				t.Fatalf("%v: a decision with the store down is not marked Degraded", p.OnStoreFailure)
			}
			if r.Allowed {
				allowed++
			}
		}
		return allowed
	}
	open := &Policy{Name: "open", Limit: lim, OnStoreFailure: FallbackOpen}
	if got := count(open, "a", 500); got != 500 {
		t.Errorf("open: %d of 500 allowed", got)
	}
	closed := &Policy{Name: "closed", Limit: lim, OnStoreFailure: FallbackClosed, Allowlist: []string{"health"}}
	if got := count(closed, "a", 100); got != 0 {
		t.Errorf("closed: %d of 100 allowed for a key not on the allowlist", got)
	}
	if got := count(closed, "health", 100); got != 100 {
		t.Errorf("closed: %d of 100 allowed for an allowlisted key", got)
	}
	// Local: the burst divided by the live instances.
	local := &Policy{Name: "local", Limit: lim, OnStoreFailure: FallbackLocal}
	if got := count(local, "a", 500); got != 90 {
		t.Errorf("local, 1 instance: %d of 500 allowed in one instant, want the burst, 90", got)
	}
	handler{e}.SetInstances(3)
	if got := count(local, "b", 500); got != 30 {
		t.Errorf("local, 3 instances: %d of 500 allowed in one instant, want 90/3", got)
	}
	fail := &Policy{Limit: lim, OnStoreFailure: FallbackError}
	if _, err := e.AllowN(ctx, "a", fail, 1); !errors.Is(err, ErrStoreUnavailable) || !errors.Is(err, ErrBreakerOpen) {
		t.Errorf("error fallback with the breaker open: %v, want ErrStoreUnavailable and ErrBreakerOpen", err)
	}
	if _, err := e.AllowN(ctx, "a", nil, 1); !errors.Is(err, ErrNilPolicy) {
		t.Errorf("nil policy: %v, want ErrNilPolicy", err)
	}
}

// TestBreakerCountsStoreCalls: decisions the deny cache answers, between
// failed store calls, do not reset the count of failures in a row: they tell
// nothing of the store.
func TestBreakerCountsStoreCalls(t *testing.T) {
	checkLeaks(t)
	clock := testkit.NewClock()
	e, store := newMemoryEngine(t, clock)
	ctx := context.Background()
	p := &Policy{Limit: PerSecond(1), OnStoreFailure: FallbackOpen}
	e.Allow(ctx, "denied", p)
	if r, _ := e.Allow(ctx, "denied", p); r.Allowed {
		t.Fatal("second request within the limit of 1/s allowed")
	}
	store.Down.Store(true)
	for i := range 3 {
		if r, _ := e.Allow(ctx, "denied", p); r.Allowed || r.Degraded {
			t.Fatalf("cached denial %d: %+v", i, r)
		}
		e.Allow(ctx, fmt.Sprint("fresh", i), p)
	}
	if e.brk.State() != BreakerOpen {
		t.Fatal("3 failed store calls in a row, with cached denials between them, did not open the breaker")
	}
}

// notReadyStore fails every call with counter.ErrNotReady while NotReady is
// set, as a store whose setup has not succeeded yet.
type notReadyStore struct {
	testkit.Store
}

func (s *notReadyStore) Take(ctx context.Context, key string, hash uint64, lim counter.Limit, n int64) (counter.Result, error) {
	if s.Down.Load() {
		s.Takes.Add(1)
		return counter.Result{}, fmt.Errorf("test: %w", counter.ErrNotReady)
	}
	return s.Store.Take(ctx, key, hash, lim, n)
}

// TestBreakerNotReady: a store not set up yet (counter.ErrNotReady) is no
// verdict for the breaker: decisions follow the fallback, each asks the
// store, and the first one after it is set up goes to it, with no probe
// interval to wait.
func TestBreakerNotReady(t *testing.T) {
	checkLeaks(t)
	clock := testkit.NewClock()
	store := &notReadyStore{testkit.Store{Store: counter.NewMemoryStore(counter.MemoryConfig{Clock: clock.Now})}}
	store.Down.Store(true)
	e, err := New(store, withClock(clock.Now), WithoutDetector(), withDenyCache(0), WithBreaker(3, 10*time.Second, 40*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	p := &Policy{Limit: PerSecond(1000), OnStoreFailure: FallbackOpen}
	for i := range 10 {
		r, err := e.Allow(context.Background(), "k", p)
		if err != nil || !r.Allowed || !r.Degraded {
			t.Fatalf("decision %d before setup: %+v, %v; want the open fallback", i, r, err)
		}
	}
	if got := store.Takes.Load(); got != 10 {
		t.Errorf("%d of 10 decisions asked the store before setup, want all", got)
	}
	if e.brk.State() != BreakerClosed {
		t.Fatalf("breaker %v after 10 takes of a store not set up, want closed", e.brk.State())
	}
	store.Down.Store(false)
	if r, err := e.Allow(context.Background(), "k", p); err != nil || !r.Allowed || r.Degraded || r.Remaining != 999 {
		t.Errorf("first decision once set up: %+v, %v; want the store's", r, err)
	}
}
