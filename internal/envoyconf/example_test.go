package envoyconf

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hotkeyd/hotkey"
	"github.com/hotkeyd/hotkey/counter"
)

// entries builds a descriptor from key, value pairs.
func entries(kv ...string) []Entry {
	es := make([]Entry, 0, len(kv)/2)
	for i := 0; i+1 < len(kv); i += 2 {
		es = append(es, Entry{kv[i], kv[i+1]})
	}
	return es
}

func mustLoad(t *testing.T, path string) *Config {
	t.Helper()
	c, err := Load(path)
	if err != nil {
		t.Fatalf("Load(%s): %v", path, err)
	}
	return c
}

func mustParse(t *testing.T, files map[string]string) *Config {
	t.Helper()
	m := make(map[string][]byte, len(files))
	for n, s := range files {
		m[n] = []byte(s)
	}
	c, err := Parse(m)
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	return c
}

// want is what a descriptor should match; path "" means no match.
type want struct {
	path      string
	rpu       uint32
	unit      Unit
	unlimited bool
	shadow    bool
	key       string
	metric    string // "" reads path
}

func check(t *testing.T, c *Config, domain string, es []Entry, w want) Match {
	t.Helper()
	m, ok := c.Match(domain, es)
	if w.path == "" {
		if ok {
			t.Errorf("%s %v: matched %s, want no match", domain, es, m.Rule.Path)
		}
		return m
	}
	if !ok {
		t.Errorf("%s %v: no match, want %s", domain, es, w.path)
		return m
	}
	r := m.Rule
	if r.Path != w.path {
		t.Errorf("%s %v: matched %s, want %s", domain, es, r.Path, w.path)
	}
	if r.Unlimited != w.unlimited || r.ShadowMode != w.shadow {
		t.Errorf("%s %v: unlimited %v shadow %v, want %v %v", domain, es, r.Unlimited, r.ShadowMode, w.unlimited, w.shadow)
	}
	if !w.unlimited && (r.RequestsPerUnit != w.rpu || r.Unit != w.unit) {
		t.Errorf("%s %v: %d per %v, want %d per %v", domain, es, r.RequestsPerUnit, r.Unit, w.rpu, w.unit)
	}
	switch {
	case w.unlimited || w.rpu == 0:
		if r.Policy != nil {
			t.Errorf("%s %v: policy %+v, want none", domain, es, r.Policy)
		}
	case r.Policy == nil:
		t.Errorf("%s %v: no policy", domain, es)
	default:
		lim := counter.Limit{Algorithm: counter.SlidingWindow, Rate: int64(w.rpu), Period: w.unit.Duration()}
		if r.Policy.Limit != lim || r.Policy.Name != "envoy/"+w.path || r.Policy.OnStoreFailure != hotkey.FallbackLocal {
			t.Errorf("%s %v: policy %+v, want %s %+v local", domain, es, r.Policy, "envoy/"+w.path, lim)
		}
	}
	if m.Key != w.key {
		t.Errorf("%s %v: key %q, want %q", domain, es, m.Key, w.key)
	}
	metric := w.metric
	if metric == "" {
		metric = w.path
	}
	if m.Metric != metric {
		t.Errorf("%s %v: metric %q, want %q", domain, es, m.Metric, metric)
	}
	return m
}

// matchRules matches each descriptor and returns the rules (nil for none).
func matchRules(c *Config, domain string, descs ...[]Entry) []*Rule {
	rs := make([]*Rule, len(descs))
	for i, d := range descs {
		if m, ok := c.Match(domain, d); ok {
			rs[i] = m.Rule
		}
	}
	return rs
}

// TestRatelimitExample loads envoyproxy/ratelimit's example configuration
// directory and checks the behaviours its README's "Full test
// environment" lists, and the rest of its rules.
func TestRatelimitExample(t *testing.T) {
	c := mustLoad(t, filepath.Join("testdata", "ratelimit-example"))
	if got := strings.Join(c.Domains(), ","); got != "mongo_cps,rl" {
		t.Fatalf("domains %s", got)
	}
	const rl = "rl"
	// curl localhost:8888/test
	check(t, c, rl, entries("source_cluster", "proxy", "destination_cluster", "mock"),
		want{path: "rl.source_cluster_proxy.destination_cluster_mock", rpu: 1, unit: Minute, key: "proxy,mock"})
	// /header -H "foo: foo"
	check(t, c, rl, entries("foo", "foo"), want{path: "rl.foo", rpu: 2, unit: Minute, key: "foo"})
	// /twoheader -H "foo: foo" -H "bar: bar"
	check(t, c, rl, entries("foo", "foo", "bar", "bar"), want{path: "rl.foo.bar", rpu: 3, unit: Minute, key: "foo,bar"})
	// /twoheader -H "foo: foo" -H "baz: baz": 1 a second
	check(t, c, rl, entries("foo", "foo", "baz", "baz"), want{path: "rl.foo.baz", rpu: 1, unit: Second, key: "foo,baz"})
	// /twoheader -H "foo: foo" -H "bar: banned": every request over
	m := check(t, c, rl, entries("foo", "foo", "bar", "banned"), want{path: "rl.foo.bar_banned", rpu: 0, unit: Minute, key: "foo,banned"})
	if m.Rule != nil && m.Rule.Name != "banned_limit" {
		t.Errorf("banned rule named %q", m.Rule.Name)
	}
	// /twoheader -H "foo: foo" -H "baz: shady": shadow mode
	check(t, c, rl, entries("foo", "foo", "baz", "shady"), want{path: "rl.foo.baz_shady", rpu: 3, unit: Minute, shadow: true, key: "foo,shady"})
	// /twoheader -H "foo: foo" -H "baz: not-so-shady"
	check(t, c, rl, entries("foo", "foo", "baz", "not-so-shady"), want{path: "rl.foo.baz_not-so-shady", rpu: 3, unit: Minute, key: "foo,not-so-shady"})

	// Unlimited rules.
	check(t, c, rl, entries("foo", "x", "bay", "y"), want{path: "rl.foo.bay", unlimited: true, key: "x,y"})
	check(t, c, rl, entries("qux", "anything"), want{path: "rl.qux", unlimited: true, key: "anything"})
	// detailed_metric: the runtime value in the metric.
	check(t, c, rl, entries("unspec", "abc"), want{path: "rl.unspec", rpu: 2, unit: Minute, key: "abc", metric: "rl.unspec_abc"})
	check(t, c, rl, entries("unspec", "def"), want{path: "rl.unspec", rpu: 2, unit: Minute, key: "def", metric: "rl.unspec_def"})
	// No rule: unknown domain, unknown key, a request deeper than the rules.
	check(t, c, "nope", entries("foo", "foo"), want{})
	check(t, c, rl, entries("nope", "foo"), want{})
	check(t, c, rl, entries("foo", "foo", "bar", "bar", "baz", "baz"), want{})
	check(t, c, rl, entries("source_cluster", "proxy"), want{})
	check(t, c, rl, nil, want{})
	check(t, c, "mongo_cps", entries("database", "users"), want{path: "mongo_cps.database_users", rpu: 500, unit: Second, key: "users"})
	check(t, c, "mongo_cps", entries("database", "other"), want{})

	// replaces: /fiveheader sends (foo, bar), (source_cluster,
	// destination_cluster) and (category).
	bkthomps := entries("foo", "foo", "bar", "bkthomps")
	account := entries("category", "account")
	rs := matchRules(c, rl, bkthomps, entries("source_cluster", "proxy", "destination_cluster", "fake"), account)
	if got := Replaced(rs); !slices.Equal(got, []bool{true, true, false}) {
		t.Errorf("bkthomps, fake, account: replaced %v, want the first two", got)
	}
	if got := Replaced(matchRules(c, rl, bkthomps)); !slices.Equal(got, []bool{false}) {
		t.Errorf("bkthomps alone: replaced %v", got)
	}
	rs = matchRules(c, rl, entries("foo", "foo", "bar", "banned"), entries("source_cluster", "proxy", "destination_cluster", "override"), entries("nope", "x"))
	if got := Replaced(rs); !slices.Equal(got, []bool{true, false, false}) {
		t.Errorf("banned, override, unmatched: replaced %v, want the banned one", got)
	}
	rs = matchRules(c, rl, entries("source_cluster", "proxy", "destination_cluster", "bkthomps"), bkthomps)
	if got := Replaced(rs); !slices.Equal(got, []bool{false, true}) {
		t.Errorf("destination bkthomps, bar bkthomps: replaced %v", got)
	}
	if r := rs[0]; r == nil || !slices.Equal(r.Replaces, []string{"bkthomps"}) {
		t.Errorf("replaces of %v", r)
	}

	// Rules: by domain, then in file order.
	var paths []string
	for _, r := range c.Rules() {
		paths = append(paths, r.Path)
	}
	wantPaths := []string{
		"mongo_cps.database_users", "mongo_cps.database_default",
		"rl.category_account",
		"rl.source_cluster_proxy.destination_cluster_bkthomps", "rl.source_cluster_proxy.destination_cluster_mock",
		"rl.source_cluster_proxy.destination_cluster_override", "rl.source_cluster_proxy.destination_cluster_fake",
		"rl.foo", "rl.foo.bar", "rl.foo.bar_bkthomps", "rl.foo.bar_banned", "rl.foo.baz", "rl.foo.baz_not-so-shady",
		"rl.foo.baz_shady", "rl.foo.bay", "rl.unspec", "rl.qux",
	}
	if !slices.Equal(paths, wantPaths) {
		t.Errorf("rules\n%s\nwant\n%s", strings.Join(paths, "\n"), strings.Join(wantPaths, "\n"))
	}
	r := c.Rules()[0]
	if r.Domain != "mongo_cps" || r.File != filepath.Join("testdata", "ratelimit-example", "config.yaml") || r.Line != 5 {
		t.Errorf("first rule %s at %s:%d", r.Domain, r.File, r.Line)
	}
}

func TestReadmeExamples(t *testing.T) {
	load := func(t *testing.T, name string) *Config {
		t.Helper()
		return mustLoad(t, filepath.Join("testdata", "readme", name))
	}
	t.Run("1", func(t *testing.T) {
		c := load(t, "example01.yaml")
		check(t, c, "mongo_cps", entries("database", "users"), want{path: "mongo_cps.database_users", rpu: 500, unit: Second, key: "users"})
		check(t, c, "mongo_cps", entries("database", "default"), want{path: "mongo_cps.database_default", rpu: 500, unit: Second, key: "default"})
		check(t, c, "mongo_cps", entries("database", "other"), want{})
	})
	t.Run("2", func(t *testing.T) {
		c := load(t, "example02.yaml")
		const p = "messaging.message_type_marketing.to_number"
		check(t, c, "messaging", entries("message_type", "marketing", "to_number", "2061111111"), want{path: p, rpu: 5, unit: Day, key: "marketing,2061111111"})
		check(t, c, "messaging", entries("message_type", "marketing", "to_number", "2062222222"), want{path: p, rpu: 5, unit: Day, key: "marketing,2062222222"})
		check(t, c, "messaging", entries("to_number", "2061111111"), want{path: "messaging.to_number", rpu: 100, unit: Day, key: "2061111111"})
		check(t, c, "messaging", entries("message_type", "marketing"), want{})
		check(t, c, "messaging", entries("message_type", "other", "to_number", "2061111111"), want{})
	})
	t.Run("3", func(t *testing.T) {
		c := load(t, "example03.yaml")
		check(t, c, "edge_proxy_per_ip", entries("remote_address", "50.0.0.1"), want{path: "edge_proxy_per_ip.remote_address", rpu: 10, unit: Second, key: "50.0.0.1"})
		check(t, c, "edge_proxy_per_ip", entries("remote_address", "50.0.0.5"), want{path: "edge_proxy_per_ip.remote_address_50.0.0.5", rpu: 0, unit: Second, key: "50.0.0.5"})
	})
	t.Run("4", func(t *testing.T) {
		req := entries("key", "value", "subkey", "subvalue")
		a := load(t, "example04a.yaml")
		check(t, a, "example4", req, want{})
		check(t, a, "example4", entries("key", "value"), want{path: "example4.key_value", rpu: 300, unit: Second, key: "value"})
		b := load(t, "example04b.yaml")
		check(t, b, "example4", req, want{path: "example4.key_value.subkey", rpu: 300, unit: Second, key: "value,subvalue"})
		check(t, b, "example4", entries("key", "value"), want{})
	})
	t.Run("5", func(t *testing.T) {
		c := load(t, "example05.yaml")
		m := check(t, c, "internal", entries("ldap", "x"), want{path: "internal.ldap", unlimited: true, key: "x"})
		if m.Rule != nil && m.Rule.Unit != 0 {
			t.Errorf("unlimited rule has unit %v", m.Rule.Unit)
		}
		check(t, c, "internal", entries("azure", "x"), want{path: "internal.azure", rpu: 100, unit: Minute, key: "x"})
	})
	t.Run("6", func(t *testing.T) {
		c := load(t, "example06.yaml")
		check(t, c, "example6", entries("service", "auth-service", "user", "user-a"), want{path: "example6.service.user_user-a", rpu: 10, unit: Second, shadow: true, key: "auth-service,user-a"})
		check(t, c, "example6", entries("service", "auth-service", "user", "user-b"), want{path: "example6.service.user_user-b", rpu: 20, unit: Second, key: "auth-service,user-b"})
		check(t, c, "example6", entries("service", "auth-service", "user", "user-c"), want{})
	})
	t.Run("7", func(t *testing.T) {
		c := load(t, "example07.yaml")
		d1 := entries("key_1", "value_1", "user", "bkthomps")
		d2 := entries("key_2", "value_2", "user", "bkthomps")
		check(t, c, "example7", d1, want{path: "example7.key_1_value_1.user_bkthomps", rpu: 5, unit: Second, key: "value_1,bkthomps"})
		check(t, c, "example7", d2, want{path: "example7.key_2_value_2.user_bkthomps", rpu: 10, unit: Second, key: "value_2,bkthomps"})
		for _, tc := range []struct {
			descs [][]Entry
			want  []bool
		}{
			{[][]Entry{d1}, []bool{false}},
			{[][]Entry{d2}, []bool{false}},
			{[][]Entry{d1, d2}, []bool{true, false}},
			{[][]Entry{d2, d1}, []bool{false, true}},
		} {
			if got := Replaced(matchRules(c, "example7", tc.descs...)); !slices.Equal(got, tc.want) {
				t.Errorf("%v: replaced %v, want %v", tc.descs, got, tc.want)
			}
		}
	})
	t.Run("8", func(t *testing.T) {
		c := load(t, "example08.yaml")
		check(t, c, "example8", entries("key1", "unspecified_value"), want{path: "example8.key1", rpu: 10, unit: Minute, key: "unspecified_value", metric: "example8.key1_unspecified_value"})
		check(t, c, "example8", entries("key1", "unspecified_value2"), want{path: "example8.key1", rpu: 10, unit: Minute, key: "unspecified_value2", metric: "example8.key1_unspecified_value2"})
		check(t, c, "example8", entries("key1", "value1"), want{path: "example8.key1_value1", rpu: 20, unit: Minute, key: "value1"})
	})
	t.Run("9", func(t *testing.T) {
		c := load(t, "example09.yaml")
		check(t, c, "example9", entries("key1", "value_1"), want{path: "example9.key1_value*", rpu: 20, unit: Minute, key: "value_1"})
		check(t, c, "example9", entries("key1", "value_2"), want{path: "example9.key1_value*", rpu: 20, unit: Minute, key: "value_2"})
		check(t, c, "example9", entries("key1", "other"), want{})
	})
	t.Run("10", func(t *testing.T) {
		c := load(t, "example10a.yaml")
		const p = "example10.route.http_method.subject_id"
		check(t, c, "example10", entries("route", "api", "http_method", "GET", "subject_id", "123"),
			want{path: p, rpu: 60, unit: Minute, key: "api,GET,123", metric: "example10.route_api.http_method_GET.subject_id"})
		check(t, c, "example10", entries("route", "web", "http_method", "POST", "subject_id", "456"),
			want{path: p, rpu: 60, unit: Minute, key: "web,POST,456", metric: "example10.route_web.http_method_POST.subject_id"})
		w := load(t, "example10b.yaml")
		check(t, w, "example10_wildcard", entries("user", "alice", "action", "readfile", "resource", "documents"),
			want{path: "example10_wildcard.user.action_read*.resource", rpu: 100, unit: Minute, key: "alice,readfile,documents", metric: "example10_wildcard.user_alice.action_readfile.resource"})
		check(t, w, "example10_wildcard", entries("user", "alice", "action", "write", "resource", "documents"), want{})
	})
	t.Run("11", func(t *testing.T) {
		c := load(t, "example11a.yaml")
		for _, v := range []string{"files/a.pdf", "files/b.csv", "files/c.txt"} {
			check(t, c, "example11", entries("files", v), want{path: "example11.files_files/*", rpu: 10, unit: Hour, key: "files/*"})
		}
		for _, v := range []string{"files_no_share/a.pdf", "files_no_share/b.csv"} {
			check(t, c, "example11", entries("files_no_share", v), want{path: "example11.files_no_share_files_no_share/*", rpu: 10, unit: Hour, key: v})
		}
		// The README's prose gives "example11_metrics.route_api.method_GET";
		// envoyproxy/ratelimit's code and tests give the pattern and no
		// value for method (which has no value_to_metric): so does this.
		m := mustLoad(t, filepath.Join("testdata", "readme", "example11b.yaml"))
		check(t, m, "example11_metrics", entries("route", "api/v1", "method", "GET"),
			want{path: "example11_metrics.route_api/*.method", rpu: 60, unit: Minute, key: "api/*,GET"})
		check(t, m, "example11_metrics", entries("route", "api/v2", "method", "POST"),
			want{path: "example11_metrics.route_api/*.method", rpu: 60, unit: Minute, key: "api/*,POST"})
	})
}

// TestReadmeDirectory loads the README's examples as a directory: both
// configurations of Example 4 are for one domain, which is refused; without
// the second, the rest load.
func TestReadmeDirectory(t *testing.T) {
	dir := filepath.Join("testdata", "readme")
	_, err := Load(dir)
	wantErr := filepath.Join(dir, "example04b.yaml") + `: line 2: domain: domain "example4" is already defined in ` + filepath.Join(dir, "example04a.yaml") + " (line 2)"
	if err == nil || !strings.HasPrefix(err.Error(), wantErr) {
		t.Fatalf("Load(%s) = %v, want %s", dir, err, wantErr)
	}
	tmp := t.TempDir()
	ents, err := readDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for name, data := range ents {
		if name != "example04b.yaml" {
			writeFile(t, filepath.Join(tmp, name), string(data))
		}
	}
	c := mustLoad(t, tmp)
	wantDomains := "edge_proxy_per_ip,example10,example10_wildcard,example11,example11_metrics,example4,example6,example7,example8,example9,internal,messaging,mongo_cps"
	if got := strings.Join(c.Domains(), ","); got != wantDomains {
		t.Errorf("domains %s\nwant %s", got, wantDomains)
	}
	check(t, c, "example9", entries("key1", "value_1"), want{path: "example9.key1_value*", rpu: 20, unit: Minute, key: "value_1"})
	if n := len(c.Rules()); n != 21 {
		t.Errorf("%d rules, want 21", n)
	}
}

func TestUnit(t *testing.T) {
	for _, tc := range []struct {
		u    Unit
		name string
		d    time.Duration
	}{
		{0, "unknown", 0},
		{Second, "second", time.Second},
		{Minute, "minute", time.Minute},
		{Hour, "hour", time.Hour},
		{Day, "day", 24 * time.Hour},
		{Week, "week", 7 * 24 * time.Hour},
		{Month, "month", 30 * 24 * time.Hour},
		{Year, "year", 365 * 24 * time.Hour},
		{8, "Unit(8)", 0},
	} {
		if tc.u.String() != tc.name || tc.u.Duration() != tc.d {
			t.Errorf("%d: %s %v, want %s %v", int(tc.u), tc.u, tc.u.Duration(), tc.name, tc.d)
		}
	}
	// The RLS proto's numbers.
	if Second != 1 || Minute != 2 || Hour != 3 || Day != 4 || Month != 5 || Year != 6 || Week != 7 {
		t.Error("units not numbered as RateLimitResponse.RateLimit.Unit")
	}
	for _, s := range []string{"SECOND", "Minute", "hOUR", "week", "MONTH", "Year", "day"} {
		if _, ok := parseUnit(s); !ok {
			t.Errorf("unit %q refused", s)
		}
	}
	for _, s := range []string{"unknown", "UNKNOWN", "seconds", "", "1s"} {
		if u, ok := parseUnit(s); ok {
			t.Errorf("unit %q read as %v", s, u)
		}
	}
}
