package counter

import (
	"context"
	"time"
)

// Leases and returns: the store operations of a reserve mode, in which an
// instance takes a block of a key's units in one call, admits from it
// locally, and gives back what it did not use.
//
// A returned unit never leaves the counter with more room than it would
// have had if the lease had taken only the units spent (world B), whatever
// other traffic the counter saw. Per algorithm, r units returned at t1 of a
// lease taken at t0:
//
//   - FixedWindow: if t0's window is still the current one, r comes off its
//     count (never below 0); else nothing: that window is gone. Exact.
//   - SlidingWindow: r comes off the count of t0's window if it is the
//     current or the previous one; else nothing. Exact.
//   - SlidingLog: up to r of the units stamped at the lease's instant leave
//     the log. Exact.
//   - TokenBucket: the TAT moves back by r·T - (t1 - t0), T the emission
//     interval, if that is positive, and never behind now; so a lease
//     returns nothing once held for r intervals. Proof: GCRA admits c at s
//     by TAT ← max(TAT, s) + c·T. World B's TAT at t0 is A's less r·T, and
//     both are at or past t0 (A's ≥ t0 + r·T). Over [t0, t1] the same
//     admissions, of total cost Σ, move A's TAT forward by Σ·T at least
//     (max only adds), while B's is then max(TAT_B(t0) + Σ·T, s_j + the
//     costs from the j-th admission on ·T, t1): each term is at most
//     TAT_A(t1) - r·T + (t1 - t0), since s_j ≤ t1 and t0 + r·T ≤ TAT_A(t0).
//     So max(TAT_A - r·T + (t1 - t0), t1) is at or past B's TAT read at t1,
//     and A admits from then on only what B would. B's waste while full
//     (refill past the burst) is what the (t1 - t0) term pays for: burst 10
//     at 1/s, lease 5 at t=0, one more unit at t=3, return 5: B holds 9,
//     and A gets back 2 units (5 - 3), holding 9 too. Each return compares
//     A with a world without returns, and the GCRA step is monotone in the
//     TAT, so returns of leases open at the same time compose. Only the
//     interval the TAT was written under is trusted: under another limit (a
//     policy change) a return gives back nothing.
//
// Return takes the token Lease gave: the store's instant of the lease (or,
// for the memory store's sliding log, the stamp of the entry holding its
// units), in the store's own clock (ns in memory, µs on Redis), and the
// generation of the counter the lease charged. A counter lost and made
// again (deleted; on Redis flushed, or its server restarted without its
// data) is of another generation, and a return gives it nothing: its
// count never held the lease's units.

// Lease is the outcome of one Leaser.Lease.
type Lease struct {
	// Granted is the number of units charged: 0 when denied.
	Granted int64
	// Result is what a Take of Granted units answered (Allowed, and the
	// Remaining left after them); when denied, what a Take of one unit
	// answered (RetryAfter and NextAfter for a unit).
	Result Result
	// Token identifies the lease to Return. It means nothing to callers.
	Token Token
}

// Token identifies a lease to Leaser.Return: the store's instant of the
// lease and the generation of the counter it charged (see above).
type Token struct{ at, gen int64 }

// Leaser is implemented by stores that lease blocks of units and take
// unused ones back.
type Leaser interface {
	// Lease charges the largest m, 1 ≤ m ≤ n, that the counter key admits
	// now, as a Take of m would, in one atomic step; none if not even one
	// unit fits. n is positive and at most lim.Capacity(); Lease validates
	// neither, as Take. It may block on I/O.
	Lease(ctx context.Context, key string, hash uint64, lim Limit, n int64) (Lease, error)
	// Return gives back r unused units of the lease whose Token is token,
	// taken on key under lim, and reports how many went back (for a token
	// bucket, how many more units it admits now than before): at most r,
	// fewer where the algorithm's rule says (see lease.go), none if the
	// counter expired or is of another generation. lim must be the
	// lease's, and a caller whose limit changed since returns nothing;
	// where a store can tell (a token bucket's interval, on Redis another
	// algorithm's state), it gives nothing back. r must not pass the
	// lease's units not admitted, and each unit goes back once. It may
	// block on I/O.
	Return(ctx context.Context, key string, hash uint64, lim Limit, r int64, token Token) (int64, error)
}

var (
	_ Leaser = (*MemoryStore)(nil)
	_ Leaser = (*RedisStore)(nil)
)

// Lease implements Leaser. It reads the store's clock; LeaseAt takes the
// time. It never fails.
func (s *MemoryStore) Lease(_ context.Context, key string, hash uint64, lim Limit, n int64) (Lease, error) {
	return s.lease(s.clock(), key, hash, lim, n), nil
}

// LeaseAt is Lease at the instant now. A key without a counter whose
// stripe is full is refused as by TakeAt.
func (s *MemoryStore) LeaseAt(now time.Time, key string, lim Limit, n int64) Lease {
	return s.lease(now, key, 0, lim, n)
}

// lease is LeaseAt of the key whose Hash is hash (0: not computed yet).
func (s *MemoryStore) lease(now time.Time, key string, hash uint64, lim Limit, n int64) Lease {
	var l Lease
	if ok, wait := s.update(now, key, hash, func(c *state, t int64) { l = c.lease(t, lim, n) }); !ok {
		return Lease{Result: refused(lim, wait)}
	}
	return l
}

// Return implements Leaser. It reads the store's clock; ReturnAt takes
// the time. It never fails.
func (s *MemoryStore) Return(_ context.Context, key string, hash uint64, lim Limit, r int64, token Token) (int64, error) {
	return s.giveBackAt(s.clock(), key, hash, lim, r, token), nil
}

// ReturnAt is Return at the instant now.
func (s *MemoryStore) ReturnAt(now time.Time, key string, lim Limit, r int64, token Token) int64 {
	return s.giveBackAt(now, key, 0, lim, r, token)
}

// giveBackAt is ReturnAt of the key whose Hash is hash (0: not computed yet).
func (s *MemoryStore) giveBackAt(now time.Time, key string, hash uint64, lim Limit, r int64, token Token) int64 {
	if r <= 0 {
		return 0
	}
	id := s.identify(key, hash)
	st := s.stripe(id)
	t := s.nanos(now)
	st.mu.Lock()
	defer st.mu.Unlock()
	i := st.t.find(id)
	if i < 0 || st.t.cells[i].cnt.expires <= t {
		return 0
	}
	c := st.t.state(i)
	if int64(c.gen) != token.gen {
		return 0
	}
	back := c.giveBack(t, lim, r, token.at)
	st.t.setState(i, c)
	return back
}

// lease charges the largest m ≤ n that lim admits on s at now: a Take of
// one unit, then of m-1 more at the same instant, which leaves the state a
// Take of m would (the units of one instant add up).
func (s *state) lease(now int64, lim Limit, n int64) Lease {
	res := s.take(now, lim, 1)
	if !res.Allowed {
		return Lease{Result: res}
	}
	m := min(n, res.Remaining+1)
	if m > 1 {
		res = s.take(now, lim, m-1)
	}
	tok := now
	if lim.Algorithm == SlidingLog {
		tok = s.logNewest() // now, or the end of its slot (logAdd)
	}
	return Lease{Granted: m, Result: res, Token: Token{tok, int64(s.gen)}}
}

// giveBack takes back up to r units of a lease taken at token (see
// lease.go's rules) and returns how many went back.
func (s *state) giveBack(now int64, lim Limit, r, token int64) int64 {
	p := int64(lim.Period)
	switch lim.Algorithm {
	case FixedWindow:
		if w := now / p; token/p != w || s.a != w {
			return 0
		}
		back := min(r, s.b)
		s.b -= back
		return back
	case SlidingWindow:
		w, w0 := now/p, token/p
		var back int64
		switch {
		case w0 < w-1:
		case s.a == w0:
			back = min(r, s.b)
			s.b -= back
		case s.a == w0+1:
			back = min(r, s.c)
			s.c -= back
		}
		return back
	case SlidingLog:
		if token <= now-p {
			return 0
		}
		for j := range s.log {
			if e := &s.log[j]; e.at == token {
				back := min(r, e.n)
				if e.n -= back; e.n == 0 {
					s.log = append(s.log[:j], s.log[j+1:]...)
				}
				return back
			}
		}
		return 0
	}
	return s.giveBackGCRA(now, lim, r, token)
}

// giveBackGCRA moves the TAT back by r intervals less the time since the
// lease (see lease.go), if the TAT was written under lim's interval.
func (s *state) giveBackGCRA(now int64, lim Limit, r, token int64) int64 {
	g := newGCRA(lim.Period.Nanoseconds(), lim, 1, fracBits)
	if s.interval() != g.unit {
		return 0
	}
	tat := fixed{s.a, s.b}
	if !(fixed{now, 0}).less(tat) {
		return 0
	}
	d := tat.sub(fixed{now, 0})
	give := g.unit.mul(r)
	if elapsed := (fixed{max(0, now-token), 0}); elapsed.less(give) {
		give = give.sub(elapsed)
	} else {
		return 0
	}
	if d.less(give) {
		give = d
	}
	tat = tat.sub(give)
	s.a, s.b = tat.w, tat.f
	s.expires = max(now, tat.ceil())
	return g.room(d.sub(give)) - g.room(d)
}

// room is how many units fit the tolerance with the TAT d ahead of now.
func (g *gcra) room(d fixed) int64 {
	if g.tol.less(d) {
		return 0
	}
	return g.tol.sub(d).per(g.unit)
}
