package hotkey

import (
	"cmp"
	"slices"
	"strings"
	"time"

	"github.com/hotkeyd/hotkey/coordinator"
	"github.com/hotkeyd/hotkey/shard"
	"github.com/hotkeyd/hotkey/split"
)

// HotKey is a key split on this instance now.
type HotKey struct {
	// Policy and Key name the counter (the counter name, policy|key):
	// Policy is empty for a decision without a named policy.
	Policy, Key string
	// Level is the number of subcounters the key is decided on.
	Level shard.Level
	// ExpiresIn and Origin come from the coordinator's lease that holds
	// the level, when it keeps leases (NATS): how long the lease lasts
	// unless renewed, and the instance whose lease it is. Zero otherwise,
	// and for a key split statically (WithSplitKeys, withSplitAll).
	ExpiresIn time.Duration
	Origin    string
}

// HotKeys returns the keys split on this instance now (those of WithSplitKeys
// included; under withSplitAll, those promoted above it), highest level
// first, then by counter name. It reads the split
// table and the coordinator's leases: meant for status pages, not for the
// decision path.
func (e *Engine) HotKeys() []HotKey {
	leases := map[string]coordinator.Lease{}
	if r, ok := e.coord.(coordinator.Reporter); ok {
		for _, l := range r.Leases() {
			leases[l.Key] = l
		}
	}
	var out []HotKey
	e.table.Range(func(ent *split.Entry) bool {
		if level := ent.Level(); level > shard.Level1 {
			policy, key, ok := strings.Cut(ent.Key, "|")
			if !ok {
				policy, key = "", ent.Key
			}
			l := leases[ent.Key]
			out = append(out, HotKey{Policy: policy, Key: key, Level: level, ExpiresIn: l.ExpiresIn, Origin: l.Origin})
		}
		return true
	})
	slices.SortFunc(out, func(a, b HotKey) int {
		if c := cmp.Compare(b.Level, a.Level); c != 0 {
			return c
		}
		return cmp.Or(strings.Compare(a.Policy, b.Policy), strings.Compare(a.Key, b.Key))
	})
	return out
}

// Stats is a snapshot of an engine's state, for metrics and status pages.
type Stats struct {
	// Region is the engine's region (WithRegion); empty for none.
	Region string
	// Instances is the number of live instances the coordinator counts,
	// this one included.
	Instances int
	// Breaker is the state of the store's circuit breaker.
	Breaker BreakerState
	// HotKeys is the number of keys HotKeys would list, by level (4, 16,
	// 64).
	HotKeys map[shard.Level]int
	// Coordinator holds the coordinator's counters since Start, when it
	// keeps them (NATS); nil otherwise.
	Coordinator *coordinator.Stats
}

// Stats returns a snapshot of the engine's state.
func (e *Engine) Stats() Stats {
	st := Stats{Region: e.opt.region, Instances: e.liveInstances(), Breaker: e.brk.State(), HotKeys: map[shard.Level]int{}}
	e.table.Range(func(ent *split.Entry) bool {
		if level := ent.Level(); level > shard.Level1 {
			st.HotKeys[level]++
		}
		return true
	})
	if r, ok := e.coord.(coordinator.Reporter); ok {
		cs := r.Stats()
		st.Coordinator = &cs
	}
	return st
}
