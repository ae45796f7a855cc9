package hotkey

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/hotkeyd/hotkey/counter"
	"github.com/hotkeyd/hotkey/internal/testkit"
)

// TestMetrics: decisions are counted by policy and result, hot keys by
// level, the breaker's state and changes, store calls and failures.
func TestMetrics(t *testing.T) {
	checkLeaks(t)
	clock := testkit.NewClock()
	store := &testkit.Store{Store: counter.NewMemoryStore(counter.MemoryConfig{Clock: clock.Now})}
	reg := prometheus.NewRegistry()
	e, err := New(store, withClock(clock.Now), WithoutDetector(), WithMetrics(reg))
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	ctx := context.Background()
	p := &Policy{Name: "api", Limit: PerSecond(5), OnStoreFailure: FallbackOpen}
	for range 8 {
		e.AllowN(ctx, "k", p, 1)
	}
	e.Allow(ctx, "", pol(PerSecond(5)))
	handler{e}.SetLevel("hot", hashKey("hot"), 16)
	handler{e}.SetLevel("warm", hashKey("warm"), 4)
	store.Down.Store(true)
	for range 4 {
		e.AllowN(ctx, "k2", p, 1) // not "k": the deny cache answers for it
	}
	want := map[string]float64{
		`hotkey_decisions_total{policy="api",result="allowed",sync="store"}`:          5,
		`hotkey_decisions_total{policy="api",result="denied",sync="store"}`:           3,
		`hotkey_decisions_total{policy="api",result="fallback_allowed",sync="store"}`: 4,
		`hotkey_decisions_total{policy="default",result="invalid",sync="store"}`:      1,
		`hotkey_hot_keys{level="16"}`:                                                 1,
		`hotkey_hot_keys{level="4"}`:                                                  1,
		`hotkey_level_changes_total{level="16"}`:                                      1,
		`hotkey_breaker_open`:                                                         1,
		`hotkey_breaker_changes_total{state="open"}`:                                  1,
		`hotkey_store_errors_total`:                                                   3,
		`hotkey_peers`:                                                                0,
	}
	got := gather(t, reg)
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %v, want %v", k, got[k], v)
		}
	}
	if n := got["hotkey_store_duration_seconds"]; n != 8 {
		t.Errorf("store calls timed: %v, want 8 (5 admitted, the last emptying the bucket, then the deny cache; 3 failing before the breaker opened)", n)
	}
	if n, err := testutil.GatherAndCount(reg, "hotkey_clock_skew_seconds"); err != nil || n != 0 {
		t.Errorf("clock skew exported for a store that does not measure it: %d, %v", n, err)
	}
}

// gather returns the metrics of reg by name and labels, as
// name{label="value",...}: a counter's or gauge's value, a histogram's
// count of observations.
// TestMetricsSyncLabel: a decision is counted under its policy's sync
// mode, so that store, reserve and gossip policies are told apart.
func TestMetricsSyncLabel(t *testing.T) {
	checkLeaks(t)
	reg := prometheus.NewRegistry()
	e, err := New(counter.NewMemoryStore(counter.MemoryConfig{}), WithoutDetector(), WithMetrics(reg))
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	ctx := context.Background()
	for _, s := range []Sync{SyncStore, SyncReserve, SyncGossip} {
		p := &Policy{Name: "p-" + s.String(), Limit: PerSecond(100), Sync: s}
		for range int(s) + 1 {
			if _, err := e.Allow(ctx, "k", p); err != nil {
				t.Fatal(err)
			}
		}
	}
	got := gather(t, reg)
	for _, s := range []Sync{SyncStore, SyncReserve, SyncGossip} {
		k := `hotkey_decisions_total{policy="p-` + s.String() + `",result="allowed",sync="` + s.String() + `"}`
		if got[k] != float64(s)+1 {
			t.Errorf("%s = %v, want %v", k, got[k], float64(s)+1)
		}
	}
}

func gather(t testing.TB, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			name := mf.GetName()
			if len(m.GetLabel()) > 0 {
				name += "{"
				for i, l := range m.GetLabel() {
					if i > 0 {
						name += ","
					}
					name += l.GetName() + `="` + l.GetValue() + `"`
				}
				name += "}"
			}
			switch {
			case m.Counter != nil:
				got[name] = m.Counter.GetValue()
			case m.Gauge != nil:
				got[name] = m.Gauge.GetValue()
			case m.Histogram != nil:
				got[name] = float64(m.Histogram.GetSampleCount())
			}
		}
	}
	return got
}

// decisionsCounted is the sum of hotkey_decisions_total over its labels.
func decisionsCounted(got map[string]float64) float64 {
	n := 0.0
	for k, v := range got {
		if strings.HasPrefix(k, "hotkey_decisions_total{") {
			n += v
		}
	}
	return n
}

// TestDecisionDuration: every decision is observed once, whatever its
// outcome (allowed, denied, fallback, error, bad input), single or in a
// batch, on a store that batches and on one that does not; a request
// without a policy is no decision.
func TestDecisionDuration(t *testing.T) {
	for _, batcher := range []bool{true, false} {
		t.Run(fmt.Sprintf("batcher=%v", batcher), func(t *testing.T) {
			clock := testkit.NewClock()
			bs := &batchStore{MemoryStore: counter.NewMemoryStore(counter.MemoryConfig{Clock: clock.Now})}
			var store counter.Store = bs
			if !batcher {
				store = &testkit.Store{Store: bs.MemoryStore}
			}
			setDown := func(down bool) {
				bs.mu.Lock()
				bs.down = down
				bs.mu.Unlock()
				if s, ok := store.(*testkit.Store); ok {
					s.Down.Store(down)
				}
			}
			reg := prometheus.NewRegistry()
			e, err := New(store, withClock(clock.Now), WithoutDetector(), WithMetrics(reg),
				WithBreaker(1000, time.Second, time.Second)) // no breaker in the way
			if err != nil {
				t.Fatal(err)
			}
			defer e.Close()
			ctx := context.Background()
			open := &Policy{Name: "o", Limit: Limit{Rate: 3, Period: time.Hour}, OnStoreFailure: FallbackOpen}
			failing := &Policy{Name: "e", Limit: Limit{Rate: 3, Period: time.Hour}, OnStoreFailure: FallbackError}
			want := 0
			for range 5 { // 3 allowed, 2 denied
				e.Allow(ctx, "k", open)
				want++
			}
			e.Allow(ctx, "", open)      // invalid
			e.AllowN(ctx, "k", open, 4) // invalid: over the burst
			e.Allow(ctx, "k", nil)      // no decision
			reqs := []Request{
				{Key: "b", Policy: open, Cost: 1},
				{Key: "b", Policy: nil, Cost: 1}, // no decision
				{Key: "", Policy: open, Cost: 1},
				{Key: "b", Policy: failing, Cost: 2},
				{Key: "k", Policy: open, Cost: 1}, // the deny cache answers
			}
			out := make([]Decision, len(reqs))
			e.AllowBatch(ctx, reqs, out)
			e.AllowBatch(ctx, reqs[:1], out) // one request: decided alone
			want += 2 + 4 + 1
			setDown(true)
			for range 3 {
				e.Allow(ctx, "d", open)    // fallback_allowed
				e.Allow(ctx, "d", failing) // error
			}
			e.AllowBatch(ctx, reqs, out)
			want += 6 + 4
			got := gather(t, reg)
			if n := got["hotkey_decision_duration_seconds"]; n != float64(want) {
				t.Errorf("decisions observed: %v, want %d", n, want)
			}
			if n := decisionsCounted(got); n != float64(want) {
				t.Errorf("decisions counted: %v, want %d", n, want)
			}
			for _, r := range []string{"allowed", "denied", "fallback_allowed", "error", "invalid"} {
				if got[`hotkey_decisions_total{policy="o",result="`+r+`",sync="store"}`]+got[`hotkey_decisions_total{policy="e",result="`+r+`",sync="store"}`] == 0 {
					t.Errorf("no decision with result %s: the test misses a case", r)
				}
			}
		})
	}
}

// newMetricsEngine is an engine with metrics, on a simulated clock, over a
// store that batches (and, not being a *counter.MemoryStore, gets a deny
// cache), closed when t ends.
func newMetricsEngine(t *testing.T) (*testkit.Clock, *batchStore, *prometheus.Registry, *Engine) {
	t.Helper()
	clock := testkit.NewClock()
	bs := &batchStore{MemoryStore: counter.NewMemoryStore(counter.MemoryConfig{Clock: clock.Now})}
	reg := prometheus.NewRegistry()
	e, err := New(bs, withClock(clock.Now), WithoutDetector(), WithMetrics(reg))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return clock, bs, reg, e
}

// TestDenyCacheHits: hotkey_deny_cache_hits_total counts the takes the
// deny cache answered, exactly: a denial the store did not see.
func TestDenyCacheHits(t *testing.T) {
	clock, bs, reg, e := newMetricsEngine(t)
	if e.deny == nil {
		t.Fatal("no deny cache")
	}
	ctx := context.Background()
	takes := func() int {
		bs.mu.Lock()
		defer bs.mu.Unlock()
		n := bs.takes
		for _, b := range bs.batches {
			n += b
		}
		return n
	}
	hits := func() float64 { return gather(t, reg)["hotkey_deny_cache_hits_total"] }
	want := 0.0
	for _, alg := range []Algorithm{FixedWindow, SlidingWindow, TokenBucket, SlidingLog} {
		p := &Policy{Name: alg.String(), Limit: Limit{Algorithm: alg, Rate: 3, Period: time.Second}}
		for i := range 40 {
			clock.Advance(50 * time.Millisecond)
			before := takes()
			var rs []Result
			if i%2 == 0 {
				r, _ := e.AllowN(ctx, "k", p, int64(1+i%3))
				rs = append(rs, r)
			} else {
				out := make([]Decision, 2)
				e.AllowBatch(ctx, []Request{{Key: "k", Policy: p, Cost: int64(1 + i%3)}, {Key: "other", Policy: p, Cost: 1}}, out)
				rs = append(rs, out[0].Result, out[1].Result)
			}
			// The takes the store did not see, the deny cache answered.
			cached := len(rs) - (takes() - before)
			want += float64(cached)
			if cached == len(rs) {
				for _, r := range rs {
					if r.Allowed {
						t.Fatalf("%v, decision %d: admitted without a store call", alg, i)
					}
				}
			}
			if got := hits(); got != want {
				t.Fatalf("%v, decision %d (%+v, store calls %d): %v deny cache hits, want %v", alg, i, rs, takes()-before, got, want)
			}
		}
	}
	if want < 20 {
		t.Errorf("only %v decisions answered by the deny cache: the test misses its case", want)
	}
}

// TestNearLimit: hotkey_near_limit_total counts, by policy, the admitted
// decisions that left less than a fifth of the limit, with two policies on
// one key and mixed costs, single and in batches; not denials nor the
// fallback's decisions.
func TestNearLimit(t *testing.T) {
	_, bs, reg, e := newMetricsEngine(t)
	ctx := context.Background()
	a := &Policy{Name: "a", Limit: Limit{Rate: 10, Period: time.Hour}, OnStoreFailure: FallbackOpen}
	b := &Policy{Name: "b", Limit: Limit{Rate: 7, Period: time.Hour}, OnStoreFailure: FallbackOpen}
	// a, limit 10: remaining 7, 4, 2 (80% used: not past), 1, 0, then denied.
	for _, n := range []int64{3, 3, 2, 1, 1, 1} {
		e.AllowN(ctx, "k", a, n)
	}
	// b, limit 7, on the same key, in a batch: remaining 6, 2, 1 (6 of 7
	// used, 86%: near), 0, then denied; and a single decision denied.
	var reqs []Request
	for _, n := range []int64{1, 4, 1, 1, 1} {
		reqs = append(reqs, Request{Key: "k", Policy: b, Cost: n})
	}
	reqs = append(reqs, Request{Key: "k2", Policy: a, Cost: 9}) // remaining 1: near
	out := make([]Decision, len(reqs))
	e.AllowBatch(ctx, reqs, out)
	e.Allow(ctx, "k", b)
	// The fallback's admissions are not counted, however little they leave.
	bs.mu.Lock()
	bs.down = true
	bs.mu.Unlock()
	e.AllowN(ctx, "f", a, 10)
	got := gather(t, reg)
	for p, want := range map[string]float64{"a": 3, "b": 2} {
		if n := got[`hotkey_near_limit_total{policy="`+p+`"}`]; n != want {
			t.Errorf("policy %s: %v near-limit decisions, want %v", p, n, want)
		}
	}
	if n := got[`hotkey_decisions_total{policy="a",result="fallback_allowed",sync="store"}`]; n != 1 {
		t.Errorf("fallback decisions %v, want 1", n)
	}
}

func TestNearLimitThreshold(t *testing.T) {
	for _, tt := range []struct {
		limit, remaining int64
		want             bool
	}{
		{10, 2, false}, {10, 1, true}, {7, 2, false}, {7, 1, true}, {5, 1, false}, {5, 0, true},
		{1, 0, true}, {1, 1, false}, {100, 20, false}, {100, 19, true}, {101, 20, true}, {104, 20, true}, {105, 21, false},
	} {
		if got := nearLimit(Result{Allowed: true, Limit: tt.limit, Remaining: tt.remaining}); got != tt.want {
			t.Errorf("limit %d, remaining %d: near %v, want %v", tt.limit, tt.remaining, got, tt.want)
		}
	}
}

// BenchmarkAllowMetrics is the decision path with and without metrics, on
// a store that is not in process (so the deny cache is on, as on Redis):
// admitted decisions on many keys, and denials the deny cache answers.
func BenchmarkAllowMetrics(b *testing.B) {
	keys := make([]string, 4096)
	for i := range keys {
		keys[i] = fmt.Sprintf("user:%d", i)
	}
	for _, denied := range []bool{false, true} {
		for _, on := range []bool{false, true} {
			b.Run(fmt.Sprintf("denied=%v/metrics=%v", denied, on), func(b *testing.B) {
				store := &testkit.Store{Store: counter.NewMemoryStore(counter.MemoryConfig{})}
				opts := []Option{WithoutDetector()}
				if on {
					opts = append(opts, WithMetrics(prometheus.NewRegistry()))
				}
				e, err := New(store, opts...)
				if err != nil {
					b.Fatal(err)
				}
				defer e.Close()
				ctx := context.Background()
				p := &Policy{Name: "api", Limit: PerSecond(1 << 40)}
				if denied {
					p = &Policy{Name: "api", Limit: Limit{Rate: 1, Period: time.Hour}}
				}
				for _, k := range keys {
					e.Allow(ctx, k, p)
				}
				b.ReportAllocs()
				i := 0
				for b.Loop() {
					r, err := e.Allow(ctx, keys[i&(len(keys)-1)], p)
					if err != nil || r.Allowed == denied {
						b.Fatalf("%+v %v", r, err)
					}
					i++
				}
			})
		}
	}
}
