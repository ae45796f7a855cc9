package daemon

import (
	"fmt"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/hotkeyd/hotkey"
	"github.com/hotkeyd/hotkey/internal/envoyconf"
)

// TestDescMetrics checks the per-descriptor counts: hits, within and over
// the limit, near it (hits past 80%), shadow mode; and that labels beyond
// the rules' own paths stop at maxDetailedLabels.
func TestDescMetrics(t *testing.T) {
	dm := newDescMetrics(prometheus.NewRegistry())
	rule := &envoyconf.Rule{Domain: "d", Path: "d.user", RequestsPerUnit: 10}
	m := envoyconf.Match{Rule: rule, Key: "bob", Metric: rule.Path}
	get := func(v *prometheus.CounterVec, label string) float64 {
		return testutil.ToFloat64(v.WithLabelValues("d", label))
	}
	// 10 a period: 3 hits leave 7, 4 more leave 3 (7 used: none past 8),
	// 2 more leave 1 (9 used: 1 past 8), then 3 over.
	dm.count(m, 3, hotkey.Result{Allowed: true, Remaining: 7}, false, false)
	dm.count(m, 4, hotkey.Result{Allowed: true, Remaining: 3}, false, false)
	dm.count(m, 2, hotkey.Result{Allowed: true, Remaining: 1}, false, false)
	dm.count(m, 3, hotkey.Result{Remaining: 1}, true, false)
	for name, c := range map[string]struct {
		v    *prometheus.CounterVec
		want float64
	}{"hits": {dm.hits, 12}, "within": {dm.within, 9}, "near": {dm.near, 1}, "over": {dm.over, 3}, "shadow": {dm.shadow, 0}} {
		if got := get(c.v, "d.user"); got != c.want {
			t.Errorf("%s: %v, want %v", name, got, c.want)
		}
	}
	shadow := &envoyconf.Rule{Domain: "d", Path: "d.shadow", RequestsPerUnit: 1, ShadowMode: true}
	dm.count(envoyconf.Match{Rule: shadow, Metric: shadow.Path}, 2, hotkey.Result{}, true, true)
	if got := get(dm.shadow, "d.shadow"); got != 2 {
		t.Errorf("shadow: %v, want 2", got)
	}

	// Detailed labels: each its own until the cap, then the rule's path.
	detailed := &envoyconf.Rule{Domain: "d", Path: "d.ip", RequestsPerUnit: 10, DetailedMetric: true}
	for i := range maxDetailedLabels + 5 {
		dm.count(envoyconf.Match{Rule: detailed, Metric: fmt.Sprintf("d.ip_%d", i)}, 1, hotkey.Result{Allowed: true, Remaining: 9}, false, false)
	}
	if got := get(dm.hits, "d.ip_0"); got != 1 {
		t.Errorf("first detailed label: %v hits, want 1", got)
	}
	if got := get(dm.hits, "d.ip"); got != 5 {
		t.Errorf("rule's path after the cap: %v hits, want 5", got)
	}
	// A label seen before the cap keeps counting.
	dm.count(envoyconf.Match{Rule: detailed, Metric: "d.ip_7"}, 1, hotkey.Result{Allowed: true, Remaining: 9}, false, false)
	if got := get(dm.hits, "d.ip_7"); got != 2 {
		t.Errorf("known detailed label after the cap: %v hits, want 2", got)
	}
	// A descriptor's own limit: its path is the request's keys, counted
	// as a detailed label, and past the cap under overrideLabel.
	own, err := envoyconf.OverrideRule("d", 5, envoyconf.Hour, 1)
	if err != nil {
		t.Fatal(err)
	}
	dm.count(envoyconf.Match{Rule: own, Metric: "d.anything"}, 1, hotkey.Result{Allowed: true, Remaining: 4}, false, false)
	if got := get(dm.hits, overrideLabel); got != 1 {
		t.Errorf("own limit past the cap: %v hits under %q, want 1", got, overrideLabel)
	}
	// A long label is cut, and keeps a hash of the whole.
	long := strings.Repeat("x", 5000)
	if l := boundLabel(long); len(l) > maxLabelLen || l == boundLabel(long+"y") {
		t.Errorf("bounded label of 5,000 bytes: %d bytes, or not distinct", len(l))
	}
	if n := testutil.CollectAndCount(dm.hits); n != maxDetailedLabels+4 {
		t.Errorf("%d hit series, want %d (two rules, the detailed cap, the fallbacks)", n, maxDetailedLabels+4)
	}
}
