package hotkey

import (
	"context"
	"sync"
	"testing"

	"go.uber.org/goleak"

	"github.com/hotkeyd/hotkey/coordinator"
	"github.com/hotkeyd/hotkey/internal/testkit"
	"github.com/hotkeyd/hotkey/shard"
)

// checkLeaks fails t if goroutines started during the test outlive its
// cleanups; call it first, so that its check runs after theirs.
func checkLeaks(t *testing.T) {
	opt := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, opt) })
}

// levelLog records the level changes an engine reports.
type levelLog struct {
	mu     sync.Mutex
	levels map[string][]shard.Level
}

func (l *levelLog) hook(key string, level shard.Level) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.levels == nil {
		l.levels = map[string][]shard.Level{}
	}
	l.levels[key] = append(l.levels[key], level)
}

func (l *levelLog) of(key string) []shard.Level {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]shard.Level(nil), l.levels[key]...)
}

// TestCoordinatorLevels: the levels a coordinator says are in force are
// the ones decisions use; a merged key leaves the table once its usage is
// back on the unsplit counter, moved by the engine's loop or by a decision,
// whichever comes first.
func TestCoordinatorLevels(t *testing.T) {
	checkLeaks(t)
	var log levelLog
	e, _ := newMemoryEngine(t, testkit.NewClock(), WithLevelHook(log.hook))
	h := handler{e}
	ctx := context.Background()
	lim := PerSecond(1000)
	for _, level := range []shard.Level{4, 16, 64, 16, 4} {
		h.SetLevel("k", hashKey("k"), level)
		if got := e.levelOf("k"); got != level {
			t.Fatalf("Level = %d after SetLevel(%d)", got, level)
		}
		if r, err := e.Allow(ctx, "k", pol(lim)); err != nil || r.Shards != level {
			t.Fatalf("at level %d: %+v, %v", level, r, err)
		}
	}
	h.SetLevel("k", hashKey("k"), 1)
	if e.levelOf("k") != 1 {
		t.Fatalf("merged key at level %d, want 1", e.levelOf("k"))
	}
	if r, err := e.Allow(ctx, "k", pol(lim)); err != nil || r.Shards != 1 {
		t.Fatalf("merged: %+v, %v", r, err)
	}
	testkit.For(t, patience, "the merged key out of the table", func() bool { return e.table.Len() == 0 })
	if got := log.of("k"); len(got) != 6 || got[5] != 1 {
		t.Fatalf("level hook saw %v, want 4 16 64 16 4 1", got)
	}
	h.SetLevel("never-split", hashKey("never-split"), 1) // nothing to merge
	if got := log.of("never-split"); len(got) != 0 {
		t.Fatalf("level hook saw %v for a key never split", got)
	}
	h.SetInstances(3)
	if e.liveInstances() != 3 {
		t.Fatalf("Instances = %d, want 3", e.liveInstances())
	}
}

// TestCoordinatorStaticFloor: a coordinator cannot take a key below its
// static level.
func TestCoordinatorStaticFloor(t *testing.T) {
	checkLeaks(t)
	e, _ := newMemoryEngine(t, testkit.NewClock(), WithSplitKeys(16, nil, "pinned"), WithCoordinator(&coordinator.Local{}))
	h := handler{e}
	h.SetLevel("pinned", hashKey("pinned"), 64)
	if e.levelOf("pinned") != 64 {
		t.Fatalf("pinned key at %d, want 64", e.levelOf("pinned"))
	}
	h.SetLevel("pinned", hashKey("pinned"), 1)
	if r, _ := e.Allow(context.Background(), "pinned", pol(PerSecond(1000))); r.Shards != 16 {
		t.Fatalf("pinned key at %d shards after a merge, want its static 16", r.Shards)
	}
}
