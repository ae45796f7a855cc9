package detector

import (
	"math/rand/v2"
	"runtime"
	"strconv"
	"testing"
	"unsafe"

	"github.com/cespare/xxhash/v2"
)

// distinctKeys is how many distinct keys TestMemory sends: 10M, or 1M
// (one sub-window) under the race detector, where 10M would take minutes.
func distinctKeys() int {
	if raceEnabled {
		return 1_000_000
	}
	return 10_000_000
}

// TestMemory sends 10M distinct keys, 1M per sub-window, with 100 hot keys
// at 20T among them, and checks that the heap, detector included, grew by
// at most 8 MiB: the detector allocates its memory up front and copies only
// the keys that enter its table. The flood does not fill the table: the
// promotion threshold rises over the sketch's noise.
func TestMemory(t *testing.T) {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)

	s := newSim(t, DefaultConfig())
	r := rand.New(rand.NewPCG(7, 8))
	perStep := 1_000_000 / s.cfg.Steps
	buf := make([]byte, 0, 32)
	n := distinctKeys()
	for i := 0; i < n; i++ {
		buf = strconv.AppendInt(append(buf[:0], "distinct:"...), int64(i), 10)
		// Observe does not keep key, so it may alias buf. One stripe: the
		// count of keys in the table below depends on how the goroutine
		// moves between processors on a loaded machine, not the memory.
		s.d.observe(0, unsafe.String(unsafe.SliceData(buf), len(buf)), xxhash.Sum64(buf))
		if i%5 == 0 { // 100 hot keys, at 20T each
			buf = strconv.AppendInt(append(buf[:0], "hot:"...), int64(r.IntN(100)), 10)
			s.d.observe(0, unsafe.String(unsafe.SliceData(buf), len(buf)), xxhash.Sum64(buf))
		}
		if (i+1)%perStep == 0 {
			s.tick()
		}
	}
	hot := 0
	for _, ev := range s.events {
		if ev.Key[0] == 'h' && ev.Level == 64 {
			hot++
		}
	}

	runtime.GC()
	runtime.ReadMemStats(&after)
	grew := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	t.Logf("%d distinct keys: heap grew by %.2f MiB (detector included), %d keys in the table, %d hot keys at 64, promotion threshold %d",
		n, float64(grew)/(1<<20), len(s.d.live), hot, s.d.promoteAt.Load())
	if grew > 8<<20 {
		t.Errorf("heap grew by %.2f MiB, want at most 8", float64(grew)/(1<<20))
	}
	if hot != 100 {
		t.Errorf("%d hot keys stepped up to 64, want 100", hot)
	}
	// A distinct key whose estimate reaches P by collisions gets in, once in
	// about 10^5 here, and leaves after a window; the table never fills.
	if n := len(s.d.live); n > 200 || s.d.Rejected() > 0 {
		t.Errorf("%d keys in the table and %d rejected, want the 100 hot keys and at most 100 more", n, s.d.Rejected())
	}
	runtime.KeepAlive(s.d)
}

// TestObserveAllocs: Observe allocates nothing, for a key in the sketch
// only and for a key in the exact table.
func TestObserveAllocs(t *testing.T) {
	s := newSim(t, DefaultConfig())
	hot := newSource("hot")
	for range 1000 {
		s.d.Observe(hot.key, hot.hash)
	}
	if s.d.table.Load().find(hot.hash, s.d.hashes) < 0 {
		t.Fatal("hot key not in the table")
	}
	cold := newSource("cold")
	i := uint64(0)
	for _, tt := range []struct {
		name string
		f    func()
	}{
		{"cold key", func() { s.d.Observe(cold.key, cold.hash) }},
		{"distinct keys", func() { i++; s.d.Observe(cold.key, i*0x9e3779b97f4a7c15) }},
		{"key in the table", func() { s.d.Observe(hot.key, hot.hash) }},
	} {
		if n := testing.AllocsPerRun(1000, tt.f); n != 0 {
			t.Errorf("%s: %v allocations per Observe, want 0", tt.name, n)
		}
	}
}
