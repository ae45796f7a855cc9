package gossip

import (
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
	stripes   []roundStripe
	mask      uint64
	maxKeyLen int
	dropped   atomic.Uint64
}

type roundStripe struct {
	mu    sync.Mutex // guards units
	units map[roundKey]int64
	max   int
	_     [40]byte // a stripe's lock and map apart from its neighbours'
}

type roundKey struct{ limit, key string }

// NewRound returns an empty round configured by cfg (MaxKeys, MaxKeyLen).
func NewRound(cfg Config) *Round {
	cfg = cfg.withDefaults()
	n := roundStripes
	for n > 1 && n > cfg.MaxKeys {
		n >>= 1
	}
	r := &Round{stripes: make([]roundStripe, n), mask: uint64(n - 1), maxKeyLen: cfg.MaxKeyLen}
	for i := range r.stripes {
		r.stripes[i] = roundStripe{units: make(map[roundKey]int64), max: cfg.MaxKeys / n}
	}
	return r
}

// Add adds n units consumed by key under limit, hash being the key's hash
// (the engine's xxhash; it picks the stripe). It reports whether the round
// holds them: an add of a new key past the cap is dropped, as is one the
// codec cannot carry (a limit or key empty or too long, n ≤ 0), and counted
// by Dropped. A key's units saturate at MaxInt64.
func (r *Round) Add(limit, key string, hash uint64, n int64) bool {
	if n <= 0 || key == "" || len(key) > r.maxKeyLen || limit == "" || len(limit) > MaxLimitLen {
		r.dropped.Add(1)
		return false
	}
	st := &r.stripes[hash&r.mask]
	k := roundKey{limit, key}
	st.mu.Lock()
	u, ok := st.units[k]
	if !ok && len(st.units) >= st.max {
		st.mu.Unlock()
		r.dropped.Add(1)
		return false
	}
	st.units[k] = u + min(n, maxUnits-u)
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
			out = make([]Entry, 0, len(st.units)*len(r.stripes))
		}
		for k, u := range st.units {
			out = append(out, Entry{Limit: k.limit, Key: k.key, Units: u})
		}
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
		n += len(st.units)
		st.mu.Unlock()
	}
	return n
}

// Dropped returns the number of adds the round did not hold since it was
// made (see Add): a figure for a metric.
func (r *Round) Dropped() uint64 { return r.dropped.Load() }
