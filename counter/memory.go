package counter

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"math"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/hotkeyd/hotkey/internal/keyhash"
	"github.com/hotkeyd/hotkey/internal/prefetch"
)

// MemoryConfig configures a MemoryStore. The zero value is usable: every
// field has a default.
type MemoryConfig struct {
	// MaxKeys bounds the number of counters held (default 1<<20), split
	// evenly over the stripes. When a stripe is full, a new counter takes
	// the room of an expired one; a live one (which would decide otherwise
	// than a fresh counter) is never dropped. A stripe full of live
	// counters refuses new ones (see TakeAt and Full).
	MaxKeys int
	// Stripes is the number of independently locked stripes, rounded up to a
	// power of two (default 512). A hash of the key picks the stripe.
	Stripes int
	// Clock returns the current time. Nil, the default, is the system's
	// clock, which the store reads on its monotonic clock alone (as
	// time.Since does), once a decision; time.Now itself is equivalent,
	// at the cost of a second reading.
	Clock func() time.Time
	// TallyKeys bounds the keys the store's tally names between two
	// drains (see TakeTallied), split evenly over the stripes, each
	// stripe's share at most one less than its counters (so that a full
	// stripe always holds an untallied counter whose expiry bounds a
	// refusal's wait). 0, the default, keeps no tally.
	TallyKeys int
	// MaxWatermarks bounds the watermarks of ChargeTotals held (default
	// 1<<18), store-wide: each holds its sender's name (at most
	// MaxFromLen bytes) and takes about 200 bytes at most, 50 MiB at the
	// default. Past it a new watermark is refused until an expired one
	// can be swept; a live one is never dropped.
	MaxWatermarks int
}

// DefaultMemoryConfig returns the defaults documented on MemoryConfig.
func DefaultMemoryConfig() MemoryConfig {
	return MemoryConfig{MaxKeys: 1 << 20, Stripes: 512, MaxWatermarks: 1 << 18}
}

// MemoryStore keeps counters in process memory: a table per stripe (see
// memtable.go), each under its own mutex, picked by a hash of the key. It is
// safe for concurrent use and never blocks on I/O. It allocates when a
// stripe's table grows, for sliding logs' entries and for watermarks
// (ChargeTotals), never to decide on a present key; its tables' cells hold
// no pointers for the garbage collector to scan.
type MemoryStore struct {
	stripes []stripe
	spans   []cellSpan // per stripe, read without its lock by Prefetch
	mask    uint64
	clock   func() time.Time
	system  bool         // clock is the system's: see now
	mix     uint64       // scrambles the callers' hashes (see identify)
	keySeed maphash.Seed // of the fingerprints' first halves

	// An instant is epochNano plus its time since epoch (see nanos).
	epoch     time.Time
	epochNano int64

	users atomic.Int32 // engines attached (see Attach)

	marks marks // of ChargeTotals, held by the stripes' tables
}

type stripe struct {
	mu sync.Mutex // guards t, its watermarks too
	t  table      // its hot fields (cells, n, limit) share mu's cache line
	_  [stripePad]byte
}

// stripePad rounds a stripe up to whole cache lines: in an array that
// starts on a line (as the default 512 stripes' does, being large enough
// to be page-aligned), two stripes never share a line, and a stripe's mutex
// and its table's hot fields are on one.
const stripePad = (64 - (unsafe.Sizeof(sync.Mutex{})+unsafe.Sizeof(table{}))%64) % 64

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
	if cfg.MaxWatermarks <= 0 {
		cfg.MaxWatermarks = def.MaxWatermarks
	}
	system := cfg.Clock == nil
	if system {
		cfg.Clock = time.Now
	}
	n := 1
	for n < cfg.Stripes {
		n <<= 1
	}
	for n > 1 && n > cfg.MaxKeys { // keep the bound exact
		n >>= 1
	}
	perStripe := max(1, cfg.MaxKeys/n)
	tallies := 0
	if cfg.TallyKeys > 0 {
		tallies = min(cfg.TallyKeys/n, perStripe-1)
	}
	s := &MemoryStore{
		stripes: make([]stripe, n),
		spans:   make([]cellSpan, n),
		mask:    uint64(n - 1),
		clock:   cfg.Clock,
		system:  system,
		mix:     rand.Uint64(),
		keySeed: maphash.MakeSeed(),
	}
	s.marks.max = int64(cfg.MaxWatermarks)
	s.marks.soonest.Store(math.MaxInt64)
	s.epoch = time.Now() // a monotonic reading, whatever the clock
	s.epochNano = s.epoch.UnixNano()
	for i := range s.stripes {
		s.stripes[i].t = newTable(perStripe)
		s.stripes[i].t.span = &s.spans[i]
		s.stripes[i].t.maxTallies = tallies
	}
	return s
}

// Take implements Store. It reads the store's clock; TakeAt takes the time.
func (s *MemoryStore) Take(_ context.Context, key string, hash uint64, lim Limit, n int64) (Result, error) {
	if hash == 0 {
		hash = Hash(key)
	}
	// The clock's reading waits for the loads before it: start the
	// cell's miss first, so that the two overlap.
	s.Prefetch(hash)
	r, _ := s.take(s.now(), key, hash, lim, n, false, "")
	return r, nil
}

// now is the store's clock's current instant in its ns (see nanos). The
// system's clock is read on its monotonic clock alone, which is what
// nanos keeps of time.Now's reading.
func (s *MemoryStore) now() int64 {
	if s.system {
		return s.epochNano + int64(time.Since(s.epoch))
	}
	return s.nanos(s.clock())
}

// nanos is the instant now in ns: epochNano plus now's time since epoch,
// which Go measures on the monotonic clock when now carries a reading (those
// of time.Now do), so that a step of the wall clock neither refills nor
// drains a counter. For a time without one (an injected clock's) it is
// now.UnixNano(), within 292 years of the store's creation.
func (s *MemoryStore) nanos(now time.Time) int64 { return s.epochNano + int64(now.Sub(s.epoch)) }

// TakeAt is Take at the instant now. It never fails. hash is Hash(key),
// or 0 for the store to compute it; it picks key's stripe and cell, and two
// keys of one hash still keep two counters (see memtable.go).
//
// A key without a counter whose stripe is full of live counters is
// refused: denied, with a RetryAfter (and for a token bucket a NextAfter)
// of the earliest a counter of the stripe may expire, a hint: no room comes
// sooner. Full counts it. A refusal costs no sweep of the stripe until
// then.
func (s *MemoryStore) TakeAt(now time.Time, key string, hash uint64, lim Limit, n int64) Result {
	r, _ := s.take(s.nanos(now), key, hash, lim, n, false, "")
	return r
}

// take is TakeAt at t, in the store's ns, and, with tally, TakeTallied
// under limit: the two share the hot path, and a take without tally
// touches nothing of the tally.
func (s *MemoryStore) take(t int64, key string, hash uint64, lim Limit, n int64, tally bool, limit string) (Result, bool) {
	id := s.identify(key, hash)
	st := s.stripe(id)
	st.mu.Lock()
	i := s.cell(st, id, t)
	if i < 0 {
		wait := time.Duration(st.t.soonest - t)
		st.mu.Unlock()
		return refused(lim, wait), true
	}
	c := st.t.state(i)
	res := c.take(t, lim, n)
	st.t.setState(i, c)
	tallied := !tally || !res.Allowed || st.t.tallyLocked(i, key, limit, n)
	st.mu.Unlock()
	return res, tallied
}

// update runs f on key's counter state (hash as for TakeAt) at now, in the store's ns, holding
// its stripe, and writes the state back. When the stripe is full of live
// counters and has none for key, it runs nothing and returns false with
// how long until one expires. take, the hot path, does the same inline.
func (s *MemoryStore) update(now time.Time, key string, hash uint64, f func(c *state, t int64)) (bool, time.Duration) {
	id := s.identify(key, hash)
	st := s.stripe(id)
	t := s.nanos(now)
	st.mu.Lock()
	defer st.mu.Unlock()
	i := s.cell(st, id, t)
	if i < 0 {
		return false, time.Duration(st.t.soonest - t)
	}
	c := st.t.state(i)
	f(&c, t)
	st.t.setState(i, c)
	return true, 0
}

// Prefetch starts loading the cache line of the counter of the key whose
// Hash is hash, and returns at once: a caller about to decide on the key
// does other work meanwhile (the engine feeds its hot-key detector), so
// that the two cache misses, on a large store nearly certain, overlap. It
// changes nothing and reads no key.
func (s *MemoryStore) Prefetch(hash uint64) {
	h := s.scramble(hash)
	sp := &s.spans[s.stripeOf(h)]
	n := sp.n.Load()
	if n <= 0 {
		return
	}
	prefetch.Line(sp.base.Load() + uintptr(homeIn([2]uint64{0, h}, int(n)))*unsafe.Sizeof(cell{}))
}

// Hash is the hash a store is given with a key: a hash under a secret
// seed drawn when the process starts (hash/maphash), so that clients
// cannot craft keys of one Hash. It differs from process to process.
func Hash(key string) uint64 { return keyhash.Sum(key) }

// scramble is a Hash under the store's own secret, so that which stripe
// and cell a key gets owes nothing to the other uses of its Hash, nor to a
// hash a caller made otherwise. It is a bijection: keys of one scramble are
// keys of one Hash.
func (s *MemoryStore) scramble(hash uint64) uint64 { return mix64(hash ^ s.mix) }

// fingerprint is key's identity in the store, for a caller that has not
// hashed it.
func (s *MemoryStore) fingerprint(key string) [2]uint64 { return s.identify(key, 0) }

// identify is key's identity in the store: a hash of the key under the
// store's seed, which tells apart keys of one Hash, and its Hash (hash, or
// computed if hash is 0) scrambled, which places it.
func (s *MemoryStore) identify(key string, hash uint64) [2]uint64 {
	if hash == 0 {
		hash = Hash(key)
	}
	return fingerprint(maphash.String(s.keySeed, key), s.scramble(hash))
}

// stripe returns the stripe of the key whose fingerprint is id: bits of its
// second half pick the stripe, its top bits the cell in the stripe's table.
func (s *MemoryStore) stripe(id [2]uint64) *stripe { return &s.stripes[s.stripeOf(id[1])] }

// stripeOf is the index of the stripe of the key whose scrambled hash is h.
func (s *MemoryStore) stripeOf(h uint64) uint64 { return (h >> 32) & s.mask }

// refused is the result of a take refused for want of room until wait.
func refused(lim Limit, wait time.Duration) Result {
	r := Result{Limit: lim.Capacity(), RetryAfter: wait, ResetAfter: wait}
	if lim.Algorithm == TokenBucket {
		r.NextAfter = wait
	}
	return r
}

// cell returns the index of id's cell in st (locked) at t: a new counter if
// it had none, in the room of expired ones if the stripe is full, and a
// fresh one if its counter had expired. It returns -1, and counts a
// refusal, if id had no counter and the stripe is full of live ones, none
// of which expires before st.t.soonest, after t.
func (s *MemoryStore) cell(st *stripe, id [2]uint64, t int64) int {
	i := st.t.find(id)
	switch {
	case i < 0:
		if st.t.full() && !st.t.sweep(t) {
			st.t.refused++
			return -1
		}
		i = st.t.insert(id)
	case st.t.cells[i].cnt.expires <= t:
		// An expired counter decides like a fresh one; reuse its memory.
		st.t.reset(i)
	}
	return i
}

// Len returns the number of counters held, expired ones included.
func (s *MemoryStore) Len() int { return int(s.sum(func(t *table) uint64 { return uint64(t.n) })) }

// sum adds up f of every stripe's table, each under its stripe's lock.
func (s *MemoryStore) sum(f func(t *table) uint64) uint64 {
	var n uint64
	for i := range s.stripes {
		st := &s.stripes[i]
		st.mu.Lock()
		n += f(&st.t)
		st.mu.Unlock()
	}
	return n
}

// ErrFull is returned (wrapped in a *FullError) by MemoryStore.Reshard
// when a counter it would seed has no room: its stripe is full of live
// counters.
var ErrFull = errors.New("memory store full")

// FullError is ErrFull for the counter Name, with Wait, how long until a
// counter of its stripe expires: the soonest room may come.
type FullError struct {
	Name string
	Wait time.Duration
}

func (e *FullError) Error() string {
	return fmt.Sprintf("%v: no room for %q for %v", ErrFull, e.Name, e.Wait)
}

func (e *FullError) Unwrap() error { return ErrFull }

// Attach notes one more user (an engine) deciding on the store, until the
// function it returns is called. Shared reports whether more than one is.
// An engine that cannot move a key's usage for want of room goes on
// deciding where the usage is held only while the store is its alone:
// another could have moved the usage where this one cannot follow.
func (s *MemoryStore) Attach() (detach func()) {
	s.users.Add(1)
	var once sync.Once
	return func() { once.Do(func() { s.users.Add(-1) }) }
}

// Shared reports whether more than one user is attached (see Attach).
func (s *MemoryStore) Shared() bool { return s.users.Load() > 1 }

// Full returns the number of counters the store refused to create, their
// stripe being full of live counters: takes of new keys (see TakeAt), and
// counters a Reshard could not seed. Each stripe holds MaxKeys/Stripes.
func (s *MemoryStore) Full() uint64 { return s.sum(func(t *table) uint64 { return t.refused }) }

// Close implements Store. The memory store holds no goroutines.
func (s *MemoryStore) Close() error { return nil }
