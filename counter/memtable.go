package counter

import (
	"math"
	"math/bits"
	"sync/atomic"
	"unsafe"
)

// A stripe's counters live in a table: open addressing with linear probing
// over an array of cells, each one cache line holding a key's
// identity and its counts inline. The array holds no pointers, so the
// garbage collector never scans it, and a decision on a present key touches
// one cache line of it. A sliding log's entries, the one variable-sized
// state, sit in a side slice that the cell indexes: a table holds at most
// as many logs as its limit of counters, each of at most maxLogEntries+1
// entries.
//
// A key is known by a 128-bit fingerprint: a hash of the key under a seed
// drawn when the store is made, and the caller's hash of it (see Hash)
// scrambled by a secret drawn then, which places it. Two keys share a
// counter only if both halves collide, about once in 2^108 stores of a
// million keys each; keys made to share a Hash, which is unseeded, still
// differ in the seeded half, which nobody can aim at. Holding no key bytes
// keeps a cell at one cache line, and the caller's key strings are not kept
// alive.

// maxLoad is the table's highest load, in eighths: beyond it, a table
// grows, to at most the cells that hold its limit at that load.
const maxLoad = 6

// cell is one counter: its fingerprint (id[0] == 0 marks an empty cell, so
// a fingerprint's first half is never 0), its counts, for a sliding log
// the index + 1 of its entries in table.logs (0: none), and the units it
// admitted into the store's tally since the last drain (see tally.go; 0:
// none, and then no tally entry names it).
type cell struct {
	id    [2]uint64
	cnt   counts
	log   int32
	tally uint32
}

// A cell is exactly one cache line: these fail to compile otherwise.
var (
	_ [64 - unsafe.Sizeof(cell{})]byte
	_ [unsafe.Sizeof(cell{}) - 64]byte
)

// table is one stripe's counters. It is guarded by its stripe's mutex.
type table struct {
	cells []cell
	span  *cellSpan // where cells are, for readers without the mutex; nil: none
	n     int       // live cells
	limit int       // the most live cells it may hold
	max   int       // the cells' length it may grow to: enough for limit within maxLoad
	logs  [][]logEntry
	free  []int32 // indexes of logs not in use
	// gen is the generation of the counter made last (counts.gen).
	gen uint32
	// soonest is at or before the expiry of every counter held (see
	// sweep): setState lowers it, sweep sets it.
	soonest int64
	refused uint64 // inserts refused by a full table (MemoryStore.Full)
	// tallies names the cells whose tally is above 0, one entry each, in
	// the order they were first tallied; it holds at most maxTallies.
	tallies    []tallyEntry
	maxTallies int
	// marks are the watermarks of ChargeTotals on the table's counters,
	// counted and capped by the store (see total.go); nil until the first.
	marks map[markID]mark
}

// cellSpan says where a table's cells are, for a reader that does not hold the
// stripe's mutex (MemoryStore.Prefetch): it may read a base and a length of
// two different arrays, or of one freed since, so it may only use them for
// a hint.
type cellSpan struct {
	base atomic.Uintptr
	n    atomic.Int64
}

// fingerprint makes a nonzero first half, as cell requires.
func fingerprint(h1, h2 uint64) [2]uint64 { return [2]uint64{h1 | 1, h2} }

// newTable returns a table for up to keys counters.
func newTable(keys int) table {
	return table{limit: keys, max: max(8, (keys*8+maxLoad-1)/maxLoad)}
}

// home is where id's probe sequence starts.
func (t *table) home(id [2]uint64) int { return homeIn(id, len(t.cells)) }

// homeIn is where id's probe sequence starts in n cells: the second half of
// the fingerprint, the placing one, scaled to them (its top bits; bits from
// 32 up pick the stripe).
func homeIn(id [2]uint64, n int) int {
	hi, _ := bits.Mul64(id[1], uint64(n))
	return int(hi)
}

// next is the cell after i, wrapping around.
func (t *table) next(i int) int {
	if i++; i == len(t.cells) {
		return 0
	}
	return i
}

// dist is how many cells from i forward j is, wrapping around.
func (t *table) dist(i, j int) int {
	if j < i {
		j += len(t.cells)
	}
	return j - i
}

// find returns the index of id's cell, or -1.
func (t *table) find(id [2]uint64) int {
	if len(t.cells) == 0 {
		return -1
	}
	for i := t.home(id); ; i = t.next(i) {
		c := &t.cells[i]
		if c.id == id {
			return i
		}
		if c.id[0] == 0 {
			return -1
		}
	}
}

// full reports whether the table holds its limit.
func (t *table) full() bool { return t.n >= t.limit }

// insert adds id with zero counts and returns its cell's index. id is not
// in the table, and the table is not full.
func (t *table) insert(id [2]uint64) int {
	if (t.n+1)*8 > len(t.cells)*maxLoad {
		t.grow()
	}
	t.n++
	t.gen++
	return t.place(cell{id: id, cnt: counts{gen: t.gen}})
}

// place puts c in the first free slot of its probe sequence.
func (t *table) place(c cell) int {
	i := t.home(c.id)
	for t.cells[i].id[0] != 0 {
		i = t.next(i)
	}
	t.cells[i] = c
	return i
}

// grow doubles the cells (to at most max), placing each live one anew.
func (t *table) grow() {
	old := t.cells
	t.cells = make([]cell, min(t.max, max(8, 2*len(old))))
	if t.span != nil {
		t.span.n.Store(0) // while the two are out of step
		t.span.base.Store(uintptr(unsafe.Pointer(&t.cells[0])))
		t.span.n.Store(int64(len(t.cells)))
	}
	for i := range old {
		if c := &old[i]; c.id[0] != 0 {
			t.place(*c)
		}
	}
}

// remove empties cell i and shifts back the cells after it that its
// emptiness would cut off from their probe start (backward-shift deletion:
// no tombstones, so lookups never slow with churn).
func (t *table) remove(i int) {
	t.freeLog(t.cells[i].log)
	t.n--
	for j := t.next(i); ; j = t.next(j) {
		c := &t.cells[j]
		if c.id[0] == 0 {
			break
		}
		// c may fill the hole at i unless its probe starts in (i, j].
		if t.dist(t.home(c.id), j) >= t.dist(i, j) {
			t.cells[i] = *c
			i = j
		}
	}
	t.cells[i] = cell{}
}

// state returns cell i's state, with its log.
func (t *table) state(i int) state {
	c := &t.cells[i]
	s := state{counts: c.cnt}
	if c.log > 0 {
		s.log = t.logs[c.log-1]
	}
	return s
}

// setState stores s into cell i, giving it a log if s has one and it had
// none.
func (t *table) setState(i int, s state) {
	c := &t.cells[i]
	c.cnt = s.counts
	t.soonest = min(t.soonest, s.expires)
	switch {
	case c.log > 0:
		t.logs[c.log-1] = s.log
	case s.log != nil:
		c.log = t.newLog(s.log)
	}
}

// newLog keeps log and returns its index + 1.
func (t *table) newLog(log []logEntry) int32 {
	if k := len(t.free); k > 0 {
		j := t.free[k-1]
		t.free = t.free[:k-1]
		t.logs[j] = log
		return j + 1
	}
	t.logs = append(t.logs, log)
	return int32(len(t.logs))
}

// reusableLog is the capacity of a log kept for the next counter when its
// own is dropped: larger ones go to the garbage collector.
const reusableLog = 32

// freeLog releases log index + 1 (0: none).
func (t *table) freeLog(log int32) {
	if log == 0 {
		return
	}
	if l := t.logs[log-1]; cap(l) <= reusableLog {
		t.logs[log-1] = l[:0]
	} else {
		t.logs[log-1] = nil
	}
	t.free = append(t.free, log-1)
}

// reset makes cell i a fresh counter, keeping its log's memory and its
// tally: units admitted before still go out at the next drain.
func (t *table) reset(i int) {
	c := &t.cells[i]
	t.gen++
	c.cnt = counts{gen: t.gen}
	if c.log > 0 {
		t.logs[c.log-1] = t.logs[c.log-1][:0]
	}
}

// sweep makes room if it can, and reports whether the table has room: if
// some counter may have expired by now (now is at or past soonest), it drops
// every expired counter and notes the soonest expiry of those left. A live
// counter is never dropped: a key that came back to a fresh counter would
// be admitted again. Nor is a tallied one, whose units the next drain reads
// from it: it counts in soonest only while live, and its drain lowers
// soonest to its expiry. Refused inserts cost no sweep until a counter
// expires or is drained.
func (t *table) sweep(now int64) bool {
	if now < t.soonest {
		return !t.full()
	}
	soonest := int64(math.MaxInt64)
	for i := 0; i < len(t.cells); {
		// A removal may shift a later cell into i (check it next) or a
		// cell from the start to the end (checked twice: harmless).
		if c := &t.cells[i]; c.id[0] != 0 {
			switch {
			case c.cnt.expires > now:
				soonest = min(soonest, c.cnt.expires)
			case c.tally == 0:
				t.remove(i)
				continue
			}
		}
		i++
	}
	t.soonest = soonest
	return !t.full()
}
