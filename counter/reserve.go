// Reserve: a store whose instance admits from blocks of units leased from
// another store (sync: reserve).

package counter

import (
	"context"
	"math"
	"sync"
	"sync/atomic"
	"time"
)

// Defaults of ReserveConfig.
const (
	DefaultLease         = 100 * time.Millisecond
	DefaultReserveBlocks = 1 << 16
)

// ReserveConfig configures a ReserveStore.
type ReserveConfig struct {
	// Lease is how long a block may be admitted from before its unused
	// units go back to the store; 0 means DefaultLease.
	Lease time.Duration
	// Instances returns the live instances sharing the store: one
	// instance's block is at most the capacity divided by them. Nil: 1.
	Instances func() int
	// MaxBlocks bounds the keys holding a block; past it a key is decided
	// on the store, one call per decision. 0 means DefaultReserveBlocks.
	MaxBlocks int
	// Clock reads the instance's time, as the time since an instant of
	// its own: only differences between readings count, and it must not
	// step, as Go's monotonic clock does not. Nil means Go's monotonic
	// clock.
	Clock func() time.Duration
	// Ahead leases a key's next block in the background, so that its
	// decisions do not wait on the store:
	//   - under its limit, while its block runs low (a quarter of its
	//     units or of its lease left), the block that takes over is leased
	//     ahead; a decision that finds the block spent before that lease is
	//     in waits for it, and does not ask again;
	//   - over its limit, the decision that finds the key's wait over is
	//     denied as the wait did, and the decisions after the lease admit
	//     from its block.
	// The decision that opens a fixed window's next window still asks the
	// store (see leaseAhead). For a store across a network; a store in
	// memory answers at once.
	Ahead bool
	// Sweep is how often the blocks of ended leases are returned, and
	// idle keys forgotten; 0 means half the lease. Negative: never (tests
	// on a clock of their own, where returns must come at points they
	// choose: a block's next decision, and Close).
	Sweep time.Duration
}

// ReserveStats counts what a ReserveStore did.
type ReserveStats struct {
	Local    uint64 // decisions admitted from a block, with no store call
	Denied   uint64 // decisions denied with no store call, while the store lacked a block's worth
	Leases   uint64 // store calls that leased a block
	Takes    uint64 // decisions taken on the store, not from a block (a cold key, a cost the block lacked)
	Returns  uint64 // store calls that returned a block's unused units
	Returned uint64 // units the store took back
	Unspent  uint64 // units given back to the store that it did not take back (see Leaser.Return)
}

// ReserveStore decides from blocks of units leased from a Leaser: an
// instance leases a key's block in one store call and admits from it
// locally until it is spent or its lease ends, when its unused units go
// back. A block lasts about one lease at the key's local rate, and is at
// most the counter's capacity divided by the live instances, so that no
// instance holds more than its part; a key too slow to fill a block of 2
// is decided on the store, one call per decision. A key over its limit
// costs about one lease a lease interval too: once a lease finds the store
// short, the key is denied locally until a refill worth leasing is due
// (see shortfall).
//
// Units leave the store before they are admitted, so a ReserveStore never
// admits more units than the store counted: its error is a denial while
// units sit unused in another instance's block (until that block's lease
// ends). A window algorithm's block ends with the window that counted it,
// so its windows hold exactly. A token bucket counts a block's units when
// it is leased, and they may be admitted up to a lease later, while the
// bucket refills for others: over any interval it admits at most rate ×
// lease more than a bucket deciding each unit when admitted. A sliding
// log, whose units count from their instant, is decided on the store
// (the engine does not send it here: hotkey.Sync.Keeps).
// The store's clock decides what is counted and when a window ends; the
// instance measures a block's life, from the store's answer, on a clock
// that does not step, so a step of its wall clock changes no block's life.
// Safe for concurrent use. Close returns every open block.
type ReserveStore struct {
	base      LeaseStore
	lease     int64 // ns
	instances func() int
	clock     func() time.Duration
	maxBlocks int64

	shards [64]reserveShard
	n      atomic.Int64 // blocks held

	local, denied, leases, takes, returns, returned, unspent atomic.Uint64
	waits                                                    atomic.Uint64 // decisions that waited for a lease ahead

	ahead   bool
	aheadMu sync.RWMutex   // held to start a lease ahead, and by Close to stop them
	aheads  sync.WaitGroup // leases ahead under way

	closed   atomic.Bool
	stop     chan struct{}
	stopped  chan struct{}
	closeErr error
	once     sync.Once
}

type reserveShard struct {
	mu     sync.Mutex
	blocks map[string]*block
}

// block is one key's lease, and what sizes the next.
type block struct {
	mu    sync.Mutex // held across the store call that leases it
	hash  uint64
	lim   Limit
	left  int64 // leased units not admitted yet
	token Token // the lease's, for Return
	from  int64 // when it was leased, ns on ReserveConfig.Clock
	until int64 // when the lease ends, ns on ReserveConfig.Clock

	// The key's local rate: units decided since `since`, and the last
	// estimate, in units per lease.
	used     int64
	since    int64
	perLease float64
	idle     int  // sweeps since the key was last decided
	dead     bool // forgotten: a decision that found it looks again

	// wait, when the last lease found the store short, says until when
	// the key is denied locally. short is wait while a lease of the key
	// is under way, read without b.mu.
	wait   *reserveDenial
	short  atomic.Pointer[reserveDenial]
	epoch  uint64 // counts Deletes of the key: a lease ahead from before one gives its block back
	edge   int64  // for a window algorithm, when the last lease's window ends (ns on ReserveConfig.Clock); 0 if not known
	edgeAt int64  // when the last lease was asked, that told edge

	// With ReserveConfig.Ahead, the block that takes over from this one
	// is leased while this one runs low (prefetch): fetch is open while
	// that lease is under way, and closed when it is in; next is its
	// block until this one is spent or ends. size is what this block was
	// granted.
	next  *spare
	fetch chan struct{}
	size  int64
}

// spare is a block leased ahead (block.next): its units, under lim, and
// its lease's token and life, as block's.
type spare struct {
	lim         Limit
	left        int64
	token       Token
	from, until int64
}

// LeaseStore is a store that leases blocks of units: the memory and Redis
// stores are.
type LeaseStore interface {
	Store
	Leaser
}

// NewReserveStore returns a store that leases blocks from base. The
// caller closes base after the ReserveStore.
func NewReserveStore(base LeaseStore, cfg ReserveConfig) *ReserveStore {
	if cfg.Lease <= 0 {
		cfg.Lease = DefaultLease
	}
	if cfg.MaxBlocks <= 0 {
		cfg.MaxBlocks = DefaultReserveBlocks
	}
	if cfg.Clock == nil {
		start := time.Now()
		cfg.Clock = func() time.Duration { return time.Since(start) }
	}
	if cfg.Instances == nil {
		cfg.Instances = func() int { return 1 }
	}
	s := &ReserveStore{base: base, lease: int64(cfg.Lease), instances: cfg.Instances, clock: cfg.Clock, maxBlocks: int64(cfg.MaxBlocks), ahead: cfg.Ahead,
		stop: make(chan struct{}), stopped: make(chan struct{})}
	for i := range s.shards {
		s.shards[i].blocks = make(map[string]*block)
	}
	switch {
	case cfg.Sweep == 0:
		go s.sweep(cfg.Lease / 2)
	case cfg.Sweep > 0:
		go s.sweep(cfg.Sweep)
	default:
		close(s.stopped)
	}
	return s
}

// Stats returns what the store did so far.
func (s *ReserveStore) Stats() ReserveStats {
	return ReserveStats{Local: s.local.Load(), Denied: s.denied.Load(), Leases: s.leases.Load(), Takes: s.takes.Load(),
		Returns: s.returns.Load(), Returned: s.returned.Load(), Unspent: s.unspent.Load()}
}

// Take implements Store: from the key's block when it holds n units under
// lim; denied locally while the store is known to lack a block's worth;
// else from a block leased now, or on the store.
func (s *ReserveStore) Take(ctx context.Context, key string, hash uint64, lim Limit, n int64) (Result, error) {
	if s.closed.Load() {
		return s.take(ctx, key, hash, lim, n)
	}
	var b *block
	for {
		if b = s.block(key, hash); b == nil { // no room for another block
			return s.take(ctx, key, hash, lim, n)
		}
		if d := b.short.Load(); d != nil && d.lim == lim {
			// A lease of this key found the store short and another is
			// under way: its answer goes to the decisions that wait for
			// it, not to this one.
			s.denied.Add(1)
			return d.result(int64(s.clock()), lim), nil
		}
		b.mu.Lock()
		if b.dead {
			b.mu.Unlock()
			continue
		}
		if c := b.fetch; c != nil && b.lim == lim && !(b.open(int64(s.clock())) && b.left >= n) {
			// The block is spent or ended while the next one is being
			// leased ahead: that lease answers sooner than another.
			b.mu.Unlock()
			s.waits.Add(1)
			select {
			case <-c:
			case <-ctx.Done():
				return Result{}, ctx.Err()
			}
			continue
		}
		break
	}
	defer b.mu.Unlock()
	if s.closed.Load() { // closed meanwhile: no block outlives Close
		s.giveBack(ctx, key, b)
		return s.take(ctx, key, hash, lim, n)
	}
	now := int64(s.clock())
	b.used += n
	b.idle = 0
	if b.lim == lim && b.open(now) && b.left >= n {
		b.left -= n
		s.local.Add(1)
		if s.low(b, now) {
			s.fetchAhead(key, hash, b, lim, now)
		}
		return Result{Allowed: true, Limit: lim.Capacity(), Remaining: b.left}, nil
	}
	if sp := b.next; sp != nil {
		// The block is spent or ended: the one leased ahead takes over.
		b.next = nil
		if sp.lim == lim && sp.open(now) && sp.left >= n {
			s.giveBack(ctx, key, b)
			b.lim, b.left, b.token, b.from, b.until, b.size = lim, sp.left-n, sp.token, sp.from, sp.until, sp.left
			s.local.Add(1)
			return Result{Allowed: true, Limit: lim.Capacity(), Remaining: b.left}, nil
		}
		s.returnUnits(ctx, key, b.hash, sp.lim, sp.left, sp.token)
	}
	if d := b.wait; d != nil && d.lim == lim && now < d.until && now >= d.at {
		// The store lacked a block's worth when last asked, and will
		// not have one before d.until.
		s.denied.Add(1)
		return d.result(now, lim), nil
	}
	// The block is spent, ended or of another limit: what is left of it
	// goes back before the next is leased.
	s.giveBack(ctx, key, b)
	size := s.size(b, now, lim, n)
	if size <= n || lim.Algorithm == SlidingLog {
		return s.take(ctx, key, hash, lim, n)
	}
	if d := b.wait; d != nil && d.lim == lim {
		b.short.Store(d) // the key is over its limit: decisions meanwhile are denied, not queued
		if s.leaseAhead(key, hash, b, lim, size, now) {
			s.denied.Add(1)
			return d.result(now, lim), nil
		}
	}
	l, err := s.base.Lease(ctx, key, hash, lim, size)
	b.short.Store(nil)
	if err != nil {
		return Result{}, err
	}
	s.noteLease(b, now, lim, l, size)
	switch {
	case l.Granted >= n:
		s.hold(b, lim, l, l.Granted-n, now)
		r := l.Result
		r.Allowed, r.Remaining = true, b.left
		if b.left > 0 {
			r.NextAfter = 0 // the store is empty, this block is not: no denial to remember
		}
		return r, nil
	case l.Granted > 0: // fewer than n fit: not a block, and not n
		b.lim, b.left, b.token = lim, l.Granted, l.Token
		s.giveBack(ctx, key, b)
		b.wait = nil
		return s.take(ctx, key, hash, lim, n)
	}
	return b.wait.result(now, lim), nil // not one unit fits: the store's denial
}

// noteLease counts l, a lease of size for b under lim asked at now, and
// notes what it tells of the store: where its window ends, and if it got
// fewer units than asked, how long the key waits (shortfall). The caller
// holds b.mu.
func (s *ReserveStore) noteLease(b *block, now int64, lim Limit, l Lease, size int64) {
	s.leases.Add(1)
	b.wait, b.edge, b.edgeAt = nil, 0, now
	if left := windowLeft(lim, l.Result); left > 0 && left < math.MaxInt64 {
		b.edge = now + int64(left)
	}
	if l.Granted < size {
		b.wait = s.shortfall(now, lim, l, size)
	}
}

// hold makes l, leased for b under lim asked at now, b's block, with left
// of its units not admitted yet: it lasts a lease, or to the end of the
// window that counted it if sooner. The caller holds b.mu.
func (s *ReserveStore) hold(b *block, lim Limit, l Lease, left, now int64) {
	b.lim, b.left, b.token, b.from, b.until, b.size = lim, left, l.Token, now, s.until(lim, l, now), l.Granted
}

// until is when a block of l, leased under lim asked at now, ends: a
// lease later, or at the end of the window that counted it if sooner.
func (s *ReserveStore) until(lim Limit, l Lease, now int64) int64 {
	return now + min(s.lease, int64(windowLeft(lim, l.Result)))
}

// low reports whether b, admitted from at now, runs low enough for its
// next block to be leased ahead: an eighth of its units or of its lease
// left (reserveLow). Not while the key is short (its leases follow its waits), nor
// while a block is leased ahead or held; nor for a block that ends with
// its window, by time: a block leased ahead would end with it. The
// caller holds b.mu.
func (s *ReserveStore) low(b *block, now int64) bool {
	if !s.ahead || b.wait != nil || b.next != nil || b.fetch != nil {
		return false
	}
	if reserveLow*b.left < b.size {
		return true
	}
	return reserveLow*(b.until-now) < s.lease && !(b.edge > 0 && b.until >= b.edge)
}

// reserveLow: a block runs low with 1/reserveLow of its units or of its
// lease left. Long enough for a lease to come back (a store's round trip
// is a fraction of a millisecond to a few; the default lease's eighth,
// 12.5 ms), and short, since the block leased ahead is taken up that
// much into its lease.
const reserveLow = 8

// fetchAhead starts leasing, in the background, the block that takes
// over from b when it is spent or ends (b.next), so that a key under its
// limit does not wait on the store either: b runs low at now (low). The
// decisions that find b spent before the lease is in wait for it (Take).
// The caller holds b.mu.
func (s *ReserveStore) fetchAhead(key string, hash uint64, b *block, lim Limit, now int64) {
	size := s.size(b, now, lim, 1)
	if b.perLease > 0 {
		// The block leased now is taken up when b is spent or ends (lead,
		// at the estimated rate), and lasts a lease, or to its window's
		// end, from now: what the key uses from then to its end.
		lead := b.until - now
		if spend := float64(b.left) * float64(s.lease) / b.perLease; spend < float64(lead) {
			lead = int64(spend)
		}
		life := min(s.lease, b.windowLeft(now, lim))
		size = min(size, int64(math.Ceil(b.perLease*float64(max(0, life-lead))/float64(s.lease))))
	}
	if size < 2 {
		return
	}
	c := make(chan struct{})
	epoch := b.epoch
	started := s.background(key, hash, b, lim, size, func(ctx context.Context, l Lease, err error) {
		b.fetch = nil
		defer close(c)
		if err != nil {
			return // the next decision that finds b spent leases itself, and meets the error
		}
		s.noteLease(b, now, lim, l, size)
		if l.Granted == 0 {
			return
		}
		if b.dead || b.epoch != epoch || s.closed.Load() || b.next != nil {
			s.returnUnits(ctx, key, hash, lim, l.Granted, l.Token) // forgotten, deleted or closed meanwhile
			return
		}
		b.next = &spare{lim: lim, left: l.Granted, token: l.Token, from: now, until: s.until(lim, l, now)}
	})
	if started {
		b.fetch = c // before the lease's end, which waits for b.mu
	}
}

// background leases size units of key under lim for b in a goroutine
// that Close waits for, and calls done with the lease under b.mu; ctx
// bounds done's store calls too. It reports false, starting nothing, once
// the store is closed. The caller holds b.mu.
func (s *ReserveStore) background(key string, hash uint64, b *block, lim Limit, size int64, done func(ctx context.Context, l Lease, err error)) bool {
	s.aheadMu.RLock()
	defer s.aheadMu.RUnlock()
	if s.closed.Load() {
		return false
	}
	s.aheads.Add(1)
	go func() {
		defer s.aheads.Done()
		ctx, cancel := context.WithTimeout(context.Background(), reserveAheadTimeout)
		defer cancel()
		l, err := s.base.Lease(ctx, key, hash, lim, size)
		b.mu.Lock()
		defer b.mu.Unlock()
		done(ctx, l, err)
	}()
	return true
}

// leaseAhead starts leasing b's next block of size under lim in the
// background (ReserveConfig.Ahead), asked at now, and reports whether it
// did. The caller holds b.mu, and has stored b's wait in b.short, which
// the lease clears. A lease that fails leaves no wait, so that the next
// decision leases itself and meets the error.
//
// Not for a fixed window whose last lease was in an earlier window: the
// whole limit is back, and a decision then is likely one the next block
// admits. A token bucket's or sliding window's wait ends when a part of a
// refill is due, and a fixed window's within its window (to see units
// returned), to a key still over its limit.
func (s *ReserveStore) leaseAhead(key string, hash uint64, b *block, lim Limit, size, now int64) bool {
	if !s.ahead || lim.Algorithm == FixedWindow && !(b.edgeAt <= now && now < b.edge) {
		return false
	}
	epoch := b.epoch
	return s.background(key, hash, b, lim, size, func(ctx context.Context, l Lease, err error) {
		b.short.Store(nil)
		if err != nil {
			b.wait = nil
			return
		}
		s.noteLease(b, now, lim, l, size)
		if l.Granted == 0 {
			return
		}
		s.giveBack(ctx, key, b) // a block leased meanwhile under another limit
		s.hold(b, lim, l, l.Granted, now)
		if b.dead || b.epoch != epoch || s.closed.Load() {
			s.giveBack(ctx, key, b) // forgotten, deleted or closed meanwhile
		}
	})
}

// reserveAheadTimeout bounds a lease in the background.
const reserveAheadTimeout = 5 * time.Second

// shortfall is what a lease of size that got fewer units (l) tells of
// the store at now, read before the call: when a refill worth leasing
// will be there for this instance, at the earliest. A refill worth
// leasing is the instance's part of what the store frees in a lease, at
// least 2 units and at most size. It is there when the store's next unit
// is due and then the rest of it has been freed at the instance's part of
// the rate (the other live instances lease their parts meanwhile): for a
// token bucket, at one emission interval a unit; for a sliding window as
// fast at most, since the previous window's weight frees units no faster
// than the limit's rate. A fixed window frees its units at its end. The
// instant is at most a lease away: other instances return unused units,
// which the store's answer does not foresee, and a lease is as long as an
// instance goes without asking the store.
func (s *ReserveStore) shortfall(now int64, lim Limit, l Lease, size int64) *reserveDenial {
	r := l.Result
	first := r.RetryAfter // not one unit fit
	if l.Granted > 0 {
		first = r.NextAfter // set by a token bucket the lease emptied
	}
	unit := int64(lim.Period) / max(lim.Rate, 1)
	n := int64(max(1, s.instances()))
	if l.Granted == 0 {
		n = 1 // the others took what there was: this instance's turn is next
	}
	k := max(2, min(size, int64(math.Ceil(float64(lim.Rate)*float64(s.lease)/float64(lim.Period)/float64(n)))))
	var wait int64
	switch lim.Algorithm {
	case FixedWindow:
		wait = int64(r.ResetAfter)
	case TokenBucket, SlidingWindow:
		if first <= 0 {
			first = time.Duration(unit)
		}
		wait = addSat(int64(first), mulSat(mulSat(k-1, unit), n))
		if left := int64(windowLeft(lim, r)); lim.Algorithm == SlidingWindow && left > 0 {
			// A unit a sliding window frees and no one takes before its
			// window ends is lost: the window's count is the next one's
			// weight. So the waits shorten toward the end, to half of
			// what is left (down to a millisecond).
			wait = min(wait, max(left/2, min(left, int64(time.Millisecond))))
		}
	}
	until := addSat(now, min(max(wait, 1), s.lease))
	if r.Allowed { // the lease's own result: the store's answer to the next unit
		r.Allowed, r.Remaining = false, 0
	}
	r.RetryAfter = max(r.RetryAfter, time.Duration(until-now))
	r.NextAfter = 0
	return &reserveDenial{lim: lim, at: now, until: until, res: r}
}

// reserveDenial is a key's denial while its store lacks a block's worth:
// from at to until, both on ReserveConfig.Clock, as the store answered at
// at.
type reserveDenial struct {
	lim       Limit
	at, until int64
	res       Result
}

// result is d's answer at now: its store's answer with the times that
// have passed since taken off, and a retry no sooner than d ends.
func (d *reserveDenial) result(now int64, lim Limit) Result {
	r := d.res
	r.Limit = lim.Capacity()
	passed := time.Duration(max(0, now-d.at))
	r.RetryAfter = max(r.RetryAfter-passed, time.Duration(max(0, d.until-now)), time.Millisecond)
	r.ResetAfter = max(0, r.ResetAfter-passed)
	return r
}

// windowLeft is how long the window a lease of a window algorithm charged
// has left, from the lease's result: the block must be spent in that
// window, which alone counts its units. Read from the store's own answer,
// it needs no clock of the store's; now was read before the call, so the
// window ends no earlier than now plus it. For a token bucket, whose units
// count at any time, the lease decides.
func windowLeft(lim Limit, r Result) time.Duration {
	switch lim.Algorithm {
	case FixedWindow:
		return r.ResetAfter // the window's end, when its count resets
	case SlidingWindow:
		return r.ResetAfter - lim.Period // the current window's count reaches 0 a period after it ends
	}
	return math.MaxInt64
}

// LeaseTime returns how long a block is admitted from, at most: within it
// every block an instance leased is spent or ended.
func (s *ReserveStore) LeaseTime() time.Duration { return time.Duration(s.lease) }

// take decides n units on the store itself.
func (s *ReserveStore) take(ctx context.Context, key string, hash uint64, lim Limit, n int64) (Result, error) {
	s.takes.Add(1)
	return s.base.Take(ctx, key, hash, lim, n)
}

// size returns the units to lease for b at now: about one lease of the
// key's local rate, at least n, at most the capacity divided by the live
// instances. It updates the rate estimate.
func (s *ReserveStore) size(b *block, now int64, lim Limit, n int64) int64 {
	if b.since == 0 || now < b.since { // first, or the clock stepped back
		b.used, b.since = 0, now
	}
	switch elapsed := now - b.since; {
	case elapsed >= s.lease:
		rate := float64(b.used) * float64(s.lease) / float64(elapsed)
		b.perLease = (b.perLease + rate) / 2 // an average of the last estimates, halving the older
		b.used, b.since = 0, now
	case b.perLease == 0 && b.used >= reserveEvidence:
		// A first estimate, before a whole lease has passed, once the
		// key has been decided often enough for one to mean something.
		b.perLease = float64(b.used) * float64(s.lease) / float64(max(elapsed, s.lease/10))
	case b.wait == nil && b.open(now) && b.until-now > s.lease/2:
		// The last block, leased whole, was spent within half its lease:
		// the key is faster than the estimate, which doubles until the
		// next. (A block the store cut short says nothing of the rate.)
		b.perLease *= 2
	}
	// One lease at the estimated rate, and no more: what is left of a
	// block when its lease ends costs a return, and for a token bucket
	// the units held are lost (see lease.go); a key that turns faster
	// spends its block early and leases the next, with a doubled estimate.
	want := int64(math.Min(math.Ceil(b.perLease), math.MaxInt64/2))
	if left := b.windowLeft(now, lim); left < s.lease {
		// A window algorithm's block ends with its window, and what is
		// left of it then is lost to the window: lease what the key uses
		// until then.
		want = min(want, max(2, int64(math.Ceil(b.perLease*float64(left)/float64(s.lease)))))
	}
	fair := lim.Capacity() / int64(max(1, s.instances()))
	return max(n, min(want, fair))
}

// windowLeft is how long the window of lim that holds now has left, as
// the key's last lease under lim told (b.edge); MaxInt64 if it did not
// tell (a token bucket, or no lease yet).
func (b *block) windowLeft(now int64, lim Limit) int64 {
	if b.edge == 0 || b.lim != lim || now < b.edgeAt {
		return math.MaxInt64 // not told, or the clock stepped back before it was
	}
	if now < b.edge {
		return b.edge - now
	}
	p := int64(lim.Period)
	return p - (now-b.edge)%p
}

// open reports whether b's lease holds at now: ended at its end, and at a
// reading before it began (a Clock that stepped), since a block must not
// outlive the window that counted it.
func (b *block) open(now int64) bool { return b.from <= now && now < b.until }

// open reports whether sp's lease holds at now, as block.open.
func (sp *spare) open(now int64) bool { return sp.from <= now && now < sp.until }

// giveBack returns b's unused units to the store. The caller holds b.mu.
func (s *ReserveStore) giveBack(ctx context.Context, key string, b *block) {
	if b.left <= 0 {
		b.left = 0
		return
	}
	left := b.left
	b.left, b.until = 0, 0
	s.returnUnits(ctx, key, b.hash, b.lim, left, b.token)
}

// returnUnits gives left unused units of a block of key under lim, leased
// with token, back to the store.
func (s *ReserveStore) returnUnits(ctx context.Context, key string, hash uint64, lim Limit, left int64, token Token) {
	if left <= 0 {
		return
	}
	s.returns.Add(1)
	got, err := s.base.Return(ctx, key, hash, lim, left, token)
	if err != nil {
		got = 0
	}
	s.returned.Add(uint64(got))
	s.unspent.Add(uint64(left - got))
}

// block returns key's block, made if it has none; nil when MaxBlocks are
// held.
func (s *ReserveStore) block(key string, hash uint64) *block {
	sh := &s.shards[hash&uint64(len(s.shards)-1)]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if b := sh.blocks[key]; b != nil {
		return b
	}
	if s.n.Load() >= s.maxBlocks {
		return nil
	}
	b := &block{hash: hash}
	sh.blocks[key] = b
	s.n.Add(1)
	return b
}

// sweep returns the unused units of ended leases every interval, and
// forgets keys not decided for a while, until Close.
func (s *ReserveStore) sweep(every time.Duration) {
	defer close(s.stopped)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
			s.sweepOnce(false)
		}
	}
}

// reserveEvidence is how many decisions a key needs, within its first
// lease, to be leased a block before the lease has passed: a cold key's
// first decisions go to the store, one call each.
const reserveEvidence = 8

// reserveIdleSweeps is how many sweeps a key may go undecided before its
// block and rate estimate are forgotten.
const reserveIdleSweeps = 20

// sweepOnce returns the unused units of ended leases (every lease when
// all), and forgets idle keys.
func (s *ReserveStore) sweepOnce(all bool) {
	now := int64(s.clock())
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		var ended []string
		for k, b := range sh.blocks {
			if !b.mu.TryLock() {
				continue // a decision is leasing it
			}
			b.idle++
			if all || !b.open(now) || b.idle > reserveIdleSweeps || b.next != nil && !b.next.open(now) {
				ended = append(ended, k)
			}
			b.mu.Unlock()
		}
		sh.mu.Unlock()
		for _, k := range ended {
			sh.mu.Lock()
			b := sh.blocks[k]
			sh.mu.Unlock()
			if b == nil {
				continue
			}
			b.mu.Lock()
			at := int64(s.clock())
			if all || !b.open(at) {
				s.giveBack(ctx, k, b)
			}
			forget := all || b.idle > reserveIdleSweeps
			if sp := b.next; sp != nil && (forget || !sp.open(at)) {
				b.next = nil
				s.returnUnits(ctx, k, b.hash, sp.lim, sp.left, sp.token)
			}
			if forget {
				s.giveBack(ctx, k, b)
				b.dead = true
			}
			b.mu.Unlock()
			if forget {
				sh.mu.Lock()
				if sh.blocks[k] == b {
					delete(sh.blocks, k)
					s.n.Add(-1)
				}
				sh.mu.Unlock()
			}
		}
	}
}

// Close returns every open block to the store and stops the sweeper;
// later Takes go to the store. It does not close the store it leases
// from. Safe to call twice.
func (s *ReserveStore) Close() error {
	s.once.Do(func() {
		s.closed.Store(true)
		s.aheadMu.Lock() // no lease ahead starts after this
		s.aheadMu.Unlock()
		close(s.stop)
		<-s.stopped
		s.aheads.Wait()
		s.sweepOnce(true)
	})
	return nil
}
