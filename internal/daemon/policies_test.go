package daemon

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hotkeyd/hotkey"
	"github.com/hotkeyd/hotkey/counter"
	"github.com/hotkeyd/hotkey/internal/testkit"
)

// exampleFile is the policies file of the issue, verbatim.
const exampleFile = `policies:
  default:
    algorithm: token_bucket
    limit: 100
    period: 1s
    burst: 100
    on_store_failure: local
  login:
    algorithm: sliding_log
    limit: 5
    period: 1m
    on_store_failure: closed
    allowlist: [health_check]
`

func TestParsePoliciesExample(t *testing.T) {
	ps, err := ParsePolicies([]byte(exampleFile))
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(ps.Names(), ","); got != "default,login" {
		t.Fatalf("names %s", got)
	}
	d := ps["default"]
	want := counter.Limit{Algorithm: counter.TokenBucket, Rate: 100, Period: time.Second, Burst: 100}
	if d.Name != "default" || d.Limit != want || d.OnStoreFailure != hotkey.FallbackLocal || len(d.Allowlist) != 0 {
		t.Errorf("default = %+v", d)
	}
	l := ps["login"]
	want = counter.Limit{Algorithm: counter.SlidingLog, Rate: 5, Period: time.Minute}
	if l.Name != "login" || l.Limit != want || l.OnStoreFailure != hotkey.FallbackClosed || strings.Join(l.Allowlist, ",") != "health_check" {
		t.Errorf("login = %+v", l)
	}
}

func TestParsePoliciesDefaults(t *testing.T) {
	ps, err := ParsePolicies([]byte("policies:\n  api:\n    limit: 10\n    period: 1s\n  win:\n    algorithm: fixed_window\n    limit: 3\n    period: 2s\n    on_store_failure: open\n"))
	if err != nil {
		t.Fatal(err)
	}
	if got := ps["default"]; got == nil || got.Limit != BuiltinPolicy().Limit || got.OnStoreFailure != hotkey.FallbackLocal {
		t.Errorf("no default in the file: want the built-in one, got %+v", got)
	}
	api := ps["api"]
	if api.Limit.Algorithm != counter.TokenBucket || api.Limit.Capacity() != 10 || api.OnStoreFailure != hotkey.FallbackLocal {
		t.Errorf("api = %+v: want token_bucket, burst = limit, local", api)
	}
	if w := ps["win"]; w.Limit.Algorithm != counter.FixedWindow || w.OnStoreFailure != hotkey.FallbackOpen {
		t.Errorf("win = %+v", w)
	}
	if api.Sync != hotkey.SyncStore {
		t.Errorf("api's sync %v, want store", api.Sync)
	}
}

func TestParsePoliciesSync(t *testing.T) {
	ps, err := ParsePolicies([]byte("policies:\n  a:\n    limit: 5\n    period: 1s\n    sync: reserve\n  b:\n    limit: 5\n    period: 1s\n    sync: store\n  c:\n    limit: 5\n    period: 1s\n    sync: gossip\n"))
	if err != nil {
		t.Fatal(err)
	}
	if a, b, c := ps["a"].Sync, ps["b"].Sync, ps["c"].Sync; a != hotkey.SyncReserve || b != hotkey.SyncStore || c != hotkey.SyncGossip {
		t.Errorf("sync: a %v, b %v, c %v; want reserve, store, gossip", a, b, c)
	}
}

// TestParsePoliciesRefused: each bad file is refused with the line and the
// field at fault.
func TestParsePoliciesRefused(t *testing.T) {
	cases := []struct {
		name, file string
		line       int
		field, msg string
	}{
		{"unknown field", "policies:\n  a:\n    limit: 1\n    period: 1s\n    burts: 3\n", 5, "policies.a.burts", "unknown field"},
		{"unknown top-level", "policy:\n  a:\n    limit: 1\n", 1, "policy", "unknown field"},
		{"bad algorithm", "policies:\n  a:\n    algorithm: leaky\n    limit: 1\n    period: 1s\n", 3, "policies.a.algorithm", `unknown algorithm "leaky"`},
		{"bad period", "policies:\n  a:\n    limit: 1\n    period: 1x\n", 4, "policies.a.period", "not a duration"},
		{"negative period", "policies:\n  a:\n    limit: 1\n    period: -1s\n", 4, "policies.a.period", "positive"},
		{"zero limit", "policies:\n  a:\n    limit: 0\n    period: 1s\n", 3, "policies.a.limit", "positive"},
		{"text limit", "policies:\n  a:\n    limit: lots\n    period: 1s\n", 3, "policies.a.limit", "whole number"},
		{"float limit", "policies:\n  a:\n    limit: 1.5\n    period: 1s\n", 3, "policies.a.limit", "whole number"},
		{"missing limit", "policies:\n  a:\n    period: 1s\n", 3, "policies.a.limit", "missing"},
		{"missing period", "policies:\n  a:\n    limit: 5\n", 3, "policies.a.period", "missing"},
		{"burst on window", "policies:\n  a:\n    algorithm: sliding_window\n    limit: 5\n    period: 1s\n    burst: 9\n", 6, "policies.a.burst", "token_bucket only"},
		{"zero burst", "policies:\n  a:\n    limit: 5\n    period: 1s\n    burst: 0\n", 5, "policies.a.burst", "positive"},
		{"reserve sliding log", "policies:\n  a:\n    algorithm: sliding_log\n    limit: 5\n    period: 1s\n    sync: reserve\n", 6, "policies.a.sync", `sync reserve cannot keep a sliding_log`},
		{"bad regions", "policies:\n  a:\n    limit: 5\n    period: 1s\n    regions: global\n", 5, "policies.a.regions", `unknown value "global": want independent, exchange or shares`},
		{"shares token bucket", "policies:\n  a:\n    limit: 5\n    period: 1s\n    regions: shares\n", 5, "policies.a.regions", "regions shares splits a fixed window's limit"},
		{"bad sync", "policies:\n  a:\n    limit: 5\n    period: 1s\n    sync: gossipy\n", 5, "policies.a.sync", `unknown value "gossipy": want store, reserve or gossip`},
		{"sync not a value", "policies:\n  a:\n    limit: 5\n    period: 1s\n    sync: [reserve]\n", 5, "policies.a.sync", "single value"},
		{"bad fallback", "policies:\n  a:\n    limit: 5\n    period: 1s\n    on_store_failure: error\n", 5, "policies.a.on_store_failure", "want local, open or closed"},
		{"sliding log too large", "policies:\n  a:\n    algorithm: sliding_log\n    limit: 200000\n    period: 1s\n", 4, "policies.a.limit", "too large"},
		{"limit over 2^53-1", "policies:\n  a:\n    algorithm: fixed_window\n    limit: 9223372036854775807\n    period: 1h\n", 4, "policies.a.limit", "over 2^53-1"},
		{"window period over 2^53-1 µs", "policies:\n  a:\n    algorithm: sliding_window\n    limit: 5\n    period: 2562047h\n", 5, "policies.a.period", "over 2^53-1 µs"},
		{"burst over 2^53-1", "policies:\n  a:\n    limit: 5\n    period: 1s\n    burst: 9007199254740992\n", 5, "policies.a.burst", "over 2^53-1"},
		{"burst refilling over 2^37 ms", "policies:\n  a:\n    limit: 1\n    period: 8760h\n    burst: 700\n", 5, "policies.a.burst", "set burst to at most 4"},
		{"period refilling over 2^37 ms", "policies:\n  a:\n    limit: 1\n    period: 43800h\n", 4, "policies.a.period", "2^37 ms"},
		{"allowlist not a list", "policies:\n  a:\n    limit: 5\n    period: 1s\n    allowlist: health\n", 5, "policies.a.allowlist", "list"},
		{"allowlist empty key", "policies:\n  a:\n    limit: 5\n    period: 1s\n    allowlist: [ok, \"\"]\n", 5, "policies.a.allowlist[1]", "empty key"},
		{"duplicate policy", "policies:\n  a:\n    limit: 5\n    period: 1s\n  a:\n    limit: 6\n    period: 1s\n", 5, "policies.a", "defined twice (first on line 2)"},
		{"duplicate field", "policies:\n  a:\n    limit: 5\n    limit: 6\n    period: 1s\n", 4, "policies.a.limit", "defined twice"},
		{"bad name", "policies:\n  \"a b\":\n    limit: 5\n    period: 1s\n", 2, "policies.a b", "letters, digits"},
		{"policy not a mapping", "policies:\n  a: 5\n", 2, "policies.a", "want a mapping"},
		{"policies not a mapping", "policies: [a, b]\n", 1, "policies", "want a mapping"},
		{"no policies", "policies: {}\n", 1, "policies", "no policies"},
		{"missing policies", "# nothing\n{}\n", 2, "policies", "missing"},
		{"bad yaml", "policies:\n  a:\n    limit: 5\n   period: 1s\n", 4, "", "invalid YAML"},
		{"unclosed quote", "policies:\n  a:\n    limit: 5\n    period: \"1s\n    burst: 3\n", 4, "", "invalid YAML"},
		{"unclosed list after a closed one", "policies:\n  a:\n    allowlist: [x,\n      y]\n    limit: 5\n    period: 1s\n  b: [\n", 7, "", "invalid YAML"},
		{"tab yaml", "policies:\n\ta:\n", 2, "", "invalid YAML"},
		{"two documents", "policies:\n  a:\n    limit: 5\n    period: 1s\n---\npolicies: {}\n", 6, "", "second YAML document"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := ParsePolicies([]byte(c.file))
			var pe *PolicyError
			if !errors.As(err, &pe) {
				t.Fatalf("err = %v, want a *PolicyError", err)
			}
			if pe.Line != c.line || pe.Field != c.field || !strings.Contains(pe.Msg, c.msg) {
				t.Errorf("got line %d field %q msg %q; want line %d field %q msg containing %q", pe.Line, pe.Field, pe.Msg, c.line, c.field, c.msg)
			}
			if s := err.Error(); c.line > 0 && !strings.HasPrefix(s, "line ") {
				t.Errorf("message %q does not start with its line", s)
			}
		})
	}
	if _, err := ParsePolicies(nil); err == nil || !strings.Contains(err.Error(), "empty") {
		t.Errorf("empty file: %v", err)
	}
}

// FuzzParsePolicies: any file is loaded or refused with a *PolicyError of
// bounded length, allocating at most fuzzPoliciesCostLimit of its size.
func FuzzParsePolicies(f *testing.F) {
	f.Add([]byte(exampleFile))
	f.Add([]byte("policies:\n  a:\n    limit: 1\n    period: 1s\n"))
	f.Add([]byte("policies:\n  a:\n    limit: 0x10\n    period: 1ns\n    burst: 1_000\n"))
	f.Add([]byte("policies:\n  a: &x\n    limit: 1\n    period: 1s\n  b: *x\n"))
	f.Add([]byte("policies:\n  a:\n    <<: {limit: 1}\n    period: 1s\n"))
	f.Add([]byte("policies: {a: {limit: 9223372036854775807, period: 2562047h, algorithm: fixed_window}}"))
	f.Add([]byte("---\n...\n"))
	f.Add([]byte("policies:\n  a:\n    allowlist: [x, [y], {z: 1}, ~]\n"))
	f.Add([]byte("policies: &x\n  a: *x\n"))
	f.Add([]byte(policiesBomb()))
	f.Add([]byte("policies:\n  a:\n    allowlist: " + strings.Repeat("[", 200) + strings.Repeat("]", 200) + "\n"))
	f.Add([]byte("policies:\n  ? " + strings.Repeat("n", 200) + "\n  : {limit: 1, period: 1s}\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		var (
			ps  Policies
			err error
		)
		alloc := testkit.Allocated(func() { ps, err = ParsePolicies(data) })
		if limit := fuzzPoliciesCostLimit(len(data)); alloc > limit {
			t.Errorf("%d bytes allocated for a %d-byte file, want at most %d", alloc, len(data), limit)
		}
		if err != nil {
			var pe *PolicyError
			if !errors.As(err, &pe) {
				t.Fatalf("error %v (%T) is not a *PolicyError", err, err)
			}
			if pe.Line < 0 || pe.Msg == "" {
				t.Fatalf("bad error %+v", pe)
			}
			if n := len(pe.Error()); n > maxPolicyErrorLen {
				t.Errorf("error of %d bytes, want at most %d", n, maxPolicyErrorLen)
			}
			return
		}
		if ps[DefaultPolicy] == nil {
			t.Fatal("no default policy")
		}
		for name, p := range ps {
			if p.Name != name || checkPolicyName(name) != nil {
				t.Fatalf("policy %q named %q", name, p.Name)
			}
			if err := p.Limit.Validate(); err != nil {
				t.Fatalf("policy %q: invalid limit accepted: %v", name, err)
			}
			if p.OnStoreFailure == hotkey.FallbackError {
				t.Fatalf("policy %q: fallback error accepted", name)
			}
			for _, k := range p.Allowlist {
				if k == "" || len(k) > hotkey.DefaultMaxKeyLen {
					t.Fatalf("policy %q: allowlist key %q accepted", name, k)
				}
			}
		}
	})
}

// TestParsePoliciesRegions: regions reads independent (the default),
// exchange and shares; a daemon without --regions refuses the last two at
// load, naming the policy.
func TestParsePoliciesRegions(t *testing.T) {
	file := "policies:\n  a:\n    limit: 5\n    period: 1s\n  b:\n    limit: 5\n    period: 1s\n    regions: exchange\n  c:\n    algorithm: fixed_window\n    limit: 5\n    period: 1s\n    regions: shares\n"
	ps, err := ParsePolicies([]byte(file))
	if err != nil {
		t.Fatal(err)
	}
	if a, b, c := ps["a"].Regions, ps["b"].Regions, ps["c"].Regions; a != hotkey.RegionsIndependent || b != hotkey.RegionsExchange || c != hotkey.RegionsShares {
		t.Errorf("regions: a %v, b %v, c %v; want independent, exchange, shares", a, b, c)
	}
	path := filepath.Join(t.TempDir(), "p.yaml")
	if err := os.WriteFile(path, []byte(file), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := ParseArgs([]string{"--policies", path}, env(nil), nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := loadRules(cfg); err == nil || !strings.Contains(err.Error(), "policies.b.regions") || !strings.Contains(err.Error(), "needs the fleet's regions") {
		t.Errorf("loaded without --regions: %v, want policies.b.regions refused", err)
	}
	cfg, err = ParseArgs([]string{"--policies", path, "--region", "eu", "--regions", "eu,us"}, env(nil), nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := loadRules(cfg); err != nil {
		t.Errorf("with --regions: %v", err)
	}
}
