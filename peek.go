package hotkey

import (
	"context"
	"errors"
	"fmt"

	"github.com/hotkeyd/hotkey/counter"
	"github.com/hotkeyd/hotkey/shard"
	"github.com/hotkeyd/hotkey/split"
)

// errNoPeek is Peek's error for a store that cannot answer without taking
// (no counter.Peeker).
var errNoPeek = fmt.Errorf("the store cannot peek: %w", errors.ErrUnsupported)

// Peek reports what a decision of one unit of key under p would find now,
// without charging the unit or changing any counter: Allowed says whether
// one unit would pass, Remaining what would be left after it. A split key
// is answered whole, from every subcounter that holds its usage: Allowed
// says whether one of them would admit the unit, Remaining is the sum of
// what each holds less the unit, RetryAfter (when none would) the soonest
// one of them admits, ResetAfter the latest one is empty again. A
// decision, which tries one or two subcounters, may so be denied where
// Peek allows. A SyncReserve policy is read on the store, on its key's one
// counter (it is never split): units in the blocks of instances count as
// used. A SyncGossip policy is read on this
// instance's view. Peek feeds neither the hot-key detector nor the
// decision metrics, and moves no usage. When the store cannot answer,
// p.OnStoreFailure decides as for AllowN, and its local counters are
// read, not charged. Bad input returns AllowN's errors; a store that
// cannot peek returns an error wrapping errors.ErrUnsupported. It blocks
// only on the store, which reads a split key's subcounters together where it
// is a counter.BatchPeeker (on Redis, in one round trip per node that holds
// them), else one each.
func (e *Engine) Peek(ctx context.Context, key string, p *Policy) (Result, error) {
	if p == nil {
		return Result{}, ErrNilPolicy
	}
	name, hash, err := e.counterName(key, p, 1)
	if err != nil {
		return Result{}, err
	}
	if p.Regions == RegionsShares && e.xr != nil {
		return e.peekShare(ctx, p, name, hash, e.xr.shareLimit(p, key, e.opt.clock()))
	}
	if p.Sync == SyncGossip {
		return e.peekGossip(name, hash, p.Limit), nil
	}
	peeker, ok := e.store.(counter.Peeker)
	if !ok {
		return Result{}, errNoPeek
	}
	// A SyncReserve key, or one shared with other regions, is never split.
	r, err := e.peekStore(ctx, peeker, name, hash, p.Limit, p.Sync != SyncReserve && p.Regions == RegionsIndependent)
	if err == nil {
		return r, nil
	}
	if errors.Is(ctx.Err(), context.Canceled) {
		return Result{}, err
	}
	return e.peekFallback(ctx, key, name, hash, p, err)
}

// peekStore peeks at the counters that hold the usage of counter name: the
// unsplit one, or every subcounter of a split key when splits (see Peek;
// a SyncReserve key is never split).
func (e *Engine) peekStore(ctx context.Context, peeker counter.Peeker, name string, hash uint64, lim Limit, splits bool) (Result, error) {
	if ent := e.entry(name, hash); ent != nil && splits {
		level, pl := ent.HeldAt()
		if e.reshard == nil { // no move: decisions take where the key's level fits
			level, pl = shard.Fit(ent.Level(), lim.Rate, lim.Capacity(), e.opt.minShare, 1), e.placement()
		}
		if level > shard.Level1 {
			return e.peekSplit(ctx, peeker, ent, level, pl, lim)
		}
	}
	stored, sh := unsplitCounter(name, hash)
	r, err := e.peekOne(ctx, peeker, stored, sh, lim)
	if err != nil {
		return Result{}, err
	}
	return unsplit(r), nil
}

// peekSplit peeks at each of the level subcounters of ent under pl, and
// answers for the key whole (see Peek).
func (e *Engine) peekSplit(ctx context.Context, peeker counter.Peeker, ent *split.Entry, level shard.Level, pl shard.Placement, lim Limit) (Result, error) {
	ops := make([]counter.PeekOp, 0, int(level))
	for _, c := range ent.Shards(level, pl, lim) {
		ops = append(ops, counter.PeekOp{Key: c.Name, Hash: c.Hash, Limit: c.Limit})
	}
	if err := e.peekMany(ctx, peeker, ops); err != nil {
		return Result{}, err
	}
	capacity := lim.Capacity()
	out := Result{Limit: capacity, Shards: level}
	var held int64 // units the subcounters hold before the peeked one
	for _, op := range ops {
		r := op.Result
		out.ResetAfter = max(out.ResetAfter, r.ResetAfter)
		if r.Allowed {
			held += r.Remaining + 1
			out.Allowed = true
			continue
		}
		held += max(0, r.Remaining)
		if out.RetryAfter == 0 || r.RetryAfter < out.RetryAfter {
			out.RetryAfter = r.RetryAfter
		}
	}
	if out.Allowed {
		out.RetryAfter = 0
		held--
	}
	out.Remaining = min(capacity, held)
	return out, nil
}

// peekOne peeks at one counter: the deny cache's answer if it knows the
// counter denies, else the store's, through the breaker.
func (e *Engine) peekOne(ctx context.Context, peeker counter.Peeker, name string, hash uint64, lim Limit) (counter.Result, error) {
	if r, ok := e.knownDenied(hash, lim, 1); ok {
		return r, nil
	}
	if err := ctx.Err(); err != nil {
		return counter.Result{}, err
	}
	ok, probe := e.brk.allow()
	if !ok {
		return counter.Result{}, ErrBreakerOpen
	}
	r, err := peeker.Peek(ctx, name, hash, lim)
	e.brk.report(ctx, probe, err)
	return r, err
}

// peekMany sets the Result of each of ops as peekOne would find it, the
// counters the deny cache does not know read in one call through the
// breaker: a PeekBatch if peeker is a counter.BatchPeeker, else a Peek
// each. It may reorder ops. It returns the first error an op met, and then
// the Results are not all set.
func (e *Engine) peekMany(ctx context.Context, peeker counter.Peeker, ops []counter.PeekOp) error {
	ask := 0 // ops[:ask] go to the store
	for i := range ops {
		if r, ok := e.knownDenied(ops[i].Hash, ops[i].Limit, 1); ok {
			ops[i].Result = r
			continue
		}
		ops[ask], ops[i] = ops[i], ops[ask]
		ask++
	}
	if ask == 0 {
		return nil
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	ok, probe := e.brk.allow()
	if !ok {
		return ErrBreakerOpen
	}
	var err error
	if bp, ok := peeker.(counter.BatchPeeker); ok {
		bp.PeekBatch(ctx, ops[:ask])
		for i := range ask {
			if err = ops[i].Err; err != nil {
				break
			}
		}
	} else {
		for i := range ask {
			op := &ops[i]
			if op.Result, err = peeker.Peek(ctx, op.Key, op.Hash, op.Limit); err != nil {
				break
			}
		}
	}
	e.brk.report(ctx, probe, err)
	return err
}

// peekFallback answers a peek the store could not, as p's fallback
// decides: FallbackLocal reads this instance's share without charging it.
func (e *Engine) peekFallback(ctx context.Context, key, name string, hash uint64, p *Policy, cause error) (Result, error) {
	lim, fb := p.Limit, p.OnStoreFailure
	capacity := lim.Capacity()
	r := Result{Limit: capacity, Shards: 1, Degraded: true}
	switch {
	case fb == FallbackError:
		return Result{}, fmt.Errorf("%w: %w", ErrStoreUnavailable, cause)
	case fb == FallbackOpen || fb == FallbackClosed && p.allowlisted(key):
		r.Allowed, r.Remaining = true, capacity-1
	case fb == FallbackClosed:
		r.RetryAfter = lim.Period
	default:
		lr, _ := e.local.Peek(ctx, name, hash, e.localShare(lim))
		r.Allowed, r.Remaining, r.RetryAfter, r.ResetAfter = lr.Allowed, lr.Remaining, lr.RetryAfter, lr.ResetAfter
	}
	return r, nil
}

// localShare is this instance's share of lim, which FallbackLocal
// enforces on its local counters.
func (e *Engine) localShare(lim Limit) Limit {
	share, capacity := lim, lim.Capacity()
	inst := int64(max(1, e.liveInstances()))
	share.Rate = max(1, lim.Rate/inst)
	if share.Algorithm == counter.TokenBucket {
		share.Burst = max(1, capacity/inst)
	}
	return share
}
