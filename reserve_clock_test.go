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
