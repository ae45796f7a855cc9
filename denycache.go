package hotkey

import (
	"math"
	"sync/atomic"
	"time"

	"github.com/hotkeyd/hotkey/counter"
	"github.com/hotkeyd/hotkey/shard"
)

// denyCache remembers, for a while, which subcounters denied: a subcounter
// that denied a cost of n with retry-after d denies any cost ≥ n until d has
// passed, so asking the store again is wasted work. It is direct-mapped and
// fixed in size: a slot holds the latest deny that hashed to it, and losing
// one only costs a store call. Entries are keyed by the subcounter AND the
// limit, so a changed limit takes effect at once. Safe for concurrent use;
// lookups take no lock and do not allocate.
//
// A denial remembered with a holding (addHeld) may be held past the
// store's retry-after by whole units of the limit, for a key asked much
// faster than its limit (see holding).
type denyCache struct {
	slots []atomic.Pointer[denial]
	mask  uint64
}

type denial struct {
	id    uint64 // fingerprint of subcounter and limit
	cost  int64
	at    int64 // when it denied, Unix ns
	until int64 // at + retry-after, plus hold-1 units when held
	hold  int64 // the units of the limit the denial covers, ≥ 1 when held
	since int64 // when the hold's epoch began, Unix ns (addHeld)
	res   counter.Result
	hits  atomic.Int64 // refusals in the epoch: lookups it answered, and more when held
}

func newDenyCache(size int) *denyCache {
	n := 1
	for n < size {
		n <<= 1
	}
	return &denyCache{slots: make([]atomic.Pointer[denial], n), mask: uint64(n - 1)}
}

// denyID fingerprints a subcounter (by its hash) under a limit.
func denyID(sub uint64, lim counter.Limit) uint64 {
	x := shard.Mix(sub ^ uint64(lim.Rate)*0x9e3779b97f4a7c15)
	x = shard.Mix(x ^ uint64(lim.Period))
	return shard.Mix(x ^ uint64(lim.Burst)<<8 ^ uint64(lim.Algorithm))
}

// lookup returns the cached deny for id if one covers cost at the instant
// clock returns, between the deny and its end; clock is read only when the
// slot matches.
func (c *denyCache) lookup(id uint64, cost int64, clock func() time.Time) (counter.Result, bool) {
	d := c.slots[id&c.mask].Load()
	if d == nil || d.id != id || cost < d.cost {
		return counter.Result{}, false
	}
	now := clock().UnixNano()
	if now >= d.until || now < d.at { // passed, or the clock stepped back before it
		return counter.Result{}, false
	}
	d.hits.Add(1)
	res := d.res
	// Held, the denial's end; cut short (a hold below the store's
	// retry-after), the store's retry-after still.
	res.RetryAfter = max(time.Duration(d.until-now), res.RetryAfter-time.Duration(now-d.at))
	res.ResetAfter = max(0, res.ResetAfter-time.Duration(now-d.at))
	return res, true
}

// add records that the subcounter id denied cost at now with res, for its
// retry-after or most, whichever is shorter.
func (c *denyCache) add(id uint64, cost int64, now time.Time, res counter.Result, most time.Duration) {
	if res.RetryAfter <= 0 || most <= 0 {
		return
	}
	t := now.UnixNano()
	c.slots[id&c.mask].Store(&denial{id: id, cost: cost, at: t, until: t + int64(min(res.RetryAfter, most)), res: res})
}

// holding is how long a denial may be held past the store's retry-after:
// by hold-1 more units of the limit (a unit is due every unit), hold at
// most most. Under load far over the limit, a denial's end sends every
// request asked until the store's next answer to the store; when one unit
// is there, all but one are denied there. Held until several units are
// due, that flood is mostly admitted, and the requests asked between the
// units running out and the store saying so are spread over more denials.
// A token bucket keeps the units held (most ≤ half its burst) and a
// sliding log frees them until they are taken, but a sliding window loses
// the room its window ends with: there window is its period, and a hold
// ends before the window does, by 1/64 of it or two round trips (trip, how
// long the store took to answer), whichever is longer. The zero holding
// holds nothing.
//
// life, if positive, bounds how long a denial is remembered instead: its
// retry-after or life, whichever is shorter (denyHold), and it is not held.
type holding struct {
	unit   time.Duration
	most   int64
	window time.Duration
	trip   time.Duration
	life   time.Duration
}

// holdFor returns the holding for a denial under lim, whose store answered
// in trip: most is at most half the capacity and 1/8 of the period, which
// a key asked far over its limit finds its units late by. A fixed window's
// denial lasts to the window's end already: it holds nothing more.
func holdFor(lim counter.Limit, trip time.Duration) holding {
	if lim.Algorithm == counter.FixedWindow || lim.Rate <= 0 {
		return holding{}
	}
	unit := lim.Period / time.Duration(lim.Rate)
	if unit <= 0 {
		return holding{}
	}
	most := min(lim.Capacity()/2, int64(lim.Period/8/unit)+1)
	if most <= 1 {
		return holding{}
	}
	h := holding{unit: unit, most: most}
	if lim.Algorithm == counter.SlidingWindow {
		h.window, h.trip = lim.Period, max(0, trip)
	}
	return h
}

// end is when a denial at t (Unix ns) with res ends, held hold units.
func (h holding) end(t int64, res counter.Result, hold int64) int64 {
	until := t + int64(res.RetryAfter) + (hold-1)*int64(h.unit)
	if h.window > 0 {
		left := res.ResetAfter // the window's rest, plus a period if it has counted units
		if left > h.window {
			left -= h.window
		}
		until = min(until, t+int64(left-max(h.window/64, 2*h.trip)))
	}
	return max(until, t+int64(res.RetryAfter))
}

// restUnits is how many units past a held denial's end a key may go
// unrefused and keep its hold: the flood at a denial's end and its round
// trips take a few.
const restUnits = 16

// addHeld is add of a denial that h lets the cache hold; refused is 1 if
// the store refused the take, 0 if it admitted it and emptied the bucket.
//
// The hold starts at one unit. The refusals of the key (lookups the cache
// answered, and store denials) are counted over an epoch of at least four
// units and hold units, carried from a denial to the one that replaces it;
// at the epoch's end the hold doubles (to h.most) if the refusals were at
// least twice the units due in it, stays if as many, and halves if fewer,
// so only a key asked faster than its limit is held. A key that rests
// longer than its last denial lasted, and than its hold and restUnits
// more, starts again at one unit. While a denial is live, a store answer
// it covers (no later end, no smaller cost) leaves it in place, so the
// flood at its end does not shorten the next.
func (c *denyCache) addHeld(id uint64, cost int64, now time.Time, res counter.Result, h holding, refused int64) {
	if h.life > 0 {
		c.add(id, cost, now, res, h.life)
		return
	}
	if h.most <= 1 {
		c.add(id, cost, now, res, math.MaxInt64)
		return
	}
	if res.RetryAfter <= 0 {
		return
	}
	t := now.UnixNano()
	slot := &c.slots[id&c.mask]
	d := &denial{id: id, cost: cost, at: t, hold: 1, since: t, res: res}
	if prev := slot.Load(); prev != nil && prev.id == id && prev.hold > 0 {
		if prev.cost <= cost && h.end(t, res, 1) <= prev.until {
			prev.hits.Add(refused)
			return
		}
		if t-prev.until <= max(prev.until-prev.at, (prev.hold+restUnits)*int64(h.unit)) { // the key did not rest
			d.hold, d.since = prev.hold, prev.since
			refused += prev.hits.Load()
			if units := (t-prev.since)/int64(h.unit) + 1; units >= max(4, prev.hold) {
				d.hold, d.since = nextHold(prev.hold, refused, units, h.most), t
				refused = 0
			}
		}
	}
	d.hits.Store(refused)
	d.until = h.end(t, res, d.hold)
	slot.Store(d)
}

// nextHold is the hold after an epoch in which a key held hold units was
// refused refused times while units were due, at most most.
func nextHold(hold, refused, units, most int64) int64 {
	switch {
	case refused >= 2*units:
		return min(2*hold, most)
	case refused >= units:
		return min(hold, most)
	}
	return max(1, hold/2)
}

// forget drops the deny of the subcounter and limit id, if the cache holds
// it.
func (c *denyCache) forget(id uint64) {
	slot := &c.slots[id&c.mask]
	if d := slot.Load(); d != nil && d.id == id {
		slot.CompareAndSwap(d, nil)
	}
}
