package hotkey

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hotkeyd/hotkey/counter"
	"github.com/hotkeyd/hotkey/internal/testkit"
)

// TestReserveClockStep: three engines on one redis-server decide a
// SyncReserve fixed-window key; one engine's clock steps a minute forward,
// then back, first while it holds a block, then after a denial it
// remembers. Redis's clock decides what is counted, and windows are read
// on it (the host's clock, which the test cannot move: the test waits for
// Redis's windows). Every window admits at most the limit; in the window
// after the second step, traffic under the limit is not denied by the
// stepped engine; and after Close the blocks' unused units are back.
func TestReserveClockStep(t *testing.T) {
	checkLeaks(t)
	const limit = 300
	lim := Limit{Algorithm: FixedWindow, Rate: limit, Period: time.Second}
	p := &Policy{Name: "step", Limit: lim, Sync: SyncReserve}
	prefix := fmt.Sprintf("reserve-step-%x:", rand.Uint64())
	var step atomic.Int64 // how far the stepped engine's clock is ahead
	clocks := [3]func() time.Time{
		func() time.Time { return time.Unix(0, time.Now().UnixNano()+step.Load()) }, // a wall clock, stepped
		time.Now,
		time.Now,
	}
	var engines [3]*Engine
	for i := range engines {
		client := redis.NewClient(&redis.Options{Addr: env.Server.Addr})
		t.Cleanup(func() { client.Close() })
		store, err := counter.NewRedisStore(context.Background(), client, counter.RedisConfig{Prefix: prefix})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { store.Close() })
		e, err := New(store, WithoutDetector(), withClock(clocks[i]))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { e.Close() })
		engines[i] = e
	}
	stepped := engines[0]
	ctx := context.Background()
	perWindow := map[int64]int64{}
	window := func() int64 { return time.Now().UnixNano() / int64(lim.Period) }
	allow := func(e *Engine) bool {
		r, err := e.Allow(ctx, "k", p)
		if err != nil {
			t.Fatal(err)
		}
		if r.Allowed {
			perWindow[window()]++ // read after the decision: at most one late
		}
		return r.Allowed
	}
	// Redis's windows pass in real time: wait for the next to start.
	nextWindow := func() int64 {
		w := window()
		time.Sleep(time.Until(time.Unix(0, (w+1)*int64(lim.Period))))
		return window()
	}

	// Window 1: the stepped engine leases a block, steps a minute
	// forward (its block ends and goes back; it leases another), then
	// back, holding that block.
	w1 := nextWindow()
	for range 20 {
		allow(stepped)
	}
	step.Store(int64(time.Minute))
	for range 5 {
		allow(stepped)
	}
	step.Store(0)
	// Window 2: a burst of three times the limit over the three engines.
	// Then the stepped engine, a minute ahead, remembers a denial, and
	// steps back.
	w2 := nextWindow()
	for i := range 3 * limit {
		allow(engines[i%3])
	}
	step.Store(int64(time.Minute))
	allow(stepped)
	step.Store(0)
	// Window 3: a third of the limit, spread over the engines: nothing
	// should be denied.
	w3 := nextWindow()
	var denied [3]int
	for i := range limit / 3 {
		if !allow(engines[i%3]) {
			denied[i%3]++
		}
	}
	admitted3 := perWindow[w3]
	for _, e := range engines {
		if err := e.Close(); err != nil {
			t.Fatal(err)
		}
	}
	// What Redis counted in window 3: one probe's remaining.
	probeClient := redis.NewClient(&redis.Options{Addr: env.Server.Addr})
	defer probeClient.Close()
	probe, err := counter.NewRedisStore(ctx, probeClient, counter.RedisConfig{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	defer probe.Close()
	r, err := probe.Take(ctx, nameOf(p.Name, "k"), 0, lim, 1)
	probed := window()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("windows %d, %d, %d; admitted by window %v; window 3: denied by engine %v of %d; after Close, a probe in window %d: %+v", w1, w2, w3, perWindow, denied, limit/3, probed, r)
	for w, n := range perWindow {
		if n > limit+1 {
			t.Errorf("window %d: %d admitted, over %d (+1 read late)", w, n, limit)
		}
	}
	if denied != [3]int{} {
		t.Errorf("window 3, under the limit: %v denied by engine", denied)
	}
	switch {
	case probed != w3:
		t.Logf("window 3 ended before the probe: the blocks' return not checked")
	case !r.Allowed || r.Remaining != limit-admitted3-1:
		t.Errorf("after Close: %+v, want %d left: not every block's unused units are back", r, limit-admitted3-1)
	}
}

// TestReserveWallStepBack: engine A's wall clock steps back 20 ms near a
// fixed window's end while A holds a block of it; engine B then takes the
// next window's whole limit, and A decides again. A times its block on its
// monotonic clock, which did not step, so the block ends with its window
// on the store's clock and each window admits at most the limit.
func TestReserveWallStepBack(t *testing.T) {
	clock := testkit.NewClock()
	clock.Set(time.Unix(1767225600, 0)) // the store's clock, at a window's start
	var step atomic.Int64               // how far A's wall clock is behind
	store := counter.NewMemoryStore(counter.MemoryConfig{Clock: clock.Now})
	wallA := func() time.Time { return clock.Now().Add(-time.Duration(step.Load())) }
	monoA := func() time.Duration { return clock.Now().Sub(time.Unix(0, 0)) }
	a, err := New(store, WithoutDetector(), withClock(wallA), withMonotonic(monoA), withoutReserveSweep())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	b, err := New(store, WithoutDetector(), withClock(clock.Now), withoutReserveSweep())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	lim := Limit{Algorithm: FixedWindow, Rate: 1000, Period: time.Second}
	p := &Policy{Name: "step", Limit: lim, Sync: SyncReserve}
	ctx := context.Background()
	perWindow := map[int64]int64{}
	allow := func(e *Engine) {
		r, err := e.Allow(ctx, "k", p)
		if err != nil {
			t.Fatal(err)
		}
		if r.Allowed {
			perWindow[clock.Now().UnixNano()/int64(lim.Period)]++
		}
	}
	// A at 500/s, within the limit, to 10 ms before the window's end,
	// when its wall clock steps back 20 ms.
	for range 495 {
		allow(a)
		clock.Advance(2 * time.Millisecond)
	}
	step.Store(int64(20 * time.Millisecond))
	clock.Advance(10 * time.Millisecond) // the next window's start
	for range 3 * lim.Rate {
		allow(b)
	}
	for range 100 {
		allow(a)
		clock.Advance(100 * time.Microsecond)
	}
	st, _ := a.reserveStats()
	t.Logf("admitted by window %v; A: %+v", perWindow, st)
	for w, n := range perWindow {
		if n > lim.Rate {
			t.Errorf("window %d: %d admitted, over %d", w, n, lim.Rate)
		}
	}
	if st.Leases == 0 {
		t.Error("A leased no block")
	}
}
