package hotkey

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/hotkeyd/hotkey/counter"
	"github.com/hotkeyd/hotkey/shard"
)

// ErrNoPeek is returned by Peek when the engine's store cannot answer
// without taking (it is no counter.Peeker).
var ErrNoPeek = errors.New("the store cannot peek")

// Peek reports what AllowN(ctx, key, p, 1) would answer now, without
// charging the unit or changing any counter: Allowed says whether one unit
// would pass, Remaining what would be left after it. It feeds neither the
// hot-key detector nor the decision metrics, and moves no usage: a split
// key is read where its usage is held. When the store cannot answer,
// p.OnStoreFailure decides as for AllowN, and its local counters are read,
// not charged. A SyncGossip policy is read on this instance's view. Bad
// input returns AllowN's errors; a store that cannot peek returns
// ErrNoPeek. It blocks only on the store.
func (e *Engine) Peek(ctx context.Context, key string, p *Policy) (Result, error) {
	if p == nil {
		return Result{}, ErrNilPolicy
	}
	if err := e.check(key, p.Limit, 1); err != nil {
		return Result{}, err
	}
	name := key
	if p.Name != "" {
		if strings.IndexByte(p.Name, '|') >= 0 {
			return Result{}, fmt.Errorf("%w: %q holds '|'", ErrInvalidPolicyName, p.Name)
		}
		name = CounterName(p.Name, key)
	}
	hash := hashKey(name)
	if p.Sync == SyncGossip {
		return e.peekGossip(name, hash, p.Limit), nil
	}
	peeker, ok := e.store.(counter.Peeker)
	if !ok {
		return Result{}, ErrNoPeek
	}
	r, err := e.peekStore(ctx, peeker, name, hash, p.Limit)
	if err == nil {
		return r, nil
	}
	if errors.Is(ctx.Err(), context.Canceled) {
		return Result{}, err
	}
	return e.peekFallback(ctx, key, name, hash, p, err)
}

// peekStore peeks at the counters that hold the usage of counter name: the
// unsplit one, or one of a split key's subcounters and, on a deny, a
// second one, as decideSplit takes.
func (e *Engine) peekStore(ctx context.Context, peeker counter.Peeker, name string, hash uint64, lim Limit) (Result, error) {
	level, pl := shard.Level1, shard.Placement(nil)
	if ent := e.entry(name, hash); ent != nil {
		level, pl = ent.HeldAt()
		if level > shard.Level1 {
			i := ent.Pick(level, e.opt.selection, e.seed)
			sub, subHash := ent.Sub(level, i, pl)
			r, err := e.peekOne(ctx, peeker, sub, subHash, subLimit(lim, level, i))
			if err != nil {
				return Result{}, err
			}
			if !r.Allowed && e.opt.secondChance {
				j := shard.SecondChance(i, int(level), shard.Mix(e.seed^ent.Hash^uint64(r.RetryAfter)))
				sub, subHash = ent.Sub(level, j, pl)
				if r2, err := e.peekOne(ctx, peeker, sub, subHash, subLimit(lim, level, j)); err == nil && (r2.Allowed || r2.RetryAfter < r.RetryAfter) {
					r = r2
				}
			}
			capacity := lim.Capacity()
			return Result{Allowed: r.Allowed, Limit: capacity, Remaining: min(capacity, r.Remaining*int64(level)), RetryAfter: r.RetryAfter, ResetAfter: r.ResetAfter, Shards: level}, nil
		}
	}
	r, err := e.peekOne(ctx, peeker, shard.Name(name), hash, lim)
	if err != nil {
		return Result{}, err
	}
	return unsplit(r), nil
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
	inst := int64(max(1, e.Instances()))
	share.Rate = max(1, lim.Rate/inst)
	if share.Algorithm == counter.TokenBucket {
		share.Burst = max(1, capacity/inst)
	}
	return share
}
