package hotkey

import (
	"context"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/hotkeyd/hotkey/coordinator"
	"github.com/hotkeyd/hotkey/counter"
	"github.com/hotkeyd/hotkey/internal/testkit"
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
	e, err := New(counter.NewMemoryStore(counter.MemoryConfig{}), WithoutDetector(), WithCoordinator(co), WithSplitKeys(shard.Level4, nil, "static"))
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

// TestSplitKeysByPolicy: WithSplitKeys splits the counter of each key under
// the policy it names, and no other policy's counter of that key; HotKeys
// lists it under that policy and key.
func TestSplitKeysByPolicy(t *testing.T) {
	api := &Policy{Name: "api", Limit: PerSecond(1600)}
	web := &Policy{Name: "web", Limit: PerSecond(1600)}
	bare := &Policy{Limit: PerSecond(1600)}
	e, _ := newMemoryEngine(t, testkit.NewClock(), WithSplitKeys(shard.Level16, api, "k"), WithSplitKeys(shard.Level4, nil, "k"))
	want := []HotKey{
		{Policy: "api", Key: "k", Level: shard.Level16},
		{Key: "k", Level: shard.Level4},
	}
	if got := e.HotKeys(); !reflect.DeepEqual(got, want) {
		t.Errorf("HotKeys() = %+v\nwant %+v", got, want)
	}
	for _, tt := range []struct {
		give *Policy
		key  string
		want shard.Level
	}{
		{api, "k", shard.Level16},
		{web, "k", shard.Level1},
		{bare, "k", shard.Level4},
		{api, "other", shard.Level1},
	} {
		res, err := e.Allow(context.Background(), tt.key, tt.give)
		if err != nil || !res.Allowed || res.Shards != tt.want {
			t.Errorf("Allow(%q) under %q: %+v, %v: want allowed on %d counters", tt.key, tt.give.Name, res, err, tt.want)
		}
	}
}

// TestSplitKeysChecked: New refuses the keys of WithSplitKeys that AllowN
// refuses under their policy, with ErrInvalidConfig, and only those: the
// length bound is the key's, not the counter name's.
func TestSplitKeysChecked(t *testing.T) {
	longest := strings.Repeat("k", DefaultMaxKeyLen)
	for _, tt := range []struct {
		give Option
		want error
	}{
		{WithSplitKeys(shard.Level4, &Policy{Name: "a|b"}, "c"), ErrInvalidPolicyName},
		{WithSplitKeys(shard.Level4, nil, "k", ""), ErrEmptyKey},
		{WithSplitKeys(shard.Level4, &Policy{Name: "api"}, ""), ErrEmptyKey},
		{WithSplitKeys(shard.Level4, &Policy{Name: "api"}, longest+"k"), ErrKeyTooLong},
		{WithSplitKeys(shard.Level4, &Policy{Name: "api"}, longest), nil},
		{WithSplitKeys(shard.Level4, nil, longest), nil},
	} {
		e, err := New(counter.NewMemoryStore(counter.MemoryConfig{}), WithoutDetector(), tt.give)
		if tt.want == nil {
			if err != nil {
				t.Errorf("New: %v, want an engine", err)
				continue
			}
			e.Close()
		} else if !errors.Is(err, tt.want) || !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("New: %v, want %v and ErrInvalidConfig", err, tt.want)
		}
	}
}
