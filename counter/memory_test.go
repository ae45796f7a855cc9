package counter

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func TestMemoryBounded(t *testing.T) {
	s := NewMemoryStore(MemoryConfig{MaxKeys: 1000, Stripes: 8})
	lim := Limit{Rate: 10, Period: time.Hour}
	for i := range 20_000 {
		k := fmt.Sprintf("k%d", i)
		s.TakeAt(t0, k, Hash(k), lim, 1)
	}
	if n := s.Len(); n > 1000 {
		t.Errorf("store holds %d counters, max 1000", n)
	}
}

func TestMemoryEvictsExpiredFirst(t *testing.T) {
	s := NewMemoryStore(MemoryConfig{MaxKeys: 64, Stripes: 1})
	short := Limit{Rate: 1, Period: time.Second}
	long := Limit{Rate: 1, Period: time.Hour}
	// 32 counters that stay live for an hour, 32 that expire in a second.
	for i := range 32 {
		k := fmt.Sprintf("live%d", i)
		s.TakeAt(t0, k, 0, long, 1)
		k = fmt.Sprintf("short%d", i)
		s.TakeAt(t0, k, 0, short, 1)
	}
	// A minute later, 32 new counters fill the room the expired ones left.
	later := t0.Add(time.Minute)
	for i := range 32 {
		s.TakeAt(later, fmt.Sprintf("new%d", i), 0, long, 1)
	}
	for i := range 32 {
		k := fmt.Sprintf("live%d", i)
		if s.TakeAt(later, k, 0, long, 1).Allowed {
			t.Fatalf("%s forgot its state: a live counter was evicted while expired ones remained", k)
		}
	}
}

func TestMemoryExpiredCounterStartsFresh(t *testing.T) {
	s := NewMemoryStore(MemoryConfig{})
	lim := Limit{Algorithm: SlidingLog, Rate: 3, Period: time.Second}
	for range 3 {
		s.TakeAt(t0, "k", 1, lim, 1)
	}
	if s.TakeAt(t0, "k", 1, lim, 1).Allowed {
		t.Fatal("4th of 3 admitted")
	}
	r := s.TakeAt(t0.Add(time.Second), "k", 1, lim, 1)
	if !r.Allowed || r.Remaining != 2 {
		t.Errorf("after expiry: %+v, want allowed with 2 remaining", r)
	}
}

func TestMemoryConcurrentExact(t *testing.T) {
	t0 := time.Now() // one instant: nothing refills, no window starts
	s := NewMemoryStore(MemoryConfig{Clock: func() time.Time { return t0 }})
	for _, alg := range []Algorithm{TokenBucket, SlidingWindow, FixedWindow, SlidingLog} {
		lim := Limit{Algorithm: alg, Rate: 1000, Period: time.Hour}
		var mu sync.Mutex
		admitted := 0
		var wg sync.WaitGroup
		for range 8 {
			wg.Go(func() {
				n := 0
				for range 300 {
					if r, _ := s.Take(context.Background(), alg.String(), 7, lim, 1); r.Allowed {
						n++
					}
				}
				mu.Lock()
				admitted += n
				mu.Unlock()
			})
		}
		wg.Wait()
		if admitted != 1000 {
			t.Errorf("%v: admitted %d of 2400, want 1000", alg, admitted)
		}
	}
}

func TestMemoryTakeDoesNotAllocate(t *testing.T) {
	s := NewMemoryStore(MemoryConfig{})
	for _, alg := range []Algorithm{TokenBucket, SlidingWindow, FixedWindow} {
		lim := Limit{Algorithm: alg, Rate: 1 << 40, Period: time.Second}
		s.TakeAt(t0, "k", 1, lim, 1)
		if n := testing.AllocsPerRun(100, func() { s.TakeAt(t0, "k", 1, lim, 1) }); n != 0 {
			t.Errorf("%v: %v allocs per Take on an existing key", alg, n)
		}
	}
}

func TestLimitValidate(t *testing.T) {
	tests := []struct {
		give Limit
		ok   bool
	}{
		{PerSecond(1), true},
		{PerMinute(100), true},
		{Limit{Rate: 1, Period: time.Second, Burst: 5}, true},
		{Limit{Rate: 0, Period: time.Second}, false},
		{Limit{Rate: 1}, false},
		{Limit{Rate: 1, Period: time.Second, Burst: -1}, false},
		{Limit{Algorithm: numAlgorithms, Rate: 1, Period: time.Second}, false},
		{Limit{Algorithm: SlidingLog, Rate: MaxLogRate + 1, Period: time.Second}, false},
	}
	for _, tt := range tests {
		if err := tt.give.Validate(); (err == nil) != tt.ok {
			t.Errorf("%+v: Validate() = %v", tt.give, err)
		}
	}
	for a := range numAlgorithms {
		if got, err := ParseAlgorithm(a.String()); err != nil || got != a {
			t.Errorf("ParseAlgorithm(%q) = %v, %v", a.String(), got, err)
		}
	}
	if _, err := ParseAlgorithm("leaky"); err == nil {
		t.Error("ParseAlgorithm accepted an unknown name")
	}
}

// TestMemoryNanos checks the store's instants: an injected clock's times
// (no monotonic reading) are their Unix ns, as before; time.Now's advance
// with the monotonic clock, which a step of the wall clock does not move.
func TestMemoryNanos(t *testing.T) {
	s := NewMemoryStore(MemoryConfig{})
	for _, at := range []time.Time{t0, t0.Add(-400 * 24 * time.Hour), t0.Add(time.Nanosecond), time.Unix(0, 1)} {
		if got := s.nanos(at); got != at.UnixNano() {
			t.Errorf("nanos(%v) = %d, want %d", at, got, at.UnixNano())
		}
	}
	a := time.Now()
	b := a.Add(1500 * time.Millisecond) // keeps a's monotonic reading, moved
	if d := s.nanos(b) - s.nanos(a); d != int64(1500*time.Millisecond) {
		t.Errorf("nanos moved %d ns over 1.5 s of the monotonic clock", d)
	}
	if d := s.nanos(a) - a.UnixNano(); d < -int64(time.Second) || d > int64(time.Second) {
		t.Errorf("nanos(now) is %v from the wall clock just after the store was made", time.Duration(d))
	}
}

// TestSlidingWindowAcrossWindowStart: the previous window's weighted count
// is rounded down, so under a limit of 1 a second two requests a
// millisecond apart across a whole second both pass (as the package
// documentation says), and the next is refused.
func TestSlidingWindowAcrossWindowStart(t *testing.T) {
	s := NewMemoryStore(MemoryConfig{})
	lim := Limit{Algorithm: SlidingWindow, Rate: 1, Period: time.Second}
	start := time.Unix(t0.Unix()+1, 0) // a window starts: a whole second
	for i, c := range []struct {
		at   time.Duration
		want bool
	}{{-500 * time.Microsecond, true}, {500 * time.Microsecond, true}, {time.Millisecond, false}} {
		if got := s.TakeAt(start.Add(c.at), "k", 0, lim, 1).Allowed; got != c.want {
			t.Errorf("request %d at %v from the window's start: allowed %v, want %v", i, c.at, got, c.want)
		}
	}
}

// TestMemorySystemClock: a store on the system's clock (Clock nil) reads
// the instant time.Now would give, on its monotonic reading alone.
func TestMemorySystemClock(t *testing.T) {
	s := NewMemoryStore(MemoryConfig{})
	if !s.system {
		t.Fatal("a nil Clock is not the system's")
	}
	for range 100 {
		before := s.nanos(time.Now())
		got := s.now()
		after := s.nanos(time.Now())
		if got < before || got > after {
			t.Fatalf("now() = %d, outside [%d, %d]", got, before, after)
		}
	}
	injected := time.Unix(1e9, 0)
	s = NewMemoryStore(MemoryConfig{Clock: func() time.Time { return injected }})
	if s.system || s.now() != injected.UnixNano() {
		t.Fatalf("an injected clock reads %d, want %d", s.now(), injected.UnixNano())
	}
}
