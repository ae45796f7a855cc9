package hotkey

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hotkeyd/hotkey/counter"
	"github.com/hotkeyd/hotkey/internal/testkit"
	"github.com/hotkeyd/hotkey/shard"
)

// gateStore holds the first take on one counter until released, and
// notes whether a move read that counter before the take landed.
type gateStore struct {
	*counter.MemoryStore
	hold     string
	first    atomic.Bool
	entered  chan struct{} // closed when the held take is waiting
	release  chan struct{} // closed by the test to let it go on
	landed   atomic.Bool
	early    atomic.Bool   // a move read hold before the take landed
	reshards chan struct{} // gets a value per move
}

func (s *gateStore) Take(ctx context.Context, key string, hash uint64, lim counter.Limit, n int64) (counter.Result, error) {
	if key == s.hold && s.first.CompareAndSwap(false, true) {
		close(s.entered)
		<-s.release
		defer s.landed.Store(true)
	}
	return s.MemoryStore.Take(ctx, key, hash, lim, n)
}

func (s *gateStore) Reshard(ctx context.Context, from, to []counter.Shard) error {
	for _, sh := range from {
		if sh.Name == s.hold && !s.landed.Load() {
			s.early.Store(true)
		}
	}
	select {
	case s.reshards <- struct{}{}:
	default:
	}
	return s.MemoryStore.Reshard(ctx, from, to)
}

// TestTakeInFlightWhileSplit: a decision that found its key unsplit and is
// still taking from the unsplit counter when the key is split lands before
// the key's usage moves off that counter, so its unit is carried to the
// subcounters and the key admits no more than its limit; one at a time
// (AllowN) and in a batch (AllowBatch).
func TestTakeInFlightWhileSplit(t *testing.T) {
	for _, batched := range []bool{false, true} {
		name := "single"
		if batched {
			name = "batch"
		}
		t.Run(name, func(t *testing.T) {
			clock := testkit.NewClock()
			p := &Policy{Name: "p", Limit: Limit{Algorithm: SlidingWindow, Rate: 40, Period: time.Hour}}
			key := "k"
			gs := &gateStore{
				MemoryStore: counter.NewMemoryStore(counter.MemoryConfig{Clock: clock.Now}),
				hold:        CounterName(p.Name, key),
				entered:     make(chan struct{}),
				release:     make(chan struct{}),
				reshards:    make(chan struct{}, 1),
			}
			var store counter.Store = gs
			if batched {
				store = &gateBatcher{gs}
			}
			e := newEngineOn(t, store, clock)
			var admitted atomic.Int64
			decide := func() {
				var r Result
				var err error
				if batched {
					out := make([]Decision, 2)
					e.AllowBatch(context.Background(), []Request{{Key: key, Policy: p, Cost: 1}, {Key: "other", Policy: p, Cost: 1}}, out)
					r, err = out[0].Result, out[0].Err
				} else {
					r, err = e.AllowN(context.Background(), key, p, 1)
				}
				if err != nil {
					t.Error(err)
				}
				if r.Allowed {
					admitted.Add(1)
				}
			}
			var wg sync.WaitGroup
			wg.Go(decide) // takes from the unsplit counter, and waits there
			<-gs.entered
			handler{e}.SetLevel(gs.hold, hashKey(gs.hold), shard.Level4)
			wg.Go(decide) // finds the key split: moves its usage, then decides
			// Let the held take go once the move has read the unsplit
			// counter (the fault), or after a while (no move comes before
			// the take lands).
			select {
			case <-gs.reshards:
			case <-time.After(200 * time.Millisecond):
			}
			close(gs.release)
			wg.Wait()
			if gs.early.Load() {
				t.Error("the key's usage moved off its unsplit counter while a take on it was in flight")
			}
			for range 200 {
				decide()
			}
			if got := admitted.Load(); got != 40 {
				t.Errorf("admitted %d, limit 40", got)
			}
		})
	}
}

// gateBatcher is a gateStore that batches: its batch's takes go through
// the gate one by one.
type gateBatcher struct{ *gateStore }

func (b *gateBatcher) TakeBatch(ctx context.Context, ops []counter.Op) {
	for i := range ops {
		op := &ops[i]
		op.Result, op.Err = b.Take(ctx, op.Key, op.Hash, op.Limit, op.N)
	}
}
