package envoyconf

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/hotkeyd/hotkey"
	"github.com/hotkeyd/hotkey/counter"
)

func writeFile(t *testing.T, path, data string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

// readDir reads the files of a flat directory.
func readDir(dir string) (map[string][]byte, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	out := make(map[string][]byte)
	for _, e := range ents {
		data, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			return nil, err
		}
		out[e.Name()] = data
	}
	return out, nil
}

// TestMatchOrder: a descriptor with the value before the wildcards (in
// file order) before the key alone; no fallback to a less specific
// descriptor once one matched.
func TestMatchOrder(t *testing.T) {
	c := mustParse(t, map[string]string{"a.yaml": `
domain: d
descriptors:
  - key: k
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: k
    value: a*
    rate_limit: {unit: second, requests_per_unit: 2}
  - key: k
    value: ab*
    rate_limit: {unit: second, requests_per_unit: 3}
  - key: k
    value: abc
    rate_limit: {unit: second, requests_per_unit: 4}
  - key: any
    value: "*"
    rate_limit: {unit: second, requests_per_unit: 5}
  - key: any
    rate_limit: {unit: second, requests_per_unit: 6}
  - key: mid
    value: bar*b
    rate_limit: {unit: second, requests_per_unit: 7}
  - key: p
    value: v
    rate_limit: {unit: second, requests_per_unit: 8}
  - key: p
    descriptors:
      - key: q
        rate_limit: {unit: second, requests_per_unit: 9}
`})
	for _, tc := range []struct {
		es   []Entry
		path string
	}{
		{entries("k", "abc"), "d.k_abc"},
		{entries("k", "abd"), "d.k_a*"},  // a* comes first in the file
		{entries("k", "ab*"), "d.k_ab*"}, // the value itself
		{entries("k", "b"), "d.k"},
		{entries("k", ""), "d.k"},
		{entries("any", ""), "d.any_*"},
		{entries("any", "x"), "d.any_*"},
		{entries("mid", "bar*b"), "d.mid_bar*b"}, // '*' only at the end is a wildcard
		{entries("mid", "barxb"), ""},
		{entries("p", "v", "q", "x"), ""}, // p=v matched, and has no nested descriptors
		{entries("p", "w", "q", "x"), "d.p.q"},
		{entries("p", "w"), ""},
		{entries("K", "abc"), ""}, // case-sensitive
	} {
		m, ok := c.Match("d", tc.es)
		got := ""
		if ok {
			got = m.Rule.Path
		}
		if got != tc.path {
			t.Errorf("%v: matched %q, want %q", tc.es, got, tc.path)
		}
	}
}

// TestMatchPairs: keys and values are matched as pairs, not as "key_value"
// strings.
func TestMatchPairs(t *testing.T) {
	c := mustParse(t, map[string]string{"a.yaml": `
domain: d
descriptors:
  - key: a
    value: b_c
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: x_y
    value: z
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: w
    value: v*
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: e_
    rate_limit: {unit: second, requests_per_unit: 1}
`})
	for _, tc := range []struct {
		es   []Entry
		path string
	}{
		{entries("a", "b_c"), "d.a_b_c"},
		{entries("a_b", "c"), ""},
		{entries("x_y", "z"), "d.x_y_z"},
		{entries("x", "y_z"), ""},
		{entries("w", "v1"), "d.w_v*"},
		{entries("w_v", "1"), ""},
		{entries("w_v1", "x"), ""},
		{entries("e", ""), ""},
		{entries("e_", "q"), "d.e_"},
	} {
		m, ok := c.Match("d", tc.es)
		got := ""
		if ok {
			got = m.Rule.Path
		}
		if got != tc.path {
			t.Errorf("%v: matched %q, want %q", tc.es, got, tc.path)
		}
	}
}

// TestKeysDistinct: two descriptors matching a rule never share a counter
// key, whatever their values hold, but through share_threshold.
func TestKeysDistinct(t *testing.T) {
	c := mustParse(t, map[string]string{"a.yaml": `
domain: d
descriptors:
  - key: one
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: a
    descriptors:
      - key: b
        rate_limit: {unit: second, requests_per_unit: 1}
  - key: s
    value: p*
    share_threshold: true
    descriptors:
      - key: t
        rate_limit: {unit: second, requests_per_unit: 1}
`})
	var values []string
	var gen func(prefix string, n int)
	gen = func(prefix string, n int) {
		values = append(values, prefix)
		if n == 0 {
			return
		}
		for _, ch := range []string{"a", ",", `\`, "~", "\xff"} {
			gen(prefix+ch, n-1)
		}
	}
	gen("", 3)
	long := strings.Repeat("x", hotkey.DefaultMaxKeyLen)
	values = append(values, long, long+"y", long[:hotkey.DefaultMaxKeyLen-1], `\~`, `~\`)
	// a value spelling the hashed key of another descriptor
	sum := sha256.Sum256([]byte(long + "y"))
	values = append(values, "~"+hex.EncodeToString(sum[:]), "~~", `\\~`)
	// values that are not UTF-8, and values spelling their escapes
	values = append(values, "Espa\xf1a", `Espa\xf1a`, "España", "\xc3", `\xc3`, `\\xff`, "\ufffd")
	slices.Sort(values)
	values = slices.Compact(values)

	keyOf := func(es []Entry) string {
		m, ok := c.Match("d", es)
		if !ok {
			t.Fatalf("%v: no match", es)
		}
		if m.Key == "" || len(m.Key) > hotkey.DefaultMaxKeyLen || !utf8.ValidString(m.Key) {
			t.Fatalf("%v: key %q of %d bytes", es, m.Key, len(m.Key))
		}
		return m.Key
	}
	seen := make(map[string]string)
	for _, v := range values {
		es := entries("one", v)
		k := keyOf(es)
		if prev, ok := seen[k]; ok {
			t.Fatalf("one=%q and one=%q share key %q", prev, v, k)
		}
		seen[k] = v
	}
	if k := keyOf(entries("one", "plain")); k != "plain" {
		t.Errorf("single entry key %q, want the value", k)
	}
	if k := keyOf(entries("one", `a,b\c`)); k != `a\,b\\c` {
		t.Errorf("escaped key %q", k)
	}
	if k := keyOf(entries("one", "Espa\xf1a")); k != `Espa\xf1a` {
		t.Errorf("key of a value that is not UTF-8: %q", k)
	}
	if k := keyOf(entries("one", long+"y")); k != "~"+hex.EncodeToString(sum[:]) {
		t.Errorf("long key %q, want ~ and its sha256", k)
	}
	seen = make(map[string]string)
	for _, v1 := range values {
		for _, v2 := range values {
			k := keyOf(entries("a", v1, "b", v2))
			id := fmt.Sprintf("%q,%q", v1, v2)
			if prev, ok := seen[k]; ok {
				t.Fatalf("a,b = %s and %s share key %q", prev, id, k)
			}
			seen[k] = id
		}
	}
	// share_threshold: one key for every value matching the pattern.
	k1, k2 := keyOf(entries("s", "p1", "t", "x")), keyOf(entries("s", "p2", "t", "x"))
	if k1 != "p*,x" || k2 != k1 {
		t.Errorf("shared keys %q %q, want p*,x", k1, k2)
	}
	if k := keyOf(entries("s", "p1", "t", "y")); k == k1 {
		t.Errorf("t=y shares t=x's key %q", k)
	}
}

// TestMetrics: detailed_metric, value_to_metric and share_threshold as the
// reference's tests have them.
func TestMetrics(t *testing.T) {
	c := mustParse(t, map[string]string{"a.yaml": `
domain: d
descriptors:
  - key: route
    value_to_metric: true
    descriptors:
      - key: method
        value: GET
        value_to_metric: true
        descriptors:
          - key: subject
            rate_limit: {unit: minute, requests_per_unit: 60}
      - key: method
        value_to_metric: true
        descriptors:
          - key: subject
            detailed_metric: true
            rate_limit: {unit: minute, requests_per_unit: 60}
  - key: k1
    descriptors:
      - key: k2
        value_to_metric: true
        descriptors:
          - key: k3
            rate_limit: {unit: second, requests_per_unit: 1}
  - key: service
    value: svc/*
    share_threshold: true
    descriptors:
      - key: endpoint
        detailed_metric: true
        rate_limit: {unit: minute, requests_per_unit: 80}
  - key: files
    value: top/*
    share_threshold: true
    descriptors:
      - key: files
        value: nested/*
        share_threshold: true
        rate_limit: {unit: minute, requests_per_unit: 300}
  - key: w
    value: x*
    rate_limit: {unit: minute, requests_per_unit: 1}
`})
	for _, tc := range []struct {
		es     []Entry
		metric string
	}{
		{entries("route", "api", "method", "GET", "subject", "1"), "d.route_api.method_GET.subject"},
		{entries("route", "", "method", "GET", "subject", "1"), "d.route.method_GET.subject"},
		// detailed_metric wins over value_to_metric
		{entries("route", "api", "method", "POST", "subject", "1"), "d.route_api.method_POST.subject_1"},
		{entries("route", "", "method", "POST", "subject", "1"), "d.route_.method_POST.subject_1"},
		{entries("k1", "X", "k2", "Y", "k3", "Z"), "d.k1.k2_Y.k3"},
		{entries("service", "svc/user", "endpoint", "get"), "d.service_svc/*.endpoint_get"},
		{entries("service", "svc/user", "endpoint", ""), "d.service_svc/*.endpoint"},
		{entries("files", "top/1", "files", "nested/2"), "d.files_top/*.files_nested/*"},
		{entries("w", "x1"), "d.w_x*"},
	} {
		m, ok := c.Match("d", tc.es)
		if !ok {
			t.Errorf("%v: no match", tc.es)
			continue
		}
		if m.Metric != tc.metric {
			t.Errorf("%v: metric %q, want %q", tc.es, m.Metric, tc.metric)
		}
	}
}

func TestReplaced(t *testing.T) {
	a := &Rule{Name: "a"}
	b := &Rule{Name: "b", Replaces: []string{"a"}}
	u := &Rule{Name: "u", Unlimited: true, Replaces: []string{"b"}}
	v := &Rule{Name: "v", Unlimited: true}
	w := &Rule{Replaces: []string{"v"}}
	for _, tc := range []struct {
		rules []*Rule
		want  string
	}{
		{nil, ""},
		{[]*Rule{a, nil}, "--"},
		{[]*Rule{a, b}, "x-"},
		{[]*Rule{b, a, a}, "-xx"},
		{[]*Rule{a, b, u}, "xx-"}, // an unlimited rule's replaces count
		{[]*Rule{v, w}, "--"},     // an unlimited rule is never dropped
		{[]*Rule{nil, b}, "--"},
	} {
		var got strings.Builder
		for _, x := range Replaced(tc.rules) {
			if x {
				got.WriteByte('x')
			} else {
				got.WriteByte('-')
			}
		}
		if got.String() != tc.want {
			t.Errorf("%d rules: %s, want %s", len(tc.rules), got.String(), tc.want)
		}
	}
}

func TestPolicyName(t *testing.T) {
	hash := func(p string) string {
		s := sha256.Sum256([]byte(p))
		return hex.EncodeToString(s[:8])
	}
	short := "rl.foo.bar_bkthomps"
	if got := PolicyName(short); got != "envoy/"+short {
		t.Errorf("%s: %s", short, got)
	}
	fits := strings.Repeat("a", 114)
	if got := PolicyName(fits); got != "envoy/"+fits {
		t.Errorf("114 bytes: %s", got)
	}
	long := strings.Repeat("a", 115)
	if got, want := PolicyName(long), "envoy/"+long[:97]+"~"+hash(long); got != want {
		t.Errorf("115 bytes: %s, want %s", got, want)
	}
	if got, want := PolicyName("d.a|b"), "envoy/d.a_b~"+hash("d.a|b"); got != want {
		t.Errorf("|: %s, want %s", got, want)
	}
	if PolicyName("d.a|b") == PolicyName("d.a_b") || PolicyName("d.a|b") == PolicyName("d.a||b") {
		t.Error("paths differing in | share a name")
	}
	multi := strings.Repeat("é", 100) // 2 bytes each: the cut falls inside one
	got := PolicyName(multi)
	if len(got) > 120 || !utf8.ValidString(got) || !strings.HasPrefix(got, "envoy/"+strings.Repeat("é", 48)+"~") {
		t.Errorf("multibyte: %q (%d bytes)", got, len(got))
	}
}

// TestPolicies: the extensions algorithm, on_store_failure and sync, and
// the defaults.
func TestPolicies(t *testing.T) {
	c := mustParse(t, map[string]string{"a.yaml": `
domain: d
descriptors:
  - key: default
    rate_limit: {unit: second, requests_per_unit: 5}
  - key: tb
    rate_limit: {unit: minute, requests_per_unit: 7, algorithm: token_bucket, on_store_failure: closed, sync: gossip}
  - key: fw
    rate_limit: {unit: hour, requests_per_unit: 8, algorithm: fixed_window, on_store_failure: open, sync: reserve}
  - key: sl
    rate_limit: {unit: day, requests_per_unit: 9, algorithm: sliding_log}
  - key: zero
    rate_limit: {unit: day, requests_per_unit: 0, algorithm: token_bucket}
  - key: un
    rate_limit: {unlimited: true, requests_per_unit: 3, name: un}
  - key: ` + strings.Repeat("k", 200) + `
    rate_limit: {unit: second, requests_per_unit: 1}
`})
	pol := func(key string) *hotkey.Policy {
		m, ok := c.Match("d", entries(key, "v"))
		if !ok {
			t.Fatalf("%s: no match", key)
		}
		return m.Rule.Policy
	}
	for _, tc := range []struct {
		key  string
		lim  counter.Limit
		fb   hotkey.Fallback
		sync hotkey.Sync
	}{
		{"default", counter.Limit{Algorithm: counter.SlidingWindow, Rate: 5, Period: Second.Duration()}, hotkey.FallbackLocal, hotkey.SyncStore},
		{"tb", counter.Limit{Algorithm: counter.TokenBucket, Rate: 7, Period: Minute.Duration(), Burst: 7}, hotkey.FallbackClosed, hotkey.SyncGossip},
		{"fw", counter.Limit{Algorithm: counter.FixedWindow, Rate: 8, Period: Hour.Duration()}, hotkey.FallbackOpen, hotkey.SyncReserve},
		{"sl", counter.Limit{Algorithm: counter.SlidingLog, Rate: 9, Period: Day.Duration()}, hotkey.FallbackLocal, hotkey.SyncStore},
	} {
		p := pol(tc.key)
		if p == nil || p.Limit != tc.lim || p.OnStoreFailure != tc.fb || p.Sync != tc.sync || p.Name != "envoy/d."+tc.key {
			t.Errorf("%s: %+v, want %+v %v %v", tc.key, p, tc.lim, tc.fb, tc.sync)
		}
	}
	if p := pol("zero"); p != nil {
		t.Errorf("zero: policy %+v", p)
	}
	if m, _ := c.Match("d", entries("un", "v")); m.Rule.Policy != nil || m.Rule.RequestsPerUnit != 3 || m.Rule.Name != "un" {
		t.Errorf("unlimited: %+v", m.Rule)
	}
	long := "d." + strings.Repeat("k", 200)
	if p := pol(strings.Repeat("k", 200)); p == nil || p.Name != PolicyName(long) || len(p.Name) != 120 {
		t.Errorf("long: %+v", p)
	}
	// Same configuration, same names.
	again := mustParse(t, map[string]string{"b.yaml": "domain: d\ndescriptors:\n  - key: " + strings.Repeat("k", 200) + "\n    rate_limit: {unit: second, requests_per_unit: 1}\n"})
	if a, b := c.Rules()[6].Policy.Name, again.Rules()[0].Policy.Name; a != b {
		t.Errorf("names differ: %s %s", a, b)
	}
}

// TestCompat: what envoyproxy/ratelimit accepts loads: nothing for a
// value, YAML 1.1 booleans, aliases, a top level without descriptors,
// numbers as keys and values.
func TestCompat(t *testing.T) {
	c := mustParse(t, map[string]string{
		"a.yaml": `
domain: d
descriptors:
  - key: a
    value:
    shadow_mode: yes
    quota_mode: on
    rate_limit: &lim
      unit: SECOND
      requests_per_unit: 0x10
      name:
      replaces:
  - key: 42
    value: 1.50
    detailed_metric: True
    rate_limit: *lim
  - key: n
    rate_limit:
  - key: e
    value: ""
    descriptors:
`,
		"b.yml": "domain: empty\n",
	})
	m, ok := c.Match("d", entries("a", "x"))
	if !ok || !m.Rule.ShadowMode || !m.Rule.QuotaMode || m.Rule.RequestsPerUnit != 16 || m.Rule.Unit != Second || m.Rule.Name != "" {
		t.Errorf("a: %+v", m.Rule)
	}
	m, ok = c.Match("d", entries("42", "1.50"))
	if !ok || !m.Rule.DetailedMetric || m.Rule.RequestsPerUnit != 16 || m.Rule.Path != "d.42_1.50" {
		t.Errorf("42: %+v", m.Rule)
	}
	if _, ok := c.Match("d", entries("n", "x")); ok {
		t.Error("rate_limit with nothing: a rule")
	}
	if _, ok := c.Match("empty", entries("a", "x")); ok {
		t.Error("domain without descriptors: a match")
	}
}

// TestOverrideKey: descriptors that carry their own limit share a counter
// only if their unit, keys and values are the same.
func TestOverrideKey(t *testing.T) {
	seen := map[string][]Entry{}
	for _, es := range [][]Entry{
		{{"a", "b"}},
		{{"a.b", ""}},
		{{"a", "b"}, {"c", "d"}},
		{{"a", "b,c"}, {"", "d"}},
		{{"a,b", "c"}, {"d", ""}},
		{{"a", "b\\"}, {"c", "d"}},
		{{"b", "a"}},
		{{"~x", "y"}},
		{{"", ""}},
		{{"a", "\xff"}},
		{{"a", `\xff`}},
		{{"\xff", "b"}},
	} {
		for _, u := range []Unit{Hour, Day} {
			for _, m := range []uint32{1, 2, 24} {
				k := OverrideKey(u, m, es)
				if prev, ok := seen[k]; ok {
					t.Errorf("%v and %d × %v %v share the key %q", prev, m, u, es, k)
				}
				seen[k] = es
			}
		}
	}
	if k := OverrideKey(Hour, 1, []Entry{{"user", "bob"}}); k != "hour,user,bob" {
		t.Errorf("OverrideKey(hour, user bob) = %q", k)
	}
	if k := OverrideKey(Hour, 2, []Entry{{"user", "bob"}}); k != "2*hour,user,bob" {
		t.Errorf("OverrideKey(2 × hour, user bob) = %q", k)
	}
	r, err := OverrideRule("edge", 5, Minute, 1)
	if err != nil || r.Policy == nil || r.Policy.Name != "envoy-override/edge" || r.Policy.Limit.Rate != 5 || r.Policy.Limit.Period != time.Minute || !r.Override {
		t.Errorf("OverrideRule: %+v, %v", r, err)
	}
	if r, err := OverrideRule("edge", 5, Hour, 3); err != nil || r.Policy.Limit.Period != 3*time.Hour || r.Period() != 3*time.Hour {
		t.Errorf("OverrideRule of 5 per 3 hours: %+v, %v", r, err)
	}
	if r, err := OverrideRule("edge", 0, Minute, 1); err != nil || r.Policy != nil {
		t.Errorf("OverrideRule of 0: a policy %+v, %v", r.Policy, err)
	}
	// What cannot be enforced is an error: a unit of 0, a multiplier of 0,
	// a period over what a store times exactly (1000 years).
	for _, c := range []struct {
		unit Unit
		mult uint32
	}{{0, 1}, {Hour, 0}, {Year, 1000}, {Year, math.MaxUint32}} {
		if r, err := OverrideRule("edge", 5, c.unit, c.mult); err == nil {
			t.Errorf("OverrideRule of 5 per %d × %v: %+v, want an error", c.mult, c.unit, r)
		}
	}
}
