// Package counter holds the rate-limiting algorithms and the stores that run
// them. A store makes one atomic decision per call (Take) on one counter; it
// knows nothing of hot keys or of how a key was split.
//
// Four algorithms are offered, each a trade-off between memory, exactness and
// burst behaviour:
//
//   - TokenBucket, implemented as GCRA (generic cell rate algorithm). State is
//     one timestamp per key, the theoretical arrival time (TAT). A request of
//     cost n advances the TAT by n emission intervals (Period/Rate) and is
//     admitted when the new TAT is no further than Burst intervals ahead of
//     now. It allows bursts of up to Burst and a sustained Rate per Period, at
//     the cost of one timestamp of state. The interval is kept to 2^-32 of
//     the store's tick (see gcra.go) in memory, and on Redis to 2^-b µs with b
//     from 32 at tolerances up to 16 ms down to 26 at 1 s and 14 at an hour,
//     so a rate is enforced as given even when it does not divide its period
//     (slower by less than a grid step per unit, never faster). The
//     tolerance, the time to refill the whole burst, is at most
//     MaxTolerance (2^37 ms, 4.35 years): Validate refuses a longer one. The
//     default choice.
//   - SlidingWindow, the sliding-window counter: two fixed windows (current and
//     previous), with the previous one weighted by how much of it still lies
//     inside the sliding window. Two integers of state; the estimate assumes the
//     previous window's requests were evenly spread, so it can be off by a few
//     percent under bursty traffic, never by 2×. The weighted count is rounded
//     down (so that steady traffic at the rate is never refused), so the first
//     request after a window starts may pass though the previous window was
//     full: under a limit of 1 a second, two requests a millisecond apart
//     across a whole second both pass. Windows start at multiples of Period
//     from the Unix epoch.
//   - FixedWindow: one counter per aligned window. The cheapest, but a client
//     can send Rate requests at the end of one window and Rate more at the start
//     of the next, so up to 2× Rate can pass within one Period across a
//     boundary.
//   - SlidingLog: the admitted requests of the last Period, each with its
//     instant. Exact, and its state grows with the requests (on Redis with
//     the units: one sorted-set member each), so it is meant for low limits
//     such as logins; Rate is capped at MaxLogRate. The memory store keeps a
//     request as one entry whatever its cost and bounds a log's entries: a
//     log busier than maxLogEntries/2 requests per period rounds instants up
//     to a slot of the period, which may deny a little early, never admit
//     more (see slidinglog.go).
//
// Bounds: Rate and Burst are at most MaxCount (2^53-1, where a Lua double
// stops being exact), a window's Period at most MaxWindowPeriod; Validate
// refuses what a store could not enforce exactly.
//
// Charges: the memory store also adds usage to a counter without a decision
// (MemoryStore.ChargeAt), the units another instance admitted on the key,
// saturating at the algorithm's bounds (see charge.go). A TotalCharger
// charges a sender's running total of such units once, keeping per counter
// and sender the highest total charged (see total.go).
//
// Leases (lease.go): a store that is a Leaser charges a block of up to n
// units in one call (Lease) and takes unused ones back (Return) by each
// algorithm's rule, never leaving a counter more room than it would have
// had if the block had been only the units spent.
//
// Time: the memory store reads an injected clock; the Redis store takes time
// from redis.call('TIME'), so client clocks never decide.
package counter

import (
	"context"
	"errors"
	"fmt"
	"math/bits"
	"time"
)

// Algorithm names a rate-limiting algorithm. The zero value is TokenBucket.
type Algorithm uint8

// The algorithms every store supports.
const (
	TokenBucket Algorithm = iota
	SlidingWindow
	FixedWindow
	SlidingLog
	numAlgorithms
)

var algorithmNames = [numAlgorithms]string{"token_bucket", "sliding_window", "fixed_window", "sliding_log"}

// String returns the algorithm's name as used in configuration files.
func (a Algorithm) String() string {
	if a < numAlgorithms {
		return algorithmNames[a]
	}
	return fmt.Sprintf("Algorithm(%d)", uint8(a))
}

// ParseAlgorithm returns the algorithm named s (see Algorithm.String).
func ParseAlgorithm(s string) (Algorithm, error) {
	for i, n := range algorithmNames {
		if n == s {
			return Algorithm(i), nil
		}
	}
	return 0, fmt.Errorf("%w: %q", ErrUnknownAlgorithm, s)
}

// MaxLogRate caps Rate for SlidingLog, whose Redis state holds one entry
// per admitted unit.
const MaxLogRate = 100_000

// The bounds of what a store enforces exactly. A Lua double, in which the
// Redis scripts count, is exact up to 2^53.
const (
	// MaxCount caps Rate and Burst, and so a cost.
	MaxCount = 1<<53 - 1
	// MaxWindowPeriod caps Period for the window algorithms and the log,
	// which the Redis scripts count in µs (about 285 years).
	MaxWindowPeriod = MaxCount * time.Microsecond
	// MaxTolerance caps a token bucket's tolerance, the time to refill its
	// whole burst: Burst intervals of Period/Rate, each rounded up to the
	// Redis store's grid (see redisGCRA). It is 2^37 ms, about 4.35 years.
	MaxTolerance = (1 << maxSpanLevel) * time.Millisecond
)

// ErrInvalidLimit is in every error for a limit that cannot be enforced
// (errors.Is): each of the errors below that names a field of a limit wraps
// it.
var ErrInvalidLimit = errors.New("invalid limit")

// Errors returned for invalid limits, each wrapping ErrInvalidLimit, and for
// invalid costs. Store errors are wrapped separately.
var (
	ErrInvalidRate      error = &limitError{"limit rate must be positive"}
	ErrInvalidPeriod    error = &limitError{"limit period must be positive"}
	ErrInvalidBurst     error = &limitError{"limit burst must not be negative"}
	ErrUnknownAlgorithm error = &limitError{"unknown algorithm"}
	ErrLimitTooLarge    error = &limitError{"limit too large for algorithm"}
	// ErrBurstTooLarge and ErrPeriodTooLong come wrapped with
	// ErrLimitTooLarge, and tell which field is beyond its bound.
	ErrBurstTooLarge    error = &limitError{"burst too large"}
	ErrPeriodTooLong    error = &limitError{"period too long"}
	ErrInvalidCost            = errors.New("cost must be positive")
	ErrCostExceedsBurst       = errors.New("cost exceeds burst")
)

// limitError is an error in one field of a limit: its text is its own, and
// it is ErrInvalidLimit to errors.Is.
type limitError struct{ msg string }

func (e *limitError) Error() string { return e.msg }
func (e *limitError) Unwrap() error { return ErrInvalidLimit }

// Limit is a rate limit: Rate requests per Period, enforced by Algorithm.
// Burst applies to TokenBucket only (0 means Rate); the window algorithms
// admit at most Rate per window.
type Limit struct {
	Algorithm Algorithm
	Rate      int64
	Period    time.Duration
	Burst     int64
}

// PerSecond returns a token-bucket limit of rate per second with a burst of rate.
func PerSecond(rate int64) Limit { return Limit{Rate: rate, Period: time.Second} }

// PerMinute returns a token-bucket limit of rate per minute with a burst of rate.
func PerMinute(rate int64) Limit { return Limit{Rate: rate, Period: time.Minute} }

// Capacity is the largest cost a single request can have: Burst (or Rate when
// Burst is 0) for TokenBucket, Rate for the window algorithms.
func (l Limit) Capacity() int64 {
	if l.Algorithm == TokenBucket && l.Burst > 0 {
		return l.Burst
	}
	return l.Rate
}

// Validate reports whether l can be enforced exactly. Besides positive
// figures, that takes Rate and Burst at most MaxCount, a window's Period at
// most MaxWindowPeriod and a token bucket's tolerance at most MaxTolerance;
// beyond them the error wraps ErrLimitTooLarge (and ErrBurstTooLarge or
// ErrPeriodTooLong when that field is at fault).
func (l Limit) Validate() error {
	if err := l.validate(); err != nil {
		return err
	}
	return l.checkTolerance()
}

// validate is Validate but for the token bucket's tolerance. A share of a
// valid limit (a split key's subcounter) passes it; its tolerance may pass
// MaxTolerance by the rounding of its share, and the Redis store then cuts
// its capacity to what fits: it admits less, never more.
func (l Limit) validate() error {
	switch {
	case l.Algorithm >= numAlgorithms:
		return fmt.Errorf("%w: %d", ErrUnknownAlgorithm, l.Algorithm)
	case l.Rate <= 0:
		return fmt.Errorf("%w: %d", ErrInvalidRate, l.Rate)
	case l.Period <= 0:
		return fmt.Errorf("%w: %v", ErrInvalidPeriod, l.Period)
	case l.Burst < 0:
		return fmt.Errorf("%w: %d", ErrInvalidBurst, l.Burst)
	case l.Algorithm == SlidingLog && l.Rate > MaxLogRate:
		return fmt.Errorf("%w: sliding_log rate %d > %d", ErrLimitTooLarge, l.Rate, MaxLogRate)
	case l.Rate > MaxCount:
		return fmt.Errorf("%w: rate %d is over 2^53-1 (%d), the most a store counts exactly: use a longer period instead", ErrLimitTooLarge, l.Rate, int64(MaxCount))
	case l.Burst > MaxCount:
		return fmt.Errorf("%w: %w: %d is over 2^53-1 (%d), the most a store counts exactly", ErrLimitTooLarge, ErrBurstTooLarge, l.Burst, int64(MaxCount))
	case l.Algorithm != TokenBucket && l.Period > MaxWindowPeriod:
		return fmt.Errorf("%w: %w: %v period %v is over 2^53-1 µs (%v), the longest a store times exactly", ErrLimitTooLarge, ErrPeriodTooLong, l.Algorithm, l.Period, MaxWindowPeriod)
	}
	return nil
}

// checkTolerance reports whether a token bucket's tolerance is within
// MaxTolerance on the Redis store's grid, where it is coarsest (the memory
// store's nanoseconds hold 2^63).
func (l Limit) checkTolerance() error {
	if l.Algorithm != TokenBucket {
		return nil
	}
	// Most limits are far within the bound, and the exact check can be
	// spared on the decision path.
	if toleranceWithinHalf(l) {
		return nil
	}
	return l.checkToleranceExact()
}

// toleranceWithinHalf reports whether a token bucket's tolerance, its
// period rounded up to a µs and its interval to the coarsest grid (1 µs),
// is within half of MaxTolerance (so within MaxTolerance on every store).
func toleranceWithinHalf(l Limit) bool {
	c := l.Capacity()
	return c <= int64(MaxTolerance/2/time.Microsecond) && !toleranceOverBy(l.Period+time.Microsecond, c, l.Rate, MaxTolerance/2)
}

// checkToleranceExact is checkTolerance on the Redis store's figures.
func (l Limit) checkToleranceExact() error {
	c := l.Capacity()
	over := toleranceOver(l.Period, c, l.Rate)
	if !over {
		if g, _ := redisGCRA(micros(l.Period), l, 1); g.capacity == c {
			return nil
		}
	}
	field := ErrBurstTooLarge
	if l.Burst == 0 {
		field = ErrPeriodTooLong
	}
	fit := maxBurst(l)
	switch {
	case fit == 0:
		return fmt.Errorf("%w: %w: token_bucket at %d per %v takes over %v (2^37 ms) to refill one unit, the most a store times exactly: use a shorter period or a higher limit",
			ErrLimitTooLarge, ErrPeriodTooLong, l.Rate, l.Period, MaxTolerance)
	case over:
		return fmt.Errorf("%w: %w: token_bucket burst %d at %d per %v takes over %v (2^37 ms) to refill, the most a store times exactly: set burst to at most %d",
			ErrLimitTooLarge, field, c, l.Rate, l.Period, MaxTolerance, fit)
	}
	err := fmt.Errorf("token_bucket burst %d at %d per %v: its interval, rounded up to the Redis store's time grid, makes the burst take over %v (2^37 ms) to refill: set burst to at most %d, or use a lower limit",
		c, l.Rate, l.Period, MaxTolerance, fit)
	if l.Burst == 0 { // the limit is at fault
		return fmt.Errorf("%w: %w", ErrLimitTooLarge, err)
	}
	return fmt.Errorf("%w: %w: %w", ErrLimitTooLarge, ErrBurstTooLarge, err)
}

// toleranceOver reports whether period·burst/rate is over MaxTolerance,
// exactly (in 128 bits).
func toleranceOver(period time.Duration, burst, rate int64) bool {
	return toleranceOverBy(period, burst, rate, MaxTolerance)
}

// toleranceOverBy reports whether period·burst/rate is over bound,
// exactly (in 128 bits).
func toleranceOverBy(period time.Duration, burst, rate int64, bound time.Duration) bool {
	lh, ll := bits.Mul64(uint64(period), uint64(burst))
	rh, rl := bits.Mul64(uint64(bound), uint64(rate))
	return lh > rh || lh == rh && ll > rl
}

// maxBurst is the largest burst l's rate and period can have within
// MaxTolerance on every store; 0 if none.
func maxBurst(l Limit) int64 {
	hi, lo := bits.Mul64(uint64(MaxTolerance), uint64(l.Rate))
	b := int64(MaxCount)
	if hi < uint64(l.Period) {
		if q, _ := bits.Div64(hi, lo, uint64(l.Period)); q < MaxCount {
			b = int64(q)
		}
	}
	if b == 0 {
		return 0
	}
	l.Burst = b
	g, _ := redisGCRA(micros(l.Period), l, 1)
	return g.capacity
}

// ttl is how long a counter's state matters after its last update: the
// period, or for a token bucket the time to refill the whole burst.
func (l Limit) ttl() time.Duration {
	switch l.Algorithm {
	case TokenBucket:
		return time.Duration(float64(l.Period) * float64(l.Capacity()) / float64(l.Rate))
	case SlidingWindow:
		return 2 * l.Period
	}
	return l.Period
}

// Result is the outcome of one Take.
type Result struct {
	Allowed bool
	// Limit is the counter's capacity (Burst or Rate).
	Limit int64
	// Remaining is how many more units the counter would admit now.
	Remaining int64
	// RetryAfter is how long until a denied request of the same cost could
	// pass; 0 when allowed.
	RetryAfter time.Duration
	// ResetAfter is how long until the counter is back to full capacity.
	ResetAfter time.Duration
	// NextAfter is how long until a request of cost 1 could pass: 0 when
	// one could now. It is the store's own figure, rounded as the store
	// rounds its decisions, so that a caller remembering a denial (the
	// engine's deny cache) agrees with the store. Only TokenBucket sets it;
	// it is 0 for the other algorithms.
	NextAfter time.Duration
}

// Store runs the algorithms on named counters. Implementations are safe for
// concurrent use.
type Store interface {
	// Take charges n units to the counter key under lim and reports whether
	// they were admitted. hash is Hash(key), computed once by the caller,
	// or 0 for the store to compute it: the memory store places key by it,
	// so a call with another hash of key may find another counter. Take
	// validates neither lim nor n: callers (the engine) do. Take may block
	// on I/O.
	Take(ctx context.Context, key string, hash uint64, lim Limit, n int64) (Result, error)
	// Close releases the store's resources and stops its goroutines.
	Close() error
}

// Op is one Take of a batch (see Batcher): its arguments, and once the
// batch is done, its Result or Err.
type Op struct {
	Key   string
	Hash  uint64
	Limit Limit
	N     int64

	Result Result
	Err    error
}

// Batcher is implemented by stores that can run many Takes in one round
// trip.
type Batcher interface {
	// TakeBatch runs each of ops as Take would, those on one key in their
	// order, and sets its Result or Err. It returns when all are done.
	TakeBatch(ctx context.Context, ops []Op)
}
