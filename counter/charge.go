package counter

import (
	"context"
	"math"
	"math/bits"
	"time"
)

// A charge is usage added to a counter without a decision: the units
// another instance or region admitted on the key, in the units of the
// algorithm. A charge of n leaves a counter as an admitted Take of n would,
// for every n a Take could admit; beyond that, it saturates at a bound of
// its algorithm, so that an absurd n can neither overflow a counter nor
// make it admit more:
//
//   - TokenBucket: the TAT moves to max(TAT, now) + n intervals, at most
//     maxDebt beyond now. Past an empty bucket (the tolerance beyond now)
//     the units are owed: the bucket admits nothing until the TAT is back
//     within its tolerance, as if the instances sharing it had taken them
//     from one bucket. Without the debt, peers' units arriving on a bucket
//     that this instance's own takes keep empty would be forgotten, and
//     each instance would admit the whole rate.
//   - FixedWindow, SlidingWindow: n is added to the current window's count,
//     at most MaxCount, the highest Rate: a saturated window denies every
//     Take, and the sliding estimate of two of them stays within an int64.
//   - SlidingLog: an entry of n units at now, bounded as a Take's entries
//     are (see slidinglog.go), at most maxLogUnits units each.

// maxDebt caps how far a charge moves a token bucket's TAT beyond now:
// the bursts of 16 instances at the longest tolerance a Limit accepts, so
// that peers' bursts undelivered at once are owed, not forgiven, while a
// TAT stays within an int64 of ns for another 160 years.
const maxDebt = 16 * MaxTolerance

// maxLogUnits caps the units of one sliding log entry written by a charge:
// a log of maxLogEntries+1 such entries still sums within MaxCount, and one
// entry is far above MaxLogRate, so it denies as any larger one would.
const maxLogUnits = MaxCount / (maxLogEntries + 1)

// MaxAdmitted returns the most units l admits on one counter over any span
// of time: a token bucket's burst (Capacity) plus its rate over the span,
// rounded up; for the window algorithms the rate of each window the span
// touches (⌊span/Period⌋ + 2), the most a sliding window or log admits too.
// It saturates at MaxInt64; a negative span counts as 0, and a limit
// without a positive Rate and Period admits 0.
func (l Limit) MaxAdmitted(span time.Duration) int64 {
	if l.Rate <= 0 || l.Period <= 0 {
		return 0
	}
	span = max(span, 0)
	if l.Algorithm != TokenBucket {
		return mulSat(l.Rate, int64(span/l.Period)+2)
	}
	hi, lo := bits.Mul64(uint64(l.Rate), uint64(span))
	if hi >= uint64(l.Period) {
		return math.MaxInt64
	}
	q, r := bits.Div64(hi, lo, uint64(l.Period))
	if r > 0 {
		q++
	}
	if q > math.MaxInt64 {
		return math.MaxInt64
	}
	return addSat(l.Capacity(), int64(q))
}

// mulSat is a·b for a, b ≥ 0, or MaxInt64 if it is past an int64.
func mulSat(a, b int64) int64 {
	if hi, lo := bits.Mul64(uint64(a), uint64(b)); hi != 0 || lo > math.MaxInt64 {
		return math.MaxInt64
	}
	return a * b
}

// ChargeOp is one charge of a ChargeBatch: its arguments, and once the
// batch is done, whether the counter holds it (Charged) or Err.
type ChargeOp struct {
	Key   string
	Hash  uint64
	Limit Limit
	N     int64

	Charged bool
	Err     error
}

// Charger is implemented by stores that take charges: usage added to a
// counter without a decision (see above).
type Charger interface {
	// Charge adds n units of usage to key's counter under lim now, leaving
	// it as an admitted Take of n would, for every n a Take could admit,
	// and saturating beyond (see above). It reports whether the counter
	// holds the charge (a memory store whose stripe is full drops it). A
	// charge of n ≤ 0, or under a limit without a positive Rate and Period,
	// changes nothing and reports true. It may block on I/O.
	Charge(ctx context.Context, key string, hash uint64, lim Limit, n int64) (bool, error)
}

// BatchCharger is implemented by Chargers that charge many counters in
// fewer calls than one each.
type BatchCharger interface {
	Charger
	// ChargeBatch charges each of ops as Charge would, one after the other,
	// and sets its Charged or Err. It returns when all are done. It may
	// block on I/O.
	ChargeBatch(ctx context.Context, ops []ChargeOp)
}

var (
	_ BatchCharger = (*MemoryStore)(nil)
	_ BatchCharger = (*RedisStore)(nil)
)

// Charge implements Charger: ChargeAt at the store's clock's now. It
// never fails.
func (s *MemoryStore) Charge(_ context.Context, key string, hash uint64, lim Limit, n int64) (bool, error) {
	return s.ChargeAt(s.clock(), key, hash, lim, n), nil
}

// ChargeBatch implements BatchCharger: a Charge of each op in turn.
func (s *MemoryStore) ChargeBatch(ctx context.Context, ops []ChargeOp) {
	for i := range ops {
		op := &ops[i]
		op.Charged, op.Err = s.Charge(ctx, op.Key, op.Hash, op.Limit, op.N)
	}
}

// ChargeAt adds n units of usage to key's counter under lim at now, with
// no decision: what an admitted Take of n would leave, saturating where a
// Take could not have admitted n (see charge.go). It reports whether the
// counter holds the charge. A key without a counter whose stripe is full of
// live counters is not charged: the charge is dropped, reported false and
// counted by Full, as a refused Take is. A charge of n ≤ 0, or under a limit
// without a positive Rate and Period, changes nothing and reports true.
// Like TakeAt it is safe for concurrent use and never blocks on I/O.
func (s *MemoryStore) ChargeAt(now time.Time, key string, hash uint64, lim Limit, n int64) bool {
	if n <= 0 || lim.Rate <= 0 || lim.Period <= 0 {
		return true
	}
	ok, _ := s.update(now, key, hash, func(c *state, t int64) { c.charge(t, lim, n) })
	return ok
}

// charge adds n > 0 units under lim to s at now (see charge.go).
func (s *state) charge(now int64, lim Limit, n int64) {
	switch lim.Algorithm {
	case SlidingWindow:
		s.chargeSlidingWindow(now, lim, n)
	case FixedWindow:
		s.chargeFixedWindow(now, lim, n)
	case SlidingLog:
		s.chargeSlidingLog(now, lim, n)
	default:
		s.chargeGCRA(now, lim, n)
	}
}

func (s *state) chargeGCRA(now int64, lim Limit, n int64) {
	g := newGCRA(lim.Period.Nanoseconds(), lim, 1, fracBits)
	var d fixed
	if s.a > now || s.a == now && s.b > 0 {
		d = fixed{s.a, s.b}.sub(fixed{now, 0})
	}
	if written := s.interval(); written != (fixed{}) && written != g.unit && (fixed{}).less(d) {
		d = d.rescale(written, g.unit) // see takeGCRA
	}
	limit := fixed{int64(maxDebt), 0} // beyond any tolerance (Validate)
	if !d.less(limit) {
		return // owing all a counter may: nothing to add
	}
	if room := limit.sub(d).per(g.unit); n > room {
		d = limit
	} else {
		d = d.add(g.unit.mul(n))
	}
	tat := fixed{now, 0}.add(d)
	s.a, s.b = tat.w, tat.f
	s.setInterval(g.unit)
	s.expires = tat.ceil()
}

func (s *state) chargeFixedWindow(now int64, lim Limit, n int64) {
	p := int64(lim.Period)
	w := now / p
	if w != s.a {
		s.a, s.b = w, 0
	}
	s.b = addCount(s.b, n)
	s.expires = windowEnd(w, 1, p)
}

func (s *state) chargeSlidingWindow(now int64, lim Limit, n int64) {
	p := int64(lim.Period)
	w := now / p
	s.rollWindows(w)
	s.b = addCount(s.b, n)
	s.expires = windowEnd(w, 2, p)
}

func (s *state) chargeSlidingLog(now int64, lim Limit, n int64) {
	p := int64(lim.Period)
	s.logDrop(now - p)
	s.logAdd(now, min(n, maxLogUnits), p)
	last := &s.log[len(s.log)-1] // where the units went: a new entry or the newest
	last.n = min(last.n, maxLogUnits)
	s.expires = addSat(s.logNewest(), p)
}

// addCount is a+n for a window's count a ≥ 0 and n > 0, at most MaxCount.
func addCount(a, n int64) int64 {
	if a >= MaxCount || n > MaxCount-a {
		return max(a, MaxCount)
	}
	return a + n
}
