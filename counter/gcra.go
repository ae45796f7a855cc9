package counter

import (
	"math/big"
	"math/bits"
	"time"
)

// The token bucket's arithmetic, shared by both stores: the memory store
// decides with it, the Redis store turns a script's reply into a Result with
// it (gcraScript mirrors gcra.decide).
//
// Instants and durations are counted in ticks of the store's clock (ns in
// memory, µs on Redis) with a fraction of fracBits bits, so that the
// emission interval Period/Rate is kept exact to 2^-32 of a tick: a rate
// that does not divide its period is enforced at its rate, not at the rate
// of a whole-tick interval. The one rounding is of the interval, upwards,
// to the store's grid of 2^-b tick (b = 32 in memory; on Redis b depends on
// the tolerance, see redisGCRA): it makes a bucket slower by less than one
// grid step per unit, never faster. The burst tolerance is a whole number of
// intervals, so a full burst always fits, whatever the costs it is taken in.

// fracBits is the number of fraction bits of a fixed.
const fracBits = 32

const fracOne = 1 << fracBits

// fixed is an instant or a duration in ticks: w whole ticks plus f/2^32 of
// one, 0 ≤ f < 2^32. It is exact as long as w does not overflow.
type fixed struct{ w, f int64 }

func (a fixed) add(b fixed) fixed {
	f := a.f + b.f
	return fixed{a.w + b.w + f>>fracBits, f & (fracOne - 1)}
}

func (a fixed) sub(b fixed) fixed {
	w, f := a.w-b.w, a.f-b.f
	if f < 0 {
		w, f = w-1, f+fracOne
	}
	return fixed{w, f}
}

func (a fixed) less(b fixed) bool { return a.w < b.w || a.w == b.w && a.f < b.f }

// ceil is a rounded up to a whole tick.
func (a fixed) ceil() int64 {
	if a.f > 0 {
		return a.w + 1
	}
	return a.w
}

// mul is n·a, for n ≥ 0.
func (a fixed) mul(n int64) fixed {
	hi, lo := bits.Mul64(uint64(a.f), uint64(n)) // < 2^95
	return fixed{a.w*n + int64(hi<<(64-fracBits)|lo>>fracBits), int64(lo & (fracOne - 1))}
}

// per is how many whole b fit in a: floor(a/b), for a ≥ 0 and b > 0.
func (a fixed) per(b fixed) int64 {
	n := max(0, int64(a.float()/b.float())) // off by a unit or two at most
	for n > 0 && a.less(b.mul(n)) {
		n--
	}
	for !a.less(b.mul(n + 1)) {
		n++
	}
	return n
}

// rescale is a·to/from, a ≥ 0 and from > 0, rounded up to 2^-32 tick (so
// a debt never shrinks by it), and at most 2^62 ticks.
func (a fixed) rescale(from, to fixed) fixed {
	raw := func(x fixed) *big.Int {
		v := big.NewInt(x.w)
		return v.Lsh(v, fracBits).Add(v, big.NewInt(x.f))
	}
	num := raw(a)
	q, r := new(big.Int).QuoRem(num.Mul(num, raw(to)), raw(from), new(big.Int))
	if r.Sign() > 0 {
		q.Add(q, big.NewInt(1))
	}
	if q.BitLen() > 62+fracBits {
		return fixed{1 << 62, 0}
	}
	f := new(big.Int).And(q, big.NewInt(fracOne-1)).Int64()
	return fixed{q.Rsh(q, fracBits).Int64(), f}
}

func (a fixed) float() float64 { return float64(a.w) + float64(a.f)/fracOne }

// interval is period/rate ticks, rounded up to 2^-32 tick; rate > 0.
func interval(period, rate int64) fixed {
	q, r := period/rate, period%rate
	hi, lo := bits.Mul64(uint64(r), fracOne)
	f, rem := bits.Div64(hi, lo, uint64(rate)) // r < rate: the quotient fits
	if rem > 0 {
		f++
	}
	return fixed{q, 0}.add(fixed{0, int64(f)}) // f may be 2^32: carry it
}

// gcra is one Take's figures, in ticks: the emission interval, the
// increment of the TAT by the Take's cost n, and the burst tolerance.
type gcra struct {
	unit, inc, tol fixed
	capacity       int64
}

// onGrid is a, a ≥ 0, rounded up to a multiple of 2^-b tick, 0 ≤ b ≤ fracBits.
func (a fixed) onGrid(b int) fixed {
	step := int64(1) << (fracBits - b)
	return fixed{a.w, 0}.add(fixed{0, (a.f + step - 1) &^ (step - 1)}) // may carry
}

// units is a in units of 2^-b tick: a is on that grid (onGrid), and below
// 2^63 of its units.
func (a fixed) units(b int) int64 { return a.w<<b | a.f>>(fracBits-b) }

// newGCRA returns the figures of a Take of n under lim, period being
// lim.Period in ticks (at least 1), on a grid of 2^-b tick.
func newGCRA(period int64, lim Limit, n int64, b int) gcra {
	unit := interval(max(1, period), max(1, lim.Rate)).onGrid(b)
	c := lim.Capacity()
	return gcra{unit: unit, inc: unit.mul(n), tol: unit.mul(c), capacity: c}
}

// decide reports whether a Take finding the TAT d ahead of now (d ≥ 0)
// admits its cost: whether the TAT it leaves, d+inc from now, is within the
// tolerance.
func (g *gcra) decide(d fixed) bool { return !g.tol.less(d.add(g.inc)) }

// result is the Result of a Take that found the TAT d ahead of now (d ≥ 0)
// and was admitted or not, tick being the length of a tick. Durations are
// rounded up to a tick, so that waiting one out never ends early.
func (g *gcra) result(d fixed, allowed bool, tick time.Duration) Result {
	res := Result{Allowed: allowed, Limit: g.capacity}
	if allowed {
		d = d.add(g.inc)
	} else {
		res.RetryAfter = time.Duration(d.add(g.inc).sub(g.tol).ceil()) * tick
	}
	if !g.tol.less(d) { // d beyond the tolerance: a limit was lowered
		res.Remaining = g.tol.sub(d).per(g.unit)
	}
	res.ResetAfter = time.Duration(d.ceil()) * tick
	if next := d.add(g.unit).sub(g.tol); (fixed{}).less(next) {
		res.NextAfter = time.Duration(next.ceil()) * tick
	}
	return res
}
