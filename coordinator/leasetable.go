package coordinator

import (
	"slices"
	"strings"
	"time"

	"github.com/hotkeyd/hotkey/shard"
)

// leaseTable is the lease table of a NATS coordinator and the rules that
// turn it into levels in force. It keeps, per key, this instance's own level
// and, for each level, the latest expiry any peer's lease gave it; the level
// in force is the highest of the own level and the levels with an unexpired
// lease. A raise of the own level is in force at once; a lowering once the
// own lease at the old level, if it was published, lapses on the peers (ttl
// after its last publication), so that every instance leaves the old level
// at about the same instant. The table holds at most maxKeys keys: a peer's
// lease for a new key is dropped while it is full, and an own level for a
// new key evicts the key held only by peers whose leases expire first.
//
// Level changes are queued for the Handler and coalesced per key against
// what it was last handed (changes). The table does no I/O, reads no clock
// and starts nothing: every method that depends on time takes it, as now.
// It is not safe for concurrent use; NATS guards it with its mutex.
type leaseTable struct {
	id      string        // this instance's ID: the origin of its own leases
	ttl     time.Duration // ttl of the own leases
	maxKeys int           // most keys held
	every   time.Duration // longest interval between sweeps
	base    time.Time     // origin of the instants kept in entries

	keys    map[string]*entry
	own     map[string]shard.Level // own levels: key → level (each also in keys)
	pending map[string]change      // level changes not yet taken by changes
	told    map[string]shard.Level // levels handed out by changes, 1s omitted
	nextExp int64                  // instant by which the next sweep runs

	// onChange, if set, is called when a level change is queued or
	// withdrawn; onSooner when a lease expires before the next sweep was
	// due. They are called from the table's methods and must not block.
	onChange, onSooner func()
}

// newLeaseTable returns an empty table for an instance called id whose own
// leases last ttl, holding at most maxKeys keys, swept at least every every.
// start is the earliest time its methods will be given.
func newLeaseTable(id string, ttl time.Duration, maxKeys int, every time.Duration, start time.Time) *leaseTable {
	return &leaseTable{
		id:      id,
		ttl:     ttl,
		maxKeys: maxKeys,
		every:   every,
		base:    start,
		keys:    make(map[string]*entry),
		own:     make(map[string]shard.Level),
		pending: make(map[string]change),
		told:    make(map[string]shard.Level),
		nextExp: int64(every),
	}
}

// entry is one key of the lease table. Instants are nanoseconds since the
// table's base.
type entry struct {
	hash   uint64
	own    shard.Level // this instance's level, 0 if none
	ownExp int64       // when the own lease last published at level own lapses on the peers; 0 if not published
	exp    [3]int64    // latest expiry of peers' leases at 4, 16, 64; 0 if none
	level  shard.Level // level in force, as last computed
	// origin[i] names the instance whose lease gave exp[i] (for a lease
	// learned by join sync, the instance that answered): one string per
	// level, for leases.
	origin [3]string
}

// change is a level change for the Handler.
type change struct {
	hash  uint64
	level shard.Level
}

var slotLevels = [3]shard.Level{shard.Level4, shard.Level16, shard.Level64}

func slot(level shard.Level) int {
	switch level {
	case shard.Level4:
		return 0
	case shard.Level16:
		return 1
	}
	return 2
}

// force returns the level in force at now: the highest of the own level and
// the levels with an unexpired lease, 1 if none.
func (e *entry) force(now int64) shard.Level {
	l := max(shard.Level1, e.own)
	for i := len(e.exp) - 1; i >= 0; i-- {
		if e.exp[i] > now {
			return max(l, slotLevels[i])
		}
	}
	return l
}

// expiry returns the latest expiry of any peer lease of e.
func (e *entry) expiry() int64 { return max(e.exp[0], e.exp[1], e.exp[2]) }

// at returns now as an instant of the entries.
func (t *leaseTable) at(now time.Time) int64 { return int64(now.Sub(t.base)) }

// setOwn makes level (4, 16 or 64, or 1 for none) this instance's own level
// for key at now. It reports whether the own level changed, and ok false if
// key is new and the table is full of keys this instance holds.
func (t *leaseTable) setOwn(key string, level shard.Level, now time.Time) (changed, ok bool) {
	n := t.at(now)
	e := t.keys[key]
	if e != nil && e.own > level && e.ownExp > 0 {
		// Lowering: the peers hold the own lease at the old level until
		// it lapses there, ttl after its last publication; keep it in force
		// here until then too, so that every instance leaves the old level
		// at about the same instant (two instances deciding on different
		// subcounters would each enforce the whole limit).
		i := slot(e.own)
		if e.ownExp > e.exp[i] {
			e.exp[i], e.origin[i] = e.ownExp, t.id
		}
		t.expiring(e.exp[i])
		e.ownExp = 0
	}
	if level == shard.Level1 {
		if e == nil || e.own == 0 {
			return false, true
		}
		e.own = 0
		delete(t.own, key)
		t.update(key, e, n)
		return true, true
	}
	if e == nil {
		if len(t.keys) >= t.maxKeys && !t.evictPeerKey(n) {
			return false, false
		}
		e = &entry{hash: shard.NameHash(key), level: shard.Level1}
		t.keys[key] = e
	}
	if e.own == level {
		return false, true
	}
	if level > e.own {
		e.ownExp = 0 // the new level is not published yet
	}
	e.own = level
	t.own[key] = level
	t.update(key, e, n)
	return true, true
}

// published records that the own leases (key → level) go out at now. Those
// no longer the key's own level are ignored.
func (t *leaseTable) published(leases map[string]shard.Level, now time.Time) {
	exp := t.at(now) + int64(t.ttl)
	for k, l := range leases {
		if e := t.keys[k]; e != nil && e.own == l {
			e.ownExp = exp
		}
	}
}

// applyLease merges a lease of peer origin for key at level, received at
// now and lasting ttl. It reports false if key is new and the table full:
// the lease is dropped.
func (t *leaseTable) applyLease(origin, key string, level shard.Level, ttl time.Duration, now time.Time) bool {
	n := t.at(now)
	e := t.keys[key]
	if e == nil {
		if len(t.keys) >= t.maxKeys {
			return false
		}
		e = &entry{hash: shard.NameHash(key), level: shard.Level1}
		t.keys[key] = e
	}
	i := slot(level)
	if exp := n + int64(ttl); exp >= e.exp[i] {
		e.exp[i], e.origin[i] = exp, origin
	}
	t.expiring(e.exp[i])
	t.update(key, e, n)
	return true
}

// sweep forgets the peers' leases expired at now and updates the levels in
// force. It returns how long after now the next sweep is due: at the
// soonest expiry, and at most the sweep interval.
func (t *leaseTable) sweep(now time.Time) time.Duration {
	n := t.at(now)
	next := n + int64(t.every)
	for k, e := range t.keys {
		for i, exp := range e.exp {
			switch {
			case exp == 0:
			case exp <= n:
				e.exp[i] = 0
			default:
				next = min(next, exp)
			}
		}
		t.update(k, e, n)
	}
	t.nextExp = next
	return time.Duration(next - n)
}

// changes returns the level changes queued since the last call, key →
// change, and counts them as handed to the Handler. It returns nil if there
// are none.
func (t *leaseTable) changes() map[string]change {
	if len(t.pending) == 0 {
		return nil
	}
	batch := t.pending
	t.pending = make(map[string]change)
	for k, ch := range batch {
		if ch.level == shard.Level1 {
			delete(t.told, k)
		} else {
			t.told[k] = ch.level
		}
	}
	return batch
}

// each calls fn for every lease unexpired at now: the own ones with a full
// ttl (they are renewed), the peers' with the time they have left.
func (t *leaseTable) each(now time.Time, fn func(key string, level shard.Level, ttl time.Duration, own bool)) {
	n := t.at(now)
	for k, e := range t.keys {
		if e.own > 0 {
			fn(k, e.own, t.ttl, true)
		}
		for i, exp := range e.exp {
			if exp > n {
				fn(k, slotLevels[i], time.Duration(exp-n), false)
			}
		}
	}
}

// leases returns the keys split at now, as NATS.Leases describes them.
func (t *leaseTable) leases(now time.Time) []Lease {
	n := t.at(now)
	out := make([]Lease, 0, len(t.keys))
	for k, e := range t.keys {
		level := e.force(n)
		if level == shard.Level1 {
			continue
		}
		l := Lease{Key: k, Level: level}
		if e.own == level {
			exp := n + int64(t.ttl) // not published yet: a full ttl when it is
			if e.ownExp > 0 {
				exp = e.ownExp
			}
			l.ExpiresIn, l.Origin = time.Duration(exp-n), t.id
		}
		if i := slot(level); e.exp[i] > n && time.Duration(e.exp[i]-n) > l.ExpiresIn {
			l.ExpiresIn, l.Origin = time.Duration(e.exp[i]-n), e.origin[i]
		}
		out = append(out, l)
	}
	slices.SortFunc(out, func(a, b Lease) int {
		if a.Level != b.Level {
			return int(b.Level - a.Level)
		}
		return strings.Compare(a.Key, b.Key)
	})
	return out
}

// evictPeerKey removes the key held only by peers whose leases expire
// first, making room for an own key. It reports whether it found one.
func (t *leaseTable) evictPeerKey(n int64) bool {
	var victim string
	var ve *entry
	for k, e := range t.keys {
		if e.own == 0 && (ve == nil || e.expiry() < ve.expiry()) {
			victim, ve = k, e
		}
	}
	if ve == nil {
		return false
	}
	ve.exp = [3]int64{}
	t.update(victim, ve, n)
	return true
}

// update recomputes e's level in force at n, queues a change if it moved,
// and drops e from the table once nothing holds it.
func (t *leaseTable) update(key string, e *entry, n int64) {
	l := e.force(n)
	if l == shard.Level1 {
		delete(t.keys, key)
	}
	if l == e.level {
		return
	}
	e.level = l
	if l == t.toldLevel(key) {
		delete(t.pending, key) // back where the Handler is
	} else {
		t.pending[key] = change{hash: e.hash, level: l}
	}
	if t.onChange != nil {
		t.onChange()
	}
}

func (t *leaseTable) toldLevel(key string) shard.Level {
	if l, ok := t.told[key]; ok {
		return l
	}
	return shard.Level1
}

// expiring makes sure the next sweep is due by exp.
func (t *leaseTable) expiring(exp int64) {
	if exp < t.nextExp {
		t.nextExp = exp
		if t.onSooner != nil {
			t.onSooner()
		}
	}
}
