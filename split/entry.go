package split

import (
	"iter"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/hotkeyd/hotkey/counter"
	"github.com/hotkeyd/hotkey/shard"
)

// Entry is one split key: its level, the counters that hold its usage, and
// what picks its subcounters. Its methods are safe for concurrent use; a
// Table moves its usage and gates the decisions on it.
type Entry struct {
	Key   string
	Hash  uint64
	level atomic.Int32
	seq   atomic.Uint64
	// inflight counts the decisions a Table let in and that have not left,
	// and moving is set while a move waits for them and reads the counters
	// (see Table.Enter). Beside seq, which the same decisions write, so that
	// a decision moves one cache line between cores, not two.
	inflight atomic.Int64
	moving   atomic.Bool
	parked   atomic.Bool // see Table.Park
	// visited holds each level the key was set to since its usage last
	// moved: other instances may have taken from those levels' counters.
	visited atomic.Uint32
	names   [4]atomic.Pointer[nameSet] // by level
	// held is where the usage is, read whole: a level and a placement read
	// apart could pair the old level with the new placement mid-move.
	held  atomic.Pointer[Counters]
	mu    sync.Mutex // serialises moves
	limit atomic.Pointer[counter.Limit]
	// places are the latest placements (distinct versions, oldest first,
	// maxPlaces at most) the key's counters were named under while this
	// instance knew it split.
	placesMu sync.Mutex
	places   []shard.Placement
	placeV   atomic.Uint64 // the version noted last, for a check without the lock
}

// maxPlaces is how many placements an entry remembers. A node map changes
// seldom; reading counters under a placement that holds nothing costs a
// read, never a unit.
const maxPlaces = 4

type nameSet struct {
	version uint64
	names   []string
	hashes  []uint64 // shard.NameHash of each name
}

// NewEntry returns an entry for key (with hash) at level, whose usage is
// held at level held under placement p (nil: one node).
func NewEntry(key string, hash uint64, level, held shard.Level, p shard.Placement) *Entry {
	e := &Entry{Key: key, Hash: hash}
	e.SetLevel(level)
	e.held.Store(&Counters{held, p})
	e.NotePlacement(p)
	return e
}

// HeldAt returns the level and placement whose counters hold the key's
// usage.
func (e *Entry) HeldAt() (shard.Level, shard.Placement) {
	h := e.held.Load()
	return h.Level, h.P
}

// Holds reports whether the counters of level under p hold the key's usage:
// it last moved to them, and the key has been at no other level since.
func (e *Entry) Holds(level shard.Level, p shard.Placement) bool {
	return e.held.Load().same(Counters{level, p}) && Levels(e.visited.Load())&^bit(level) == 0
}

// NotePlacement notes p as a placement the key's counters may be named
// under, which a move reads them under. A nil p, or the version noted last,
// costs no lock.
func (e *Entry) NotePlacement(p shard.Placement) {
	if p == nil || e.placeV.Load() == p.Version() {
		return
	}
	e.placesMu.Lock()
	defer e.placesMu.Unlock()
	v := p.Version()
	e.places = slices.DeleteFunc(e.places, func(q shard.Placement) bool { return q.Version() == v })
	e.places = append(e.places, p)
	if len(e.places) > maxPlaces {
		e.places = slices.Delete(e.places, 0, len(e.places)-maxPlaces)
	}
	e.placeV.Store(v)
}

// Placements returns the placements noted, oldest first. The slice is the
// caller's.
func (e *Entry) Placements() []shard.Placement {
	e.placesMu.Lock()
	defer e.placesMu.Unlock()
	return slices.Clone(e.places)
}

// Limit returns the limit of the latest decision on the key, and false if
// none was made since the entry was made.
func (e *Entry) Limit() (counter.Limit, bool) {
	if l := e.limit.Load(); l != nil {
		return *l, true
	}
	return counter.Limit{}, false
}

// decided notes lim as the limit of the latest decision, and returns the one
// before it (lim if none): the limit the key's counters were written under.
func (e *Entry) decided(lim counter.Limit) counter.Limit {
	prev := e.limit.Load()
	if prev == nil || *prev != lim {
		l := lim // a copy of its own, so that only a change allocates
		e.limit.Store(&l)
	}
	if prev == nil {
		return lim
	}
	return *prev
}

// Level returns the entry's level.
func (e *Entry) Level() shard.Level { return shard.Level(e.level.Load()) }

// SetLevel changes the entry's level.
func (e *Entry) SetLevel(l shard.Level) {
	e.level.Store(int32(l))
	e.visited.Or(uint32(bit(l)))
}

// Parked reports whether e is parked (see Table.Park).
func (e *Entry) Parked() bool { return e.parked.Load() }

// Names returns the names of the key's n subcounters under p (see
// shard.Names), computed once per level and placement version. The caller
// must not modify the slice.
func (e *Entry) Names(n shard.Level, p shard.Placement) []string { return e.nameSet(n, p).names }

func (e *Entry) nameSet(n shard.Level, p shard.Placement) *nameSet {
	v := version(p)
	slot := &e.names[n.Index()]
	if s := slot.Load(); s != nil && s.version == v {
		return s
	}
	s := &nameSet{version: v, names: shard.Names(e.Key, e.Hash, n, p)}
	s.hashes = make([]uint64, len(s.names))
	for i, name := range s.names {
		s.hashes[i] = shard.NameHash(name)
	}
	slot.Store(s)
	return s
}

// Sub returns the name and hash of subcounter i of the key's n under p:
// what a store and the deny cache know it by.
func (e *Entry) Sub(n shard.Level, i int, p shard.Placement) (name string, hash uint64) {
	s := e.nameSet(n, p)
	return s.names[i], s.hashes[i]
}

// Shards yields each subcounter of the key's n under p that has a share of
// lim: its index and the subcounter, named, hashed and limited to its share
// (Share), in index order. A subcounter whose share is nothing (lim too small
// to split n ways) is left out: no decision takes from it under lim.
func (e *Entry) Shards(n shard.Level, p shard.Placement, lim counter.Limit) iter.Seq2[int, counter.Shard] {
	return func(yield func(int, counter.Shard) bool) {
		s, capacity := e.nameSet(n, p), lim.Capacity()
		for i := range int(n) {
			sub := Share(lim, capacity, n, i)
			if sub.Rate == 0 { // not Validate: a share's tolerance may pass the bound by its rounding
				continue
			}
			if !yield(i, counter.Shard{Name: s.names[i], Hash: s.hashes[i], Limit: sub}) {
				return
			}
		}
	}
}

// Share is subcounter i's share of lim, whose capacity is capacity, split n
// ways: rate and burst are each split with remainders to the first
// subcounters (shard.Share).
func Share(lim counter.Limit, capacity int64, n shard.Level, i int) counter.Limit {
	lim.Rate = shard.Share(lim.Rate, int(n), i)
	if lim.Algorithm == counter.TokenBucket {
		lim.Burst = shard.Share(capacity, int(n), i)
	}
	return lim
}

// Pick returns the subcounter, in [0, n), for the next decision on the key.
// seed is a per-instance random value, so instances do not march in step.
func (e *Entry) Pick(n shard.Level, sel shard.Selection, seed uint64) int {
	s := e.seq.Add(1)
	if sel == shard.Random {
		return int(shard.Mix(e.Hash^seed+s*0x9e3779b97f4a7c15) % uint64(n))
	}
	return int((s + seed) % uint64(n))
}
