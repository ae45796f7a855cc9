package hotkey

import (
	"context"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/hotkeyd/hotkey/counter"
	"github.com/hotkeyd/hotkey/detector"
)

// hotEngine is an engine whose detector splits at 1000/s and merges back
// after coolDown; the detector runs on real time.
func hotEngine(t *testing.T, coolDown time.Duration, opts ...Option) *Engine {
	t.Helper()
	cfg := detector.DefaultConfig()
	cfg.CoolDown = coolDown
	e, err := New(counter.NewMemoryStore(counter.MemoryConfig{}), append([]Option{WithDetector(cfg)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// drive sends decisions for key, pause apart, until cond holds for a result
// or the (generous) deadline passes, and returns the last result. With no
// pause the key runs far over the threshold; 10 ms apart, far under it.
func drive(t *testing.T, e *Engine, key string, pause time.Duration, cond func(Result) bool) Result {
	t.Helper()
	lim := PerSecond(1_000_000)
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		r, err := e.Allow(context.Background(), key, pol(lim))
		if err != nil {
			t.Fatal(err)
		}
		if cond(r) {
			return r
		}
		time.Sleep(pause)
	}
	t.Fatalf("%s: condition not met before the deadline", key)
	return Result{}
}

func TestDetectorSplitsAndMergesHotKey(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	e := hotEngine(t, 200*time.Millisecond)
	defer e.Close()
	r := drive(t, e, "hot", 0, func(r Result) bool { return r.Shards > 1 })
	if r.Shards != 4 && r.Shards != 16 && r.Shards != 64 {
		t.Fatalf("hot key split into %d", r.Shards)
	}
	if r, _ := e.Allow(context.Background(), "cold", pol(PerSecond(1_000_000))); r.Shards != 1 {
		t.Errorf("cold key split into %d", r.Shards)
	}
	// Quiet, the key steps down one level per cool-down until it is whole.
	drive(t, e, "hot", 10*time.Millisecond, func(r Result) bool { return r.Shards == 1 })
}

func TestDetectorKeepsStaticLevel(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	e := hotEngine(t, 100*time.Millisecond, WithSplitKeys(16, nil, "pinned"))
	defer e.Close()
	drive(t, e, "pinned", 0, func(r Result) bool { return r.Shards == 64 })
	// It cools back to its static level and stays there.
	drive(t, e, "pinned", 10*time.Millisecond, func(r Result) bool { return r.Shards == 16 })
	time.Sleep(500 * time.Millisecond) // several more cool-downs
	if r, _ := e.Allow(context.Background(), "pinned", pol(PerSecond(1_000_000))); r.Shards != 16 {
		t.Errorf("static key at %d shards, want 16", r.Shards)
	}
}

func TestCloseStopsDetector(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	e := hotEngine(t, time.Second)
	e.Allow(context.Background(), "k", pol(PerSecond(10)))
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	if err := e.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}
