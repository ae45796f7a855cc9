// Package hotkey is a rate-limiting engine that survives hot keys.
//
// Cold keys cost one counter in the store. A split key is spread over 4, 16
// or 64 subcounters, each enforcing its share of the limit, so one key at
// tens of thousands of requests per second no longer lands on one Redis
// counter. A decision hashes the key once; that hash feeds the split-table
// lookup, the choice of subcounter and the store's striping.
//
// Keys are split when the hot-key detector (package detector) finds them hot
// on this instance, and merged back when they cool; WithSplitAll and
// WithSplitKeys split keys statically as well.
package hotkey

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strings"
	"sync/atomic"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/hotkeyd/hotkey/coordinator"
	"github.com/hotkeyd/hotkey/counter"
	"github.com/hotkeyd/hotkey/detector"
	"github.com/hotkeyd/hotkey/shard"
)

// Limit is a rate limit; see counter.Limit.
type Limit = counter.Limit

// Algorithm names a rate-limiting algorithm; see counter.Algorithm.
type Algorithm = counter.Algorithm

// Store is where counters live; see counter.Store.
type Store = counter.Store

// The algorithms.
const (
	TokenBucket   = counter.TokenBucket
	SlidingWindow = counter.SlidingWindow
	FixedWindow   = counter.FixedWindow
	SlidingLog    = counter.SlidingLog
)

// PerSecond returns a token-bucket limit of rate per second with a burst of rate.
func PerSecond(rate int64) Limit { return counter.PerSecond(rate) }

// PerMinute returns a token-bucket limit of rate per minute with a burst of rate.
func PerMinute(rate int64) Limit { return counter.PerMinute(rate) }

// Errors for bad input. Limit errors (counter.ErrInvalidLimit and the like)
// are re-exported here; store errors come back wrapped as the store made them.
var (
	ErrEmptyKey         = errors.New("empty key")
	ErrKeyTooLong       = errors.New("key too long")
	ErrClosed           = errors.New("engine closed")
	ErrInvalidCost      = counter.ErrInvalidCost
	ErrCostExceedsBurst = counter.ErrCostExceedsBurst
	ErrInvalidLimit     = counter.ErrInvalidLimit
	ErrInvalidPeriod    = counter.ErrInvalidPeriod
	ErrInvalidBurst     = counter.ErrInvalidBurst
	ErrUnknownAlgorithm = counter.ErrUnknownAlgorithm
	ErrLimitTooLarge    = counter.ErrLimitTooLarge
	// ErrStoreUnavailable wraps the cause when the store cannot answer and
	// the fallback is FallbackError.
	ErrStoreUnavailable = errors.New("store unavailable")
	// ErrBreakerOpen is the cause while the circuit breaker is open.
	ErrBreakerOpen = errors.New("circuit breaker open")
	// ErrUnknownFallback is returned by ParseFallback.
	ErrUnknownFallback = errors.New("unknown fallback")
	// ErrInvalidPolicyName: a policy's name holds '|', which separates it
	// from the key in counter names.
	ErrInvalidPolicyName = errors.New("invalid policy name")
)

// Result is the outcome of one decision.
type Result struct {
	Allowed bool
	// Limit is the key's capacity: its burst (token bucket) or rate.
	Limit int64
	// Remaining estimates how much more the key would admit now. For a split
	// key it is N × the remaining of the subcounter that decided.
	Remaining int64
	// RetryAfter is how long until a denied request could pass; 0 if allowed.
	RetryAfter time.Duration
	// ResetAfter is how long until the counter is back to full.
	ResetAfter time.Duration
	// Shards is the number of subcounters the key was split into (1 if not).
	Shards int
	// Degraded says the store could not answer and the policy's fallback
	// decided (see Fallback).
	Degraded bool
}

// placer is implemented by stores that know how counter names map to nodes.
type placer interface{ Placement() counter.Placement }

// Engine makes rate-limit decisions on a Store. It is safe for concurrent
// use. The zero value is not usable; call New.
type Engine struct {
	store     Store
	placer    placer // nil: one node
	opt       options
	seed      uint64 // per instance: offsets subcounter choice
	table     *shard.Table
	splits    []atomic.Pointer[shard.Entry] // per-key state under WithSplitAll, direct-mapped
	deny      *denyCache                    // nil: disabled
	detect    *detector.Detector            // nil: disabled
	coord     coordinator.Coordinator
	reshard   counter.Resharder // nil: no state transfer
	instances atomic.Int32      // live instances, as the coordinator last said
	brk       *breaker
	local     *counter.MemoryStore // FallbackLocal's counters
	metrics   *metrics             // nil: none kept
	log       *slog.Logger
	refuse    refusals
	settleNow chan struct{} // wakes the loop to settle merged and refused keys
	life      context.Context
	endLife   context.CancelFunc // called by Close: ends the loop's store calls
	stop      chan struct{}      // closed by Close
	done      chan struct{}      // closed when the event loop has stopped
	closed    atomic.Bool
}

// New returns an engine deciding on store. The engine does not own store:
// Close leaves it open.
func New(store Store, opts ...Option) (*Engine, error) {
	if store == nil {
		return nil, errors.New("hotkey: nil store")
	}
	o := defaultOptions()
	for _, opt := range opts {
		if err := opt(&o); err != nil {
			return nil, fmt.Errorf("hotkey: %w", err)
		}
	}
	e := &Engine{store: store, opt: o, seed: rand.Uint64(), table: shard.NewTable(o.maxHotKeys), log: o.logger, settleNow: make(chan struct{}, 1)}
	e.local = counter.NewMemoryStore(counter.MemoryConfig{MaxKeys: o.localKeys, Clock: o.clock})
	e.brk = newBreaker(o.breakerFailures, o.breakerProbe, o.breakerMaxProbe, o.clock, e.breakerChanged)
	if o.registerer != nil {
		m, err := newMetrics(o.registerer, e)
		if err != nil {
			return nil, fmt.Errorf("hotkey: metrics: %w", err)
		}
		e.metrics = m
	}
	e.placer, _ = store.(placer)
	if o.denyCache > 0 {
		e.deny = newDenyCache(o.denyCache)
	}
	if o.splitAll > shard.Level1 {
		e.splits = make([]atomic.Pointer[shard.Entry], splitCacheSize)
	}
	for k, level := range o.splitKeys {
		if err := e.checkKey(k); err != nil {
			return nil, fmt.Errorf("hotkey: split key: %w", err)
		}
		if !e.table.Set(k, hashKey(k), level, shard.Level1, nil) {
			return nil, fmt.Errorf("hotkey: more split keys than max hot keys (%d)", o.maxHotKeys)
		}
	}
	if rs, ok := store.(counter.Resharder); ok && o.transfer {
		e.reshard = rs
	}
	e.instances.Store(1)
	if o.detect {
		d, err := detector.New(o.detector, time.Now())
		if err != nil {
			return nil, fmt.Errorf("hotkey: %w", err)
		}
		e.detect = d
	}
	e.coord = o.coord
	if e.coord == nil {
		e.coord = &coordinator.Local{}
	}
	if err := e.coord.Start(handler{e}); err != nil {
		return nil, fmt.Errorf("hotkey: coordinator: %w", err)
	}
	e.stop, e.done = make(chan struct{}), make(chan struct{})
	e.life, e.endLife = context.WithCancel(context.Background())
	if e.detect != nil {
		e.detect.Start()
	}
	go e.loop()
	return e, nil
}

// skewCheck is how often the engine looks at the store's clock skew, and
// maxSkew how much it takes a warning.
const (
	skewCheck = 10 * time.Second
	maxSkew   = 100 * time.Millisecond
)

// checkSkew logs a warning when the store's clock skew crosses maxSkew
// (warned says it already had), and a note when it is back under.
func (e *Engine) checkSkew(warned bool) bool {
	s, ok := e.store.(skewer)
	if !ok {
		return false
	}
	d, ok := s.ClockSkew()
	if !ok {
		return warned
	}
	over := d > maxSkew || d < -maxSkew
	switch {
	case over && !warned:
		e.log.Warn("clock skew between this host and the store", "skew", d, "warn_above", maxSkew)
	case !over && warned:
		e.log.Info("clock skew back under the warning level", "skew", d)
	}
	return over
}

// loop hands the detector's level changes to the coordinator, and settles
// merged and refused keys (see settle), until Close.
func (e *Engine) loop() {
	defer close(e.done)
	var events <-chan detector.Event
	if e.detect != nil {
		events = e.detect.Events()
	}
	retry := time.NewTicker(settleRetry)
	defer retry.Stop()
	skewTick := time.NewTicker(skewCheck)
	defer skewTick.Stop()
	skewed := false
	unsettled := false
	for {
		select {
		case <-skewTick.C:
			skewed = e.checkSkew(skewed)
		case ev, ok := <-events:
			if !ok {
				events = nil // closed by Close
				continue
			}
			e.coord.Announce(ev.Key, ev.Hash, ev.Level)
		case <-e.settleNow:
			unsettled = e.settle()
		case <-retry.C:
			if unsettled {
				unsettled = e.settle()
			}
		case <-e.stop:
			return
		}
	}
}

// handler applies the coordinator's decisions to the engine.
type handler struct{ e *Engine }

// SetLevel implements coordinator.Handler. A key split statically
// (WithSplitKeys, WithSplitAll) never goes below its static level. When the
// table is full (WithMaxHotKeys), the level waits, and the table comes to
// hold the highest-ranked keys (see settle). A key merged back stays in the
// table, at level 1, until its usage is back on the unsplit counter.
func (h handler) SetLevel(key string, hash uint64, level int) {
	e := h.e
	e.refuse.mu.Lock()
	defer e.refuse.mu.Unlock()
	delete(e.refuse.keys, key) // a newer level replaces one the table refused
	static := e.staticLevel(key)
	switch {
	case level > static:
		held, p := e.heldOutside(key, hash)
		if !e.table.Set(key, hash, level, held, p) {
			e.refusedLocked(key, hash, level)
			return
		}
	case static > shard.Level1:
		if e.table.Lookup(key, hash) == nil && e.opt.splitKeys[key] == 0 {
			return // under WithSplitAll, and never split above it
		}
		e.table.Set(key, hash, static, static, e.placement())
		level = static
		e.wakeSettle() // a key promoted under WithSplitAll leaves the table
	default:
		if !e.table.Merge(key, hash) {
			return
		}
		e.wakeSettle()
	}
	e.applied(key, level)
}

// applied logs and counts a level applied to key.
func (e *Engine) applied(key string, level int) {
	e.log.Info("hot key level", "key", key, "level", level)
	e.metrics.levelChanged(level)
	if e.opt.levelHook != nil {
		e.opt.levelHook(key, level)
	}
}

// breakerChanged logs and counts a change of the breaker's state.
func (e *Engine) breakerChanged(s BreakerState, cause error) {
	if s == BreakerOpen {
		e.log.Warn("store circuit breaker opened: decisions follow their fallback", "error", cause)
	} else {
		e.log.Info("store circuit breaker closed: the store answers again")
	}
	e.metrics.breakerChanged(s)
}

// BreakerState returns the state of the circuit breaker around the store.
func (e *Engine) BreakerState() BreakerState { return e.brk.State() }

// SetInstances implements coordinator.Handler: the detector compares local
// rates with its threshold over the live instances.
func (h handler) SetInstances(n int) {
	h.e.instances.Store(int32(n))
	if h.e.detect != nil {
		h.e.detect.SetInstances(n)
	}
}

// Instances returns the number of live instances, as the coordinator last
// reported it (1 with the Local coordinator).
func (e *Engine) Instances() int { return int(e.instances.Load()) }

// Level returns the level key is split to on this engine: 1 if it is not
// split.
func (e *Engine) Level(key string) int {
	hash := hashKey(key)
	if ent := e.table.Lookup(key, hash); ent != nil {
		return ent.Level()
	}
	return e.staticLevel(key)
}

// staticLevel returns the level WithSplitKeys and WithSplitAll give key: 1
// if neither splits it.
func (e *Engine) staticLevel(key string) int {
	return max(e.opt.splitKeys[key], e.opt.splitAll, shard.Level1)
}

// Allow is AllowN(ctx, key, lim, 1).
func (e *Engine) Allow(ctx context.Context, key string, lim Limit) (Result, error) {
	return e.AllowN(ctx, key, lim, 1)
}

// AllowN decides whether n units for key fit in lim, and charges them if so.
// Bad input returns a typed error (ErrEmptyKey, ErrKeyTooLong,
// ErrInvalidCost, ErrCostExceedsBurst, or a limit error). When the store
// cannot answer, the engine's fallback decides (WithFallback; by default a
// local memory store at lim divided by the live instances): see Decide.
// AllowN blocks only on the store.
func (e *Engine) AllowN(ctx context.Context, key string, lim Limit, n int64) (Result, error) {
	return e.allow(ctx, key, lim, n, e.opt.fallback, nil)
}

// Decide decides whether n units for key fit in p's limit, and charges
// them if so. The counter is the policy's own: named p.Name + "|" + key when
// p.Name is set (see CounterName), so two policies on one key never share
// state, and the hot-key detector, the split table and the coordinator see
// that name. When the store cannot answer (the call fails, ctx's deadline
// passes first, or the circuit breaker around it is open), p.OnStoreFailure
// decides, and the result says Degraded; only FallbackError returns the
// store's error (wrapping ErrStoreUnavailable). A call cut by ctx's deadline
// counts as a failure of the store toward the breaker; one cut by ctx's
// cancellation returns ctx's error and counts as nothing. Bad input returns
// a typed error, as for AllowN.
func (e *Engine) Decide(ctx context.Context, key string, p *Policy, n int64) (Result, error) {
	if p == nil {
		return Result{}, errors.New("hotkey: nil policy")
	}
	return e.allow(ctx, key, p.Limit, n, p.OnStoreFailure, p)
}

// CounterName returns the name of the counter that Decide charges for key
// under a policy named policy: policy + "|" + key, or key alone for an
// unnamed policy (and for AllowN). A policy name must not hold '|', so that
// two policies' counters never share a name; an AllowN key that holds '|'
// (say "login|bob") names the same counter as Decide's for that policy and
// key, so keep such keys out of AllowN where policies are in use.
func CounterName(policy, key string) string {
	if policy == "" {
		return key
	}
	return policy + "|" + key
}

// allow is the decision path; p, if not nil, names the policy, its counters'
// namespace, and holds its allowlist.
func (e *Engine) allow(ctx context.Context, key string, lim Limit, n int64, fb Fallback, p *Policy) (Result, error) {
	if err := e.check(key, lim, n); err != nil {
		e.metrics.rejectInput(p)
		return Result{}, err
	}
	name := key
	if p != nil && p.Name != "" {
		if strings.IndexByte(p.Name, '|') >= 0 {
			e.metrics.rejectInput(p)
			return Result{}, fmt.Errorf("%w: %q holds '|'", ErrInvalidPolicyName, p.Name)
		}
		name = CounterName(p.Name, key)
	}
	hash := hashKey(name)
	if e.detect != nil {
		e.detect.Observe(hash, name)
	}
	r, err := e.decideStore(ctx, name, hash, lim, n)
	if err == nil {
		e.metrics.decided(p, r, false)
		return r, nil
	}
	if errors.Is(ctx.Err(), context.Canceled) { // the caller left: nobody to answer
		e.metrics.failed(p)
		return Result{}, err
	}
	if !errors.Is(err, ErrBreakerOpen) {
		e.metrics.storeFailure()
	}
	return e.fallback(ctx, key, name, hash, lim, n, fb, p, err)
}

// fallback decides without the store, as fb says, for key (on the
// allowlist) whose counter is name; cause is why.
func (e *Engine) fallback(ctx context.Context, key, name string, hash uint64, lim Limit, n int64, fb Fallback, p *Policy, cause error) (Result, error) {
	capacity := lim.Capacity()
	r := Result{Limit: capacity, Shards: 1, Degraded: true}
	switch {
	case fb == FallbackError:
		e.metrics.failed(p)
		return Result{}, fmt.Errorf("%w: %w", ErrStoreUnavailable, cause)
	case fb == FallbackOpen || fb == FallbackClosed && p.allowlisted(key):
		r.Allowed, r.Remaining = true, capacity-n
	case fb == FallbackClosed:
		r.RetryAfter = lim.Period
	default: // FallbackLocal: this instance's share of the limit
		share := lim
		inst := int64(max(1, e.Instances()))
		share.Rate = max(1, lim.Rate/inst)
		if share.Algorithm == counter.TokenBucket {
			share.Burst = max(1, capacity/inst)
		}
		if n > share.Capacity() {
			r.RetryAfter = lim.Period
			break
		}
		lr, _ := e.local.Take(ctx, name, hash, share, n) // the memory store does not fail
		r.Allowed, r.Remaining, r.RetryAfter, r.ResetAfter = lr.Allowed, lr.Remaining, lr.RetryAfter, lr.ResetAfter
	}
	e.metrics.decided(p, r, true)
	return r, nil
}

// decideStore decides on the store: the key whole, or split.
func (e *Engine) decideStore(ctx context.Context, key string, hash uint64, lim Limit, n int64) (Result, error) {
	ent := e.entry(key, hash)
	if ent == nil {
		return e.decide(ctx, key, hash, lim, n)
	}
	// The counters that hold the key's usage were last written under the
	// limit of the decision before: a move reads them under it.
	prev, ok := ent.Memo().(Limit)
	if !ok {
		prev = lim
	}
	if !ok || prev != lim {
		ent.SetMemo(lim) // for settle, should no decision come after a merge
	}
	// The counters of the level a cost of 1 fits, under the store's
	// current placement, hold the key's usage; a larger cost must fit one
	// of them (below).
	p := e.placement()
	level := shard.Fit(ent.Level(), lim.Rate, lim.Capacity(), e.opt.minShare, 1)
	if e.reshard != nil && !ent.Holds(level, p) {
		if err := ent.Transfer(level, p, func(from int, fromP shard.Placement, to int) error {
			return e.transfer(ctx, ent, prev, lim, from, fromP, to, p)
		}); err != nil {
			return Result{}, err
		}
	}
	// Merged back: out of the table once its usage is on the unsplit
	// counter (a merge that came during this decision's move leaves it to
	// the next decision or to settle).
	if ent.Level() == shard.Level1 && (e.reshard == nil || ent.Holds(shard.Level1, nil)) && e.table.Remove(ent, shard.Level1) {
		e.wakeSettle() // room for a refused key
	}
	if level == shard.Level1 {
		return e.decide(ctx, key, hash, lim, n)
	}
	if n > 1 && shard.Fit(level, lim.Rate, lim.Capacity(), e.opt.minShare, n) < level {
		// No subcounter holding the key's usage can take n. Fewer, larger
		// counters would take it from quota nobody has charged: refuse,
		// as a key whose every subcounter is full would.
		return Result{Limit: lim.Capacity(), RetryAfter: lim.Period, ResetAfter: lim.Period, Shards: level}, nil
	}
	return e.decideSplit(ctx, ent, level, p, lim, n)
}

// transfer moves the usage of ent's key from its counters at level from,
// named under placement fromP and written under fromLim, to those at level
// to under toP, under lim (see counter.Resharder). Counters written under
// another algorithm or period hold no usage lim can read: nothing moves.
func (e *Engine) transfer(ctx context.Context, ent *shard.Entry, fromLim, lim Limit, from int, fromP shard.Placement, to int, toP shard.Placement) error {
	src, dst := shards(ent, fromLim, from, fromP), shards(ent, lim, to, toP)
	if len(src) == 0 || len(dst) == 0 || fromLim.Algorithm != lim.Algorithm || fromLim.Period != lim.Period {
		return nil
	}
	ok, probe := e.brk.allow()
	if !ok {
		return ErrBreakerOpen
	}
	err := e.reshard.Reshard(ctx, src, dst)
	if errors.Is(err, counter.ErrInvalidReshard) {
		// Not the store's failure, and no retry would do better: leave
		// the usage behind rather than fail every decision on the key.
		e.brk.abandon(probe)
		e.log.Warn("hot key usage not moved", "key", ent.Key, "from", from, "to", to, "error", err)
		return nil
	}
	e.brk.report(ctx, probe, err)
	if err != nil {
		return fmt.Errorf("hotkey: moving %q from %d to %d counters: %w", ent.Key, from, to, err)
	}
	return nil
}

// shards returns ent's counters at level under placement p, each with its
// share of lim, less those whose share is nothing (lim too small to split
// that many ways: no decision ever used them under it). Transfers are rare:
// the names are not cached.
func shards(ent *shard.Entry, lim Limit, level int, p shard.Placement) []counter.Shard {
	names := shard.Names(ent.Key, ent.Hash, level, p)
	out := make([]counter.Shard, 0, level)
	for i := range level {
		sub := subLimit(lim, level, i)
		if sub.Validate() != nil {
			continue
		}
		out = append(out, counter.Shard{Name: names[i], Hash: shard.SubHash(ent.Hash, level, i), Limit: sub})
	}
	return out
}

// entry returns the split state of key, or nil if the key is not split.
func (e *Engine) entry(key string, hash uint64) *shard.Entry {
	if e.splits == nil {
		return e.table.Lookup(key, hash)
	}
	if ent := e.table.Lookup(key, hash); ent != nil {
		return ent
	}
	if ent := e.cached(key, hash); ent != nil {
		return ent
	}
	ent := shard.NewEntry(key, hash, e.opt.splitAll, e.opt.splitAll, e.placement())
	e.splits[hash&(splitCacheSize-1)].Store(ent)
	return ent
}

// cached returns key's entry in the split cache (WithSplitAll), or nil.
func (e *Engine) cached(key string, hash uint64) *shard.Entry {
	if ent := e.splits[hash&(splitCacheSize-1)].Load(); ent != nil && ent.Hash == hash && ent.Key == key {
		return ent
	}
	return nil
}

// heldOutside returns the level and placement whose counters hold the
// usage of key, not in the table: under WithSplitAll, what its entry in the
// split cache holds (the static level, or the level a limit's shares fit),
// else the unsplit counter.
func (e *Engine) heldOutside(key string, hash uint64) (int, shard.Placement) {
	if e.splits == nil {
		return shard.Level1, nil
	}
	if ent := e.cached(key, hash); ent != nil {
		return ent.HeldAt()
	}
	return e.opt.splitAll, e.placement()
}

// placement returns the store's current placement, nil for one node.
func (e *Engine) placement() shard.Placement {
	if e.placer == nil {
		return nil
	}
	return e.placer.Placement()
}

// decide takes n from the unsplit counter key.
func (e *Engine) decide(ctx context.Context, key string, hash uint64, lim Limit, n int64) (Result, error) {
	r, err := e.take(ctx, key, hash, lim, n)
	if err != nil {
		return Result{}, err
	}
	return Result{Allowed: r.Allowed, Limit: r.Limit, Remaining: r.Remaining, RetryAfter: r.RetryAfter, ResetAfter: r.ResetAfter, Shards: 1}, nil
}

// decideSplit takes n from one of the level subcounters of ent, named
// under p, and on a deny probes a second one.
func (e *Engine) decideSplit(ctx context.Context, ent *shard.Entry, level int, p shard.Placement, lim Limit, n int64) (Result, error) {
	names := ent.Names(level, p)
	i := ent.Pick(level, e.opt.selection, e.seed)
	r, err := e.take(ctx, names[i], shard.SubHash(ent.Hash, level, i), subLimit(lim, level, i), n)
	if err != nil {
		return Result{}, err
	}
	if !r.Allowed && e.opt.secondChance {
		// Which other one: drawn from the instance's seed and the deny, so
		// it adds nothing random to a run on a simulated clock.
		j := shard.SecondChance(i, level, shard.Mix(e.seed^ent.Hash^uint64(r.RetryAfter)))
		// A failed probe leaves the first answer standing.
		if r2, err := e.take(ctx, names[j], shard.SubHash(ent.Hash, level, j), subLimit(lim, level, j), n); err == nil &&
			(r2.Allowed || r2.RetryAfter < r.RetryAfter) {
			r = r2
		}
	}
	capacity := lim.Capacity()
	return Result{
		Allowed:    r.Allowed,
		Limit:      capacity,
		Remaining:  min(capacity, r.Remaining*int64(level)),
		RetryAfter: r.RetryAfter,
		ResetAfter: r.ResetAfter,
		Shards:     level,
	}, nil
}

// take asks the store for n from counter name, unless the deny cache knows
// it denies.
func (e *Engine) take(ctx context.Context, name string, hash uint64, lim Limit, n int64) (counter.Result, error) {
	if e.deny == nil {
		return e.storeTake(ctx, name, hash, lim, n)
	}
	id := denyID(hash, lim)
	if r, ok := e.deny.lookup(id, n, e.opt.clock); ok {
		return r, nil
	}
	r, err := e.storeTake(ctx, name, hash, lim, n)
	switch {
	case err != nil:
	case !r.Allowed:
		e.deny.add(id, n, e.opt.clock(), r)
	case r.NextAfter > 0:
		// The admission emptied the bucket: the store says when its next
		// unit is due. Remember that as a denial too, or a key over its
		// limit would cost a store call per unit admitted plus one per
		// unit refused. Other instances can only empty the bucket further.
		e.deny.add(id, 1, e.opt.clock(), counter.Result{Limit: r.Limit, RetryAfter: r.NextAfter, ResetAfter: r.ResetAfter})
	}
	return r, err
}

// storeTake is one Take on the store, timed when metrics are kept.
// The circuit breaker counts store calls, not decisions: a decision the deny
// cache answers tells nothing of the store. While it is open, storeTake
// fails with ErrBreakerOpen but for the one call that probes.
func (e *Engine) storeTake(ctx context.Context, name string, hash uint64, lim Limit, n int64) (counter.Result, error) {
	if err := ctx.Err(); err != nil {
		return counter.Result{}, err // over before the store was asked: no verdict on it
	}
	ok, probe := e.brk.allow()
	if !ok {
		return counter.Result{}, ErrBreakerOpen
	}
	var start time.Time
	if e.metrics != nil {
		start = time.Now()
	}
	r, err := e.store.Take(ctx, name, hash, lim, n)
	e.metrics.storeCall(start)
	e.brk.report(ctx, probe, err)
	return r, err
}

// subLimit is subcounter i's share of lim split n ways: rate and burst are
// each split with remainders to the first subcounters.
func subLimit(lim Limit, n, i int) Limit {
	capacity := lim.Capacity()
	lim.Rate = shard.Share(lim.Rate, n, i)
	if lim.Algorithm == counter.TokenBucket {
		lim.Burst = shard.Share(capacity, n, i)
	}
	return lim
}

func (e *Engine) check(key string, lim Limit, n int64) error {
	if e.closed.Load() {
		return ErrClosed
	}
	if err := e.checkKey(key); err != nil {
		return err
	}
	if err := lim.Validate(); err != nil {
		return err
	}
	if n <= 0 {
		return fmt.Errorf("%w: %d", ErrInvalidCost, n)
	}
	if c := lim.Capacity(); n > c {
		return fmt.Errorf("%w: %d > %d", ErrCostExceedsBurst, n, c)
	}
	return nil
}

func (e *Engine) checkKey(key string) error {
	switch {
	case key == "":
		return ErrEmptyKey
	case len(key) > e.opt.maxKeyLen:
		return fmt.Errorf("%w: %d bytes > %d", ErrKeyTooLong, len(key), e.opt.maxKeyLen)
	}
	return nil
}

// Close stops the engine and waits for its goroutines: later decisions
// return ErrClosed. It does not close the store. Safe to call twice.
func (e *Engine) Close() error {
	if e.closed.Swap(true) {
		return nil
	}
	if e.detect != nil {
		e.detect.Close()
	}
	e.endLife()
	close(e.stop)
	<-e.done
	return e.coord.Close()
}

// hashKey is the one hash of a key: xxhash64.
func hashKey(key string) uint64 { return xxhash.Sum64String(key) }
