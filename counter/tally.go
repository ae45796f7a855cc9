package counter

import (
	"math"
	"time"
)

// A store made with MemoryConfig.TallyKeys keeps a tally: the units each
// key admitted through TakeTallied since the last DrainTally, for a caller
// that hands them on (gossip sends them to its peers). The units are
// counted in the key's own cell (cell.tally), so a tallied decision touches
// nothing the decision does not; a stripe's list of tallied cells
// (table.tallies) names each of them once, with its key and the caller's
// limit, and is appended to only by the first tallied admission of a key
// since the last drain. A tallied cell is not dropped (see sweep) until a
// drain has read it, so no unit is lost; a drain reads and zeroes each
// under its stripe's lock, so none is read twice.

// tallyEntry names a cell with a tally: its fingerprint, and the key and
// limit of the admission that made it.
type tallyEntry struct {
	id         [2]uint64
	key, limit string
}

// TakeTallied is TakeAt that, when it admits, adds the n units to key's
// tally under limit, an identity of lim opaque to the store, to go out at
// the next DrainTally. tallied reports whether the tally holds them: false
// when the store keeps no tally, when key's stripe holds its share of
// TallyKeys tallied keys already, or when the key's tally would pass
// 2^32-1 units; the caller then keeps the units itself. It is true when
// nothing was admitted.
//
// A key's tally is drained under the limit of its first tallied admission
// since the last drain: units admitted under another limit before the
// drain go out under that one. A unit is a unit under every limit of an
// algorithm (a token bucket reads a debt in units, see takeGCRA), so this
// matters only when a key's algorithm or window changes within one round.
func (s *MemoryStore) TakeTallied(now time.Time, key string, hash uint64, lim Limit, n int64, limit string) (res Result, tallied bool) {
	return s.take(s.nanos(now), key, hash, lim, n, true, limit)
}

// tallyLocked adds n units to cell i's tally, naming the cell in the list
// under key and limit if its tally was 0. It reports whether it had room:
// in the list, and in the cell's uint32.
func (t *table) tallyLocked(i int, key, limit string, n int64) bool {
	c := &t.cells[i]
	if n <= 0 || n > math.MaxUint32-int64(c.tally) {
		return false
	}
	if c.tally == 0 {
		if len(t.tallies) >= t.maxTallies {
			return false
		}
		t.tallies = append(t.tallies, tallyEntry{id: c.id, key: key, limit: limit})
	}
	c.tally += uint32(n)
	return true
}

// DrainTally calls f with every key's tally since the last drain (see
// TakeTallied) and empties the tally: units, above 0, under the limit of
// the key's first tallied admission. It drains one stripe at a time under
// the stripe's lock, calling f with it held: f must not use the store. A
// TakeTallied during the call is drained by it or by the next one, never
// both.
func (s *MemoryStore) DrainTally(f func(limit, key string, units int64)) {
	for i := range s.stripes {
		st := &s.stripes[i]
		st.mu.Lock()
		st.t.drainTallyLocked(f)
		st.mu.Unlock()
	}
}

// drainTallyLocked hands f each listed cell's tally and zeroes it, and
// empties the list, keeping its room and letting go of its strings. A
// drained cell counts in soonest again: sweep passed it over.
func (t *table) drainTallyLocked(f func(limit, key string, units int64)) {
	for k := range t.tallies {
		e := &t.tallies[k]
		i := t.find(e.id) // a tallied cell is never removed
		if i < 0 {
			continue
		}
		c := &t.cells[i]
		f(e.limit, e.key, int64(c.tally))
		c.tally = 0
		t.soonest = min(t.soonest, c.cnt.expires)
	}
	clear(t.tallies)
	t.tallies = t.tallies[:0]
}
