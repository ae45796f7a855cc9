package hotkey

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/hotkeyd/hotkey/shard"
	"github.com/hotkeyd/hotkey/split"
)

// settleRetry is how often the engine tries again to settle what it could
// not (a merged key whose usage could not be moved back: the store did not
// answer), and settleTimeout bounds one move.
const (
	settleRetry   = time.Second
	settleTimeout = 10 * time.Second
)

// refusals holds the levels the table refused for want of room, latest
// level per key: settle applies them as room comes. Without it a key
// refused once stays unsplit until its lease changes level, since a
// coordinator says a level once. Its mutex also serialises every change of
// which keys the table holds (SetLevel, and settle's ranking and
// re-admission), so that a ranking never acts on a level SetLevel has
// replaced meanwhile.
type refusals struct {
	mu   sync.Mutex // guards keys, and the table's membership
	keys map[string]refusal
}

type refusal struct {
	hash  uint64
	level shard.Level
}

// refusalsCap is how many refused levels wait at most: twice the table,
// and at least 1,024 (a refusal costs its key and 16 bytes).
func (e *Engine) refusalsCap() int { return max(2*e.opt.maxHotKeys, 1024) }

// leaving reports whether ent is back at its floor and leaves the table
// once its usage is there. A key of WithSplitKeys stays: its entry is its
// static split.
func (e *Engine) leaving(ent *split.Entry) bool {
	return ent.Level() == e.table.Floor() && e.opt.splitKeys[ent.Key] == 0
}

// refusedLocked notes that the table had no room for key at level; the
// caller holds e.refuse.mu. At most refusalsCap levels wait: past that,
// the lowest-ranked is forgotten, so what waits is still what would rank
// first.
func (e *Engine) refusedLocked(key string, hash uint64, level shard.Level) {
	e.log.Warn("hot key not split yet: the split table is full", "key", key, "level", level, "max_hot_keys", e.opt.maxHotKeys)
	e.wakeSettle()
	if e.refuse.keys == nil {
		e.refuse.keys = map[string]refusal{}
	}
	if _, ok := e.refuse.keys[key]; !ok && len(e.refuse.keys) >= e.refusalsCap() {
		last := split.Ranked{Key: key, Hash: hash, Level: level}
		for k, r := range e.refuse.keys {
			if c := (split.Ranked{Key: k, Hash: r.hash, Level: r.level}); split.Outranks(c, last) > 0 {
				last = c
			}
		}
		if last.Key == key {
			return
		}
		delete(e.refuse.keys, last.Key)
	}
	e.refuse.keys[key] = refusal{hash, level}
}

// wakeSettle asks the engine's loop to settle now.
func (e *Engine) wakeSettle() {
	select {
	case e.settleNow <- struct{}{}:
	default:
	}
}

// settle makes the table hold the highest-ranked keys it was told of (see
// split.Outranks): when refused keys outrank keys it holds, it merges those.
// Then it moves the usage of merged keys back to their unsplit counters,
// under the limit they were last decided with, and takes them out of the
// table; then it applies the refused levels, highest-ranked first, as far
// as there is room. It reports whether a move failed and must be tried
// again. The engine's loop calls it; tests call it to settle at once. A
// call waits for a pass under way and then makes its own: two passes at
// once would each see the other's moves half done (one parks or removes an
// entry the other's ranking counted on), so a pass that returned could
// leave the table short of what it was told, until the other finished.
func (e *Engine) settle() (retry bool) {
	e.settling.Lock()
	defer e.settling.Unlock()
	e.refuse.mu.Lock()
	e.rankLocked()
	e.refuse.mu.Unlock()

	var cooled []*split.Entry
	e.table.Range(func(ent *split.Entry) bool {
		// A parked entry waits for a decision on its key, not for settle.
		if e.leaving(ent) && !ent.Parked() {
			cooled = append(cooled, ent)
		}
		return true
	})
	to, p := e.table.Floor(), e.placement()
	if to == shard.Level1 {
		p = nil
	}
	for _, ent := range cooled {
		if e.reshard != nil && !ent.Holds(to, p) {
			// A decision notes its limit before it moves the key's
			// usage. With none, this instance decided nothing on the key
			// while it was split, but others may have, on the counters
			// of the levels the key was at: the key stays, parked, for
			// its next decision to move the usage under its limit.
			lim, ok := ent.Limit()
			if !ok && to == shard.Level1 && e.table.Park(ent) {
				continue
			}
			if ok {
				ctx, cancel := context.WithTimeout(e.life, settleTimeout)
				err := e.table.Transfer(ctx, ent, split.Counters{Level: to, P: p}, lim, lim)
				cancel()
				if err != nil {
					retry = true
					continue
				}
			}
		}
		e.table.Remove(ent, to)
	}

	e.refuse.mu.Lock()
	defer e.refuse.mu.Unlock()
	waiting := make([]split.Ranked, 0, len(e.refuse.keys))
	for key, r := range e.refuse.keys {
		waiting = append(waiting, split.Ranked{Key: key, Hash: r.hash, Level: r.level})
	}
	slices.SortFunc(waiting, split.Outranks)
	for _, r := range waiting {
		if ent := e.table.Lookup(r.Key, r.Hash); ent != nil && !ent.Parked() {
			if !e.leaving(ent) {
				delete(e.refuse.keys, r.Key) // split since, at a newer level
			}
			continue // lowered to make room: it waits until it is out
		}
		held, p := e.table.Outside(r.Key, r.Hash)
		if !e.table.Set(r.Key, r.Hash, r.Level, held, p) {
			continue
		}
		delete(e.refuse.keys, r.Key)
		e.applied(r.Key, r.Level)
	}
	return retry
}

// rankLocked lowers the keys the table holds that refused keys outrank to
// their floor (merges them), when there is not room for all: their levels
// wait with the refused ones, and come back if room does. Keys of
// WithSplitKeys stay, and keys at their floor are leaving anyway. The
// caller holds e.refuse.mu.
func (e *Engine) rankLocked() {
	if len(e.refuse.keys) == 0 || e.opt.maxHotKeys <= 0 {
		return
	}
	room := e.opt.maxHotKeys
	var all []split.Ranked
	e.table.Range(func(ent *split.Entry) bool {
		switch {
		case e.opt.splitKeys[ent.Key] > 0:
			room--
		case !e.leaving(ent):
			all = append(all, split.Ranked{Key: ent.Key, Hash: ent.Hash, Level: ent.Level(), Entry: ent})
		}
		return true
	})
	for key, r := range e.refuse.keys {
		all = append(all, split.Ranked{Key: key, Hash: r.hash, Level: r.level})
	}
	if len(all) <= room {
		return // all fit once the merged keys are out
	}
	slices.SortFunc(all, split.Outranks)
	for _, r := range all[max(room, 0):] {
		if r.Entry != nil {
			r.Entry.SetLevel(e.table.Floor())
			e.refuse.keys[r.Key] = refusal{r.Hash, r.Level}
			e.applied(r.Key, e.table.Floor())
		}
	}
}
