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

// TestTakeInFlightWhileSplit: a decision that found its key unsplit, and
// whose take lands on the unsplit counter after the key was split and its
// usage moved off that counter, is made again on the new counters, so the
// key admits no more than its limit; one at a time (AllowN) and in a batch
// (AllowBatch).
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
			// counter: its unit lands after the read.
			<-gs.reshards
			close(gs.release)
			wg.Wait()
			if !gs.early.Load() {
				t.Fatal("the move did not read the unsplit counter while the take was in flight: the race this test is for did not happen")
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
