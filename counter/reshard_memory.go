package counter

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"
)

// This file holds what both stores' Reshard share (checking the shards,
// splitting a sum into shares, handing out log entries) and the memory
// store's Reshard.
//
// Usage is carried in units (requests admitted and not yet forgotten),
// summed over from and split over to in proportion to each counter's rate:
// counter j of to is seeded with usage·rate_j/R, where R is the sum of to's
// rates (which, for a split or merge of one key, is also the sum of from's).
// Per algorithm:
//
//   - TokenBucket: counter i of from has max(0, TAT_i-now)/T_i units in
//     flight, T_i = Period/rate_i. Seeding counter j with its share U·rate_j/R
//     of the sum U gives every counter of to the same TAT,
//     now + Σ max(0, TAT_i-now)·rate_i/R.
//   - SlidingWindow, FixedWindow: the current window's counts (and the
//     previous window's, for SlidingWindow) are summed, a counter whose state
//     is of an older window read as the take path reads it, and each sum is
//     split into shares that add up to it exactly (see shares).
//   - SlidingLog: the units of from still inside the window, each at its
//     entry's instant, are handed out in time order, interleaved so that each
//     counter of to gets its share of them and of every stretch of time (see
//     spread).
//
// A counter of to is raised to its seed, never lowered: a token-bucket TAT
// becomes the later of the two, a window count the larger of the two (within
// the current window; a counter of an older window is first aged as a take
// would age it), and a log's k-th newest unit the later of its own and the
// seed's k-th newest (see logRaise), so that it holds at every later instant
// as many units as the larger of the two would. Seeding writes the
// expiry a take would write. A counter with no usage to seed is not written.

// ErrInvalidReshard is returned (wrapped) by Reshard when from or to is
// empty, or their limits are invalid (the error then wraps Limit.Validate's
// too, though a token bucket's tolerance may pass MaxTolerance: a split
// key's shares may, by their rounding), differ in algorithm or period, or add up to more than an int64.
var ErrInvalidReshard = errors.New("invalid reshard")

// reshardPlan is a checked Reshard's common figures.
type reshardPlan struct {
	alg    Algorithm
	period time.Duration
	total  int64 // Σ rate over to
}

// checkReshard checks from and to (see ErrInvalidReshard).
func checkReshard(from, to []Shard) (reshardPlan, error) {
	if len(from) == 0 || len(to) == 0 {
		return reshardPlan{}, fmt.Errorf("%w: %d counters to read, %d to seed: both need at least one",
			ErrInvalidReshard, len(from), len(to))
	}
	first := from[0].Limit
	plan := reshardPlan{alg: first.Algorithm, period: first.Period}
	for _, side := range []struct {
		name   string
		shards []Shard
	}{{"from", from}, {"to", to}} {
		var sum int64
		for _, sh := range side.shards {
			lim := sh.Limit
			if err := lim.validate(); err != nil { // a share's tolerance may pass the bound
				return reshardPlan{}, fmt.Errorf("%w: %s %q: %w", ErrInvalidReshard, side.name, sh.Name, err)
			}
			if lim.Algorithm != first.Algorithm || lim.Period != first.Period {
				return reshardPlan{}, fmt.Errorf("%w: %s %q is %v per %v, %q is %v per %v",
					ErrInvalidReshard, side.name, sh.Name, lim.Algorithm, lim.Period, from[0].Name, first.Algorithm, first.Period)
			}
			if lim.Rate > math.MaxInt64-sum {
				return reshardPlan{}, fmt.Errorf("%w: %w: the rates of %s add up to more than an int64",
					ErrInvalidReshard, ErrLimitTooLarge, side.name)
			}
			sum += lim.Rate
		}
		plan.total = sum // to's, the side checked last
	}
	return plan, nil
}

// shares splits sum over to in proportion to the rates, total being their
// sum: floor(sum·rate_j/total) each, then one more to the first counters
// until the shares add up to sum; each is then capped at MaxCount.
func shares(sum int64, to []Shard, total int64) []int64 {
	out := make([]int64, len(to))
	left := sum
	for j, sh := range to {
		out[j] = weighted(sum, sh.Limit.Rate, total) // rate ≤ total
		left -= out[j]
	}
	for j := 0; left > 0; j++ { // left < len(to): each share lost less than 1
		out[j]++
		left--
	}
	for j := range out {
		// A seed past MaxCount (counts of a higher limit) denies as
		// MaxCount does under any valid limit, and stays exact on Redis.
		out[j] = min(out[j], MaxCount)
	}
	return out
}

// spread hands out n entries, in time order, to counters that are to get
// counts[j] of them (Σ counts = n): entry k goes to the counter furthest
// behind its due share of the first k+1 entries (the first such counter on a
// tie). So every counter holds its share of any stretch of the entries, give
// or take one, and with equal counts the entries go round robin.
func spread(n int, counts []int64) []int {
	owner := make([]int, n)
	given := make([]int64, len(counts))
	for k := range owner {
		best, lag := -1, int64(0)
		for j, c := range counts {
			// due·n - given·n, scaled by n to stay in integers
			if d := c*int64(k+1) - int64(n)*given[j]; d > lag {
				best, lag = j, d
			}
		}
		// Σ lag over j is n > 0, so some counter lags, and one that lags
		// has given < counts.
		owner[k] = best
		given[best]++
	}
	return owner
}

var _ Resharder = (*MemoryStore)(nil)

// Reshard implements Resharder at the store's clock; ReshardAt takes the
// time. It fails only on invalid from or to (ErrInvalidReshard), or for
// want of room (ErrFull).
func (s *MemoryStore) Reshard(_ context.Context, from, to []Shard) error {
	return s.ReshardAt(s.clock(), from, to)
}

// ReshardAt is Reshard at the instant now. Each counter is read or written
// under its own stripe's lock, one at a time, so Takes on the counters
// during the call are neither lost nor counted twice by it: a Take on a
// counter of from after it was read is not carried over, and one on a
// counter of to is kept by raise-never-lower.
//
// A counter of to that does not exist and whose stripe is full of live
// counters cannot be seeded: ReshardAt then stops and fails with ErrFull
// (wrapped). Nothing is lost: it never writes from, and the counters of
// to seeded before hold copies of from's usage, which a later seed only
// raises. The caller keeps deciding on from.
func (s *MemoryStore) ReshardAt(now time.Time, from, to []Shard) error {
	plan, err := checkReshard(from, to)
	if err != nil {
		return err
	}
	t := s.nanos(now)
	p := int64(plan.period)
	switch plan.alg {
	case TokenBucket:
		// Σ max(0, TAT_i-now)·rate_i; float64, as takeGCRA's interval is.
		// A TAT written under another interval than counter i's limit (the
		// limit changed since) counts in the units of its own: ·Period/T
		// for the interval T it was written under, not ·rate_i.
		var d float64
		for _, sh := range from {
			if c := s.peek(sh, t, false); c.a > t || c.a == t && c.b > 0 {
				w := float64(sh.Limit.Rate)
				if u := c.interval(); u != (fixed{}) {
					w = float64(p) / u.float()
				}
				d += (float64(c.a-t) + float64(c.b)/fracOne) * w
			}
		}
		tat := t + int64(math.Round(d/float64(plan.total)))
		if tat <= t {
			return nil
		}
		for _, sh := range to {
			unit := newGCRA(p, sh.Limit, 1, fracBits).unit // as takeGCRA notes it
			if err := s.seed(sh, t, func(c *state) {
				if tat > c.a {
					c.a, c.b = tat, 0
					c.setInterval(unit)
				}
				c.expires = max(c.expires, fixed{c.a, c.b}.ceil()) // takeGCRA's expiry: the TAT
			}); err != nil {
				return err
			}
		}
	case SlidingWindow, FixedWindow:
		w := t / p
		var cur, prev int64
		for _, sh := range from {
			c := s.peek(sh, t, false)
			switch { // as takeSlidingWindow and takeFixedWindow age a state
			case c.a == w:
				cur += c.b
				if plan.alg == SlidingWindow {
					prev += c.c
				}
			case c.a == w-1 && plan.alg == SlidingWindow:
				prev += c.b
			}
		}
		curs, prevs := shares(cur, to, plan.total), shares(prev, to, plan.total)
		for j, sh := range to {
			if curs[j] == 0 && prevs[j] == 0 {
				continue
			}
			if err := s.seed(sh, t, func(c *state) {
				if plan.alg == FixedWindow {
					if c.a != w {
						c.a, c.b = w, 0
					}
					c.b = max(c.b, curs[j])
					c.expires = max(c.expires, windowEnd(w, 1, p))
					return
				}
				switch c.a {
				case w:
				case w - 1:
					c.a, c.b, c.c = w, 0, c.b
				default:
					c.a, c.b, c.c = w, 0, 0
				}
				c.b, c.c = max(c.b, curs[j]), max(c.c, prevs[j])
				c.expires = max(c.expires, windowEnd(w, 2, p))
			}); err != nil {
				return err
			}
		}
	case SlidingLog:
		var log []int64 // one instant per unit
		for _, sh := range from {
			log = appendUnits(log, s.peek(sh, t, true).log)
		}
		slices.Sort(log)
		counts := shares(int64(len(log)), to, plan.total)
		seeds := make([][]int64, len(to))
		for k, j := range spread(len(log), counts) {
			seeds[j] = append(seeds[j], log[k])
		}
		for j, sh := range to {
			if len(seeds[j]) == 0 {
				continue
			}
			seed := seeds[j]
			if err := s.seed(sh, t, func(c *state) {
				c.logDrop(t - p) // as takeSlidingLog drops
				own := appendUnits(nil, c.log)
				if units, raised := logRaise(own, seed); raised {
					c.log = c.log[:0]
					for _, at := range units { // as takes would log them, bounded alike
						c.logAdd(at, 1, p)
					}
				}
				// takeSlidingLog's expiry: a period after the newest entry
				c.expires = max(c.expires, addSat(c.logNewest(), p))
			}); err != nil {
				return err
			}
		}
	}
	return nil
}

// logRaise raises a log to its seed, both given as the instants of their
// units, oldest first: the k-th newest unit of the result is the later of
// the log's and the seed's k-th newest. So at every instant from now on the
// result holds as many units as the larger of the two would: it never frees
// a unit before the seed would (which holding as many units as the seed,
// some of them the log's older ones, would), nor before the log would.
// raised is whether the result differs from own.
func logRaise(own, seed []int64) (units []int64, raised bool) {
	n := max(len(own), len(seed))
	units = make([]int64, n)
	for k := 1; k <= n; k++ { // the k-th newest
		at := int64(math.MinInt64)
		if k <= len(own) {
			at = own[len(own)-k]
		}
		if k <= len(seed) && seed[len(seed)-k] > at {
			at, raised = seed[len(seed)-k], true
		}
		units[n-k] = at
	}
	return units, raised
}

// peek returns a copy of sh's state at t: the zero state if the counter is
// absent or expired, as TakeAt would read it. With log, it copies the
// entries still inside the window of sh's limit; otherwise it leaves log out.
func (s *MemoryStore) peek(sh Shard, t int64, log bool) state {
	id := s.identify(sh.Name, sh.Hash)
	st := s.stripe(id)
	st.mu.Lock()
	defer st.mu.Unlock()
	i := st.t.find(id)
	if i < 0 || st.t.cells[i].cnt.expires <= t {
		return state{}
	}
	c := st.t.state(i)
	out := state{counts: c.counts}
	if log {
		cut := t - int64(sh.Limit.Period)
		for _, e := range c.log {
			if e.at > cut {
				out.log = append(out.log, e)
			}
		}
	}
	return out
}

// appendUnits appends the instant of every unit of log to dst.
func appendUnits(dst []int64, log []logEntry) []int64 {
	for _, e := range log {
		for range e.n {
			dst = append(dst, e.at)
		}
	}
	return dst
}

// seed runs f on sh's state at t under its stripe's lock, creating the
// counter (or resetting an expired one) as TakeAt does. It fails with
// ErrFull, running nothing, where TakeAt would refuse.
func (s *MemoryStore) seed(sh Shard, t int64, f func(c *state)) error {
	id := s.identify(sh.Name, sh.Hash)
	st := s.stripe(id)
	st.mu.Lock()
	defer st.mu.Unlock()
	i := s.cell(st, id, t)
	if i < 0 {
		return &FullError{Name: sh.Name, Wait: time.Duration(st.t.soonest - t)}
	}
	c := st.t.state(i)
	f(&c)
	st.t.setState(i, c)
	return nil
}
