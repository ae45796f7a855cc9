package hotkey

import (
	"context"
	"testing"

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
		`hotkey_decisions_total{policy="api",result="allowed"}`:          5,
		`hotkey_decisions_total{policy="api",result="denied"}`:           3,
		`hotkey_decisions_total{policy="api",result="fallback_allowed"}`: 4,
		`hotkey_decisions_total{policy="default",result="invalid"}`:      1,
		`hotkey_hot_keys{level="16"}`:                                    1,
		`hotkey_hot_keys{level="4"}`:                                     1,
		`hotkey_level_changes_total{level="16"}`:                         1,
		`hotkey_breaker_open`:                                            1,
		`hotkey_breaker_changes_total{state="open"}`:                     1,
		`hotkey_store_errors_total`:                                      3,
		`hotkey_peers`:                                                   0,
	}
	got := map[string]float64{}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
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
