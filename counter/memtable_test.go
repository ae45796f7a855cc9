package counter

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"
	"unsafe"
)

// TestTableAgainstMap runs random inserts, updates, removals and evictions on
// tables of several sizes against a map, and checks after each step that
// every key the map holds is found with its counts and no other is: so
// backward-shift removal never cuts a key off its probe sequence, growth
// keeps every key, and the limit holds.
func TestTableAgainstMap(t *testing.T) {
	for _, limit := range []int{1, 2, 7, 64, 200} {
		t.Run(fmt.Sprint(limit), func(t *testing.T) {
			r := rand.New(rand.NewPCG(uint64(limit), 1))
			tb := newTable(limit)
			model := map[[2]uint64]counts{}
			// Few distinct ids, half of them with homes at the first, the
			// middle or the last cells, so probe runs are long and wrap
			// around the end.
			ids := make([][2]uint64, 2*limit+5)
			for i := range ids {
				h := r.Uint64()
				if i%2 == 0 {
					h = []uint64{0, 1 << 63, ^uint64(0)}[r.IntN(3)] ^ r.Uint64N(1<<56)
				}
				ids[i] = fingerprint(r.Uint64(), h)
			}
			for step := range 10_000 {
				id := ids[r.IntN(len(ids))]
				now := int64(step)
				switch i := tb.find(id); {
				case i >= 0 && r.IntN(3) == 0:
					tb.remove(i)
					delete(model, id)
				case i >= 0:
					c := tb.cells[i].cnt
					c.b++
					c.expires = now + r.Int64N(50)
					tb.setState(i, state{counts: c})
					model[id] = c
				default:
					if tb.full() {
						expired := 0
						for _, c := range model {
							if c.expires <= now {
								expired++
							}
						}
						room := tb.sweep(now)
						for k, c := range model { // the model forgets what the table did
							switch {
							case tb.find(k) >= 0 && c.expires <= now:
								t.Fatalf("step %d: an expired counter survived the sweep", step)
							case tb.find(k) < 0 && c.expires > now:
								t.Fatalf("step %d: a live counter was dropped", step)
							case tb.find(k) < 0:
								delete(model, k)
							}
						}
						if room != (expired > 0) {
							t.Fatalf("step %d: sweep reported room %v with %d expired", step, room, expired)
						}
						if !room {
							break
						}
					}
					i := tb.insert(id)
					tb.setState(i, state{counts: counts{b: 1, expires: now + r.Int64N(50)}})
					model[id] = tb.cells[i].cnt
				}
				if tb.n != len(model) || tb.n > limit || len(tb.cells) > tb.max {
					t.Fatalf("step %d: table holds %d in %d cells (max %d), model %d, limit %d", step, tb.n, len(tb.cells), tb.max, len(model), limit)
				}
				for _, k := range ids {
					i := tb.find(k)
					c, ok := model[k]
					if ok != (i >= 0) || ok && tb.cells[i].cnt != c {
						t.Fatalf("step %d: %x found at %d, model has %v %+v", step, k, i, ok, c)
					}
				}
			}
		})
	}
}

// TestTableSweepKeepsLive: a sweep of a full table drops the expired
// counters only, notes when the soonest live one expires, and sweeps no
// more before then.
func TestTableSweepKeepsLive(t *testing.T) {
	tb := newTable(8)
	for i := range 8 {
		c := tb.insert(fingerprint(uint64(i+1)<<8, uint64(i)<<60))
		tb.setState(c, state{counts: counts{expires: int64(100 + i)}})
	}
	for _, tt := range []struct {
		give     int64
		wantRoom bool
		wantN    int
		wantNext int64
	}{
		{give: 0, wantRoom: false, wantN: 8, wantNext: 100},
		{give: 99, wantRoom: false, wantN: 8, wantNext: 100},
		{give: 101, wantRoom: true, wantN: 6, wantNext: 102},
	} {
		if room := tb.sweep(tt.give); room != tt.wantRoom || tb.n != tt.wantN || tb.soonest != tt.wantNext {
			t.Errorf("sweep(%d): room %v, %d held, soonest %d; want %v, %d, %d",
				tt.give, room, tb.n, tb.soonest, tt.wantRoom, tt.wantN, tt.wantNext)
		}
	}
}

// TestMemorySlidingLogsReused: counters with sliding logs that expire and
// are evicted hand their logs on, and a log never passes to a counter with
// its entries.
func TestMemorySlidingLogsReused(t *testing.T) {
	s := NewMemoryStore(MemoryConfig{MaxKeys: 16, Stripes: 1})
	lim := Limit{Algorithm: SlidingLog, Rate: 3, Period: time.Second}
	at := t0
	for round := range 50 {
		for k := range 16 {
			key := fmt.Sprintf("r%dk%d", round, k)
			for n := range 4 {
				r := s.TakeAt(at, key, 0, lim, 1)
				if r.Allowed != (n < 3) {
					t.Fatalf("%s take %d: %+v", key, n+1, r)
				}
			}
		}
		at = at.Add(2 * time.Second)
	}
	st := &s.stripes[0]
	if len(st.t.logs) > 16 {
		t.Errorf("%d logs for 16 counters: dropped logs are not reused", len(st.t.logs))
	}
}

// TestMemoryStoreAgainstMaps drives many keys through the store and through
// one state per key kept in a map, at one instant sequence, and wants the
// same answers: the table finds each key's own counts.
func TestMemoryStoreAgainstMaps(t *testing.T) {
	s := NewMemoryStore(MemoryConfig{MaxKeys: 1 << 12, Stripes: 4})
	model := map[string]*state{}
	r := rand.New(rand.NewPCG(3, 4))
	lims := []Limit{
		{Rate: 5, Period: time.Second},
		{Algorithm: SlidingWindow, Rate: 5, Period: time.Second},
		{Algorithm: FixedWindow, Rate: 5, Period: time.Second},
		{Algorithm: SlidingLog, Rate: 5, Period: time.Second},
	}
	at := t0
	for step := range 50_000 {
		at = at.Add(time.Duration(r.IntN(200)) * time.Microsecond)
		key := fmt.Sprintf("k%d", r.IntN(2000))
		lim := lims[len(key)%len(lims)]
		n := 1 + r.Int64N(2)
		got := s.TakeAt(at, key, 0, lim, n)
		m := model[key]
		now := s.nanos(at)
		if m == nil || m.expires <= now {
			m = &state{}
			model[key] = m
		}
		if want := m.take(now, lim, n); got != want {
			t.Fatalf("step %d, %s (%v): store %+v, model %+v", step, key, lim.Algorithm, got, want)
		}
	}
}

// TestPrefetchDuringGrowth: Prefetch reads where each stripe's cells are
// without the stripe's lock while other goroutines grow the tables (the race
// detector checks that it reads only what may be read so), it changes no
// decision, and once the tables stop growing each stripe's span names its
// cells.
func TestPrefetchDuringGrowth(t *testing.T) {
	lim := Limit{Algorithm: FixedWindow, Rate: 2, Period: time.Hour}
	s := NewMemoryStore(MemoryConfig{MaxKeys: 1 << 14, Stripes: 4})
	key := func(i int) string { return fmt.Sprintf("k%d", i) }
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
				s.Prefetch(Hash(key(i % (1 << 14))))
			}
		}
	}()
	for i := range 1 << 13 {
		for n := range 3 {
			if r := s.TakeAt(t0, key(i), 0, lim, 1); r.Allowed != (n < 2) {
				close(stop)
				t.Fatalf("%s take %d: %+v", key(i), n+1, r)
			}
		}
	}
	close(stop)
	<-done
	for i := range s.stripes {
		st, sp := &s.stripes[i], &s.spans[i]
		if len(st.t.cells) == 0 {
			continue
		}
		if base, n := sp.base.Load(), sp.n.Load(); base != uintptr(unsafe.Pointer(&st.t.cells[0])) || n != int64(len(st.t.cells)) {
			t.Errorf("stripe %d: span %#x+%d, cells at %p+%d", i, base, n, &st.t.cells[0], len(st.t.cells))
		}
	}
	if got := s.Len(); got != 1<<13 {
		t.Errorf("Len %d, want %d", got, 1<<13)
	}
}
