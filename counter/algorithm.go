package counter

import (
	"math"
	"math/bits"
	"time"
)

// state is one counter's state in the memory store. Field use depends on the
// algorithm; all instants are Unix nanoseconds.
type state struct {
	counts
	// log holds SlidingLog's admitted units, oldest first (slidinglog.go).
	log []logEntry
}

// counts is a counter's fixed-size state: all of it but for a sliding log.
type counts struct {
	// TokenBucket: a is the TAT, b its fraction of a ns (see gcra.go); c
	// and f are the emission interval the TAT was written under (whole ns,
	// and 2^-32 ns), so that a Take under another limit reads the debt in
	// units, not time (see takeGCRA); both 0 when there is no TAT.
	// SlidingWindow, FixedWindow: a is the window index, b the current
	// window's count, c the previous window's count.
	a, b, c int64
	// expires is when the state no longer matters (a fresh counter would
	// decide the same).
	expires int64
	f       uint32
	// gen is the counter's generation: a number the store gave it when
	// it was made, kept by every write (see Leaser.Return).
	gen uint32
}

// take runs lim's algorithm on s at now. n is positive and at most
// lim.Capacity(). The Lua scripts in redis_scripts.go mirror these functions.
func (s *state) take(now int64, lim Limit, n int64) Result {
	switch lim.Algorithm {
	case SlidingWindow:
		return s.takeSlidingWindow(now, lim, n)
	case FixedWindow:
		return s.takeFixedWindow(now, lim, n)
	case SlidingLog:
		return s.takeSlidingLog(now, lim, n)
	}
	return s.takeGCRA(now, lim, n)
}

func (s *state) takeGCRA(now int64, lim Limit, n int64) Result {
	g := newGCRA(lim.Period.Nanoseconds(), lim, n, fracBits)
	// The TAT is a, with b/2^32 ns more (see gcra.go); one at or behind now
	// counts as now.
	var d fixed
	if s.a > now || s.a == now && s.b > 0 {
		d = fixed{s.a, s.b}.sub(fixed{now, 0})
	}
	// A TAT written under another interval (the key's limit changed) holds
	// d/written units of debt: the same units under this limit are
	// d·unit/written ahead. Carried as time instead, a change to a slower
	// rate would shrink the debt and admit it again. As any TAT, the
	// converted one is written only by an admitted Take: until then the
	// debt drains at the rate it was written under.
	if written := s.interval(); written != (fixed{}) && written != g.unit && (fixed{}).less(d) {
		d = d.rescale(written, g.unit)
	}
	ok := g.decide(d)
	if ok {
		tat := fixed{now, 0}.add(d).add(g.inc)
		s.a, s.b = tat.w, tat.f
		s.setInterval(g.unit)
		s.expires = tat.ceil()
	}
	return g.result(d, ok, time.Nanosecond)
}

// interval is the emission interval a token bucket's TAT was written
// under; zero if none was noted.
func (c *counts) interval() fixed { return fixed{c.c, int64(c.f)} }

// setInterval notes u as the interval the TAT is written under.
func (c *counts) setInterval(u fixed) { c.c, c.f = u.w, uint32(u.f) }

// rollWindows makes w the sliding window's current window: the one before
// it, if it was current, becomes the previous; older counts are gone.
func (s *counts) rollWindows(w int64) {
	switch w {
	case s.a:
	case s.a + 1:
		s.a, s.b, s.c = w, 0, s.b
	default:
		s.a, s.b, s.c = w, 0, 0
	}
}

func (s *state) takeSlidingWindow(now int64, lim Limit, n int64) Result {
	p := int64(lim.Period)
	w := now / p
	s.rollWindows(w)
	elapsed := now - w*p
	left := p - elapsed
	// The previous window counts for the part of it still inside the sliding
	// window, rounded down: a counter admits its full Rate per window under
	// steady load, which keeps split keys (N small counters) as generous as
	// one large one.
	est := weighted(s.c, left, p) + s.b
	res := Result{Limit: lim.Rate}
	if n > lim.Rate-est { // est+n > Rate, which may pass an int64
		res.RetryAfter = slidingRetry(lim.Rate, s.b, s.c, n, p, elapsed)
		res.Remaining = max(0, lim.Rate-est)
	} else {
		s.b += n
		s.expires = windowEnd(w, 2, p)
		res.Allowed = true
		res.Remaining = lim.Rate - est - n
	}
	switch {
	case s.b > 0:
		res.ResetAfter = time.Duration(addSat(left, p))
	case s.c > 0:
		res.ResetAfter = time.Duration(left)
	}
	return res
}

// weighted is floor(count·left/p), exact in 128 bits.
func weighted(count, left, p int64) int64 {
	hi, lo := bits.Mul64(uint64(count), uint64(left))
	q, _ := bits.Div64(hi, lo, uint64(p)) // left ≤ p, so q ≤ count: no overflow
	return int64(q)
}

// slidingRetry is how long until floor(prev·(p-e)/p) + cur + n ≤ limit,
// where e is the time into the current window (elapsed now). It may lie in
// the next window, where cur becomes the previous count.
func slidingRetry(limit, cur, prev, n, p, elapsed int64) time.Duration {
	if n <= limit-cur {
		return time.Duration(max(1, firstAfter(prev, limit-cur-n, p)-elapsed))
	}
	return time.Duration(addSat(p-elapsed, firstAfter(cur, limit-n, p)))
}

// windowEnd is (w+k)·p, the end of k windows of p from the start of window
// w ≥ 0, or MaxInt64 if it is past an int64 (a period of centuries).
func windowEnd(w, k, p int64) int64 {
	if w+k > math.MaxInt64/p {
		return math.MaxInt64
	}
	return (w + k) * p
}

// addSat is a+b for a, b ≥ 0, or MaxInt64 if it is past an int64.
func addSat(a, b int64) int64 {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

// firstAfter is the first instant e into a window at which
// floor(count·(p-e)/p) ≤ k: count·(p-e)/p < k+1.
func firstAfter(count, k, p int64) int64 {
	if count <= k {
		return 0
	}
	return int64(math.Floor(float64(p)-float64(k+1)*float64(p)/float64(count))) + 1
}

func (s *state) takeFixedWindow(now int64, lim Limit, n int64) Result {
	p := int64(lim.Period)
	w := now / p
	if w != s.a {
		s.a, s.b = w, 0
	}
	reset := time.Duration(p - (now - w*p))
	if n > lim.Rate-s.b { // s.b+n > Rate, which may pass an int64
		// s.b exceeds Rate if the limit was lowered in this window.
		return Result{Limit: lim.Rate, Remaining: max(0, lim.Rate-s.b), RetryAfter: reset, ResetAfter: reset}
	}
	s.b += n
	s.expires = windowEnd(w, 1, p)
	return Result{Allowed: true, Limit: lim.Rate, Remaining: lim.Rate - s.b, ResetAfter: reset}
}

func (s *state) takeSlidingLog(now int64, lim Limit, n int64) Result {
	p := int64(lim.Period)
	s.logDrop(now - p)
	used := s.logUnits()
	if n > lim.Rate-used {
		// The (used+n-Rate)-th oldest unit must leave the window first.
		return Result{
			Limit:      lim.Rate,
			Remaining:  max(0, lim.Rate-used), // used > Rate once the limit is lowered
			RetryAfter: time.Duration(p - (now - s.logOldest(used+n-lim.Rate))),
			ResetAfter: time.Duration(max(0, p-(now-s.logNewest()))),
		}
	}
	s.logAdd(now, n, p)
	newest := s.logNewest() // now, or the end of its slot
	s.expires = addSat(newest, p)
	return Result{Allowed: true, Limit: lim.Rate, Remaining: lim.Rate - used - n, ResetAfter: time.Duration(p - (now - newest))}
}
