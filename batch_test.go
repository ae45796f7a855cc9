package hotkey

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hotkeyd/hotkey/counter"
	"github.com/hotkeyd/hotkey/internal/testkit"
	"github.com/hotkeyd/hotkey/shard"
)

// batchStore is a memory store that batches: it records the size of each
// TakeBatch, and while down fails every take, as a store whose server is
// gone.
type batchStore struct {
	*counter.MemoryStore
	mu      sync.Mutex
	batches []int
	takes   int
	down    bool
}

func (s *batchStore) Take(ctx context.Context, key string, hash uint64, lim counter.Limit, n int64) (counter.Result, error) {
	s.mu.Lock()
	s.takes++
	down := s.down
	s.mu.Unlock()
	if down {
		return counter.Result{}, testkit.ErrDown
	}
	return s.MemoryStore.Take(ctx, key, hash, lim, n)
}

func (s *batchStore) TakeBatch(ctx context.Context, ops []counter.Op) {
	s.mu.Lock()
	s.batches = append(s.batches, len(ops))
	down := s.down
	s.mu.Unlock()
	for i := range ops {
		op := &ops[i]
		if down {
			op.Result, op.Err = counter.Result{}, testkit.ErrDown
			continue
		}
		op.Result, op.Err = s.MemoryStore.Take(ctx, op.Key, op.Hash, op.Limit, op.N)
	}
}

// batchModel is what a batch must admit: requests in order, each if its
// cost fits what its counter has left (limits that do not refill within
// the test).
type batchModel map[string]int64

func (m batchModel) allow(r Request) bool {
	name := nameOf(r.Policy.Name, r.Key)
	if m[name]+r.Cost > r.Policy.Limit.Capacity() {
		return false
	}
	m[name] += r.Cost
	return true
}

// batchRequests returns requests on a few keys under two policies with
// costs 1 to 5, so that each key's counters fill part way through.
func batchRequests(prefix string, policies ...*Policy) []Request {
	var reqs []Request
	for i := range 120 {
		reqs = append(reqs, Request{Key: fmt.Sprintf("%s%d", prefix, i%4), Policy: policies[i%len(policies)], Cost: int64(1 + i*7%5)})
	}
	return reqs
}

// TestAllowBatchExact checks that a batch decides as its requests made one
// after another would: on a store that batches (one TakeBatch for the
// batch) and on one that does not, with mixed costs and two policies on
// one key, under every algorithm.
func TestAllowBatchExact(t *testing.T) {
	for alg := range counter.Algorithm(4) {
		t.Run(alg.String(), func(t *testing.T) {
			clock := testkit.NewClock()
			mem := counter.NewMemoryStore(counter.MemoryConfig{Clock: clock.Now})
			bs := &batchStore{MemoryStore: mem}
			for _, store := range []counter.Store{bs, counter.NewMemoryStore(counter.MemoryConfig{Clock: clock.Now})} {
				e := newEngineOn(t, store, clock)
				a := &Policy{Name: "a", Limit: Limit{Algorithm: alg, Rate: 20, Period: time.Hour}}
				b := &Policy{Name: "b", Limit: Limit{Algorithm: alg, Rate: 9, Period: time.Hour}}
				reqs := batchRequests("k", a, b)
				out := make([]Decision, len(reqs))
				e.AllowBatch(context.Background(), reqs, out)
				m := batchModel{}
				admitted := 0
				for i, r := range reqs {
					want := m.allow(r)
					if out[i].Err != nil || out[i].Result.Allowed != want {
						t.Fatalf("%T: request %d (%s %s cost %d): %+v, want allowed %v", store, i, r.Policy.Name, r.Key, r.Cost, out[i], want)
					}
					if want {
						admitted++
					}
				}
				if admitted == 0 || admitted == len(reqs) {
					t.Fatalf("admitted %d of %d: want a mix", admitted, len(reqs))
				}
			}
			if len(bs.batches) != 1 || bs.batches[0] != 120 {
				t.Errorf("TakeBatch calls %v: want one of 120", bs.batches)
			}
		})
	}
}

// TestAllowBatchItems checks the requests a batch answers alone: bad input
// fails its own item only, in order, and costs the store nothing.
func TestAllowBatchItems(t *testing.T) {
	clock := testkit.NewClock()
	bs := &batchStore{MemoryStore: counter.NewMemoryStore(counter.MemoryConfig{Clock: clock.Now})}
	e := newEngineOn(t, bs, clock)
	p := &Policy{Name: "p", Limit: Limit{Rate: 5, Period: time.Hour}}
	reqs := []Request{
		{Key: "a", Policy: p, Cost: 1},
		{Key: "", Policy: p, Cost: 1},
		{Key: "a", Policy: nil, Cost: 1},
		{Key: "a", Policy: p, Cost: 6},
		{Key: "a", Policy: p, Cost: 0},
		{Key: "a", Policy: &Policy{Name: "x|y", Limit: p.Limit}, Cost: 1},
		{Key: "a", Policy: p, Cost: 4},
		{Key: "a", Policy: p, Cost: 1},
	}
	out := make([]Decision, len(reqs))
	e.AllowBatch(context.Background(), reqs, out)
	wantErr := []error{nil, ErrEmptyKey, ErrNilPolicy, ErrCostExceedsBurst, ErrInvalidCost, ErrInvalidPolicyName, nil, nil}
	for i, w := range wantErr {
		if w == nil && out[i].Err != nil || w != nil && !errors.Is(out[i].Err, w) {
			t.Errorf("request %d: error %v, want %v", i, out[i].Err, w)
		}
	}
	if !out[0].Result.Allowed || !out[6].Result.Allowed || out[7].Result.Allowed {
		t.Errorf("allowed %v %v %v: want true true false (5 of 5 used)", out[0].Result.Allowed, out[6].Result.Allowed, out[7].Result.Allowed)
	}
	if len(bs.batches) != 1 || bs.batches[0] != 3 || bs.takes != 0 {
		t.Errorf("store saw batches %v and %d single takes: want one batch of 3", bs.batches, bs.takes)
	}
}

// TestAllowBatchSplitKeys checks that a batch decides split keys through
// the whole decision path, in order on each key, and keeps them within
// their limit beside unsplit ones.
func TestAllowBatchSplitKeys(t *testing.T) {
	clock := testkit.NewClock()
	bs := &batchStore{MemoryStore: counter.NewMemoryStore(counter.MemoryConfig{Clock: clock.Now})}
	p := &Policy{Name: "p", Limit: Limit{Algorithm: SlidingWindow, Rate: 400, Period: time.Hour}}
	e, err := New(bs, withClock(clock.Now), WithoutDetector(), WithSplitKeys(shard.Level4, p, "hot"))
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	var reqs []Request
	for i := range 600 {
		key := "hot"
		if i%3 == 0 {
			key = "cold"
		}
		reqs = append(reqs, Request{Key: key, Policy: p, Cost: int64(1 + i%2)})
	}
	out := make([]Decision, len(reqs))
	e.AllowBatch(context.Background(), reqs, out)
	used := map[string]int64{}
	for i, d := range out {
		if d.Err != nil {
			t.Fatalf("request %d: %v", i, d.Err)
		}
		if d.Result.Allowed {
			used[reqs[i].Key] += reqs[i].Cost
		}
		if want := shard.Level(1); reqs[i].Key == "hot" {
			want = shard.Level4
			if d.Result.Shards != want {
				t.Fatalf("request %d on the split key: %d shards, want %d", i, d.Result.Shards, want)
			}
		}
	}
	if used["hot"] > 400 || used["cold"] > 400 {
		t.Errorf("admitted hot %d, cold %d: limit 400", used["hot"], used["cold"])
	}
	if used["cold"] != 300 { // 200 requests of costs 1 and 2: all fit
		t.Errorf("cold admitted %d, want 300", used["cold"])
	}
	if len(bs.batches) != 1 || bs.batches[0] != 200 {
		t.Errorf("TakeBatch calls %v: want one of the 200 unsplit requests", bs.batches)
	}
}

// TestAllowBatchStoreDown checks that when the store fails, each decision
// of a batch follows its policy's fallback, and the failures open the
// breaker as single decisions' do.
func TestAllowBatchStoreDown(t *testing.T) {
	clock := testkit.NewClock()
	bs := &batchStore{MemoryStore: counter.NewMemoryStore(counter.MemoryConfig{Clock: clock.Now}), down: true}
	e := newEngineOn(t, bs, clock)
	open := &Policy{Name: "o", Limit: Limit{Rate: 1, Period: time.Hour}, OnStoreFailure: FallbackOpen}
	closed := &Policy{Name: "c", Limit: Limit{Rate: 1, Period: time.Hour}, OnStoreFailure: FallbackClosed}
	failing := &Policy{Name: "e", Limit: Limit{Rate: 1, Period: time.Hour}, OnStoreFailure: FallbackError}
	reqs := []Request{{Key: "a", Policy: open, Cost: 1}, {Key: "a", Policy: closed, Cost: 1}, {Key: "a", Policy: failing, Cost: 1}, {Key: "b", Policy: open, Cost: 1}}
	out := make([]Decision, len(reqs))
	e.AllowBatch(context.Background(), reqs, out)
	if !out[0].Result.Allowed || !out[0].Result.Degraded || out[1].Result.Allowed || !out[1].Result.Degraded ||
		!errors.Is(out[2].Err, ErrStoreUnavailable) || !out[3].Result.Allowed {
		t.Errorf("decisions with the store down: %+v", out)
	}
	if e.brk.State() != BreakerOpen {
		t.Errorf("breaker %v after 4 failed takes: want open", e.brk.State())
	}
	// While it is open, no take reaches the store.
	n := len(bs.batches)
	e.AllowBatch(context.Background(), reqs[:2], out)
	if len(bs.batches) != n || !out[0].Result.Degraded {
		t.Errorf("open breaker: the store saw %d more batches, decision %+v", len(bs.batches)-n, out[0])
	}
	// A cancelled batch answers with ctx's error and no fallback.
	bs.down = false
	clock.Advance(time.Hour)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	e.AllowBatch(ctx, reqs[:2], out)
	if !errors.Is(out[0].Err, context.Canceled) {
		t.Errorf("cancelled batch: %+v, want context.Canceled", out[0])
	}
}

// TestAllowBatchRedis runs batches on real Redis, alone and beside single
// decisions on the same keys, and checks that no counter admits more than
// its limit, with mixed costs, two policies and a split key; and that
// batches on fresh keys decide as a sequence would.
func TestAllowBatchRedis(t *testing.T) {
	client := redis.NewClient(&redis.Options{Addr: env.Server.Addr})
	defer client.Close()
	store, err := counter.NewRedisStore(context.Background(), client, counter.RedisConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	prefix := fmt.Sprintf("batch%d:", time.Now().UnixNano())
	a := &Policy{Name: "a", Limit: Limit{Algorithm: SlidingWindow, Rate: 50, Period: longPeriod}}
	b := &Policy{Name: "b", Limit: Limit{Algorithm: TokenBucket, Rate: 30, Period: longPeriod}}
	e, err := New(store, WithoutDetector(), WithSplitKeys(shard.Level4, a, prefix+"3"))
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()

	// Sequence: fresh keys, one batch.
	seq := batchRequests(prefix+"seq", a, b)
	out := make([]Decision, len(seq))
	e.AllowBatch(context.Background(), seq, out)
	m := batchModel{}
	for i, r := range seq {
		if want := m.allow(r); out[i].Err != nil || out[i].Result.Allowed != want {
			t.Fatalf("request %d (%s %s cost %d): %+v, want allowed %v", i, r.Policy.Name, r.Key, r.Cost, out[i], want)
		}
	}

	// Concurrent batches and single decisions on the same counters.
	var mu sync.Mutex
	used := map[string]int64{}
	count := func(r Request, d Decision) {
		if d.Err != nil {
			t.Error(d.Err)
			return
		}
		if d.Result.Allowed {
			mu.Lock()
			used[nameOf(r.Policy.Name, r.Key)] += r.Cost
			mu.Unlock()
		}
	}
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for range 5 {
				reqs := batchRequests(prefix, a, b)
				out := make([]Decision, len(reqs))
				e.AllowBatch(context.Background(), reqs, out)
				for i, r := range reqs {
					count(r, out[i])
				}
			}
		})
		wg.Go(func() {
			for i, r := range batchRequests(prefix, b, a) {
				if i%3 == 0 {
					res, err := e.AllowN(context.Background(), r.Key, r.Policy, r.Cost)
					count(r, Decision{res, err})
				}
			}
		})
	}
	wg.Wait()
	for name, u := range used {
		limit := a.Limit.Capacity()
		if name[0] == 'b' {
			limit = b.Limit.Capacity()
		}
		if u > limit {
			t.Errorf("%s admitted %d, limit %d", name, u, limit)
		}
		if u < limit*3/4 {
			t.Errorf("%s admitted %d, limit %d: want the counter nearly full after 1,000 requests", name, u, limit)
		}
	}
}
