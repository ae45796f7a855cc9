package hotkey

import (
	"reflect"
	"testing"
	"time"

	"github.com/hotkeyd/hotkey/coordinator"
	"github.com/hotkeyd/hotkey/counter"
	"github.com/hotkeyd/hotkey/shard"
)

// reporting is a Local coordinator that reports leases and counters, as
// NATS does.
type reporting struct {
	coordinator.Local
	leases []coordinator.Lease
}

func (r *reporting) Leases() []coordinator.Lease { return r.leases }
func (r *reporting) Stats() coordinator.Stats    { return coordinator.Stats{Published: 7} }

// TestHotKeysAndStats: HotKeys lists the keys split here, by policy and
// key, with the lease of each where the coordinator keeps leases; Stats
// counts them and carries the coordinator's counters.
func TestHotKeysAndStats(t *testing.T) {
	checkLeaks(t)
	co := &reporting{leases: []coordinator.Lease{{Key: "login|u1", Level: shard.Level16, ExpiresIn: 2 * time.Second, Origin: "peer-a"}}}
	e, err := New(counter.NewMemoryStore(counter.MemoryConfig{}), WithoutDetector(), WithCoordinator(co), WithSplitKeys(shard.Level4, "static"))
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	h := handler{e}
	h.SetLevel("login|u1", hashKey("login|u1"), shard.Level16)
	h.SetLevel("bare", hashKey("bare"), shard.Level64)
	h.SetLevel("gone|x", hashKey("gone|x"), shard.Level4)
	h.SetLevel("gone|x", hashKey("gone|x"), shard.Level1)
	want := []HotKey{
		{Key: "bare", Level: shard.Level64},
		{Policy: "login", Key: "u1", Level: shard.Level16, ExpiresIn: 2 * time.Second, Origin: "peer-a"},
		{Key: "static", Level: shard.Level4},
	}
	if got := e.HotKeys(); !reflect.DeepEqual(got, want) {
		t.Errorf("HotKeys() = %+v\nwant %+v", got, want)
	}
	st := e.Stats()
	if st.Instances != 1 || st.Breaker != BreakerClosed || st.Coordinator == nil || st.Coordinator.Published != 7 ||
		!reflect.DeepEqual(st.HotKeys, map[shard.Level]int{shard.Level4: 1, shard.Level16: 1, shard.Level64: 1}) {
		t.Errorf("Stats() = %+v, coordinator %+v", st, st.Coordinator)
	}
	lone, err := New(counter.NewMemoryStore(counter.MemoryConfig{}), WithoutDetector())
	if err != nil {
		t.Fatal(err)
	}
	defer lone.Close()
	if got, st := lone.HotKeys(), lone.Stats(); len(got) != 0 || st.Coordinator != nil || len(st.HotKeys) != 0 {
		t.Errorf("an idle lone engine: HotKeys %+v, Stats %+v", got, st)
	}
}
