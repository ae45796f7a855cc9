package hotkey

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/hotkeyd/hotkey/counter"
	"github.com/hotkeyd/hotkey/internal/testkit"
	"github.com/hotkeyd/hotkey/shard"
)

// TestPeek: Peek answers what a decision of one unit would, on a key whole
// and split, and charges nothing; on a store that cannot peek it says so.
func TestPeek(t *testing.T) {
	for _, tc := range []struct {
		name string
		key  string
		opts []Option
	}{
		{"whole", "k", nil},
		{"split", "k", []Option{WithSplitKeys(shard.Level4, &Policy{Name: "p"}, "k")}},
		// A key that ends like a subcounter's name, whose counter's name
		// is escaped: the peek reads the counter the take charges.
		{"escaped", "k|4|0", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clock := testkit.NewClock()
			store := counter.NewMemoryStore(counter.MemoryConfig{Clock: clock.Now})
			e, err := New(store, append([]Option{withClock(clock.Now), WithoutDetector()}, tc.opts...)...)
			if err != nil {
				t.Fatal(err)
			}
			defer e.Close()
			p := &Policy{Name: "p", Limit: counter.Limit{Algorithm: counter.SlidingWindow, Rate: 8, Period: time.Hour}}
			ctx := context.Background()
			for range 20 {
				if r, err := e.Peek(ctx, tc.key, p); err != nil || !r.Allowed {
					t.Fatalf("peek of a fresh key: %+v, %v", r, err)
				}
			}
			admitted := 0
			for range 20 {
				if r, err := e.AllowN(ctx, tc.key, p, 1); err == nil && r.Allowed {
					admitted++
				}
			}
			// Split 4 ways, a random pick of a subcounter leaves some
			// units unused: fewer, never more.
			if admitted > 8 || admitted < 6 {
				t.Fatalf("admitted %d of 20 after 20 peeks, want 8 (6 to 8 split)", admitted)
			}
			for range 5 {
				if r, err := e.Peek(ctx, tc.key, p); err != nil || r.Allowed || r.RetryAfter <= 0 {
					t.Fatalf("peek of a full key: %+v, %v; want denied", r, err)
				}
			}
		})
	}
	e := newEngineOn(t, &testkit.Store{Store: counter.NewMemoryStore(counter.MemoryConfig{})}, testkit.NewClock())
	if _, err := e.Peek(context.Background(), "k", &Policy{Limit: PerSecond(1)}); !errors.Is(err, errors.ErrUnsupported) {
		t.Errorf("peek on a store that cannot: %v, want errors.ErrUnsupported", err)
	}
}

// downStore fails every call, Peek included.
type downStore struct{}

var errDown = errors.New("down")

func (downStore) Take(context.Context, string, uint64, counter.Limit, int64) (counter.Result, error) {
	return counter.Result{}, errDown
}

func (downStore) Peek(context.Context, string, uint64, counter.Limit) (counter.Result, error) {
	return counter.Result{}, errDown
}

func (downStore) Close() error { return nil }

// TestPeekFallback: while the store cannot answer, a peek answers as the
// policy's fallback would decide, and charges the local counters nothing.
func TestPeekFallback(t *testing.T) {
	e := newEngineOn(t, downStore{}, testkit.NewClock())
	ctx := context.Background()
	lim := counter.Limit{Algorithm: counter.SlidingWindow, Rate: 2, Period: time.Hour}
	local := &Policy{Name: "local", Limit: lim, OnStoreFailure: FallbackLocal}
	for range 5 {
		if r, err := e.Peek(ctx, "k", local); err != nil || !r.Allowed || !r.Degraded || r.Remaining != 1 {
			t.Fatalf("local fallback, fresh: %+v, %v", r, err)
		}
	}
	for i, want := range []bool{true, true, false} {
		if r, err := e.AllowN(ctx, "k", local, 1); err != nil || r.Allowed != want {
			t.Fatalf("local fallback, decision %d after peeks: %+v, %v; want allowed %v", i, r, err, want)
		}
	}
	if r, err := e.Peek(ctx, "k", local); err != nil || r.Allowed {
		t.Errorf("local fallback, full: %+v, %v; want denied", r, err)
	}
	for _, c := range []struct {
		give Fallback
		want bool
	}{{FallbackOpen, true}, {FallbackClosed, false}} {
		if r, err := e.Peek(ctx, "k", &Policy{Name: "x", Limit: lim, OnStoreFailure: c.give}); err != nil || r.Allowed != c.want {
			t.Errorf("fallback %v: %+v, %v; want allowed %v", c.give, r, err, c.want)
		}
	}
	if _, err := e.Peek(ctx, "k", &Policy{Name: "x", Limit: lim, OnStoreFailure: FallbackError}); !errors.Is(err, ErrStoreUnavailable) {
		t.Errorf("fallback error: %v, want ErrStoreUnavailable", err)
	}
}
