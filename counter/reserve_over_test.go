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
	gate   atomic.Pointer[chan struct{}] // nil: open
	asked  chan struct{}
	leases atomic.Int64
}

// hold makes the leases from now on wait until release.
func (g *gatedLeaser) hold() {
	c := make(chan struct{})
	g.gate.Store(&c)
}

// release lets the waiting leases, and those to come, through.
func (g *gatedLeaser) release() {
	if c := g.gate.Swap(nil); c != nil {
		close(*c)
	}
}

func (g *gatedLeaser) Lease(ctx context.Context, key string, hash uint64, lim Limit, n int64) (Lease, error) {
	g.leases.Add(1)
	g.asked <- struct{}{}
	if c := g.gate.Load(); c != nil {
		<-*c
	}
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
	g := &gatedLeaser{MemoryStore: NewMemoryStore(MemoryConfig{Clock: clock.Now}), asked: make(chan struct{}, 1024)}
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
	g.hold()                    // leases now wait
	clock.Advance(DefaultLease) // every wait is over
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
	g.release()
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
	if got := g.leases.Load() - leases; got > 2 {
		t.Fatalf("%d leases after the one ahead, want at most the next one ahead: its block answers", got-1)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if st := s.Stats(); st.Leases == 0 {
		t.Fatalf("%+v", st)
	}
}

// TestReservePrefetch: with Ahead, a key under its limit has the block
// that takes over leased while its block runs low, so that the decision
// that spends the block does not wait on the store: with the store's
// leases held up, the key is decided from its blocks alone through a
// whole block and more.
func TestReservePrefetch(t *testing.T) {
	ctx := context.Background()
	clock := newStepClock()
	g := &gatedLeaser{MemoryStore: NewMemoryStore(MemoryConfig{Clock: clock.Now}), asked: make(chan struct{}, 1<<16)}
	s := NewReserveStore(g, ReserveConfig{Clock: clock.Since, Sweep: -1, Ahead: true})
	defer s.Close()
	lim := Limit{Algorithm: TokenBucket, Rate: 100_000, Period: time.Second, Burst: 100_000}
	// spareIn reports whether a block is leased ahead, and the units left
	// in the block in use; fetching, whether a lease ahead is under way.
	var spareIn func() (bool, int64)
	var fetching func() bool
	{
		at := func(f func(b *block)) {
			sh := &s.shards[1&uint64(len(s.shards)-1)]
			sh.mu.Lock()
			b := sh.blocks["warm"]
			sh.mu.Unlock()
			if b != nil {
				b.mu.Lock()
				defer b.mu.Unlock()
				f(b)
			}
		}
		spareIn = func() (in bool, left int64) {
			at(func(b *block) { in, left = b.next != nil, b.left })
			return in, left
		}
		fetching = func() (f bool) {
			at(func(b *block) { f = b.fetch != nil })
			return f
		}
	}
	// The key warms up at 10 a millisecond until a block is leased ahead.
	var left int64
	for i := 0; ; i++ {
		in, l := spareIn()
		if in {
			left = l
			break
		}
		if i == 100_000 {
			t.Fatalf("no block leased ahead: %+v", s.Stats())
		}
		if r, err := s.Take(ctx, "warm", 1, lim, 1); err != nil || !r.Allowed {
			t.Fatalf("%+v %v", r, err)
		}
		clock.Advance(100 * time.Microsecond)
		if i%100 == 99 {
			time.Sleep(time.Millisecond) // the lease ahead, in its goroutine
		}
	}
	g.hold() // from here a lease waits
	defer g.release()
	before, held := s.Stats(), g.leases.Load()
	// Through the rest of the block and the one leased ahead, no decision
	// waits on the held-up store.
	admitted, denied := 0, 0
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range 2000 {
			r, err := s.Take(ctx, "warm", 1, lim, 1)
			if err != nil {
				t.Error(err)
				return
			}
			if !r.Allowed {
				denied++
				return
			}
			admitted++
			if fetching() {
				return // the next lease ahead is under way, held up
			}
		}
	}()
	select {
	case <-done:
	case <-time.After(time.Minute):
		t.Fatalf("a decision waited on the store: %d decided before it; %+v", admitted, s.Stats())
	}
	t.Logf("%d decided from the blocks after the store's leases were held up; %+v", admitted, s.Stats())
	if st := s.Stats(); admitted <= int(left) || denied > 0 || st.Leases != before.Leases || st.Takes != before.Takes {
		t.Fatalf("%d admitted (%d left in the block), %d denied, %+v (before: %+v): want the block leased ahead to take over, with no lease or take meanwhile", admitted, left, denied, st, before)
	}

	// The next lease ahead is under way, held up. The decision that finds
	// the block spent waits for it, and does not ask the store again.
	_, left = spareIn()
	for range left {
		if r, err := s.Take(ctx, "warm", 1, lim, 1); err != nil || !r.Allowed {
			t.Fatalf("%+v %v", r, err)
		}
	}
	asked := held + 1 // the lease ahead, held up
	type answer struct {
		r   Result
		err error
	}
	got := make(chan answer, 1)
	go func() {
		r, err := s.Take(ctx, "warm", 1, lim, 1)
		got <- answer{r, err}
	}()
	for s.waits.Load() == 0 {
		if g.leases.Load() > asked {
			t.Fatal("the decision that found the block spent asked the store for another, while the lease ahead was under way")
		}
		time.Sleep(time.Millisecond)
	}
	g.release()
	a := <-got
	if a.err != nil || !a.r.Allowed {
		t.Fatalf("%+v %v: want admitted from the block leased ahead", a.r, a.err)
	}
	if st := s.Stats(); g.leases.Load() != asked || st.Takes != before.Takes {
		t.Fatalf("%d leases asked, %d before; %+v: want none but the lease ahead", g.leases.Load(), asked, st)
	}
}

// TestReservePrefetchReturned: a block leased ahead goes back to the store
// with the block in use, at Close: the store counts what was admitted,
// and no more.
func TestReservePrefetchReturned(t *testing.T) {
	ctx := context.Background()
	clock := newStepClock()
	mem := NewMemoryStore(MemoryConfig{Clock: clock.Now})
	s := NewReserveStore(mem, ReserveConfig{Clock: clock.Since, Sweep: -1, Ahead: true})
	lim := Limit{Algorithm: FixedWindow, Rate: 1_000_000, Period: time.Hour}
	admitted := int64(0)
	for spare := false; !spare; {
		if admitted == 100_000 {
			t.Fatalf("no block leased ahead: %+v", s.Stats())
		}
		if r, err := s.Take(ctx, "warm", 1, lim, 1); err != nil || !r.Allowed {
			t.Fatalf("%+v %v", r, err)
		}
		admitted++
		clock.Advance(100 * time.Microsecond)
		if admitted%100 == 0 {
			time.Sleep(time.Millisecond) // the lease ahead, in its goroutine
		}
		b := s.block("warm", 1)
		b.mu.Lock()
		spare = b.next != nil
		b.mu.Unlock()
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	r, err := mem.Take(ctx, "warm", 1, lim, 0)
	if err != nil {
		t.Fatal(err)
	}
	if used := lim.Capacity() - r.Remaining; used != admitted {
		t.Fatalf("the store counts %d used after Close, want the %d admitted; %+v", used, admitted, s.Stats())
	}
}
