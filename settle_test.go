package hotkey

import (
	"fmt"
	"testing"

	"github.com/hotkeyd/hotkey/counter"
	"github.com/hotkeyd/hotkey/shard"
	"github.com/hotkeyd/hotkey/split"
)

// TestRefusalsKeepHighestRanked: the levels that wait for room in a full
// table are bounded; past the bound, what waits is what ranks first.
func TestRefusalsKeepHighestRanked(t *testing.T) {
	checkLeaks(t)
	e, err := New(counter.NewMemoryStore(counter.MemoryConfig{}), WithoutDetector(), WithMaxHotKeys(1))
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	h := handler{e}
	h.SetLevel("top", hashKey("top"), shard.Level64)
	lowest := split.Ranked{Level: shard.Level64} // ranks before every level-4 key
	for i := range e.refusalsCap() {
		key := fmt.Sprintf("k%d", i)
		h.SetLevel(key, hashKey(key), shard.Level4)
		if r := (split.Ranked{Key: key, Hash: hashKey(key), Level: shard.Level4}); split.Outranks(r, lowest) > 0 {
			lowest = r
		}
	}
	waiting := func() int {
		e.refuse.mu.Lock()
		defer e.refuse.mu.Unlock()
		return len(e.refuse.keys)
	}
	has := func(key string) bool {
		e.refuse.mu.Lock()
		defer e.refuse.mu.Unlock()
		_, ok := e.refuse.keys[key]
		return ok
	}
	if n := waiting(); n != e.refusalsCap() {
		t.Fatalf("%d levels wait, want %d", n, e.refusalsCap())
	}
	h.SetLevel("warm", hashKey("warm"), shard.Level16) // outranks every level-4 key
	if n := waiting(); n != e.refusalsCap() || !has("warm") || has(lowest.Key) {
		t.Errorf("%d wait, warm among them %v, %s (ranked last) among them %v; want %d, true, false", n, has("warm"), lowest.Key, has(lowest.Key), e.refusalsCap())
	}
	// A level-4 key with a higher hash than all that wait ranks last: dropped.
	var last string
	for i := 0; last == ""; i++ {
		key := fmt.Sprintf("late%d", i)
		if r := (split.Ranked{Key: key, Hash: hashKey(key), Level: shard.Level4}); split.Outranks(r, lowest) > 0 {
			last = key
		}
	}
	h.SetLevel(last, hashKey(last), shard.Level4)
	if has(last) || waiting() != e.refusalsCap() {
		t.Errorf("%s, ranked last, waits (%v), or the count changed (%d)", last, has(last), waiting())
	}
	if e.levelOf("top") != shard.Level64 {
		t.Errorf("top at level %d, want 64: it outranks all that wait", e.levelOf("top"))
	}
}
