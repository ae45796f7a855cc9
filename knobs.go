package hotkey

import (
	"fmt"
	"time"

	"github.com/hotkeyd/hotkey/shard"
)

// The knobs below are not part of the public API. They exist for the tests
// and benchmarks that compare this engine with the designs it improves on
// (a static split of every key, random subcounter choice, no second
// chance, no state transfer) and for tests that run on a simulated clock.

// withSplitAll splits every key at level (4, 16 or 64): static
// probabilistic splitting, the baseline adaptive splitting improves on. A
// cost over one subcounter's share of a limit (its burst over the level) is
// then always refused: see the README's guarantees.
func withSplitAll(level shard.Level) Option {
	return func(o *options) error {
		if !level.Valid() {
			return fmt.Errorf("split level %d: must be 1, 4, 16 or 64", int(level))
		}
		o.splitAll = level
		return nil
	}
}

// withMinShare sets the smallest rate a subcounter may enforce (default 10):
// a key with limit L is split at most L/minShare ways, rounded down to a
// level, so that no subcounter gets a uselessly small share.
func withMinShare(n int64) Option {
	return func(o *options) error {
		if n <= 0 {
			return fmt.Errorf("min share %d: must be positive", n)
		}
		o.minShare = n
		return nil
	}
}

// withDenyCache sets how many denying subcounters are remembered locally
// (default 65536, rounded up to a power of two); 0 disables the cache. A
// remembered subcounter denies without a store call until its retry-after.
// An engine on a *counter.MemoryStore keeps none, whatever the size.
func withDenyCache(size int) Option {
	return func(o *options) error {
		if size < 0 {
			return fmt.Errorf("deny cache size %d: must not be negative", size)
		}
		o.denyCache = size
		return nil
	}
}

// withSecondChance turns the second-chance probe on or off (default on): when
// the chosen subcounter of a split key denies, one other is tried before the
// request is denied.
func withSecondChance(on bool) Option {
	return func(o *options) error {
		o.secondChance = on
		return nil
	}
}

// withSelection sets how a decision picks a split key's subcounter (default
// shard.RoundRobin).
func withSelection(s shard.Selection) Option {
	return func(o *options) error {
		if s != shard.RoundRobin && s != shard.Random {
			return fmt.Errorf("selection %d: unknown", s)
		}
		o.selection = s
		return nil
	}
}

// withClock sets the engine's clock (default time.Now). The engine reads it
// for the deny cache; stores keep their own time.
func withClock(clock func() time.Time) Option {
	return func(o *options) error {
		if clock == nil {
			return fmt.Errorf("clock: must not be nil")
		}
		o.clock = clock
		return nil
	}
}

// withStateTransfer says whether a key's usage moves with it when it is
// split, re-split or merged (default true, for stores that implement
// counter.Resharder, as both stores here do). Without it, the subcounters
// of a newly split key start empty, and so hand out a fresh quota.
func withStateTransfer(on bool) Option {
	return func(o *options) error {
		o.transfer = on
		return nil
	}
}

// withoutReserveSweep has SyncReserve's blocks go back only at their key's
// next decision and at Close: on a clock of the test's, never at a moment
// the sweeper chose.
func withoutReserveSweep() Option {
	return func(o *options) error {
		o.reserveSweep = -1
		return nil
	}
}

// withMonotonic times SyncReserve's blocks on mono, the time since an
// instant of its own, rather than on the engine's clock read through
// time.Time.Sub: a test's clock carries no monotonic reading, so a test
// that steps the wall clock gives this one apart.
func withMonotonic(mono func() time.Duration) Option {
	return func(o *options) error {
		o.monotonic = mono
		return nil
	}
}

// withGossipRounds keeps SyncGossip's rounds on an engine whose
// coordinator carries no gossip, for a test to flush and deliver by hand
// (gossipFlush, gossipApply).
func withGossipRounds() Option {
	return func(o *options) error {
		o.gossipRounds = true
		return nil
	}
}
