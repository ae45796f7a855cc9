package hotkey

import (
	"context"
	"errors"
	"fmt"

	"github.com/hotkeyd/hotkey/counter"
	"github.com/hotkeyd/hotkey/shard"
)

// errNoReset is Reset's error for a store that cannot delete counters (no
// counter.Deleter).
var errNoReset = fmt.Errorf("the store cannot delete counters: %w", errors.ErrUnsupported)

// Reset deletes key's counters under p, so that the key admits its whole
// limit again: its unsplit counter and its subcounters at every level (4,
// 16 and 64), whatever the level the key is split to now, since usage may
// sit where it was split before, named under the store's node map and
// those the key's split state noted. It also forgets the deny cache's
// denials of those counters and empties the key's FallbackLocal counter.
// A SyncReserve block this engine holds for them is dropped, its units not
// returned; blocks other instances hold stay theirs until their lease
// ends. A SyncGossip policy's key is reset in this instance's view only:
// peers keep theirs, and go on charging this one with what they admit.
// The key's split level is left as it is. Decisions concurrent with Reset
// land before or after it.
//
// Bad input returns Peek's errors; a store that cannot delete returns an
// error wrapping errors.ErrUnsupported; a failed deletion the store's error, wrapping
// ErrStoreUnavailable. It blocks on the store, one call.
func (e *Engine) Reset(ctx context.Context, key string, p *Policy) error {
	if p == nil {
		return ErrNilPolicy
	}
	name, hash, err := e.counterName(key, p, 1)
	if err != nil {
		return err
	}
	e.local.Delete(ctx, []counter.Shard{{Name: name, Hash: hash}})
	if p.Sync == SyncGossip {
		stored, sh := unsplitCounter(name, hash)
		e.forgetDenials([]counter.Shard{{Name: stored, Hash: sh, Limit: p.Limit}})
		if gs := e.gossip.Load(); gs != nil {
			gs.Memory().Delete(ctx, []counter.Shard{{Name: stored, Hash: sh}})
		}
		e.log.Info("key reset", "policy", p.Name, "key", key)
		return nil
	}
	var d counter.Deleter
	if rs := e.reserve.Load(); rs != nil {
		d = rs // drops the blocks of the counters it deletes
	} else if d, _ = e.store.(counter.Deleter); d == nil {
		return errNoReset
	}
	cs := e.counters(name, hash, p.Limit)
	if err := d.Delete(ctx, cs); err != nil {
		return fmt.Errorf("hotkey: reset %q: %w: %w", key, ErrStoreUnavailable, err)
	}
	// After the deletion: a denial remembered meanwhile was of the old
	// counters.
	e.forgetDenials(cs)
	e.log.Info("key reset", "policy", p.Name, "key", key)
	return nil
}

// counters returns every counter that may hold the usage of counter name
// (with hash) under lim: the unsplit one, and each subcounter of levels 4,
// 16 and 64 under no node map, the store's, and each its split state
// noted, each name once, with its share of lim.
func (e *Engine) counters(name string, hash uint64, lim Limit) []counter.Shard {
	places := []shard.Placement{nil}
	if p := e.placement(); p != nil {
		places = append(places, p)
	}
	if ent := e.table.Known(name, hash); ent != nil {
		places = append(places, ent.Placements()...)
	}
	stored, sh := unsplitCounter(name, hash)
	out := []counter.Shard{{Name: stored, Hash: sh, Limit: lim}}
	seen := map[string]bool{out[0].Name: true}
	for _, level := range []shard.Level{shard.Level4, shard.Level16, shard.Level64} {
		for _, p := range places {
			for i, sub := range shard.Names(name, hash, level, p) {
				if seen[sub] {
					continue
				}
				seen[sub] = true
				out = append(out, counter.Shard{Name: sub, Hash: shard.NameHash(sub), Limit: subLimit(lim, level, i)})
			}
		}
	}
	return out
}

// forgetDenials drops the deny cache's denials of cs under their limits.
func (e *Engine) forgetDenials(cs []counter.Shard) {
	if e.deny == nil {
		return
	}
	for _, c := range cs {
		e.deny.forget(denyID(c.Hash, c.Limit))
	}
}
