package loadgen

import "time"

// Limit is a limit a run's watched key is measured against: Units per
// Period, as a token bucket that starts full and holds Units (a burst of
// Units). The zero value states no limit.
type Limit struct {
	Units  int64
	Period time.Duration
}

// ideal is a perfect token bucket of a Limit, as GCRA: it counts the
// requests a limiter that admits exactly the limit would admit. The zero
// value is not usable; it is not safe for concurrent use.
type ideal struct {
	interval, tolerance float64 // seconds: a unit's share of the period, and the period
	tat                 float64 // theoretical arrival time, seconds from the run's start
	admitted            int64
}

func newIdeal(l Limit) *ideal {
	p := l.Period.Seconds()
	return &ideal{interval: p / float64(l.Units), tolerance: p}
}

// take counts a request of cost units meant for at, from the run's start;
// calls come in the order of at. A relative slack of 1e-9 keeps float
// rounding from refusing the last unit of a burst.
func (b *ideal) take(at time.Duration, cost int64) {
	t := at.Seconds()
	tat := max(b.tat, t) + float64(cost)*b.interval
	if tat-t <= b.tolerance*(1+1e-9) {
		b.tat = tat
		b.admitted++
	}
}
