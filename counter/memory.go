package counter

import (
	"context"
	"sync"
	"time"
)

// MemoryConfig configures a MemoryStore. The zero value is usable: every
// field has a default.
type MemoryConfig struct {
	// MaxKeys bounds the number of counters held (default 1<<20), split
	// evenly over the stripes. When a stripe is full, an insert drops its
	// expired counters and, if that frees less than 1/16 of the stripe, live
	// ones, each the soonest-expiring of a small sample.
	MaxKeys int
	// Stripes is the number of independently locked stripes, rounded up to a
	// power of two (default 512). The key hash picks the stripe.
	Stripes int
	// Clock returns the current time (default time.Now).
	Clock func() time.Time
}

// DefaultMemoryConfig returns the defaults documented on MemoryConfig.
func DefaultMemoryConfig() MemoryConfig {
	return MemoryConfig{MaxKeys: 1 << 20, Stripes: 512, Clock: time.Now}
}

// evictSample is how many counters an insert into a full stripe looks at.
const evictSample = 8

// MemoryStore keeps counters in process memory: a map per stripe, each under
// its own mutex, picked by the key hash. It is safe for concurrent use, never
// blocks on I/O and allocates only when a counter is created.
type MemoryStore struct {
	stripes   []stripe
	mask      uint64
	perStripe int
	room      int // counters freed at once when a stripe is full
	clock     func() time.Time

	// An instant is epochNano plus its time since epoch (see nanos).
	epoch     time.Time
	epochNano int64
}

type stripe struct {
	mu sync.Mutex // guards m
	m  map[string]*state
	_  [40]byte // keep stripes on separate cache lines
}

var _ Store = (*MemoryStore)(nil)

// NewMemoryStore returns a memory store configured by cfg.
func NewMemoryStore(cfg MemoryConfig) *MemoryStore {
	def := DefaultMemoryConfig()
	if cfg.MaxKeys <= 0 {
		cfg.MaxKeys = def.MaxKeys
	}
	if cfg.Stripes <= 0 {
		cfg.Stripes = def.Stripes
	}
	if cfg.Clock == nil {
		cfg.Clock = def.Clock
	}
	n := 1
	for n < cfg.Stripes {
		n <<= 1
	}
	for n > 1 && n > cfg.MaxKeys { // keep the bound exact
		n >>= 1
	}
	s := &MemoryStore{
		stripes:   make([]stripe, n),
		mask:      uint64(n - 1),
		perStripe: max(1, cfg.MaxKeys/n),
		clock:     cfg.Clock,
	}
	s.epoch = time.Now() // a monotonic reading, whatever the clock
	s.epochNano = s.epoch.UnixNano()
	s.room = max(1, s.perStripe/16)
	for i := range s.stripes {
		s.stripes[i].m = make(map[string]*state)
	}
	return s
}

// Take implements Store. It reads the store's clock; TakeAt takes the time.
func (s *MemoryStore) Take(_ context.Context, key string, hash uint64, lim Limit, n int64) (Result, error) {
	return s.TakeAt(s.clock(), key, hash, lim, n), nil
}

// nanos is the instant now in ns: epochNano plus now's time since epoch,
// which Go measures on the monotonic clock when now carries a reading (those
// of time.Now do), so that a step of the wall clock neither refills nor
// drains a counter. For a time without one (an injected clock's) it is
// now.UnixNano(), within 292 years of the store's creation.
func (s *MemoryStore) nanos(now time.Time) int64 { return s.epochNano + int64(now.Sub(s.epoch)) }

// TakeAt is Take at the instant now. It never fails.
func (s *MemoryStore) TakeAt(now time.Time, key string, hash uint64, lim Limit, n int64) Result {
	// The low bits of the hash pick the shard table and Redis slots too;
	// the high bits keep stripes independent of them.
	st := &s.stripes[(hash>>32)&s.mask]
	t := s.nanos(now)
	st.mu.Lock()
	c := st.m[key]
	if c == nil {
		if len(st.m) >= s.perStripe {
			st.evictLocked(t, s.room)
		}
		c = &state{}
		st.m[key] = c
	} else if c.expires <= t {
		// An expired counter decides like a fresh one; reuse its memory.
		*c = state{log: c.log[:0]}
	}
	res := c.take(t, lim, n)
	st.mu.Unlock()
	return res
}

// evictLocked makes room for at least one counter, and for room counters
// where it can: it drops every expired counter, then, while fewer than room
// were freed, the soonest-expiring of a sample of live ones. Freeing room at
// once spreads the cost of the sweep over the next room inserts.
func (st *stripe) evictLocked(now int64, room int) {
	freed := 0
	for k, c := range st.m {
		if c.expires <= now {
			delete(st.m, k)
			freed++
		}
	}
	for ; freed < room && len(st.m) > 0; freed++ {
		var victim string
		var soonest int64
		seen := 0
		for k, c := range st.m { // map iteration starts at a random entry
			if seen == 0 || c.expires < soonest {
				victim, soonest = k, c.expires
			}
			if seen++; seen == evictSample {
				break
			}
		}
		delete(st.m, victim)
	}
}

// Len returns the number of counters held, expired ones included.
func (s *MemoryStore) Len() int {
	n := 0
	for i := range s.stripes {
		st := &s.stripes[i]
		st.mu.Lock()
		n += len(st.m)
		st.mu.Unlock()
	}
	return n
}

// Close implements Store. The memory store holds no goroutines.
func (s *MemoryStore) Close() error { return nil }
