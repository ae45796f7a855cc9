package hotkey

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hotkeyd/hotkey/counter"
	"github.com/hotkeyd/hotkey/internal/testkit"
	"github.com/hotkeyd/hotkey/shard"
	"github.com/hotkeyd/hotkey/split"
)

// phase is one stretch of a transition run: the key at level for a number
// of periods.
type phase struct {
	level   shard.Level
	periods float64
}

// transitions takes a key 1→4→16→4→1.
var transitions = []phase{{1, 1.5}, {4, 2}, {16, 2}, {4, 2}, {1, 1.5}}

// tally counts what a run admitted, in total and per period from its start.
type tally struct {
	total     int
	perPeriod []int
}

func (c *tally) add(period int, allowed bool) {
	for len(c.perPeriod) <= period {
		c.perPeriod = append(c.perPeriod, 0)
	}
	if allowed {
		c.total++
		c.perPeriod[period]++
	}
}

// checkTransitions asserts that a split key taken through transitions
// admitted at most 2% more than the unsplit reference on the same stream,
// and at most 5% over the limit in any period after the first (the first
// holds the initial burst), plus whatever the reference itself admitted
// over the limit in that period. On a simulated clock the reference never
// does; on real time a loaded machine can stall the stream and then catch
// up, so that a period's tally holds a refill that came in the one before,
// and the split key, on the same stream, may do the same.
//
// Where instances applied a level change at different moments (disagree:
// the longest spread between the first and the last), the counters of both
// levels enforce the limit meanwhile: a period may also hold the refill of
// that time, limit × disagree ÷ period (0 on one engine); and a take in
// flight on the old counters while the usage moves is not carried over: up
// to one per concurrent caller (inflight) in a period with a transition.
//
// It first holds the reference to a sane result over the periods the
// stream lasted: at least 80% of the limit per period (else the stream
// did not drive the key over its limit, and nothing can be told: the test
// is skipped, saying why) and at most the limit per period plus one burst
// (else the unsplit key leaked, and the test fails).
func checkTransitions(t *testing.T, split, ref tally, limit int64, periods, disagree float64, inflight int) (ok bool) {
	t.Helper()
	ratio := float64(split.total) / float64(ref.total)
	t.Logf("admitted %d, unsplit reference %d: ratio %.4f; per period %v (reference %v), limit %d over %.2f periods",
		split.total, ref.total, ratio, split.perPeriod, ref.perPeriod, limit, periods)
	if lo := 0.8 * float64(limit) * periods; float64(ref.total) < lo {
		t.Skipf("the reference admitted %d over %.2f periods, under %.0f: the stream did not drive the key over its limit, so the split key cannot be judged against it", ref.total, periods, lo)
	}
	if hi := 1.02*float64(limit)*(periods+1) + 1; float64(ref.total) > hi {
		t.Fatalf("the unsplit reference admitted %d over %.2f periods, over %.0f: it did not keep its own limit", ref.total, periods, hi)
	}
	ok = true
	if ratio > 1.02 {
		t.Logf("split admitted %.4f× the reference, want ≤ 1.02", ratio)
		ok = false
	}
	for p, n := range split.perPeriod {
		if p == 0 {
			continue
		}
		bound := 1.05*float64(limit) + float64(limit)*disagree + float64(inflight)
		if p < len(ref.perPeriod) && ref.perPeriod[p] > int(limit) {
			bound += float64(ref.perPeriod[p]) - float64(limit)
			t.Logf("period %d: the reference admitted %d, over the limit of %d (a stall and catch-up): the split key may too", p, ref.perPeriod[p], limit)
		}
		if float64(n) > bound {
			t.Logf("period %d admitted %d, want ≤ %.0f (1.05 × %d plus the reference's excess, %.3f periods of instances disagreeing and %d takes in flight)", p, n, bound, limit, disagree, inflight)
			ok = false
		}
	}
	return ok
}

// TestTransferMemory drives a key at 3× its limit through levels 1→4→16→4→1
// on the memory store, on a simulated clock, next to the same stream on an
// unsplit key: moving the usage at each change of level hands out no free
// quota. Without the move (withStateTransfer(false)) the same run exceeds
// the bounds, which shows the test can tell.
func TestTransferMemory(t *testing.T) {
	checkLeaks(t)
	const limit = 320
	// The second key's unsplit counter is named escaped (shard.Name): the
	// usage moves from and back to that name.
	for _, c := range []struct {
		alg Algorithm
		key string
	}{{TokenBucket, "transfer"}, {SlidingWindow, "transfer"}, {FixedWindow, "transfer"}, {SlidingLog, "transfer"}, {TokenBucket, "transfer|16|3"}, {SlidingWindow, "transfer|64|1|2"}} {
		alg, key := c.alg, c.key
		for _, transfer := range []bool{true, false} {
			t.Run(fmt.Sprintf("%v/%s/transfer=%v", alg, key, transfer), func(t *testing.T) {
				clock := testkit.NewClock()
				start := clock.Now().Truncate(time.Second)
				store := counter.NewMemoryStore(counter.MemoryConfig{Clock: clock.Now})
				ref, err := New(store, withClock(clock.Now), WithoutDetector())
				if err != nil {
					t.Fatal(err)
				}
				defer ref.Close()
				split, err := New(store, withClock(clock.Now), WithoutDetector(), withStateTransfer(transfer))
				if err != nil {
					t.Fatal(err)
				}
				defer split.Close()
				lim := Limit{Algorithm: alg, Rate: limit, Period: time.Second}
				gap := time.Second / (3 * limit)
				ctx := context.Background()
				var sc, rc tally
				i := 0
				for _, ph := range transitions {
					handler{split}.SetLevel(key, hashKey(key), ph.level)
					for range int(ph.periods * 3 * limit) {
						at := time.Duration(i) * gap
						clock.Set(start.Add(at))
						r1, err1 := ref.Allow(ctx, key+":ref", pol(lim))
						r2, err2 := split.Allow(ctx, key, pol(lim))
						if err1 != nil || err2 != nil {
							t.Fatal(err1, err2)
						}
						if ph.level > 1 && r2.Shards != ph.level {
							t.Fatalf("at level %d the decision used %d shards", ph.level, r2.Shards)
						}
						p := int(at / time.Second)
						rc.add(p, r1.Allowed)
						sc.add(p, r2.Allowed)
						i++
					}
				}
				periods := float64(time.Duration(i)*gap) / float64(time.Second)
				if ok := checkTransitions(t, sc, rc, limit, periods, 0, 0); ok != transfer {
					if transfer {
						t.Error("split key handed out free quota across its transitions")
					} else {
						t.Error("without state transfer the run stayed within the bounds: the test cannot tell")
					}
				}
			})
		}
	}
}

// gatedStore is a memory store whose next Take, once armed, waits for a
// release before it runs: a decision in flight. It signals each Reshard.
type gatedStore struct {
	*counter.MemoryStore
	armed    atomic.Bool
	held     chan struct{} // a gated Take has started
	release  chan struct{}
	reshards chan struct{}
}

func (s *gatedStore) Take(ctx context.Context, key string, hash uint64, lim counter.Limit, n int64) (counter.Result, error) {
	if s.armed.CompareAndSwap(true, false) {
		s.held <- struct{}{}
		<-s.release
	}
	return s.MemoryStore.Take(ctx, key, hash, lim, n)
}

func (s *gatedStore) Reshard(ctx context.Context, from, to []counter.Shard) error {
	select {
	case s.reshards <- struct{}{}:
	default:
	}
	return s.MemoryStore.Reshard(ctx, from, to)
}

// TestTransferWaitsForDecisionsInFlight: a decision on a split key's
// subcounter that is still in flight when the key merges is carried to the
// unsplit counter: the move waits for it. Without that wait the move reads
// the subcounters first, the unit lands after, and the merged key admits it
// again.
func TestTransferWaitsForDecisionsInFlight(t *testing.T) {
	checkLeaks(t)
	for _, alg := range []Algorithm{TokenBucket, SlidingWindow, FixedWindow, SlidingLog} {
		t.Run(alg.String(), func(t *testing.T) {
			clock := testkit.NewClock()
			store := &gatedStore{
				MemoryStore: counter.NewMemoryStore(counter.MemoryConfig{Clock: clock.Now}),
				held:        make(chan struct{}), release: make(chan struct{}), reshards: make(chan struct{}, 1),
			}
			e, err := New(store, withClock(clock.Now), WithoutDetector())
			if err != nil {
				t.Fatal(err)
			}
			defer e.Close()
			const limit = 40
			p := pol(Limit{Algorithm: alg, Rate: limit, Period: time.Hour})
			key, ctx := "inflight", context.Background()
			handler{e}.SetLevel(key, hashKey(key), 4)
			for i := range limit - 1 {
				if r, err := e.Allow(ctx, key, p); err != nil || !r.Allowed || r.Shards != 4 {
					t.Fatalf("decision %d at level 4: %+v %v", i, r, err)
				}
			}
			select { // the split's move
			case <-store.reshards:
			default:
			}
			// The last unit's decision enters its subcounter and stays in
			// flight while the key merges.
			store.armed.Store(true)
			last := make(chan Result, 1)
			go func() {
				r, _ := e.Allow(ctx, key, p)
				last <- r
			}()
			<-store.held
			handler{e}.SetLevel(key, hashKey(key), 1)
			settled := make(chan struct{})
			go func() {
				e.settle()
				close(settled)
			}()
			// Let the move read the subcounters if it does not wait.
			select {
			case <-store.reshards:
			case <-time.After(100 * time.Millisecond):
			}
			close(store.release)
			if r := <-last; !r.Allowed {
				t.Fatalf("the last unit of %d was denied: %+v", limit, r)
			}
			<-settled
			if r, err := e.Allow(ctx, key, p); err != nil || r.Allowed || r.Shards != 1 {
				t.Errorf("after the merge, a unit past the limit: %+v %v, want denied on the unsplit counter", r, err)
			}
		})
	}
}

// TestMergeReadsLevelsOfOtherInstances: an instance that made no decision
// on a key while it was at 16 finds on the merge what the instance that did
// decide took on the 16 subcounters: its move reads every level the key
// was at since its usage last moved. With a decision at 4 first ("decided
// at 4"), it moves the usage in its loop, under the limit of that decision;
// with none, it knows no limit, and the key stays parked in its table for
// its next decision to move. Before, the first read only level 4's
// counters, and the second took the key out without a move: each handed out
// what was taken at 16 again.
func TestMergeReadsLevelsOfOtherInstances(t *testing.T) {
	checkLeaks(t)
	for _, c := range []struct {
		alg     Algorithm
		decided bool
	}{
		{TokenBucket, true}, {SlidingWindow, true}, {FixedWindow, true}, {SlidingLog, true},
		{TokenBucket, false}, {SlidingWindow, false}, {FixedWindow, false}, {SlidingLog, false},
	} {
		alg := c.alg
		t.Run(fmt.Sprintf("%v/decided at 4=%v", alg, c.decided), func(t *testing.T) {
			clock := testkit.NewClock()
			store := counter.NewMemoryStore(counter.MemoryConfig{Clock: clock.Now})
			busy, idle := newEngineOn(t, store, clock), newEngineOn(t, store, clock)
			const limit = 320 // 20 a subcounter at 16
			p := pol(Limit{Algorithm: alg, Rate: limit, Period: time.Hour})
			key, ctx := "merged", context.Background()
			admitted := 0
			allow := func(e *Engine, level shard.Level) {
				t.Helper()
				r, err := e.Allow(ctx, key, p)
				if err != nil || r.Shards != level {
					t.Fatalf("at level %d: %+v %v", level, r, err)
				}
				if r.Allowed {
					admitted++
				}
			}
			for _, e := range []*Engine{busy, idle} {
				handler{e}.SetLevel(key, hashKey(key), 4)
			}
			if c.decided {
				allow(idle, 4)
			}
			for _, e := range []*Engine{busy, idle} {
				handler{e}.SetLevel(key, hashKey(key), 16)
			}
			for range limit {
				allow(busy, 16)
			}
			// Only idle hears the merge: busy's usage is on the 16
			// subcounters alone.
			handler{idle}.SetLevel(key, hashKey(key), 1)
			idle.settle()
			if ent := idle.table.Lookup(key, hashKey(key)); (ent != nil) == c.decided || ent != nil && !ent.Parked() {
				t.Fatalf("after the merge the idle instance's entry is %+v, want it parked only with no decision", ent)
			}
			for range limit {
				allow(idle, 1)
			}
			if admitted > limit {
				t.Errorf("admitted %d in all, limit %d", admitted, limit)
			}
		})
	}
}

// newEngineOn returns an engine on store, closed at the end of the test.
func newEngineOn(t *testing.T, store counter.Store, clock *testkit.Clock) *Engine {
	t.Helper()
	e, err := New(store, withClock(clock.Now), WithoutDetector())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

// TestShardsAtToleranceBound checks that a move reads and seeds every share
// of a token bucket at the tolerance bound, though a share's own tolerance
// passes the bound by the rounding of its share (rate 1, burst 2 of 5 and 7).
func TestShardsAtToleranceBound(t *testing.T) {
	lim := Limit{Rate: 5, Period: counter.MaxTolerance / 7 / time.Microsecond * 5 * time.Microsecond, Burst: 7}
	if err := lim.Validate(); err != nil {
		t.Fatalf("Validate: %v", err)
	}
	ent := split.NewEntry("k", hashKey("k"), shard.Level4, shard.Level4, nil)
	if got := len(shards(ent, lim, shard.Level4, nil)); got != 4 {
		t.Errorf("a move of %+v at level 4 covers %d counters, want 4", lim, got)
	}
}
