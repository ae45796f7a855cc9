package gossip

import (
	"hash/maphash"
	"math"
	"sync"
	"sync/atomic"
	"unsafe"
)

// roundStripes is the most stripes a Round has: decisions on different
// keys add under different locks.
const roundStripes = 16

// Round accumulates the units each (limit, key) consumed on this instance
// since the last Flush. It holds at most MaxKeys keys: a stripe picked by
// the key's hash holds MaxKeys/stripes of them, and an add of a new key to
// a full stripe is dropped and counted (Dropped). It is safe for
// concurrent use and never blocks but on its stripes' locks.
//
// A stripe keeps its (limit, key)s in a table of open addressing with
// linear probing, whose slot holds a key's identity (roundID) and units:
// an add to a held key touches one slot and reads no key byte. Flush
// empties the table but keeps its room, so that the keys of the next round
// do not grow it again.
type Round struct {
	seeds     [2]maphash.Seed
	stripes   []roundStripe
	mask      uint64
	maxKeyLen int
	dropped   atomic.Uint64
}

type roundStripe struct {
	mu    sync.Mutex  // guards slots, keys
	slots []roundSlot // len a power of two, or 0
	keys  []roundKey  // of the slots in use, by roundSlot.key - 1
	max   int         // the most keys the stripe holds
	_     [stripePad]byte
}

// stripePad makes a stripe one cache line: its lock and its table's
// header are read together, and apart from its neighbours'.
const stripePad = (64 - (unsafe.Sizeof(sync.Mutex{})+2*unsafe.Sizeof([]int{})+unsafe.Sizeof(0))%64) % 64

// roundSlot is a table slot: a (limit, key)'s roundID, its units, and the
// index + 1 of its strings in roundStripe.keys (0: the slot is empty).
type roundSlot struct {
	id    [2]uint64
	units int64
	key   int32
	_     [4]byte
}

// maxRoundLoad is a stripe table's highest load, in eighths: beyond it,
// the table doubles.
const maxRoundLoad = 6

// roundID names a (limit, key) in a round without its bytes, as
// MemoryStore names its counters: the key's hash, and fingerprints of the
// key and the limit under the round's own seeds (limitFP), so that an add
// to a held key reads no byte of the key held, and no one without the
// seeds can choose two keys that collide or share a slot's probe.
func (r *Round) roundID(limitFP uint64, key string, hash uint64) [2]uint64 {
	return [2]uint64{hash, maphash.String(r.seeds[0], key) ^ limitFP}
}

// limitFP is limit's part of the roundIDs of its keys.
func (r *Round) limitFP(limit string) uint64 { return maphash.String(r.seeds[1], limit) }

type roundKey struct{ limit, key string }

// NewRound returns an empty round configured by cfg (MaxKeys, MaxKeyLen).
func NewRound(cfg Config) *Round {
	cfg = cfg.withDefaults()
	n := roundStripes
	for n > 1 && n > cfg.MaxKeys {
		n >>= 1
	}
	r := &Round{seeds: [2]maphash.Seed{maphash.MakeSeed(), maphash.MakeSeed()}, stripes: make([]roundStripe, n), mask: uint64(n - 1), maxKeyLen: cfg.MaxKeyLen}
	for i := range r.stripes {
		r.stripes[i].max = min(cfg.MaxKeys/n, math.MaxInt32) // a slot's key index is an int32
	}
	return r
}

// Add adds n units consumed by key under limit, hash being the key's hash
// (the engine's counter.Hash, the same for every add of the key; it picks the
// stripe and finds the key's entry). It reports whether the round holds
// them: an add of a new key past the cap is dropped, as is one the codec
// cannot carry (a limit or key empty or too long, n ≤ 0), and counted by
// Dropped. A key's units saturate at MaxInt64.
func (r *Round) Add(limit, key string, hash uint64, n int64) bool {
	return r.add(limit, r.limitFP(limit), key, hash, n)
}

// add is Add with limit's limitFP given.
func (r *Round) add(limit string, limitFP uint64, key string, hash uint64, n int64) bool {
	if n <= 0 || key == "" || len(key) > r.maxKeyLen || limit == "" || len(limit) > MaxLimitLen {
		r.dropped.Add(1)
		return false
	}
	id := r.roundID(limitFP, key, hash)
	st := &r.stripes[hash&r.mask]
	st.mu.Lock()
	if !st.addLocked(id, limit, key, n) {
		st.mu.Unlock()
		r.dropped.Add(1)
		return false
	}
	st.mu.Unlock()
	return true
}

// addLocked adds n units to id's slot, making one for (limit, key) if
// there is none and the stripe has room; it reports whether it had room.
func (st *roundStripe) addLocked(id [2]uint64, limit, key string, n int64) bool {
	mask := len(st.slots) - 1
	if mask >= 0 {
		for i := int(id[1]) & mask; ; i = (i + 1) & mask {
			s := &st.slots[i]
			if s.key == 0 {
				break
			}
			if s.id == id {
				s.units += min(n, maxUnits-s.units)
				return true
			}
		}
	}
	if len(st.keys) >= st.max {
		return false
	}
	if (len(st.keys)+1)*8 > len(st.slots)*maxRoundLoad {
		st.grow()
	}
	st.keys = append(st.keys, roundKey{limit, key})
	st.place(roundSlot{id: id, units: n, key: int32(len(st.keys))})
	return true
}

// place puts s in the first empty slot of its probe.
func (st *roundStripe) place(s roundSlot) {
	mask := len(st.slots) - 1
	i := int(s.id[1]) & mask
	for st.slots[i].key != 0 {
		i = (i + 1) & mask
	}
	st.slots[i] = s
}

// grow doubles the stripe's table and moves its slots over.
func (st *roundStripe) grow() {
	old := st.slots
	st.slots = make([]roundSlot, max(16, 2*len(old)))
	for _, s := range old {
		if s.key != 0 {
			st.place(s)
		}
	}
}

// Flush returns the round's entries, in no particular order, and empties
// it. The caller owns the slice.
func (r *Round) Flush() []Entry { return r.appendFlush(nil) }

// appendFlush is Flush appending the entries to out.
func (r *Round) appendFlush(out []Entry) []Entry {
	for i := range r.stripes {
		st := &r.stripes[i]
		st.mu.Lock()
		if out == nil {
			out = make([]Entry, 0, len(st.keys)*len(r.stripes))
		}
		if len(st.keys) > 0 {
			for _, s := range st.slots {
				if s.key != 0 {
					k := st.keys[s.key-1]
					out = append(out, Entry{Limit: k.limit, Key: k.key, Units: s.units})
				}
			}
			clear(st.slots)
		}
		clear(st.keys) // let go of the strings
		st.keys = st.keys[:0]
		st.mu.Unlock()
	}
	return out
}

// Len returns the number of keys the round holds.
func (r *Round) Len() int {
	n := 0
	for i := range r.stripes {
		st := &r.stripes[i]
		st.mu.Lock()
		n += len(st.keys)
		st.mu.Unlock()
	}
	return n
}

// Dropped returns the number of adds the round did not hold since it was
// made (see Add): a figure for a metric.
func (r *Round) Dropped() uint64 { return r.dropped.Load() }
