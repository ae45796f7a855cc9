package hotkey

import (
	"context"
	"sync"
	"time"

	"github.com/hotkeyd/hotkey/counter"
)

// Request is one decision of a batch: Cost units of Key under Policy.
type Request struct {
	Key    string
	Policy *Policy
	Cost   int64
}

// Decision is the answer to one Request of a batch: the Result, or the
// error AllowN would have returned for it.
type Decision struct {
	Result Result
	Err    error
}

// AllowBatch decides reqs, each as AllowN would, and writes their answers
// to out in order; out must be at least as long as reqs. Decisions on one
// key are made in their order in reqs.
//
// On a store that runs many takes in one round trip (counter.Batcher, as
// the Redis store does), the takes of the batch's keys that are not split
// go to the store together: a batch of 100 costs about one round trip, not
// 100. Split keys are decided as AllowN decides them, concurrently with the
// rest.
func (e *Engine) AllowBatch(ctx context.Context, reqs []Request, out []Decision) {
	out = out[:len(reqs)]
	if e.metrics != nil {
		// Each decision is observed with the batch's time: its caller
		// has no answer before the batch returns.
		start := monotonic()
		defer func() { e.metrics.decisionTook(monotonic()-start, decisions(reqs)) }()
	}
	if e.batcher == nil || len(reqs) == 1 {
		for i, r := range reqs {
			var res Result
			err := ErrNilPolicy
			if r.Policy != nil {
				res, err = e.allow(ctx, r.Key, r.Policy, r.Cost)
			}
			out[i] = Decision{Result: res, Err: err}
		}
		return
	}
	e.allowMany(ctx, reqs, out)
}

// allowMany is AllowBatch on a batcher with more than one request: a
// function of its own, so that what its goroutines capture is moved to the
// heap for batches that need them only.
func (e *Engine) allowMany(ctx context.Context, reqs []Request, out []Decision) {
	b := batch{
		ds:  make([]degraded, 0, len(reqs)),
		at:  make([]int, 0, len(reqs)),
		ops: make([]counter.Op, 0, len(reqs)),
	}
	var split sync.WaitGroup
	// Split keys are decided by the whole decision path, each on a
	// goroutine of its own, but two decisions on one key keep their order:
	// a key's later requests wait for its earlier ones.
	var after map[string]chan struct{}
	// The goroutines answer into splitOut, copied to out once they are
	// done, so that out, often the caller's stack, does not move to the
	// heap for them.
	var splitOut []Decision
	var splitAt []int // the indexes of splitOut's answers
	for i, r := range reqs {
		if r.Policy == nil {
			out[i] = Decision{Err: ErrNilPolicy}
			continue
		}
		name, hash, err := e.admit(r.Key, r.Policy, r.Cost)
		if err != nil {
			out[i] = Decision{Err: err}
			continue
		}
		d := degraded{r.Key, name, hash, r.Cost, r.Policy}
		if r.Policy.Regions == RegionsShares {
			res, err := e.decideShares(ctx, r.Policy, r.Key, name, hash, r.Cost)
			out[i].Result, out[i].Err = e.conclude(ctx, d, res, err)
			continue
		}
		switch r.Policy.Sync {
		case SyncReserve:
			// Mostly from a block in memory: no round trip to share.
			res, err := e.decideReserve(ctx, name, hash, r.Policy.Limit, r.Cost)
			out[i].Result, out[i].Err = e.conclude(ctx, d, res, err)
			continue
		case SyncGossip: // in memory
			out[i].Result, out[i].Err = e.conclude(ctx, d, e.decideGossip(name, hash, r.Policy.Limit, r.Cost), nil)
			continue
		}
		gen := e.table.Gen(hash) // before the lookup: see split.Table.Moved
		if ent := e.entry(name, hash); ent != nil && r.Policy.Regions == RegionsIndependent {
			if after == nil {
				after = make(map[string]chan struct{})
				splitOut = make([]Decision, len(reqs))
			}
			prev, done := after[name], make(chan struct{})
			after[name] = done
			splitAt = append(splitAt, i)
			split.Add(1)
			go func() {
				defer split.Done()
				defer close(done)
				if prev != nil {
					<-prev
				}
				res, err := e.decideStore(ctx, e.store, name, hash, r.Policy.Limit, r.Cost)
				res, err = e.conclude(ctx, d, res, err)
				splitOut[i] = Decision{Result: res, Err: err}
			}()
			continue
		}
		stored, sh := unsplitCounter(name, hash)
		if cr, ok := e.knownDenied(sh, r.Policy.Limit, r.Cost); ok {
			out[i].Result, out[i].Err = e.conclude(ctx, d, unsplit(cr), nil)
			continue
		}
		b.add(i, d, counter.Op{Key: stored, Hash: sh, Limit: r.Policy.Limit, N: r.Cost}, gen)
	}
	e.takeBatch(ctx, &b, out)
	split.Wait()
	for _, i := range splitAt {
		out[i] = splitOut[i]
	}
}

// decisions is the count of reqs that make a decision (and count in
// hotkey_decisions_total): those with a policy.
func decisions(reqs []Request) int {
	n := 0
	for _, r := range reqs {
		if r.Policy != nil {
			n++
		}
	}
	return n
}

// batch is the decisions of an AllowBatch that go to the store together:
// each one's decision, its index in the batch, its take, and the count of
// moves on its stripe before its key was looked up.
type batch struct {
	ds   []degraded
	at   []int
	ops  []counter.Op
	gens []uint32 // the table's Gen before each key was looked up
}

func (b *batch) add(i int, d degraded, op counter.Op, gen uint32) {
	b.ds = append(b.ds, d)
	b.at = append(b.at, i)
	b.ops = append(b.ops, op)
	b.gens = append(b.gens, gen)
}

// takeBatch sends b's takes to the store in one call, through the circuit
// breaker as storeTake does for one, and writes their decisions to out.
func (e *Engine) takeBatch(ctx context.Context, b *batch, out []Decision) {
	if len(b.ops) == 0 {
		return
	}
	if err := ctx.Err(); err != nil { // over before the store was asked
		for j, d := range b.ds {
			out[b.at[j]].Result, out[b.at[j]].Err = e.conclude(ctx, d, Result{}, err)
		}
		return
	}
	// The breaker is asked once per take, as for takes made one by one:
	// while it is open, all but a probe fail with ErrBreakerOpen. sent
	// are the takes it lets through; refused[j] says b.ops[j] is not.
	refused := make([]bool, len(b.ops))
	probes := make([]bool, len(b.ops))
	sent := b.ops[:0]
	for j := range b.ops {
		ok, probe := e.brk.allow()
		refused[j], probes[j] = !ok, probe
		if ok {
			sent = append(sent, b.ops[j]) // in place: j ≥ len(sent)
		}
	}
	var took time.Duration // the round trip, each take's time
	asked := e.opt.clock()
	if len(sent) > 0 {
		var start time.Duration
		if e.metrics != nil {
			start = monotonic()
		}
		e.batcher.TakeBatch(ctx, sent)
		if e.metrics != nil {
			took = monotonic() - start
		}
	}
	s := 0
	for j, d := range b.ds {
		var res Result
		err := ErrBreakerOpen
		if !refused[j] {
			op := &sent[s]
			s++
			err = op.Err
			e.metrics.storeTook(took)
			e.brk.report(ctx, probes[j], err)
			if err == nil {
				e.remember(op.Hash, op.Limit, op.N, op.Result, asked)
				res = unsplit(op.Result)
				if res.Allowed && e.table.Moved(d.hash, b.gens[j]) {
					// A move began while the take was in flight: decide
					// again where the usage is, as decideStore does.
					res, err = e.decideStore(ctx, e.store, d.name, d.hash, d.p.Limit, d.n)
				}
			}
		}
		out[b.at[j]].Result, out[b.at[j]].Err = e.conclude(ctx, d, res, err)
	}
}

// unsplit is the decision a take on a key's unsplit counter makes.
func unsplit(r counter.Result) Result {
	return Result{Allowed: r.Allowed, Limit: r.Limit, Remaining: r.Remaining, RetryAfter: r.RetryAfter, ResetAfter: r.ResetAfter, Shards: 1}
}
