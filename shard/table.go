package shard

import (
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Selection is how a decision picks one of a split key's subcounters.
type Selection uint8

const (
	// RoundRobin walks the subcounters in turn, from a per-instance offset.
	// Each subcounter gets exactly 1/N of an instance's decisions for the
	// key, so none runs dry while another has room.
	RoundRobin Selection = iota
	// Random picks by hashing the key hash with a per-key sequence: the
	// classic probabilistic split. Subcounters see binomially uneven load.
	Random
)

// Entry is one split key: its level and the per-key state used to pick
// subcounters. Its methods are safe for concurrent use.
type Entry struct {
	Key   string
	Hash  uint64
	level atomic.Int32
	seq   atomic.Uint64
	// inflight counts the decisions between Enter and Exit, and moving is
	// set while Transfer waits for them and moves the usage (see Enter).
	// Beside seq, which the same decisions write, so that a decision
	// moves one cache line between cores, not two.
	inflight atomic.Int64
	moving   atomic.Bool
	parked   atomic.Bool // see Table.Park
	// visited has a bit (by Level.index) for each level the key was set
	// to since its usage last moved: other instances may have taken from
	// those levels' counters, so the next move reads them too.
	visited atomic.Uint32
	names   [4]atomic.Pointer[nameSet] // by Level.index
	// held says which counters hold the key's usage (where the last state
	// transfer moved it), read whole: a level and a placement read apart
	// could pair the old level with the new placement mid-transfer and
	// name counters that hold nothing. Written under mu.
	held atomic.Pointer[heldAt]
	mu   sync.Mutex // serialises state transfers
	memo atomic.Value
	// places are the latest placements (distinct versions, oldest first,
	// maxPlaces at most) the key's counters were named under while this
	// instance knew it split: a level visited is read under each, since
	// other instances may have written its counters under any of them.
	placesMu sync.Mutex
	places   []Placement
	placeV   atomic.Uint64 // the version noted last, for a check without the lock
}

// maxPlaces is how many placements an entry remembers. A node map changes
// seldom (a failover, a slot move); reading a level's counters under a
// placement that holds nothing more costs a read, never a unit.
const maxPlaces = 4

// heldAt is where a key's usage is: the counters of level under p.
type heldAt struct {
	level Level
	p     Placement
	v     uint64 // p's version
}

type nameSet struct {
	version uint64
	names   []string
	hashes  []uint64 // NameHash of each name
}

// version returns p's version, 0 for no placement.
func version(p Placement) uint64 {
	if p == nil {
		return 0
	}
	return p.Version()
}

// NewEntry returns an entry for key (with hash) at level, whose usage is
// held at level held under placement p: the unsplit counter (1) for a key
// that just got hot, or a static level for a key split from the start. p
// may be nil: one node.
func NewEntry(key string, hash uint64, level, held Level, p Placement) *Entry {
	e := &Entry{Key: key, Hash: hash}
	e.SetLevel(level)
	e.held.Store(&heldAt{held, p, version(p)})
	e.NotePlacement(p)
	return e
}

// HeldAt returns the level and placement whose counters hold the key's
// usage.
func (e *Entry) HeldAt() (Level, Placement) {
	h := e.held.Load()
	return h.level, h.p
}

// Holds reports whether the counters of level under p hold the key's
// usage: its usage last moved to them, and the key has been at no other
// level since. The unsplit counter is named Name(key), whatever the
// placement.
func (e *Entry) Holds(level Level, p Placement) bool {
	h := e.held.Load()
	return h.level == level && (level == Level1 || h.v == version(p)) && e.visited.Load()&^level.bit() == 0
}

// bit is l's bit in Entry.visited.
func (l Level) bit() uint32 { return 1 << l.index() }

// NotePlacement notes p as a placement the key's counters may be named
// under (see Transfer): the engine notes the store's placement when it
// sets the key's level, and NewEntry and Transfer note the one the usage
// is held under, which is the one every decision takes under (see
// Enter). A nil p, or the version noted last, costs no lock.
func (e *Entry) NotePlacement(p Placement) {
	if p == nil || e.placeV.Load() == p.Version() {
		return
	}
	e.placesMu.Lock()
	defer e.placesMu.Unlock()
	v := p.Version()
	e.places = slices.DeleteFunc(e.places, func(q Placement) bool { return q.Version() == v })
	e.places = append(e.places, p)
	if len(e.places) > maxPlaces {
		e.places = slices.Delete(e.places, 0, len(e.places)-maxPlaces)
	}
	e.placeV.Store(v)
}

// Placements returns the placements noted (see NotePlacement), oldest
// first: those the key's subcounters may be named under. The slice is the
// caller's.
func (e *Entry) Placements() []Placement {
	e.placesMu.Lock()
	defer e.placesMu.Unlock()
	return slices.Clone(e.places)
}

// placements returns the placements noted, and p, each version once.
func (e *Entry) placements(p Placement) []Placement {
	e.placesMu.Lock()
	out := slices.Clone(e.places)
	e.placesMu.Unlock()
	if !slices.ContainsFunc(out, func(q Placement) bool { return version(q) == version(p) }) {
		out = append(out, p)
	}
	return out
}

// Transfer moves the key's usage to the counters of level to under
// placement p, once: if they do not hold it yet, it calls move(from, fromP,
// to) with the level and placement that hold it, and then with each other
// level the key was set to since: instances that decided the key there
// while this one did not left their usage on those counters. Those are
// read under p and under each placement noted (NotePlacement): the others
// may have written them under a node map this instance has left since; the
// target level too, under the placements other than p. Seeding
// never lowers a counter, so the usage moved is the largest of those
// levels', not their sum, which would count twice what one move copied
// from another. On success it records that to under p holds it.
// Concurrent callers wait for the one that moves, so none decides on
// counters not yet seeded. A failed move is returned and leaves the usage
// where it was, to be tried again.
//
// Before it calls move, Transfer stops new decisions from entering (see
// Enter) and waits for those that entered to exit, so that every unit a
// decision took on the old counters is there when move reads them.
func (e *Entry) Transfer(to Level, p Placement, move func(from Level, fromP Placement, to Level) error) error {
	if e.Holds(to, p) {
		return nil
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.Holds(to, p) {
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
	h := e.held.Load()
	visited := e.visited.Load()
	if h.level != to || h.level != Level1 && h.v != version(p) {
		if err := move(h.level, h.p, to); err != nil {
			return err
		}
	}
	places := e.placements(p)
	for _, l := range []Level{Level1, Level4, Level16, Level64} {
		if visited&l.bit() == 0 {
			continue
		}
		if l == Level1 { // named Name(key), whatever the placement
			if to != Level1 && h.level != Level1 {
				if err := move(l, p, to); err != nil {
					return err
				}
			}
			continue
		}
		for _, q := range places {
			if l == to && version(q) == version(p) || l == h.level && version(q) == h.v {
				continue // the target, or just read
			}
			if err := move(l, q, to); err != nil {
				return err
			}
		}
	}
	e.held.Store(&heldAt{to, p, version(p)})
	e.NotePlacement(p)
	// The levels read are done with; one set meanwhile stays.
	e.visited.And(^(visited &^ to.bit()))
	return nil
}

// Enter registers a decision on the counters of level under p, if they hold
// the key's usage and no Transfer is moving it; the caller calls Exit once
// its decision is taken. Otherwise it registers nothing and reports false:
// the caller waits for the move (AwaitTransfer), and decides again from the
// key's level as it is then.
//
// Enter and Transfer pair as a Dekker lock on inflight and moving: either
// Transfer sees the decision in flight and waits for it, or the decision
// sees the move and does not take from counters that are being read. A
// unit taken from a key's counters is so never left behind by a move,
// whatever the concurrency.
func (e *Entry) Enter(level Level, p Placement) bool {
	e.inflight.Add(1)
	if e.moving.Load() || !e.Holds(level, p) {
		e.inflight.Add(-1)
		return false
	}
	return true
}

// EnterHeld is Enter on the counters that hold the key's usage (HeldAt),
// whatever levels the key was set to since: for a decision while the move
// to its level cannot be made (its store has no room for the counters).
// It reports where to decide, and false while a Transfer is under way.
// Deciding there counts all the key's usage only where no other instance
// takes from the key's counters at the levels visited since, as on a store
// in one process's memory.
func (e *Entry) EnterHeld() (Level, Placement, bool) {
	e.inflight.Add(1)
	if e.moving.Load() {
		e.inflight.Add(-1)
		return 0, nil, false
	}
	h := e.held.Load()
	return h.level, h.p, true
}

// Exit ends a decision that Enter or EnterHeld registered.
func (e *Entry) Exit() { e.inflight.Add(-1) }

// AwaitTransfer returns once no Transfer of the key is under way.
func (e *Entry) AwaitTransfer() {
	e.mu.Lock()
	e.mu.Unlock() //nolint:staticcheck // an empty critical section: a wait
}

// Memo returns what SetMemo last stored, or nil.
func (e *Entry) Memo() any { return e.memo.Load() }

// SetMemo keeps v with the entry for its owner: the engine keeps the limit
// last decided under, to move a merged key's usage back when no decision
// comes. Every v must have the same concrete type.
func (e *Entry) SetMemo(v any) { e.memo.Store(v) }

// Level returns the entry's level.
func (e *Entry) Level() Level { return Level(e.level.Load()) }

// SetLevel changes the entry's level.
func (e *Entry) SetLevel(l Level) {
	e.level.Store(int32(l))
	e.visited.Or(l.bit())
}

// Names returns the names of the key's n subcounters under p (see Names),
// computed once per level and placement version. The caller must not modify
// the slice.
func (e *Entry) Names(n Level, p Placement) []string { return e.nameSet(n, p).names }

// nameSet returns the names of the key's n subcounters under p and their
// hashes, computed once per level and placement version.
func (e *Entry) nameSet(n Level, p Placement) *nameSet {
	var v uint64
	if p != nil {
		v = p.Version()
	}
	slot := &e.names[n.index()]
	if s := slot.Load(); s != nil && s.version == v {
		return s
	}
	s := &nameSet{version: v, names: Names(e.Key, e.Hash, n, p)}
	s.hashes = make([]uint64, len(s.names))
	for i, name := range s.names {
		s.hashes[i] = NameHash(name)
	}
	slot.Store(s)
	return s
}

// Sub returns the name and hash of subcounter i of the key's n under p:
// what a store and the deny cache know it by.
func (e *Entry) Sub(n Level, i int, p Placement) (name string, hash uint64) {
	s := e.nameSet(n, p)
	return s.names[i], s.hashes[i]
}

// Pick returns the subcounter, in [0, n), for the next decision on the key.
// seed is a per-instance random value, so instances do not march in step.
func (e *Entry) Pick(n Level, sel Selection, seed uint64) int {
	s := e.seq.Add(1)
	if sel == Random {
		return int(Mix(e.Hash^seed+s*0x9e3779b97f4a7c15) % uint64(n))
	}
	return int((s + seed) % uint64(n))
}

// SecondChance returns the subcounter to probe after subcounter i of n denied:
// another one, chosen by r (a random value).
func SecondChance(i, n int, r uint64) int {
	return (i + 1 + int(r%uint64(n-1))) % n
}

// Table is the set of split keys. Reads take no lock: the map is replaced
// whole (copy on write) behind an atomic pointer, since it is read on every
// decision and written only when a key changes level. The zero value is not
// usable; call NewTable.
type Table struct {
	_ [64]byte // off the cache line of whatever the allocator puts before
	// m is nil while the table is empty, so that a decision on a key that
	// is not split (nearly all) costs one load of this line.
	m      atomic.Pointer[map[uint64]*Entry]
	mu     sync.Mutex // serialises writers
	max    int
	parked int // entries parked (see Park), not counted against max; under mu
	_      [40]byte
}

// NewTable returns an empty table holding at most max keys (max ≤ 0: no cap).
func NewTable(max int) *Table { return &Table{max: max} }

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

// Set splits key at level, or changes its level if it is already split. A
// key new to the table gets an entry whose usage is held at level held
// under placement p: 1 for a key whose usage is on its unsplit counter, or
// the level (and placement) whose counters hold it, e.g. a static split's. It reports false, changing
// nothing, when the table is full or level is not a valid level above 1.
func (t *Table) Set(key string, hash uint64, level, held Level, p Placement) bool {
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

// Merge marks key to be merged back: its entry stays, at level 1, until the
// usage its subcounters hold has been moved back to the unsplit counter and
// Remove takes it out. It reports whether key was in the table.
func (t *Table) Merge(key string, hash uint64) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if e := t.load()[hash]; e != nil && e.Key == key {
		e.SetLevel(Level1)
		return true
	}
	return false
}

// Remove takes e out of the table if e is still the entry of its key and is
// at level (the level it was lowered to: no raise came meanwhile). It
// reports whether it did.
func (t *Table) Remove(e *Entry, level Level) bool {
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
	return true
}

// Park keeps e, a merged key's entry (at level 1), in the table for the
// next decision on the key to move its usage back, without counting it
// against the table's room: for an instance that knows no limit to move
// the usage with, having made no decision on the key while it was split.
// At most max entries are parked; Park reports false, changing nothing,
// when that many are, or e is not in the table at level 1. Set and Remove
// unpark it.
func (t *Table) Park(e *Entry) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.load()[e.Hash] != e || e.Level() != Level1 {
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

// Parked reports whether e is parked (see Table.Park).
func (e *Entry) Parked() bool { return e.parked.Load() }

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
