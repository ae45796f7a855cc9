package hotkey

import (
	"context"
	"testing"
	"time"

	"github.com/hotkeyd/hotkey/counter"
	"github.com/hotkeyd/hotkey/internal/testkit"
)

// TestReserveDenyReturned: engine B leases a fixed window's units; engine
// A, denied by the store, remembers the denial; B stops and its unused
// units go back. A, asked once a second for the next 18 s of the window,
// asks the store again within a lease and admits them, rather than deny
// from its cache to the window's end.
func TestReserveDenyReturned(t *testing.T) {
	clock := testkit.NewClock()
	clock.Set(time.Unix(1767225600, 0)) // a minute's start
	store := counter.NewMemoryStore(counter.MemoryConfig{Clock: clock.Now})
	engine := func() *Engine {
		// The memory store under another type: the engine keeps a deny
		// cache, as it does for a store out of process.
		e, err := New(struct{ counter.LeaseStore }{store}, WithoutDetector(), withClock(clock.Now), withoutReserveSweep())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { e.Close() })
		return e
	}
	a, b := engine(), engine()
	lim := Limit{Algorithm: FixedWindow, Rate: 50, Period: time.Minute}
	p := &Policy{Name: "r", Limit: lim, Sync: SyncReserve}
	ctx := context.Background()
	allow := func(e *Engine) bool {
		r, err := e.Allow(ctx, "k", p)
		if err != nil {
			t.Fatal(err)
		}
		return r.Allowed
	}
	name := nameOf(p.Name, "k")
	left := func() int64 {
		r, err := store.Peek(ctx, name, 0, lim)
		if err != nil {
			t.Fatal(err)
		}
		if !r.Allowed {
			return 0
		}
		return r.Remaining + 1
	}
	for i := 0; left() > 0; i++ { // B leases the rest of the window
		if i == int(lim.Rate) {
			t.Fatalf("B leased no more after %d decisions: %d left in the store", i, left())
		}
		if !allow(b) {
			t.Fatal("B denied under the limit")
		}
		clock.Advance(time.Microsecond)
	}
	if allow(a) {
		t.Fatal("A admitted while B's block holds the window's units")
	}
	if err := b.Close(); err != nil { // B's unused units go back
		t.Fatal(err)
	}
	free, err := store.Peek(ctx, name, 0, lim)
	if err != nil {
		t.Fatal(err)
	}
	var denied int
	const asks = 18
	for range asks {
		clock.Advance(time.Second)
		if !allow(a) {
			denied++
		}
	}
	t.Logf("the store held %d free units after B stopped; A denied %d of %d", free.Remaining, denied, asks)
	if free.Remaining < asks {
		t.Fatalf("only %d units back", free.Remaining)
	}
	if denied > 0 {
		t.Errorf("A denied %d of %d decisions while the store held %d free units", denied, asks, free.Remaining)
	}
}
