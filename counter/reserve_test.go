package counter

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hotkeyd/hotkey/internal/redistest"
)

// stepClock is a clock the test moves: testkit.Clock's twin, which this
// package's own tests cannot import (testkit imports counter), and which
// they need for the unexported sweepOnce.
type stepClock struct{ ns atomic.Int64 }

func newStepClock() *stepClock {
	c := &stepClock{}
	c.ns.Store(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano())
	return c
}

func (c *stepClock) Now() time.Time          { return time.Unix(0, c.ns.Load()) }
func (c *stepClock) Advance(d time.Duration) { c.ns.Add(int64(d)) }

// Since is the clock as a ReserveStore reads it: the time since 1970, a
// clock that does not step.
func (c *stepClock) Since() time.Duration { return time.Duration(c.ns.Load()) }

// recordingLeaser is a memory store on the test's clock that records the
// blocks it leased and the units given back.
type recordingLeaser struct {
	*MemoryStore

	mu       sync.Mutex
	leased   []int64
	returned []int64
}

func (l *recordingLeaser) Lease(ctx context.Context, key string, hash uint64, lim Limit, n int64) (Lease, error) {
	ls, err := l.MemoryStore.Lease(ctx, key, hash, lim, n)
	if ls.Granted > 0 {
		l.mu.Lock()
		l.leased = append(l.leased, ls.Granted)
		l.mu.Unlock()
	}
	return ls, err
}

func (l *recordingLeaser) Return(ctx context.Context, key string, hash uint64, lim Limit, r int64, token Token) (int64, error) {
	l.mu.Lock()
	l.returned = append(l.returned, r)
	l.mu.Unlock()
	return l.MemoryStore.Return(ctx, key, hash, lim, r, token)
}

func newReserveTest(t *testing.T, instances int) (*ReserveStore, *recordingLeaser, *stepClock) {
	t.Helper()
	clock := newStepClock()
	l := &recordingLeaser{MemoryStore: NewMemoryStore(MemoryConfig{Clock: clock.Now})}
	s := NewReserveStore(l, ReserveConfig{Clock: clock.Since, Instances: func() int { return instances }})
	t.Cleanup(func() { s.Close() })
	return s, l, clock
}

// TestReserveColdKey: a key decided now and then goes to the store, one
// call per decision, and holds no block.
func TestReserveColdKey(t *testing.T) {
	s, _, clock := newReserveTest(t, 1)
	ctx := context.Background()
	lim := PerSecond(100)
	for range 20 {
		if r, err := s.Take(ctx, "cold", 1, lim, 1); err != nil || !r.Allowed {
			t.Fatalf("%+v %v", r, err)
		}
		clock.Advance(time.Second)
	}
	if st := s.Stats(); st.Leases != 0 || st.Takes != 20 || st.Local != 0 {
		t.Errorf("stats %+v: want 20 takes, no lease", st)
	}
}

// TestReserveHotKey: a key at 20,000/s on 3 instances, under a limit of
// 30,000/s, makes under 0.1 store calls per decision; over a limit of
// 10,000/s it admits no more than the bucket allows.
func TestReserveHotKey(t *testing.T) {
	for _, c := range []struct {
		rate, burst int64
		calls       float64 // most store calls per decision
	}{
		{30000, 3000, 0.1},
		{10000, 1000, 1}, // over the limit every denial is a call: the engine's deny cache answers those
	} {
		clock := newStepClock()
		l := &recordingLeaser{MemoryStore: NewMemoryStore(MemoryConfig{Clock: clock.Now})}
		var stores []*ReserveStore
		for range 3 {
			s := NewReserveStore(l, ReserveConfig{Clock: clock.Since, Instances: func() int { return 3 }})
			t.Cleanup(func() { s.Close() })
			stores = append(stores, s)
		}
		ctx := context.Background()
		lim := Limit{Rate: c.rate, Period: time.Second, Burst: c.burst}
		var admitted, decisions int64
		for i := range 60000 { // 3 s at 20,000/s
			r, err := stores[i%3].Take(ctx, "hot", 7, lim, 1)
			if err != nil {
				t.Fatal(err)
			}
			decisions++
			if r.Allowed {
				admitted++
			}
			clock.Advance(50 * time.Microsecond)
		}
		var calls uint64
		for _, s := range stores {
			st := s.Stats()
			calls += st.Leases + st.Takes + st.Returns
		}
		// burst + rate × 3 s: what the bucket admits at most.
		if bound := c.burst + 3*c.rate; admitted > bound {
			t.Errorf("limit %d/s: admitted %d, over the bucket's %d", c.rate, admitted, bound)
		}
		perDecision := float64(calls) / float64(decisions)
		t.Logf("limit %d/s: %d decisions, %d admitted, %d store calls (%.4f per decision)", c.rate, decisions, admitted, calls, perDecision)
		if perDecision > c.calls {
			t.Errorf("limit %d/s: %.3f store calls per decision, want at most %v", c.rate, perDecision, c.calls)
		}
	}
}

// TestReserveFairPart: one instance of 4 never leases more than a quarter
// of the capacity at once, however fast its key.
func TestReserveFairPart(t *testing.T) {
	s, l, clock := newReserveTest(t, 4)
	ctx := context.Background()
	lim := Limit{Rate: 100, Period: time.Second, Burst: 100}
	for range 200 {
		s.Take(ctx, "k", 1, lim, 1)
		clock.Advance(10 * time.Microsecond)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.leased) == 0 {
		t.Fatal("no block leased at 100,000/s")
	}
	for _, n := range l.leased {
		if n > 25 {
			t.Errorf("leases %v: one over 25, a quarter of 100", l.leased)
			break
		}
	}
}

// TestReserveReturns: the unused units of a lease that ended, of a limit
// that changed, and at Close go back to the store.
func TestReserveReturns(t *testing.T) {
	s, l, clock := newReserveTest(t, 1)
	ctx := context.Background()
	lim := Limit{Rate: 1000, Period: time.Second, Burst: 1000}
	for range 50 {
		s.Take(ctx, "k", 1, lim, 1)
		clock.Advance(10 * time.Microsecond)
	}
	if s.Stats().Leases == 0 {
		t.Fatal("no block leased at 100,000/s")
	}
	clock.Advance(DefaultLease)
	s.sweepOnce(false)
	l.mu.Lock()
	ended := len(l.returned)
	l.mu.Unlock()
	if ended != 1 {
		t.Errorf("%d returns after the lease ended, want 1", ended)
	}
	for range 50 {
		s.Take(ctx, "k", 1, lim, 1)
		clock.Advance(10 * time.Microsecond)
	}
	lim2 := lim
	lim2.Rate = 2000
	s.Take(ctx, "k", 1, lim2, 1)
	s.Close()
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.returned) < 2 {
		t.Errorf("returns %v: the block of the old limit, or the last at Close, not given back", l.returned)
	}
	if st := s.Stats(); st.Returned+st.Unspent == 0 {
		t.Errorf("stats %+v", st)
	}
}

// TestReserveRedis: three instances leasing one hot key from a real Redis,
// under its limit, admit within the bucket's bound with under 0.1 store
// calls per decision, and give their blocks back at Close.
func TestReserveRedis(t *testing.T) {
	client := redis.NewClient(&redis.Options{Addr: testRedisAddr})
	t.Cleanup(func() { client.Close() })
	base := newTestStore(t, client, RedisConfig{Prefix: "reserve-test:"})
	lim := Limit{Rate: 1000000, Period: time.Second, Burst: 100000}
	key := uniqueKey(t)
	ctx := context.Background()
	var stores [3]*ReserveStore
	for i := range stores {
		stores[i] = NewReserveStore(base, ReserveConfig{Instances: func() int { return len(stores) }})
	}
	var admitted, decisions atomic.Int64
	start := time.Now()
	var wg sync.WaitGroup
	for _, s := range stores {
		wg.Go(func() {
			for range 20000 {
				r, err := s.Take(ctx, key, 9, lim, 1)
				if err != nil {
					t.Error(err)
					return
				}
				decisions.Add(1)
				if r.Allowed {
					admitted.Add(1)
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	var calls, back uint64
	for _, s := range stores {
		s.Close()
		st := s.Stats()
		calls += st.Leases + st.Takes + st.Returns
		back += st.Returned + st.Unspent
	}
	bound := lim.Burst + int64(float64(lim.Rate)*elapsed.Seconds()) + 1
	perDecision := float64(calls) / float64(decisions.Load())
	t.Logf("%d decisions in %v, %d admitted (bound %d), %d store calls (%.4f per decision), %d units given back at the end", decisions.Load(), elapsed, admitted.Load(), bound, calls, perDecision, back)
	if admitted.Load() > bound {
		t.Errorf("admitted %d, over the bucket's %d", admitted.Load(), bound)
	}
	if perDecision > 0.1 {
		t.Errorf("%.3f store calls per decision, want at most 0.1", perDecision)
	}
}

// TestReserveWindows: three instances admit at most a window's limit in
// each window, the blocks ending with the window that counted them, even
// when a burst at a window's start follows steady traffic that left blocks
// open at its end; a sliding log is decided on the store.
func TestReserveWindows(t *testing.T) {
	for _, alg := range []Algorithm{FixedWindow, SlidingWindow, SlidingLog} {
		t.Run(alg.String(), func(t *testing.T) {
			clock := newStepClock()
			base := NewMemoryStore(MemoryConfig{Clock: clock.Now})
			var stores [3]*ReserveStore
			for i := range stores {
				stores[i] = NewReserveStore(base, ReserveConfig{Clock: clock.Since, Instances: func() int { return 3 }})
				t.Cleanup(func() { stores[i].Close() })
			}
			lim := Limit{Algorithm: alg, Rate: 10000, Period: time.Second}
			perWindow := map[int64]int64{}
			ctx := context.Background()
			i := 0
			take := func() {
				r, err := stores[i%3].Take(ctx, "k", 3, lim, 1)
				if err != nil {
					t.Fatal(err)
				}
				if r.Allowed {
					perWindow[clock.Now().UnixNano()/int64(time.Second)]++
				}
				i++
			}
			for range 5 {
				// Steady traffic at 3,000/s to the window's last
				// millisecond, then a burst as the next one starts.
				for range 2970 {
					take()
					clock.Advance(time.Second / 3000)
				}
				now := clock.Now().UnixNano()
				clock.Advance(time.Duration(int64(time.Second) - now%int64(time.Second))) // the next window's start
				for range 12000 {
					take()
				}
			}
			var leases uint64
			for _, s := range stores {
				leases += s.Stats().Leases
			}
			t.Logf("admitted by window %v, %d leases", perWindow, leases)
			for w, n := range perWindow {
				if n > lim.Rate {
					t.Errorf("window %d: %d admitted, over %d", w, n, lim.Rate)
				}
			}
			if (leases == 0) != (alg == SlidingLog) {
				t.Errorf("%d leases: want none for a sliding log, some for windows", leases)
			}
		})
	}
}

// TestReserveFalseDenials: three instances at 90% of a key's limit, the
// traffic spread evenly or 60/30/10, are denied at most 2% of their
// decisions (the figure) while blocks sit in the others' hands.
func TestReserveFalseDenials(t *testing.T) {
	for _, spread := range [][]int{{0, 1, 2}, {0, 0, 0, 0, 0, 0, 1, 1, 1, 2}} {
		for _, lim := range []Limit{
			{Algorithm: FixedWindow, Rate: 1000, Period: time.Second},
			{Algorithm: SlidingWindow, Rate: 1000, Period: time.Second},
			{Algorithm: TokenBucket, Rate: 1000, Period: time.Second, Burst: 1000},
			{Algorithm: TokenBucket, Rate: 1000, Period: time.Second, Burst: 100},
		} {
			clock := newStepClock()
			base := NewMemoryStore(MemoryConfig{Clock: clock.Now})
			var stores [3]*ReserveStore
			for i := range stores {
				stores[i] = NewReserveStore(base, ReserveConfig{Clock: clock.Since, Instances: func() int { return 3 }, Sweep: -1})
				defer stores[i].Close()
			}
			var denied, calls int
			const n = 90000 // 100 s at 900/s
			for i := range n {
				if r, err := stores[spread[i%len(spread)]].Take(context.Background(), "k", 1, lim, 1); err != nil || !r.Allowed {
					denied++
				}
				clock.Advance(time.Second / 900)
			}
			for _, s := range stores {
				st := s.Stats()
				calls += int(st.Leases + st.Takes + st.Returns)
			}
			t.Logf("spread %v, %v %d/s burst %d: %d of %d denied, %.4f store calls per decision", spread, lim.Algorithm, lim.Rate, lim.Burst, denied, n, float64(calls)/n)
			if denied > n/50 {
				t.Errorf("spread %v, %v: %d of %d denied at 90%% of the limit, over 2%%", spread, lim.Algorithm, denied, n)
			}
		}
	}
}

// TestReserveClockStep: one instance of three, on a window algorithm,
// sees its clock step a minute forward, then back, while it holds a block,
// as steady traffic below the limit runs to a window's end and a burst
// starts the next: every window, on the store's clock, still admits at
// most the limit, and the steady traffic (below the limit, so any denial
// of it is false) is counted denied, during the step and outside it.
func TestReserveClockStep(t *testing.T) {
	for _, alg := range []Algorithm{FixedWindow, SlidingWindow} {
		t.Run(alg.String(), func(t *testing.T) {
			clock := newStepClock()
			var step atomic.Int64 // the stepped instance's clock, ahead of the store's
			stepped := func() time.Duration { return clock.Since() + time.Duration(step.Load()) }
			base := NewMemoryStore(MemoryConfig{Clock: clock.Now})
			var stores [3]*ReserveStore
			for i := range stores {
				c := clock.Since
				if i == 0 {
					c = stepped
				}
				stores[i] = NewReserveStore(base, ReserveConfig{Clock: c, Instances: func() int { return 3 }, Sweep: -1})
				t.Cleanup(func() { stores[i].Close() })
			}
			lim := Limit{Algorithm: alg, Rate: 10000, Period: time.Second}
			perWindow := map[int64]int64{}
			var steady, falseDenied, falseDeniedStep int
			ctx := context.Background()
			i := 0
			take := func(inSteady bool) {
				r, err := stores[i%3].Take(ctx, "k", 3, lim, 1)
				if err != nil {
					t.Fatal(err)
				}
				switch {
				case r.Allowed:
					perWindow[clock.Now().UnixNano()/int64(time.Second)]++
				case inSteady && step.Load() != 0:
					falseDeniedStep++
				case inSteady:
					falseDenied++
				}
				if inSteady {
					steady++
				}
				i++
			}
			nextWindow := func() {
				now := clock.Now().UnixNano()
				clock.Advance(time.Duration(int64(time.Second) - now%int64(time.Second)))
			}
			for w := range 4 {
				// Steady traffic at 3,000/s, within the limit, to the
				// window's last millisecond, then a burst as the next
				// one starts; the window after that is left empty, for
				// a sliding window's estimate to forget the burst.
				for j := range 2970 {
					switch {
					case w == 1 && j == 1000:
						step.Store(int64(time.Minute))
					case w == 1 && j == 2000:
						step.Store(0)
					}
					take(true)
					clock.Advance(time.Second / 3000)
				}
				nextWindow()
				for range 12000 {
					take(false)
				}
				nextWindow()
				nextWindow()
			}
			st := stores[0].Stats()
			t.Logf("admitted by window %v; steady traffic denied: %d of %d, %d of them while the clock was a minute ahead; the stepped instance: %+v", perWindow, falseDenied+falseDeniedStep, steady, falseDeniedStep, st)
			for w, n := range perWindow {
				if n > lim.Rate {
					t.Errorf("window %d: %d admitted, over %d", w, n, lim.Rate)
				}
			}
			if st.Leases == 0 {
				t.Error("the stepped instance leased no block")
			}
		})
	}
}

// TestReserveClockStepBack: instance A's wall clock steps back 20 ms near
// a window's end while A holds a block of a fixed window; B then takes
// the next window's whole limit. A's block ends with its window, by the
// store's answer measured on A's monotonic clock, which did not step: A
// admits nothing in the next window.
func TestReserveClockStepBack(t *testing.T) {
	clock := newStepClock() // the store's, at a window's start; Since is A's and B's monotonic clock
	base := NewMemoryStore(MemoryConfig{Clock: clock.Now})
	a := NewReserveStore(base, ReserveConfig{Clock: clock.Since, Instances: func() int { return 2 }, Sweep: -1})
	b := NewReserveStore(base, ReserveConfig{Clock: clock.Since, Instances: func() int { return 2 }, Sweep: -1})
	t.Cleanup(func() { a.Close(); b.Close() })
	lim := Limit{Algorithm: FixedWindow, Rate: 1000, Period: time.Second}
	perWindow := map[int64]int64{}
	ctx := context.Background()
	take := func(s *ReserveStore) {
		r, err := s.Take(ctx, "k", 5, lim, 1)
		if err != nil {
			t.Fatal(err)
		}
		if r.Allowed {
			perWindow[clock.Now().UnixNano()/int64(lim.Period)]++
		}
	}
	// A at 500/s, within the limit, to 10 ms before the window's end,
	// when its wall clock steps back 20 ms.
	for range 495 {
		take(a)
		clock.Advance(2 * time.Millisecond)
	}
	clock.Advance(10 * time.Millisecond) // the next window's start
	for range 3 * lim.Rate {
		take(b)
	}
	for range 100 {
		take(a)
		clock.Advance(100 * time.Microsecond)
	}
	t.Logf("admitted by window %v; A: %+v", perWindow, a.Stats())
	for w, n := range perWindow {
		if n > lim.Rate {
			t.Errorf("window %d: %d admitted, over %d", w, n, lim.Rate)
		}
	}
	if a.Stats().Leases == 0 {
		t.Error("A leased no block")
	}
}

// TestReserveReturnAfterLoss: two instances hold blocks of a fixed window
// on a redis-server that loses its data (FLUSHALL, or killed and
// restarted without persistence); new traffic, decided on the store,
// takes the window's whole limit from the counter made again; then the
// blocks' leases end and the instances decide again. Their returns give
// nothing to the new counter, so it admits its limit after the loss, not
// the limit and the blocks' unused units.
func TestReserveReturnAfterLoss(t *testing.T) {
	srv := redistest.ForTest(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { client.Close() })
	base := newTestStore(t, client, RedisConfig{Prefix: "loss:"})
	ctx := context.Background()
	for _, loss := range []struct {
		name string
		lose func() error
	}{
		{"flushall", func() error { return client.FlushAll(ctx).Err() }},
		{"restart", func() error {
			if err := srv.Kill(); err != nil {
				return err
			}
			return srv.Restart()
		}},
	} {
		t.Run(loss.name, func(t *testing.T) {
			clock := newStepClock()
			var stores [2]*ReserveStore
			for i := range stores {
				stores[i] = NewReserveStore(base, ReserveConfig{Clock: clock.Since, Instances: func() int { return len(stores) }, Sweep: -1})
				t.Cleanup(func() { stores[i].Close() })
			}
			key := uniqueKey(t)
			lim := Limit{Algorithm: FixedWindow, Rate: 1000, Period: longPeriod}
			var admitted int64
			count := func(r Result, err error) {
				t.Helper()
				if err != nil {
					t.Fatal(err)
				}
				if r.Allowed {
					admitted++
				}
			}
			for range 20 { // enough, fast enough, for each to lease a block
				for _, s := range stores {
					count(s.Take(ctx, key, Hash(key), lim, 1))
				}
				clock.Advance(10 * time.Microsecond)
			}
			if st := stores[0].Stats(); st.Leases == 0 {
				t.Fatalf("no block leased: %+v", st)
			}
			if err := loss.lose(); err != nil {
				t.Fatal(err)
			}
			lost := admitted
			for i := 0; ; i++ { // a restarted server answers once the client has dialed it again
				r, err := base.Take(ctx, key, Hash(key), lim, 1)
				if err == nil {
					count(r, err)
					break
				}
				if i == 100 {
					t.Fatal(err)
				}
				time.Sleep(20 * time.Millisecond)
			}
			for range lim.Rate {
				count(base.Take(ctx, key, Hash(key), lim, 1))
			}
			clock.Advance(DefaultLease) // the blocks' leases end
			for range lim.Rate {
				for _, s := range stores {
					count(s.Take(ctx, key, Hash(key), lim, 1))
				}
			}
			var returned uint64
			for _, s := range stores {
				returned += s.Stats().Returned
			}
			after := admitted - lost
			t.Logf("%d admitted before the loss, %d after it in the window of %d; %d units went back", lost, after, lim.Rate, returned)
			if after != lim.Rate {
				t.Errorf("%d admitted after the loss, want the limit, %d", after, lim.Rate)
			}
		})
	}
}
