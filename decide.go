package hotkey

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/hotkeyd/hotkey/counter"
	"github.com/hotkeyd/hotkey/shard"
	"github.com/hotkeyd/hotkey/split"
)

// The decision path, top to bottom. Allow and AllowN go through allow: it
// checks the input, names the counter (policy|key), hashes it once and
// feeds the detector. A SyncGossip policy is decided on the gossip store's
// unsplit counter (decideGossip); for the others decideStore picks the
// counters: the unsplit one (decide), or for a split key one of its
// subcounters (decideSplit), on the counters the split table lets it in to
// (split.Table.Enter, which moves the key's usage first if its level or the
// store's node map changed, through mover). take asks the deny cache, then
// the store through the breaker (storeTake). When the store cannot answer, fallback decides as the
// policy says.

// Allow is AllowN(ctx, key, p, 1).
func (e *Engine) Allow(ctx context.Context, key string, p *Policy) (Result, error) {
	return e.AllowN(ctx, key, p, 1)
}

// AllowN decides whether n units for key fit in p's limit, and charges them
// if so. It blocks only on the store.
//
// The counter is the policy's own: named p.Name + "|" + key when p.Name is
// set, key alone when it is not, so two named policies on one key never
// share state (but an unnamed policy's key "login|bob" names the counter of
// key "bob" under the policy "login"); the hot-key detector, the split
// table and the coordinator see that name, and the store counts under
// shard.Name of it (the name itself, but for keys that end like a
// subcounter's name).
//
// Bad input returns a typed error, the first that applies of: ErrEmptyKey
// or ErrKeyTooLong, a limit error such as ErrInvalidLimit, ErrInvalidCost
// or ErrCostExceedsBurst, ErrInvalidPolicyName, and an error wrapping
// errors.ErrUnsupported for a Sync the engine cannot keep. When the store
// cannot answer (the call fails, ctx's deadline passes first, or the circuit
// breaker around it is open), p.OnStoreFailure decides, and the result says Degraded; only
// FallbackError returns the store's error (wrapping ErrStoreUnavailable). A
// call cut by ctx's deadline counts as a failure of the store toward the
// breaker; one cut by ctx's cancellation returns ctx's error and counts as
// nothing.
//
// Under a Shadow policy a denial, by the store or the fallback, is charged
// as a denial and answered Allowed with ShadowDenied; errors stay errors.
func (e *Engine) AllowN(ctx context.Context, key string, p *Policy, n int64) (Result, error) {
	if p == nil {
		return Result{}, ErrNilPolicy
	}
	if e.metrics == nil {
		return e.allow(ctx, key, p, n)
	}
	start := monotonic()
	r, err := e.allow(ctx, key, p, n)
	e.metrics.decisionTook(monotonic()-start, 1)
	return r, err
}

// allow is the decision path for n units of key under p (not nil).
func (e *Engine) allow(ctx context.Context, key string, p *Policy, n int64) (Result, error) {
	name, hash, err := e.admit(key, p, n)
	if err != nil {
		return Result{}, err
	}
	d := degraded{key, name, hash, n, p}
	if p.Regions == RegionsShares {
		r, err := e.decideShares(ctx, p, key, name, hash, n)
		return e.conclude(ctx, d, r, err)
	}
	if p.Sync == SyncGossip {
		return e.conclude(ctx, d, e.decideGossip(name, hash, p.Limit, n), nil)
	}
	if p.Sync == SyncReserve {
		r, err := e.decideReserve(ctx, name, hash, p.Limit, n)
		return e.conclude(ctx, d, r, err)
	}
	if p.Regions != RegionsIndependent {
		// The other regions' units are charged to the key's one counter.
		r, err := e.decide(ctx, e.store, name, hash, p.Limit, n)
		return e.conclude(ctx, d, r, err)
	}
	r, err := e.decideStore(ctx, e.store, name, hash, p.Limit, n)
	return e.conclude(ctx, d, r, err)
}

// decideReserve decides n units of counter name under lim from the blocks
// leased from the store (SyncReserve). A key is never split under
// SyncReserve: its store calls follow its leases, about one per lease per
// instance whatever its demand, so it makes no hot shard to spread, and a
// split would multiply those calls by its level and cut its blocks as
// small. The detector still sees the key.
func (e *Engine) decideReserve(ctx context.Context, name string, hash uint64, lim Limit, n int64) (Result, error) {
	return e.decide(ctx, e.reserveStore(), name, hash, lim, n)
}

// admit checks a decision's input and names its counter (counterName), then
// checks that the engine keeps p's Sync, and returns the counter name and its
// hash, which it feeds to the detector. A refusal counts in the metrics.
func (e *Engine) admit(key string, p *Policy, n int64) (string, uint64, error) {
	name, hash, err := e.counterName(key, p, n)
	if err == nil && p.Sync != SyncStore && p.Sync != SyncGossip && (p.Sync != SyncReserve || e.leaser == nil) {
		err = fmt.Errorf("policy %q: sync %v on a store that cannot keep it: %w", p.Name, p.Sync, errors.ErrUnsupported)
	}
	if err == nil && p.Regions != RegionsIndependent {
		err = e.checkRegions(p)
	}
	if err == nil {
		if err = p.Sync.Keeps(p.Limit.Algorithm); err != nil {
			err = fmt.Errorf("policy %q: %w", p.Name, err)
		}
	}
	if err != nil {
		e.metrics.rejectInput(p)
		return "", 0, err
	}
	// The hint is for the unsplit counter, named name unless the name is
	// escaped, when it is wasted.
	switch {
	case p.Sync == SyncGossip:
		e.gossipStore().Prefetch(hash)
	case e.prefetch != nil:
		e.prefetch.Prefetch(hash) // its miss overlaps the detector's
	}
	if e.detect != nil {
		e.detect.Observe(name, hash)
	}
	return name, hash, nil
}

// counterName checks a request of n units of key under p (not nil), and
// returns the name of the key's counter under p (policy|key, nameOf) and its hash.
// Of the errors, the first that applies is returned: ErrClosed, the key's
// (ErrEmptyKey, ErrKeyTooLong), the limit's (ErrInvalidLimit), the cost's
// (ErrInvalidCost, ErrCostExceedsBurst), ErrInvalidPolicyName.
func (e *Engine) counterName(key string, p *Policy, n int64) (string, uint64, error) {
	known, err := e.check(key, p, n)
	if err != nil {
		return "", 0, err
	}
	name := key
	if p.Name != "" {
		if !known.nameOK {
			return "", 0, fmt.Errorf("%w: %q holds '|'", ErrInvalidPolicyName, p.Name)
		}
		name = nameOf(p.Name, key)
	}
	return name, hashKey(name), nil
}

// conclude ends decision d, which the store answered with r or err: it
// counts the result, or has the policy's fallback decide. A Shadow
// policy's denial, by the store or the fallback, is answered allowed here.
func (e *Engine) conclude(ctx context.Context, d degraded, r Result, err error) (Result, error) {
	if err == nil {
		if r.Allowed && d.p.Regions == RegionsExchange && e.xr != nil {
			e.xr.admitted(d.p, d.key, d.hash, d.n)
		}
		r = d.p.shadowed(r)
		e.metrics.decided(d.p, r, false)
		return r, nil
	}
	if errors.Is(ctx.Err(), context.Canceled) { // the caller left: nobody to answer
		e.metrics.failed(d.p)
		return Result{}, err
	}
	if !errors.Is(err, ErrBreakerOpen) {
		e.metrics.storeFailure()
	}
	r, err = e.fallback(ctx, d, err)
	if err == nil && r.Allowed && !r.ShadowDenied && d.p.Regions == RegionsExchange && e.xr != nil {
		e.xr.admitted(d.p, d.key, d.hash, d.n) // admitted without the store: the other regions count it all the same
	}
	return r, err
}

// degraded is a decision the store could not make: key, its counter name
// and that name's hash, the cost, and the policy, whose fallback decides.
type degraded struct {
	key, name string
	hash      uint64
	n         int64
	p         *Policy
}

// fallback decides d without the store, as its policy says; cause is why.
func (e *Engine) fallback(ctx context.Context, d degraded, cause error) (Result, error) {
	lim, fb := d.p.Limit, d.p.OnStoreFailure
	capacity := lim.Capacity()
	r := Result{Limit: capacity, Shards: 1, Degraded: true}
	switch {
	case fb == FallbackError:
		e.metrics.failed(d.p)
		return Result{}, fmt.Errorf("%w: %w", ErrStoreUnavailable, cause)
	case fb == FallbackOpen || fb == FallbackClosed && d.p.allowlisted(d.key):
		r.Allowed, r.Remaining = true, capacity-d.n
	case fb == FallbackClosed:
		r.RetryAfter = lim.Period
	default: // FallbackLocal: this instance's share of the limit
		share := e.localShare(lim)
		if d.n > share.Capacity() {
			r.RetryAfter = lim.Period
			break
		}
		lr, _ := e.local.Take(ctx, d.name, d.hash, share, d.n) // the memory store does not fail
		r.Allowed, r.Remaining, r.RetryAfter, r.ResetAfter = lr.Allowed, lr.Remaining, lr.RetryAfter, lr.ResetAfter
	}
	r = d.p.shadowed(r)
	e.metrics.decided(d.p, r, true)
	return r, nil
}

// decideStore decides on the store: the key whole, or split. A decision
// on the unsplit counter that a move off it may have missed (see
// split.Table.Moved) is made again where the key's usage is now; had the
// move read its unit, the key admits less, never more.
func (e *Engine) decideStore(ctx context.Context, st counter.Store, key string, hash uint64, lim Limit, n int64) (Result, error) {
	for {
		gen := e.table.Gen(hash)
		if ent := e.entry(key, hash); ent != nil {
			return e.decideEntry(ctx, st, ent, key, hash, lim, n)
		}
		r, err := e.decide(ctx, st, key, hash, lim, n)
		if err != nil || !r.Allowed || !e.table.Moved(hash, gen) {
			return r, err
		}
	}
}

// decideEntry is decideStore for a key with split state ent: it decides on
// the counters the table lets it in to (split.Table.Enter). It is apart so
// that an unsplit key's decision pays nothing for its defer.
func (e *Engine) decideEntry(ctx context.Context, st counter.Store, ent *split.Entry, key string, hash uint64, lim Limit, n int64) (Result, error) {
	at, err := e.table.Enter(ctx, ent, lim)
	if errors.Is(err, counter.ErrFull) {
		return fullResult(err, lim, ent.Level()), nil
	}
	if err != nil {
		return Result{}, err
	}
	defer e.table.Exit(ent)
	if e.table.RemoveMerged(ent) {
		e.wakeSettle() // room for a refused key
	}
	if at.Level == shard.Level1 {
		return e.decide(ctx, st, key, hash, lim, n)
	}
	capacity := lim.Capacity()
	if n > 1 && shard.Fit(at.Level, lim.Rate, capacity, e.opt.minShare, n) < at.Level {
		// No subcounter holding the key's usage can take n. Fewer, larger
		// counters would take it from quota nobody has charged: refuse,
		// as a key whose every subcounter is full would.
		return Result{Limit: capacity, RetryAfter: lim.Period, ResetAfter: lim.Period, Shards: at.Level}, nil
	}
	return e.decideSplit(ctx, st, ent, at.Level, at.P, lim, capacity, n)
}

// mover is the engine's split.Mover: it moves usage on the store.
type mover struct{ e *Engine }

// Move moves the usage of ent's key from the counters from, written under
// fromLim, to those of to, under lim (see counter.Resharder). Counters
// written under another algorithm or period hold no usage lim can read:
// nothing moves.
func (m mover) Move(ctx context.Context, ent *split.Entry, from, to split.Counters, fromLim, lim Limit) error {
	e := m.e
	src, dst := shards(ent, fromLim, from.Level, from.P), shards(ent, lim, to.Level, to.P)
	if len(src) == 0 || len(dst) == 0 || fromLim.Algorithm != lim.Algorithm || fromLim.Period != lim.Period {
		return nil
	}
	ok, probe := e.brk.allow()
	if !ok {
		return ErrBreakerOpen
	}
	err := e.reshard.Reshard(ctx, src, dst)
	if errors.Is(err, counter.ErrFull) {
		// The store answered: it is full, not failing. The usage stays
		// where it is (see split.Table.Enter).
		e.brk.report(ctx, probe, nil)
		return err
	}
	if errors.Is(err, counter.ErrInvalidReshard) {
		// Not the store's failure, and no retry would do better: leave
		// the usage behind rather than fail every decision on the key.
		e.brk.abandon(probe)
		e.log.Warn("hot key usage not moved", "key", ent.Key, "from", from.Level, "to", to.Level, "error", err)
		return nil
	}
	e.brk.report(ctx, probe, err)
	if err != nil {
		return fmt.Errorf("hotkey: moving %q from %d to %d counters: %w", ent.Key, from.Level, to.Level, err)
	}
	return nil
}

// shards returns ent's counters at level under placement p that have a
// share of lim, each with its share (split.Entry.Shards).
func shards(ent *split.Entry, lim Limit, level shard.Level, p shard.Placement) []counter.Shard {
	out := make([]counter.Shard, 0, level)
	for _, c := range ent.Shards(level, p, lim) {
		out = append(out, c)
	}
	return out
}

// entry returns the split state of key, or nil if the key is not split.
func (e *Engine) entry(key string, hash uint64) *split.Entry { return e.table.Find(key, hash) }

// placement returns the store's current placement, nil for one node.
func (e *Engine) placement() shard.Placement {
	if e.placer == nil {
		return nil
	}
	return e.placer.Placement()
}

// decide takes n from the unsplit counter of key (hashed hash), named
// shard.Name(key).
func (e *Engine) decide(ctx context.Context, st counter.Store, key string, hash uint64, lim Limit, n int64) (Result, error) {
	name, hash := unsplitCounter(key, hash)
	r, err := e.take(ctx, st, name, hash, lim, n)
	if err != nil {
		return Result{}, err
	}
	return unsplit(r), nil
}

// decideSplit takes n from one of the level subcounters of ent, named
// under p, and on a deny probes a second one. capacity is lim's.
func (e *Engine) decideSplit(ctx context.Context, st counter.Store, ent *split.Entry, level shard.Level, p shard.Placement, lim Limit, capacity, n int64) (Result, error) {
	i := ent.Pick(level, e.opt.selection, e.seed)
	name, hash := ent.Sub(level, i, p)
	r, err := e.take(ctx, st, name, hash, split.Share(lim, capacity, level, i), n)
	if err != nil {
		return Result{}, err
	}
	if !r.Allowed && e.opt.secondChance {
		// Which other one: drawn from the instance's seed and the deny, so
		// it adds nothing random to a run on a simulated clock.
		j := shard.SecondChance(i, int(level), shard.Mix(e.seed^ent.Hash^uint64(r.RetryAfter)))
		// A failed probe leaves the first answer standing.
		name, hash = ent.Sub(level, j, p)
		if r2, err := e.take(ctx, st, name, hash, split.Share(lim, capacity, level, j), n); err == nil &&
			(r2.Allowed || r2.RetryAfter < r.RetryAfter) {
			r = r2
		}
	}
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
func (e *Engine) take(ctx context.Context, st counter.Store, name string, hash uint64, lim Limit, n int64) (counter.Result, error) {
	if e.deny == nil {
		return e.storeTake(ctx, st, name, hash, lim, n)
	}
	id := denyID(hash, lim)
	if r, ok := e.knownDeniedID(id, n); ok {
		return r, nil
	}
	asked := e.opt.clock()
	r, err := e.storeTake(ctx, st, name, hash, lim, n)
	if err == nil {
		h := holding{life: denyHold(st)}
		if st == e.store {
			h = holdFor(lim, e.opt.clock().Sub(asked))
		}
		e.rememberID(id, n, r, asked, h)
	}
	return r, err
}

// denyHold is how long a denial st answered may be remembered, at most.
// Under SyncReserve, one lease: other instances give their blocks' unused
// units back, so the store's denial holds no longer than what the
// instance knows of their blocks. Else 0: no bound but its retry-after
// (other instances only charge more), and store mode's hold (holdFor).
func denyHold(st counter.Store) time.Duration {
	if rs, ok := st.(*counter.ReserveStore); ok {
		return rs.LeaseTime()
	}
	return 0
}

// knownDenied answers a take of n from the counter hashed hash under lim if
// the deny cache knows it denies.
func (e *Engine) knownDenied(hash uint64, lim Limit, n int64) (counter.Result, bool) {
	if e.deny == nil {
		return counter.Result{}, false
	}
	return e.knownDeniedID(denyID(hash, lim), n)
}

// knownDeniedID is knownDenied of the counter and limit whose denyID is
// id; the deny cache is on.
func (e *Engine) knownDeniedID(id uint64, n int64) (counter.Result, bool) {
	r, ok := e.deny.lookup(id, n, e.opt.clock)
	if ok {
		e.metrics.denyHit()
	}
	return r, ok
}

// remember notes in the deny cache what the store answered to a take of n
// asked at asked. The store decided after asked, so its retry-after counted
// from asked ends no later than the store's.
func (e *Engine) remember(hash uint64, lim Limit, n int64, r counter.Result, asked time.Time) {
	if e.deny != nil {
		e.rememberID(denyID(hash, lim), n, r, asked, holding{})
	}
}

// rememberID is remember of the counter and limit whose denyID is id, the
// denial held as h lets it (denyCache.addHeld); the deny cache is on.
func (e *Engine) rememberID(id uint64, n int64, r counter.Result, asked time.Time, h holding) {
	switch {
	case !r.Allowed:
		e.deny.addHeld(id, n, asked, r, h, 1)
	case r.NextAfter > 0:
		// The admission emptied the bucket: the store says when its next
		// unit is due. Remember that as a denial too, or a key over its
		// limit would cost a store call per unit admitted plus one per
		// unit refused. Other instances can only empty the bucket further.
		e.deny.addHeld(id, 1, asked, counter.Result{Limit: r.Limit, RetryAfter: r.NextAfter, ResetAfter: r.ResetAfter}, h, 0)
	}
}

// storeTake is one Take on the store, timed when metrics are kept.
// The circuit breaker counts store calls, not decisions: a decision the deny
// cache answers tells nothing of the store. While it is open, storeTake
// fails with ErrBreakerOpen but for the one call that probes.
func (e *Engine) storeTake(ctx context.Context, st counter.Store, name string, hash uint64, lim Limit, n int64) (counter.Result, error) {
	if err := ctx.Err(); err != nil {
		return counter.Result{}, err // over before the store was asked: no verdict on it
	}
	ok, probe := e.brk.allow()
	if !ok {
		return counter.Result{}, ErrBreakerOpen
	}
	var start time.Duration
	if e.metrics != nil {
		start = monotonic()
	}
	r, err := st.Take(ctx, name, hash, lim, n)
	if st == e.store { // a reserve's decision is mostly local: not a store call to time
		e.metrics.storeCall(start)
	}
	e.brk.report(ctx, probe, err)
	return r, err
}

// subLimit is subcounter i's share of lim split n ways (split.Share).
func subLimit(lim Limit, n shard.Level, i int) Limit {
	return split.Share(lim, lim.Capacity(), n, i)
}

// check checks a decision of n units of key under p, and returns what p
// was found to be.
func (e *Engine) check(key string, p *Policy, n int64) (*checked, error) {
	if e.closed.Load() {
		return nil, ErrClosed
	}
	if err := e.checkKey(key); err != nil {
		return nil, err
	}
	known, err := p.check()
	if err != nil {
		return nil, err
	}
	if n <= 0 {
		return nil, fmt.Errorf("%w: %d", ErrInvalidCost, n)
	}
	if n > known.capacity {
		return nil, fmt.Errorf("%w: %d > %d", ErrCostExceedsBurst, n, known.capacity)
	}
	return known, nil
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

// hashKey is the one hash of a key: the stores' counter.Hash, seeded per
// process.
func hashKey(key string) uint64 { return counter.Hash(key) }

// unsplitCounter returns the name of the unsplit counter of name (hashed
// hash), shard.Name(name), and its hash, which a store is given with it:
// hash itself, unless the name had to be escaped.
func unsplitCounter(name string, hash uint64) (string, uint64) {
	stored := shard.Name(name)
	if stored != name {
		hash = hashKey(stored)
	}
	return stored, hash
}

// fullResult is the denial of a decision on a key whose usage cannot move
// to its level's counters for want of room in the store (err wraps a
// *counter.FullError), at level: retry once a counter of the full stripe
// expires.
func fullResult(err error, lim Limit, level shard.Level) Result {
	r := Result{Limit: lim.Capacity(), RetryAfter: time.Second, Shards: level}
	var full *counter.FullError
	if errors.As(err, &full) {
		r.RetryAfter = max(time.Nanosecond, full.Wait)
	}
	r.ResetAfter = r.RetryAfter
	return r
}
