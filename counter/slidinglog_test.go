package counter

import (
	"fmt"
	"runtime"
	"testing"
	"time"
)

// heapAfterGC returns the live heap.
func heapAfterGC() int64 {
	runtime.GC()
	runtime.GC() // what sync.Pools dropped at the first
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc)
}

// TestMemorySlidingLogBounded measures what sliding-log counters hold in
// the memory store: a request costs one entry whatever its cost, and a
// log's entries are bounded whatever its traffic.
func TestMemorySlidingLogBounded(t *testing.T) {
	lim := Limit{Algorithm: SlidingLog, Rate: MaxLogRate, Period: time.Minute}
	s := NewMemoryStore(MemoryConfig{MaxKeys: 1 << 12, Stripes: 1})
	const keys = 256
	before := heapAfterGC()
	for i := range keys {
		if r := s.TakeAt(t0, fmt.Sprint("full", i), 0, lim, lim.Rate); !r.Allowed {
			t.Fatalf("a full cost on a fresh log: %+v", r)
		}
	}
	perKey := (heapAfterGC() - before) / keys
	t.Logf("a request of cost %d: %d bytes held", lim.Rate, perKey)
	if perKey > 1024 {
		t.Errorf("a request of cost %d holds %d bytes, want at most 1 KiB", lim.Rate, perKey)
	}

	// One counter, a request of cost 1 every 3 ms for a period: 20,000
	// requests at as many instants.
	busyLim := Limit{Algorithm: SlidingLog, Rate: 20_000, Period: time.Minute}
	before = heapAfterGC()
	at := t0
	for range busyLim.Rate {
		at = at.Add(busyLim.Period / time.Duration(busyLim.Rate))
		s.TakeAt(at, "busy", 0, busyLim, 1)
	}
	busy := heapAfterGC() - before
	t.Logf("%d requests of cost 1 in a period: %d bytes held", busyLim.Rate, busy)
	if busy > 32<<10 {
		t.Errorf("%d requests in a period hold %d bytes, want at most 32 KiB", busyLim.Rate, busy)
	}
	runtime.KeepAlive(s)
}

// TestMemorySlidingLogBusyStillExact sends a log twice its rate for three
// periods, at instants the log must round to slots: no window of a period
// may hold more than the rate, and the log admits nearly the rate per
// period all the same.
func TestMemorySlidingLogBusyStillExact(t *testing.T) {
	lim := Limit{Algorithm: SlidingLog, Rate: 2_000, Period: time.Second}
	s := NewMemoryStore(MemoryConfig{})
	step := lim.Period / time.Duration(2*lim.Rate)
	var admitted []time.Time
	for i := range 6 * lim.Rate {
		at := t0.Add(time.Duration(i) * step)
		if s.TakeAt(at, "k", 0, lim, 1).Allowed {
			admitted = append(admitted, at)
		}
	}
	// Every window (a-p, a] ending at an admission holds at most Rate.
	lo := 0
	for hi, a := range admitted {
		for !admitted[lo].After(a.Add(-lim.Period)) {
			lo++
		}
		if n := hi - lo + 1; n > int(lim.Rate) {
			t.Fatalf("%d admitted in the period up to %v, limit %d", n, a.Sub(t0), lim.Rate)
		}
	}
	want := 3 * int(lim.Rate)
	t.Logf("%d admitted in 3 periods at twice the rate", len(admitted))
	if len(admitted) < want*99/100 {
		t.Errorf("%d admitted in 3 periods at twice the rate, want at least %d", len(admitted), want*99/100)
	}
}
