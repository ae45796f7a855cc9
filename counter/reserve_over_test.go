package counter

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"
)

// TestReserveOverLimit: one key asked 1.5 and 10 times its limit, over
// three instances, costs at most 0.02 store calls per decision, and
// admits what one store deciding every request admits, within 3% (and a
// token bucket at most rate × lease more).
func TestReserveOverLimit(t *testing.T) {
	const rate = 2000
	for _, alg := range []Algorithm{TokenBucket, FixedWindow, SlidingWindow} {
		for _, load := range []float64{1.5, 10} {
			t.Run(fmt.Sprintf("%v/%g", alg, load), func(t *testing.T) {
				ctx := context.Background()
				clock := newStepClock()
				base := NewMemoryStore(MemoryConfig{Clock: clock.Now})
				stores := make([]*ReserveStore, 3)
				for i := range stores {
					stores[i] = NewReserveStore(base, ReserveConfig{Clock: clock.Since, Instances: func() int { return len(stores) }, Sweep: -1})
				}
				lim := Limit{Algorithm: alg, Rate: rate, Period: time.Second}
				if alg == TokenBucket {
					lim.Burst = rate
				}
				const step = 100 * time.Microsecond
				var due float64
				var decisions, admitted, exact, denied int64
				var retries []time.Duration
				for i := range int(3 * time.Second / step) {
					for due += load * rate * step.Seconds(); due >= 1; due-- {
						s := stores[decisions%int64(len(stores))]
						decisions++
						r, err := s.Take(ctx, "hot", 1, lim, 1)
						if err != nil {
							t.Fatal(err)
						}
						if r.Allowed {
							admitted++
						} else {
							denied++
							if denied%997 == 0 {
								retries = append(retries, r.RetryAfter)
							}
						}
						if r, _ := base.Take(ctx, "ref", 3, lim, 1); r.Allowed {
							exact++
						}
					}
					if i%10 == 0 {
						for _, s := range stores {
							s.sweepOnce(false) // the sweeper, on the test's clock
						}
					}
					clock.Advance(step)
				}
				var calls uint64
				for _, s := range stores {
					s.Close()
					st := s.Stats()
					calls += st.Leases + st.Takes + st.Returns
				}
				perDecision := float64(calls) / float64(decisions)
				ratio := float64(admitted) / float64(exact)
				t.Logf("%d decisions, %d store calls (%.4f a decision), admitted %d, one store deciding each %d (%.3f)", decisions, calls, perDecision, admitted, exact, ratio)
				if perDecision > 0.02 {
					t.Errorf("%.4f store calls per decision, want at most 0.02", perDecision)
				}
				slack := int64(0)
				if alg == TokenBucket {
					slack = rate * int64(DefaultLease) / int64(time.Second)
				}
				if ratio < 0.97 || admitted > exact+slack {
					t.Errorf("admitted %d, one store deciding each request %d: want 0.97 to 1.00 of it (plus %d for a token bucket)", admitted, exact, slack)
				}
				for _, ra := range retries {
					if ra <= 0 || ra > time.Second {
						t.Errorf("a denial's RetryAfter is %v, want within (0, 1s]", ra)
					}
				}
			})
		}
	}
}

// gatedLeaser is a memory store whose leases wait for the test to open
// its gate, as a store across a network answers later.
type gatedLeaser struct {
	*MemoryStore
	gate   chan struct{}
	asked  chan struct{}
	leases atomic.Int64
}

func (g *gatedLeaser) Lease(ctx context.Context, key string, hash uint64, lim Limit, n int64) (Lease, error) {
	g.leases.Add(1)
	g.asked <- struct{}{}
	<-g.gate
	return g.MemoryStore.Lease(ctx, key, hash, lim, n)
}

// TestReserveLeaseAhead: with Ahead, a key over its limit (a token
// bucket) has its next block leased in the background: the decision that
// finds its wait over, and those during the lease, are denied at once,
// never waiting on the store; the decisions after it admit from the
// block; Close waits for the lease and gives its block back.
func TestReserveLeaseAhead(t *testing.T) {
	ctx := context.Background()
	clock := newStepClock()
	g := &gatedLeaser{MemoryStore: NewMemoryStore(MemoryConfig{Clock: clock.Now}), gate: make(chan struct{}), asked: make(chan struct{}, 1)}
	close(g.gate) // open until the key is over its limit
	s := NewReserveStore(g, ReserveConfig{Clock: clock.Since, Sweep: -1, Ahead: true})
	lim := Limit{Algorithm: TokenBucket, Rate: 1000, Period: time.Second, Burst: 1000}
	for range 2000 { // the burst, and more: the store runs short
		if _, err := s.Take(ctx, "hot", 1, lim, 1); err != nil {
			t.Fatal(err)
		}
		select {
		case <-g.asked:
		default:
		}
		clock.Advance(10 * time.Microsecond)
	}
	if s.Stats().Denied == 0 {
		t.Fatalf("the key never ran short: %+v", s.Stats())
	}
	g.gate = make(chan struct{}) // leases now wait
	clock.Advance(DefaultLease)  // every wait is over
	leases := g.leases.Load()
	r, err := s.Take(ctx, "hot", 1, lim, 1)
	if err != nil || r.Allowed || r.RetryAfter <= 0 {
		t.Fatalf("the decision that starts the lease: %+v, %v; want denied at once, with a retry", r, err)
	}
	<-g.asked // the lease is under way
	for range 10 {
		if r, err := s.Take(ctx, "hot", 1, lim, 1); err != nil || r.Allowed {
			t.Fatalf("a decision during the lease: %+v, %v; want denied at once", r, err)
		}
	}
	if got := g.leases.Load() - leases; got != 1 {
		t.Fatalf("%d leases under way, want 1", got)
	}
	close(g.gate)
	admitted := false
	for i := 0; !admitted; i++ { // the block, once the lease is in
		if i == 5000 {
			t.Fatal("nothing admitted from the block leased ahead")
		}
		r, err := s.Take(ctx, "hot", 1, lim, 1)
		if err != nil {
			t.Fatal(err)
		}
		if admitted = r.Allowed; !admitted {
			time.Sleep(time.Millisecond)
		}
	}
	if got := g.leases.Load() - leases; got != 1 {
		t.Fatalf("%d leases after the one ahead, want none: its block answers", got-1)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if st := s.Stats(); st.Leases == 0 {
		t.Fatalf("%+v", st)
	}
}
