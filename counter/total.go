package counter

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// A total is a sender's running total of the units it admitted on a
// counter since its life began, sent again and again: duplicated,
// reordered, late, or after a partition as a larger total. A store charges
// totals idempotently by keeping, beside the counter, a watermark per
// sender: the highest total charged. A total above the watermark charges
// the difference, as a Charge of it would, and raises the watermark; a
// total at or below it charges nothing. A watermark is kept at least Keep
// after each op naming it: a total resent after its watermark is gone
// charges it all again, so Keep must outlive the resends of a total.

// TotalOp is one sender's running total of the units it admitted on a
// counter, for ChargeTotals: its arguments, and once done, Charged or Err.
type TotalOp struct {
	Key   string
	Hash  uint64 // Hash(Key), or 0 for the store to compute it
	Limit Limit
	// From names the sender (an instance's id and life): 1 to
	// MaxFromLen bytes.
	From string
	// Total is the units the sender admitted on the counter in its life:
	// 0 to MaxCount.
	Total int64
	// Keep is how long at least the watermark is kept after the op (> 0).
	Keep time.Duration
	// Most, if above 0, caps the units the op charges: the watermark
	// still rises to Total, and the units above Most are forgiven. A
	// caller bounds with it what one total may charge (a first total from
	// a sender, or the first after a partition, carries all the units of
	// the sender's life or of the partition), as the gossip store caps a
	// peer's entry at what its limit admits over the round's span.
	Most int64

	// Charged is the units charged: Total less the watermark found, if
	// positive, at most Most; 0 otherwise.
	Charged int64
	Err     error
}

// TotalCharger is implemented by stores that charge running totals
// idempotently (see above).
type TotalCharger interface {
	// ChargeTotals charges each of ops in turn and sets its Charged or
	// Err. Per op, atomically with the charge: w is the watermark of
	// (counter, From), 0 if none or expired; a Total above w charges
	// Total−w (at most Most) as Charge does for the limit's algorithm,
	// saturating alike, and sets w to Total; the watermark's expiry becomes at least Keep
	// from now, never sooner than it was. A charge the counter cannot hold
	// (a memory store's full stripe) is an Err and leaves w as it was, so
	// that a resend charges it. An invalid op (ErrInvalidTotal, an unknown
	// algorithm) charges nothing; a limit without a positive Rate and
	// Period charges nothing and keeps no watermark. It may block on I/O.
	ChargeTotals(ctx context.Context, ops []TotalOp)
}

// MaxFromLen is the most bytes of a TotalOp's From.
const MaxFromLen = 128

var (
	// ErrInvalidTotal is in the Err of an op refused for its From, Total
	// or Keep (errors.Is).
	ErrInvalidTotal = errors.New("invalid total")
	// ErrWatermarksFull is in the Err of an op that needed a new
	// watermark while the memory store held MemoryConfig.MaxWatermarks.
	ErrWatermarksFull = errors.New("watermarks full")
)

var (
	_ TotalCharger = (*MemoryStore)(nil)
	_ TotalCharger = (*RedisStore)(nil)
)

// check returns why op is invalid, or nil.
func (op *TotalOp) check() error {
	switch {
	case op.From == "" || len(op.From) > MaxFromLen:
		return fmt.Errorf("%w: sender of %d bytes, want 1 to %d", ErrInvalidTotal, len(op.From), MaxFromLen)
	case op.Total < 0 || op.Total > MaxCount:
		return fmt.Errorf("%w: total %d, want 0 to %d", ErrInvalidTotal, op.Total, int64(MaxCount))
	case op.Keep <= 0:
		return fmt.Errorf("%w: keep %v, want > 0", ErrInvalidTotal, op.Keep)
	case op.Limit.Algorithm >= numAlgorithms:
		return fmt.Errorf("%w: %d", ErrUnknownAlgorithm, op.Limit.Algorithm)
	}
	return nil
}

// unlimited reports whether lim charges nothing: no positive Rate and
// Period.
func unlimited(lim Limit) bool { return lim.Rate <= 0 || lim.Period <= 0 }

// mark is a watermark: the highest total charged from one sender on one
// counter, kept until expires (the store's ns).
type mark struct {
	total, expires int64
}

// markID names a watermark: the counter's fingerprint and the sender.
type markID struct {
	id   [2]uint64
	from string
}

// marks counts and caps a MemoryStore's watermarks, which its tables
// hold, each under its stripe's mutex.
type marks struct {
	max     int64
	n       atomic.Int64  // held, expired ones until swept
	soonest atomic.Int64  // at or before the expiry of every one held
	refused atomic.Uint64 // new ones refused at max
	sweepMu sync.Mutex    // serialises sweeps
}

// reserve takes room for a new watermark, reporting false at max.
func (m *marks) reserve() bool {
	if m.n.Add(1) > m.max {
		m.n.Add(-1)
		return false
	}
	return true
}

// lower makes soonest at most t.
func (m *marks) lower(t int64) {
	for {
		s := m.soonest.Load()
		if s <= t || m.soonest.CompareAndSwap(s, t) {
			return
		}
	}
}

// ChargeTotals implements TotalCharger: ChargeTotalsAt at the store's
// clock's now.
func (s *MemoryStore) ChargeTotals(_ context.Context, ops []TotalOp) {
	s.chargeTotals(s.now(), ops)
}

// ChargeTotalsAt is ChargeTotals at the instant now: watermarks expire on
// the store's clock. A key without a counter whose stripe is full of live
// counters is not charged: its op's Err is a *FullError, counted by Full.
// A new watermark past MaxWatermarks, when no expired one can be swept, is
// refused (ErrWatermarksFull, counted by WatermarksRefused): an old one is
// never dropped before its expiry, which would let a resent total charge
// twice. It never blocks on I/O.
func (s *MemoryStore) ChargeTotalsAt(now time.Time, ops []TotalOp) {
	s.chargeTotals(s.nanos(now), ops)
}

func (s *MemoryStore) chargeTotals(t int64, ops []TotalOp) {
	for i := range ops {
		op := &ops[i]
		op.Charged, op.Err = 0, op.check()
		if op.Err == nil && !unlimited(op.Limit) {
			s.chargeTotal(t, op)
		}
	}
}

// errNoRoom is chargeTotalLocked's report of a new watermark past the cap.
var errNoRoom = errors.New("no room")

// chargeTotal charges op, valid, at t; when a new watermark finds no room,
// once more after a sweep of expired ones.
func (s *MemoryStore) chargeTotal(t int64, op *TotalOp) {
	id := s.identify(op.Key, op.Hash)
	st := s.stripe(id)
	for swept := false; ; swept = true {
		st.mu.Lock()
		err := s.chargeTotalLocked(st, id, t, op)
		st.mu.Unlock()
		if err != errNoRoom {
			op.Err = err
			return
		}
		if swept || !s.sweepMarks(t) {
			s.marks.refused.Add(1)
			op.Err = fmt.Errorf("memory charge total: %w: %d held", ErrWatermarksFull, s.marks.max)
			return
		}
	}
}

// chargeTotalLocked charges op at t on st, whose mutex it holds, and sets
// its Charged. It returns errNoRoom for a new watermark past the cap.
func (s *MemoryStore) chargeTotalLocked(st *stripe, id [2]uint64, t int64, op *TotalOp) error {
	k := markID{id, op.From}
	m, held := st.t.marks[k]
	live := held && m.expires > t
	var w int64
	if live {
		w = m.total
	}
	expires := addSat(t, int64(op.Keep))
	if live {
		expires = max(expires, m.expires)
	}
	if op.Total <= w {
		if live {
			st.t.marks[k] = mark{m.total, expires}
		}
		return nil
	}
	if !held && !s.marks.reserve() {
		return errNoRoom
	}
	i := s.cell(st, id, t)
	if i < 0 {
		if !held {
			s.marks.n.Add(-1)
		}
		return &FullError{Name: op.Key, Wait: time.Duration(st.t.soonest - t)}
	}
	n := op.Total - w
	if op.Most > 0 {
		n = min(n, op.Most)
	}
	c := st.t.state(i)
	c.charge(t, op.Limit, n)
	st.t.setState(i, c)
	if !held {
		if st.t.marks == nil {
			st.t.marks = make(map[markID]mark)
		}
		k.from = strings.Clone(op.From) // not the caller's buffer
	}
	st.t.marks[k] = mark{op.Total, expires}
	s.marks.lower(expires)
	op.Charged = n
	return nil
}

// sweepMarks drops every expired watermark, if one may have expired by t,
// and reports whether there is room for a new one.
func (s *MemoryStore) sweepMarks(t int64) bool {
	s.marks.sweepMu.Lock()
	defer s.marks.sweepMu.Unlock()
	if s.marks.n.Load() < s.marks.max {
		return true // room made meanwhile
	}
	if t < s.marks.soonest.Load() {
		return false
	}
	// Reset first: a watermark made during the sweep lowers it, one made
	// before is in a stripe still to sweep.
	s.marks.soonest.Store(math.MaxInt64)
	for i := range s.stripes {
		st := &s.stripes[i]
		soonest := int64(math.MaxInt64)
		st.mu.Lock()
		for k, m := range st.t.marks {
			if m.expires <= t {
				delete(st.t.marks, k)
				s.marks.n.Add(-1)
			} else {
				soonest = min(soonest, m.expires)
			}
		}
		st.mu.Unlock()
		s.marks.lower(soonest)
	}
	return s.marks.n.Load() < s.marks.max
}

// Watermarks returns the number of watermarks held, expired ones not yet
// swept included (see ChargeTotalsAt).
func (s *MemoryStore) Watermarks() int { return int(s.marks.n.Load()) }

// WatermarksRefused returns the number of new watermarks refused at
// MaxWatermarks (see ChargeTotalsAt).
func (s *MemoryStore) WatermarksRefused() uint64 { return s.marks.refused.Load() }
