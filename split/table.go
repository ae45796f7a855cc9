package split

import (
	"context"
	"errors"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hotkeyd/hotkey/counter"
	"github.com/hotkeyd/hotkey/shard"
)

// A Mover is the store's side of a move: it carries the usage of e's key
// from the counters from, written under fromLim, to the counters to, under
// lim. Seeding never lowers a counter.
type Mover interface {
	Move(ctx context.Context, e *Entry, from, to Counters, fromLim, lim counter.Limit) error
}

// A Placer gives the store's current placement.
type Placer interface{ Placement() shard.Placement }

// A Sharer reports whether other engines decide on the store too.
type Sharer interface{ Shared() bool }

// Config configures a Table. The zero value is a table without a cap whose
// keys' usage never moves, on one node.
type Config struct {
	// MaxKeys caps the keys split at once; ≤ 0: no cap.
	MaxKeys int
	// Mover moves a key's usage when its level or placement changes; nil:
	// decisions take from the counters their level fits, and nothing moves.
	Mover Mover
	// Placer gives the placement counters are named under; nil: one node.
	Placer Placer
	// MinShare is the smallest rate a subcounter enforces (see shard.Fit).
	MinShare int64
	// Sharer says whether other engines decide on the store; nil: none do.
	Sharer Sharer
	// Static splits every key at this level (4, 16 or 64) when it is not
	// in the table, the baseline adaptive splitting is measured against;
	// 0 or 1: keys out of the table are unsplit.
	Static shard.Level
}

// moveStripes is the number of stripes of Table.moves.
const moveStripes = 4096

// Table is the set of split keys, and the gate between the decisions on a
// key and the moves of its usage. Reads take no lock: the map is replaced
// whole (copy on write) behind an atomic pointer, since it is read on every
// decision and written only when a key changes level. Safe for concurrent
// use; the zero value is not usable: call NewTable.
type Table struct {
	_ [64]byte // off the cache line of whatever the allocator puts before
	// m is nil while the table is empty, so that a decision on a key that
	// is not split (nearly all) costs one load of this line.
	m atomic.Pointer[map[uint64]*Entry]
	// moves counts, per stripe of hashes, the moves off unsplit counters
	// (nil without a Mover): see Moved.
	moves []atomic.Uint32
	// static holds the entries of keys out of the table under a static
	// split, direct-mapped by hash (nil without one).
	static []atomic.Pointer[Entry]
	floor  shard.Level
	mover  Mover
	placer Placer
	sharer Sharer
	share  int64
	mu     sync.Mutex // serialises writers
	// placeV is the version of the placement last noted on every entry
	// (see placement); placeMu serialises the noting.
	placeV  atomic.Uint64
	placeMu sync.Mutex
	max     int
	parked  int // entries parked (see Park), not counted against max; under mu
}

// NewTable returns an empty table configured by c.
func NewTable(c Config) *Table {
	t := &Table{max: c.MaxKeys, mover: c.Mover, placer: c.Placer, sharer: c.Sharer, share: c.MinShare, floor: shard.Level1}
	if c.Mover != nil {
		t.moves = make([]atomic.Uint32, moveStripes)
	}
	if c.Static.Split() {
		t.static = make([]atomic.Pointer[Entry], staticEntries)
		t.floor = c.Static
	}
	return t
}

// Gen returns the count of moves off the unsplit counters of the stripe of
// hash, for Moved.
func (t *Table) Gen(hash uint64) uint32 {
	if t.moves == nil {
		return 0
	}
	return t.moves[hash&(moveStripes-1)].Load()
}

// Moved reports whether a move off an unsplit counter of the stripe of hash
// began since Gen returned gen. A decision that read gen, then found its key
// unsplit (Lookup) and took from the unsplit counter, and sees Moved, must be
// made again where the usage is now: its unit may have landed after the
// move read the counter. A move begins only once the key is in the table,
// so a move that Moved does not see read the counter after the take.
func (t *Table) Moved(hash uint64, gen uint32) bool {
	return t.moves != nil && t.moves[hash&(moveStripes-1)].Load() != gen
}

// placement returns the store's current placement. One whose version is
// not the last noted is noted on every entry first (NotePlacement): from
// now on other instances may name any split key's counters under it, and a
// later move of a key this instance made no decision on meanwhile must read
// them there too. The check costs a load per call.
func (t *Table) placement() shard.Placement {
	if t.placer == nil {
		return nil
	}
	p := t.placer.Placement()
	if p != nil && t.placeV.Load() != p.Version() {
		t.notePlacement(p)
	}
	return p
}

// notePlacement notes p on every entry, in the table and kept out of it.
func (t *Table) notePlacement(p shard.Placement) {
	t.placeMu.Lock()
	defer t.placeMu.Unlock()
	if t.placeV.Load() == p.Version() {
		return
	}
	for _, e := range t.load() {
		e.NotePlacement(p)
	}
	for i := range t.static {
		if e := t.static[i].Load(); e != nil {
			e.NotePlacement(p)
		}
	}
	t.placeV.Store(p.Version())
}

// Enter lets a decision under lim on e in, and returns the counters it is to
// take from; the caller calls Exit once its take is done. They are those of
// e's level that lim's shares fit (shard.Fit, a cost of 1) under the store's
// placement, and Enter moves e's usage to them first, under the limit of the
// decision before. While a move is under way it waits. When the store has no
// room for those counters (an error wrapping counter.ErrFull), the decision
// takes from the counters that hold the usage, unless other engines decide
// on the store: then, as on any other failed move, Enter returns the error
// and lets nothing in.
func (t *Table) Enter(ctx context.Context, e *Entry, lim counter.Limit) (Counters, error) {
	prev := e.decided(lim)
	capacity := lim.Capacity()
	for {
		to := Counters{shard.Fit(e.Level(), lim.Rate, capacity, t.share, 1), t.placement()}
		if t.mover == nil {
			return to, nil
		}
		if !e.Holds(to.Level, to.P) {
			err := t.Transfer(ctx, e, to, prev, lim)
			if errors.Is(err, counter.ErrFull) {
				if t.sharer != nil && t.sharer.Shared() {
					return Counters{}, err
				}
				if held, ok := e.enterHeld(); ok {
					return held, nil
				}
				e.awaitMove()
				continue
			}
			if err != nil {
				return Counters{}, err
			}
		}
		if e.enter(to) {
			return to, nil
		}
		e.awaitMove() // another level or placement is being moved to
	}
}

// Exit ends a decision on e that Enter let in.
func (t *Table) Exit(e *Entry) {
	if t.mover != nil {
		e.inflight.Add(-1)
	}
}

// enter lets a decision on the counters at in, if they hold the key's usage
// and no move is under way. enter and Transfer pair as a Dekker lock on
// inflight and moving: either the move sees the decision and waits for it,
// or the decision sees the move and does not take from counters being read.
func (e *Entry) enter(at Counters) bool {
	e.inflight.Add(1)
	if e.moving.Load() || !e.Holds(at.Level, at.P) {
		e.inflight.Add(-1)
		return false
	}
	return true
}

// enterHeld is enter on the counters that hold the key's usage, whatever
// levels the key was set to since: for a decision while the move to its
// level cannot be made. It reports false while a move is under way.
func (e *Entry) enterHeld() (Counters, bool) {
	e.inflight.Add(1)
	if e.moving.Load() {
		e.inflight.Add(-1)
		return Counters{}, false
	}
	return *e.held.Load(), true
}

// awaitMove returns once no move of the key is under way.
func (e *Entry) awaitMove() {
	e.mu.Lock()
	e.mu.Unlock() //nolint:staticcheck // an empty critical section: a wait
}

// Transfer moves e's usage, written under fromLim, to the counters to under
// lim, once: if they do not hold it, it waits for the decisions let in to
// leave, lets no other in, and has the Mover read each of the counters Plan
// names. Concurrent callers wait for the one that moves. A failed move is
// returned and leaves the usage where it was, to be tried again. Without a
// Mover it does nothing.
func (t *Table) Transfer(ctx context.Context, e *Entry, to Counters, fromLim, lim counter.Limit) error {
	if t.mover == nil || e.Holds(to.Level, to.P) {
		return nil
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.Holds(to.Level, to.P) {
		return nil
	}
	e.moving.Store(true)
	defer e.moving.Store(false)
	for spins := 0; e.inflight.Load() > 0; spins++ {
		// Decisions in flight finish within a store call.
		if spins < 16 {
			runtime.Gosched()
		} else {
			time.Sleep(20 * time.Microsecond)
		}
	}
	visited := Levels(e.visited.Load())
	e.placesMu.Lock()
	places := slices.Clone(e.places)
	e.placesMu.Unlock()
	for _, from := range Plan(*e.held.Load(), visited, places, to) {
		if from.Level == shard.Level1 {
			t.moves[e.Hash&(moveStripes-1)].Add(1) // before the read: see Moved
		}
		if err := t.mover.Move(ctx, e, from, to, fromLim, lim); err != nil {
			return err
		}
	}
	e.held.Store(&to)
	e.NotePlacement(to.P)
	// The levels read are done with; one set meanwhile stays.
	e.visited.And(^uint32(visited &^ bit(to.Level)))
	return nil
}

// load returns the map of split keys (nil when there are none).
func (t *Table) load() map[uint64]*Entry {
	if m := t.m.Load(); m != nil {
		return *m
	}
	return nil
}

// store makes m the map of split keys.
func (t *Table) store(m map[uint64]*Entry) {
	if len(m) == 0 {
		t.m.Store(nil)
		return
	}
	t.m.Store(&m)
}

// Lookup returns the entry of key (with hash), or nil if the key is not split.
func (t *Table) Lookup(key string, hash uint64) *Entry {
	p := t.m.Load()
	if p == nil {
		return nil
	}
	if e := (*p)[hash]; e != nil && e.Key == key {
		return e
	}
	return nil
}

// Find returns the split state of key (with hash): its entry in the table,
// or under a static split the entry of a key out of it (made if need be);
// nil if the key is not split.
func (t *Table) Find(key string, hash uint64) *Entry {
	if t.static != nil {
		return t.findStatic(key, hash)
	}
	return t.Lookup(key, hash)
}

// findStatic is Find under a static split.
func (t *Table) findStatic(key string, hash uint64) *Entry {
	if e := t.Lookup(key, hash); e != nil {
		return e
	}
	if e := t.outside(key, hash); e != nil {
		return e
	}
	e := NewEntry(key, hash, t.floor, t.floor, t.placement())
	t.static[hash&(staticEntries-1)].Store(e)
	return e
}

// Known is Find without making an entry: the split state kept of key, or
// nil.
func (t *Table) Known(key string, hash uint64) *Entry {
	if e := t.Lookup(key, hash); e != nil || t.static == nil {
		return e
	}
	return t.outside(key, hash)
}

// outside returns the entry kept of key out of the table under a static
// split, or nil.
func (t *Table) outside(key string, hash uint64) *Entry {
	if e := t.static[hash&(staticEntries-1)].Load(); e != nil && e.Hash == hash && e.Key == key {
		return e
	}
	return nil
}

// Outside returns the level and placement whose counters hold the usage of
// key when it is not in the table: under a static split, where its kept
// entry holds it (the static level, or another a move left it at), else the
// unsplit counter.
func (t *Table) Outside(key string, hash uint64) (shard.Level, shard.Placement) {
	if t.static == nil {
		return shard.Level1, nil
	}
	if e := t.outside(key, hash); e != nil {
		return e.HeldAt()
	}
	return t.floor, t.placement()
}

// Floor returns the level of a key out of the table: the static split's,
// else 1.
func (t *Table) Floor() shard.Level { return t.floor }

// staticEntries bounds the entries kept of keys out of the table under a
// static split.
const staticEntries = 1 << 16

// RemoveMerged takes e out of the table if it is merged (at level 1) and its
// usage is back on the unsplit counter, and reports whether it did.
func (t *Table) RemoveMerged(e *Entry) bool {
	return e.Level() == shard.Level1 && (t.mover == nil || e.Holds(shard.Level1, nil)) && t.Remove(e, shard.Level1)
}

// Set splits key at level, or changes its level if it is already split. A
// key new to the table gets an entry whose usage is held at level held
// under placement p. It reports false, changing nothing, when the table is
// full or level is not a valid level above 1.
func (t *Table) Set(key string, hash uint64, level, held shard.Level, p shard.Placement) bool {
	if !level.Split() {
		return false
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	old := t.load()
	if e := old[hash]; e != nil {
		if e.Key != key {
			return false // a 64-bit hash collision: the first key keeps the slot
		}
		if e.parked.Load() && t.max > 0 && len(old)-t.parked >= t.max {
			return false // split again, a parked key takes room as a new one
		}
		t.unparkLocked(e)
		e.SetLevel(level)
		return true
	}
	if t.max > 0 && len(old)-t.parked >= t.max {
		return false
	}
	m := make(map[uint64]*Entry, len(old)+1)
	for h, e := range old {
		m[h] = e
	}
	m[hash] = NewEntry(key, hash, level, held, p)
	t.store(m)
	return true
}

// Merge marks key to be merged back: its entry stays, at level 1, until its
// usage is back on the unsplit counter and Remove takes it out. It reports
// whether key was in the table.
func (t *Table) Merge(key string, hash uint64) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if e := t.load()[hash]; e != nil && e.Key == key {
		e.SetLevel(shard.Level1)
		return true
	}
	return false
}

// Remove takes e out of the table if e is still the entry of its key and is
// at level (no raise came meanwhile). It reports whether it did.
func (t *Table) Remove(e *Entry, level shard.Level) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	old := t.load()
	if old[e.Hash] != e || e.Level() != level {
		return false
	}
	t.unparkLocked(e)
	m := make(map[uint64]*Entry, len(old))
	for h, x := range old {
		if h != e.Hash {
			m[h] = x
		}
	}
	t.store(m)
	if t.static != nil {
		t.static[e.Hash&(staticEntries-1)].Store(e) // it knows where the key's usage is
	}
	return true
}

// Park keeps e, a merged key's entry (at level 1), in the table for the next
// decision on the key to move its usage back, without counting it against
// the table's room: for an instance that knows no limit to move the usage
// with. At most MaxKeys entries are parked; Park reports false, changing
// nothing, when that many are, or e is not in the table at level 1. Set and
// Remove unpark it.
func (t *Table) Park(e *Entry) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.load()[e.Hash] != e || e.Level() != shard.Level1 {
		return false
	}
	if e.parked.Load() {
		return true
	}
	if t.max > 0 && t.parked >= t.max {
		return false
	}
	e.parked.Store(true)
	t.parked++
	return true
}

// unparkLocked counts e against the room again if it was parked. The
// caller holds t.mu.
func (t *Table) unparkLocked(e *Entry) {
	if e.parked.Load() {
		e.parked.Store(false)
		t.parked--
	}
}

// Range calls f for each entry until f returns false.
func (t *Table) Range(f func(*Entry) bool) {
	for _, e := range t.load() {
		if !f(e) {
			return
		}
	}
}

// Len returns the number of split keys.
func (t *Table) Len() int { return len(t.load()) }
