package hotkey

import (
	"context"
	"sync"
	"time"

	"github.com/hotkeyd/hotkey/shard"
)

// settleRetry is how often the engine tries again to settle what it could
// not (a merged key whose usage could not be moved back: the store did not
// answer), and settleTimeout bounds one move.
const (
	settleRetry   = time.Second
	settleTimeout = 10 * time.Second
)

// refusals holds the levels the table refused for want of room, latest
// level per key, at most as many keys as the table holds: settle applies
// them as merged keys leave. Without it a key refused once stays unsplit
// until its lease changes level, since a coordinator says a level once.
type refusals struct {
	mu   sync.Mutex // guards keys
	keys map[string]refusal
}

type refusal struct {
	hash  uint64
	level int
}

// refused notes that the table had no room for key at level.
func (e *Engine) refused(key string, hash uint64, level int) {
	e.refuse.mu.Lock()
	defer e.refuse.mu.Unlock()
	if _, ok := e.refuse.keys[key]; ok || len(e.refuse.keys) < max(e.opt.maxHotKeys, 1) {
		if e.refuse.keys == nil {
			e.refuse.keys = map[string]refusal{}
		}
		e.refuse.keys[key] = refusal{hash, level}
	}
	e.log.Warn("hot key not split: the split table is full", "key", key, "level", level, "max_hot_keys", e.opt.maxHotKeys)
	e.wakeSettle()
}

// dropRefused forgets a refused level of key: the key went cold.
func (e *Engine) dropRefused(key string) {
	e.refuse.mu.Lock()
	defer e.refuse.mu.Unlock()
	delete(e.refuse.keys, key)
}

// wakeSettle asks the engine's loop to settle now.
func (e *Engine) wakeSettle() {
	select {
	case e.settleNow <- struct{}{}:
	default:
	}
}

// settle moves the usage of merged keys back to their unsplit counters,
// under the limit they were last decided with, and takes them out of the
// table; then it applies the levels refused while the table was full, as
// far as there is room. It reports whether a move failed and must be tried
// again. The engine's loop calls it; it is safe to call concurrently (tests
// call it to settle at once).
func (e *Engine) settle() (retry bool) {
	var merged []*shard.Entry
	e.table.Range(func(ent *shard.Entry) bool {
		if ent.Level() == shard.Level1 {
			merged = append(merged, ent)
		}
		return true
	})
	for _, ent := range merged {
		if e.reshard != nil && !ent.Holds(shard.Level1, nil) {
			// A key's usage leaves the unsplit counter only in a decision,
			// which notes its limit first.
			lim, ok := ent.Memo().(Limit)
			if ok {
				ctx, cancel := context.WithTimeout(e.life, settleTimeout)
				err := ent.Transfer(shard.Level1, nil, func(from int, fromP shard.Placement, to int) error {
					return e.transfer(ctx, ent, lim, lim, from, fromP, to, nil)
				})
				cancel()
				if err != nil {
					retry = true
					continue
				}
			}
		}
		e.table.Remove(ent)
	}

	e.refuse.mu.Lock()
	defer e.refuse.mu.Unlock()
	for key, r := range e.refuse.keys {
		if e.table.Lookup(key, r.hash) != nil {
			delete(e.refuse.keys, key) // split since, at a newer level
			continue
		}
		held, p := e.heldOutside(key, r.hash)
		if !e.table.Set(key, r.hash, r.level, held, p) {
			continue
		}
		delete(e.refuse.keys, key)
		e.applied(key, r.level)
	}
	return retry
}
