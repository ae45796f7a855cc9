package counter

import (
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"testing"
	"time"
)

// drain returns s's tally by key, failing on a key drained twice or with
// no units.
func drain(t *testing.T, s *MemoryStore) map[string]int64 {
	t.Helper()
	out := map[string]int64{}
	s.DrainTally(func(limit, key string, units int64) {
		if _, ok := out[key]; ok || units <= 0 || limit != "L" {
			t.Errorf("drained %q under %q with %d units (seen before: %v)", key, limit, units, ok)
		}
		out[key] = units
	})
	return out
}

// tallied is TakeTallied under limit "L", failing on a denial.
func tallied(t *testing.T, s *MemoryStore, now time.Time, key string, lim Limit, n int64) bool {
	t.Helper()
	r, ok := s.TakeTallied(now, key, 0, lim, n, "L")
	if !r.Allowed {
		t.Fatalf("take of %d on %q denied", n, key)
	}
	return ok
}

var hourly = Limit{Algorithm: FixedWindow, Rate: 1 << 40, Period: time.Hour}

// TestTallyAcrossGrow: a key's tally survives its table growing, key by
// key, from 8 cells to thousands.
func TestTallyAcrossGrow(t *testing.T) {
	s := NewMemoryStore(MemoryConfig{MaxKeys: 4096, Stripes: 1, TallyKeys: 4096})
	const keys = 3000
	for i := range keys {
		for k := 0; k <= i; k += 500 { // every key already held gets more
			if !tallied(t, s, t0, fmt.Sprintf("k%d", k), hourly, 1) {
				t.Fatalf("take %d on k%d not tallied", i, k)
			}
		}
		tallied(t, s, t0, fmt.Sprintf("k%d", i), hourly, 2)
	}
	got := drain(t, s)
	lost := 0
	for i := range keys {
		want := int64(2)
		if i%500 == 0 {
			want += int64(keys - i)
		}
		if got[fmt.Sprintf("k%d", i)] != want {
			lost++
		}
	}
	if len(got) != keys || lost > 0 {
		t.Errorf("drained %d keys, %d of %d with other units than admitted", len(got), lost, keys)
	}
}

// TestTallyAcrossReset: a counter that expired and starts fresh keeps
// the units it admitted before in the round, and is named once.
func TestTallyAcrossReset(t *testing.T) {
	s := NewMemoryStore(MemoryConfig{MaxKeys: 16, Stripes: 1, TallyKeys: 8})
	lim := Limit{Algorithm: FixedWindow, Rate: 10, Period: time.Second}
	tallied(t, s, t0, "k", lim, 7)
	tallied(t, s, t0.Add(3*time.Second), "k", lim, 10) // expired: a fresh counter
	if got := drain(t, s); len(got) != 1 || got["k"] != 17 {
		t.Errorf("drained %v, want k: 17", got)
	}
}

// TestTallySweepKeepsTallied: a full stripe's sweep drops expired counters
// but not tallied ones, whose units the next drain hands out; once drained
// they make room at the next sweep, and while they are held a refusal
// waits for the untallied counter's expiry.
func TestTallySweepKeepsTallied(t *testing.T) {
	s := NewMemoryStore(MemoryConfig{MaxKeys: 4, Stripes: 1, TallyKeys: 4}) // 3 tallied at most
	short := Limit{Algorithm: FixedWindow, Rate: 10, Period: time.Second}
	long := Limit{Algorithm: FixedWindow, Rate: 10, Period: time.Hour}
	for i := range 3 {
		tallied(t, s, t0, fmt.Sprintf("t%d", i), short, int64(i+1))
	}
	if tallied(t, s, t0, "live", long, 1) {
		t.Fatal("a fourth key tallied past the cap of 3")
	}
	// Two seconds on, the tallied counters expired: still held.
	later := t0.Add(2 * time.Second)
	r, _ := s.TakeTallied(later, "new", 0, short, 1, "L")
	if r.Allowed || r.RetryAfter <= 0 || r.RetryAfter > time.Hour {
		t.Errorf("take of a new key in a stripe of tallied and live counters: %+v, want refused until the live one expires", r)
	}
	if got := drain(t, s); len(got) != 3 || got["t0"] != 1 || got["t1"] != 2 || got["t2"] != 3 {
		t.Errorf("drained %v, want t0: 1, t1: 2, t2: 3", got)
	}
	// Drained, they make room.
	if r, _ := s.TakeTallied(later, "new", 0, short, 1, "L"); !r.Allowed {
		t.Errorf("take of a new key after the drain: %+v, want admitted", r)
	}
}

// TestTallyTableSweep: a table's sweep never removes a cell with a tally,
// and a sweep after its drain does.
func TestTallyTableSweep(t *testing.T) {
	tb := newTable(8)
	tb.maxTallies = 8
	for i := range 8 {
		c := tb.insert(fingerprint(uint64(i+1)<<8, uint64(i)<<60))
		tb.setState(c, state{counts: counts{expires: 100}})
		if i%2 == 0 && !tb.tallyLocked(c, fmt.Sprint(i), "L", int64(i+1)) {
			t.Fatal("tally refused")
		}
	}
	if room := tb.sweep(200); !room || tb.n != 4 || tb.soonest != math.MaxInt64 {
		t.Errorf("sweep: room %v, %d held, soonest %d; want room, 4 held, none due", room, tb.n, tb.soonest)
	}
	var sum int64
	tb.drainTallyLocked(func(_, _ string, units int64) { sum += units })
	if sum != 1+3+5+7 || tb.soonest != 100 {
		t.Errorf("drained %d units, soonest %d; want 16, 100", sum, tb.soonest)
	}
	if tb.sweep(200); tb.n != 0 {
		t.Errorf("%d held after a sweep of drained counters, want 0", tb.n)
	}
}

// TestTallyOverflow: a key's tally holds up to 2^32-1 units; a take past
// that is admitted but not tallied, and the tally keeps what it held.
func TestTallyOverflow(t *testing.T) {
	s := NewMemoryStore(MemoryConfig{MaxKeys: 16, Stripes: 1, TallyKeys: 8})
	for _, tt := range []struct {
		give int64
		want bool
	}{
		{give: 1 << 33, want: false},
		{give: math.MaxUint32 - 1, want: true},
		{give: 1, want: true},
		{give: 1, want: false},
	} {
		if got := tallied(t, s, t0, "k", hourly, tt.give); got != tt.want {
			t.Errorf("take of %d tallied %v, want %v", tt.give, got, tt.want)
		}
	}
	if got := drain(t, s); got["k"] != math.MaxUint32 {
		t.Errorf("drained %d, want %d", got["k"], uint32(math.MaxUint32))
	}
}

// TestTallyCap: a stripe names at most its share of TallyKeys keys; held
// keys still add, and a drain makes room. A store without TallyKeys
// tallies nothing.
func TestTallyCap(t *testing.T) {
	s := NewMemoryStore(MemoryConfig{MaxKeys: 100, Stripes: 1, TallyKeys: 10})
	for i := range 12 {
		if got := tallied(t, s, t0, fmt.Sprint(i), hourly, 1); got != (i < 10) {
			t.Errorf("key %d tallied %v, want %v", i, got, i < 10)
		}
	}
	if !tallied(t, s, t0, "0", hourly, 1) {
		t.Error("a held key's take not tallied")
	}
	if got := drain(t, s); len(got) != 10 || got["0"] != 2 {
		t.Errorf("drained %d keys, key 0 %d units; want 10 keys, 2 units", len(got), got["0"])
	}
	if !tallied(t, s, t0, "11", hourly, 1) {
		t.Error("no room after a drain")
	}
	plain := NewMemoryStore(MemoryConfig{MaxKeys: 100, Stripes: 1})
	if tallied(t, plain, t0, "k", hourly, 1) {
		t.Error("a store without TallyKeys tallied")
	}
}

// TestTallyDrainEmpties: a drain empties the tally, lets go of its
// strings and keeps its room; the next drain has nothing.
func TestTallyDrainEmpties(t *testing.T) {
	s := NewMemoryStore(MemoryConfig{MaxKeys: 100, Stripes: 1, TallyKeys: 50})
	for i := range 20 {
		tallied(t, s, t0, fmt.Sprint(i), hourly, 1)
	}
	if got := drain(t, s); len(got) != 20 {
		t.Fatalf("drained %d keys, want 20", len(got))
	}
	tb := &s.stripes[0].t
	if len(tb.tallies) != 0 || cap(tb.tallies) < 20 {
		t.Errorf("tally list of %d, room %d; want empty, room for 20", len(tb.tallies), cap(tb.tallies))
	}
	for _, e := range tb.tallies[:cap(tb.tallies)] {
		if e != (tallyEntry{}) {
			t.Fatalf("drained list holds %+v", e)
		}
	}
	for i := range tb.cells {
		if tb.cells[i].tally != 0 {
			t.Fatalf("cell %d holds a tally of %d after the drain", i, tb.cells[i].tally)
		}
	}
	if got := drain(t, s); len(got) != 0 {
		t.Errorf("second drain: %v, want nothing", got)
	}
}

// TestTallyConcurrent: goroutines taking on shared keys while another
// drains: the units drained add up to the units tallied, exactly.
func TestTallyConcurrent(t *testing.T) {
	s := NewMemoryStore(MemoryConfig{MaxKeys: 1024, Stripes: 4, TallyKeys: 256})
	const workers, takes, keys = 4, 5000, 100
	var drained int64 // the drainer's, then the test's
	stop, done := make(chan struct{}), make(chan struct{})
	add := func(_, _ string, units int64) { drained += units }
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
				s.DrainTally(add)
			}
		}
	}()
	var wg sync.WaitGroup
	sums := make([]int64, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(w), 7))
			for range takes {
				n := 1 + r.Int64N(3)
				res, ok := s.TakeTallied(t0, fmt.Sprint(r.IntN(keys)), 0, hourly, n, "L")
				if !res.Allowed || !ok {
					t.Errorf("take of %d: admitted %v, tallied %v", n, res.Allowed, ok)
					return
				}
				sums[w] += n
			}
		}()
	}
	wg.Wait()
	close(stop)
	<-done
	s.DrainTally(add)
	var want int64
	for _, n := range sums {
		want += n
	}
	if drained != want {
		t.Errorf("drained %d units, tallied %d", drained, want)
	}
}

// TestTallyDoesNotAllocate: a tallied take on a held key, or on a key new
// to a tally whose list has had room since a drain, allocates nothing.
func TestTallyDoesNotAllocate(t *testing.T) {
	s := NewMemoryStore(MemoryConfig{MaxKeys: 100, Stripes: 1, TallyKeys: 50})
	keys := []string{"a", "b", "c"}
	for _, k := range keys {
		tallied(t, s, t0, k, hourly, 1)
	}
	s.DrainTally(func(_, _ string, _ int64) {})
	allocs := testing.AllocsPerRun(100, func() {
		for _, k := range keys {
			s.TakeTallied(t0, k, 0, hourly, 1, "L")
		}
	})
	if allocs != 0 {
		t.Errorf("%v allocations a run, want 0", allocs)
	}
}
