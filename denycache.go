package hotkey

import (
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
type denyCache struct {
	slots []atomic.Pointer[denial]
	mask  uint64
}

type denial struct {
	id    uint64 // fingerprint of subcounter and limit
	cost  int64
	at    int64 // when it denied, Unix ns
	until int64 // when it is forgotten: at + retry-after, or sooner
	res   counter.Result
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
	res := d.res
	res.RetryAfter -= time.Duration(now - d.at)
	res.ResetAfter = max(0, res.ResetAfter-time.Duration(now-d.at))
	return res, true
}

// add records that the subcounter id denied cost at now with res, for its
// retry-after or hold, whichever is shorter.
func (c *denyCache) add(id uint64, cost int64, now time.Time, res counter.Result, hold time.Duration) {
	if res.RetryAfter <= 0 || hold <= 0 {
		return
	}
	t := now.UnixNano()
	c.slots[id&c.mask].Store(&denial{id: id, cost: cost, at: t, until: t + int64(min(res.RetryAfter, hold)), res: res})
}

// forget drops the deny of the subcounter and limit id, if the cache holds
// it.
func (c *denyCache) forget(id uint64) {
	slot := &c.slots[id&c.mask]
	if d := slot.Load(); d != nil && d.id == id {
		slot.CompareAndSwap(d, nil)
	}
}
