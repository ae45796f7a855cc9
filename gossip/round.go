package gossip

import (
	"hash/maphash"
	"sync"
	"sync/atomic"
)

// roundStripes is the most stripes a Round has: decisions on different
// keys add under different locks.
const roundStripes = 16

// Round accumulates the units each (limit, key) consumed on this instance
// since the last Flush. It holds at most MaxKeys keys: a stripe picked by
// the key's hash holds MaxKeys/stripes of them, and an add of a new key to
// a full stripe is dropped and counted (Dropped). It is safe for
// concurrent use and never blocks but on its stripes' locks.
type Round struct {
	seeds     [2]maphash.Seed
	stripes   []roundStripe
	mask      uint64
	maxKeyLen int
	dropped   atomic.Uint64
}

type roundStripe struct {
	mu    sync.Mutex          // guards units, keys
	units map[[2]uint64]int64 // by roundID
	keys  []roundEntry        // the keys of units, in order of their first add
	max   int
	_     [16]byte // a stripe's lock and map apart from its neighbours'
}

// roundEntry is a (limit, key) a round holds, and its roundID.
type roundEntry struct {
	id         [2]uint64
	limit, key string
}

// roundID names a (limit, key) in a round without its bytes, as
// MemoryStore names its counters: the key's hash, and fingerprints of the
// key and the limit under the round's own seeds, so that an add to a held
// key reads no byte of the key held, and no one without the seeds can
// choose two keys that collide.
func (r *Round) roundID(limit, key string, hash uint64) [2]uint64 {
	return [2]uint64{hash, maphash.String(r.seeds[0], key) ^ maphash.String(r.seeds[1], limit)}
}

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
		r.stripes[i] = roundStripe{units: make(map[[2]uint64]int64), max: cfg.MaxKeys / n}
	}
	return r
}

// Add adds n units consumed by key under limit, hash being the key's hash
// (the engine's xxhash, the same for every add of the key; it picks the
// stripe and finds the key's entry). It reports whether the round holds
// them: an add of a new key past the cap is dropped, as is one the codec
// cannot carry (a limit or key empty or too long, n ≤ 0), and counted by
// Dropped. A key's units saturate at MaxInt64.
func (r *Round) Add(limit, key string, hash uint64, n int64) bool {
	if n <= 0 || key == "" || len(key) > r.maxKeyLen || limit == "" || len(limit) > MaxLimitLen {
		r.dropped.Add(1)
		return false
	}
	id := r.roundID(limit, key, hash)
	st := &r.stripes[hash&r.mask]
	st.mu.Lock()
	u, ok := st.units[id]
	if !ok && len(st.keys) >= st.max {
		st.mu.Unlock()
		r.dropped.Add(1)
		return false
	}
	st.units[id] = u + min(n, maxUnits-u)
	if !ok {
		st.keys = append(st.keys, roundEntry{id, limit, key})
	}
	st.mu.Unlock()
	return true
}

// Flush returns the round's entries, in no particular order, and empties
// it. The caller owns the slice.
func (r *Round) Flush() []Entry {
	var out []Entry
	for i := range r.stripes {
		st := &r.stripes[i]
		st.mu.Lock()
		if out == nil {
			out = make([]Entry, 0, len(st.keys)*len(r.stripes))
		}
		for _, k := range st.keys {
			out = append(out, Entry{Limit: k.limit, Key: k.key, Units: st.units[k.id]})
		}
		clear(st.keys) // let go of the strings
		st.keys = st.keys[:0]
		clear(st.units)
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
