// Package envoyconf loads the rate-limit configuration of
// envoyproxy/ratelimit (the reference implementation of Envoy's rate-limit
// service) as it is, and matches the descriptors of Envoy's rate-limit
// requests against it, so that hotkeyd can serve that protocol in its
// place.
//
// A configuration is one or more YAML files, each holding one domain:
//
//	domain: rl
//	descriptors:
//	  - key: source_cluster          # required
//	    value: proxy                 # optional; a trailing * matches a prefix
//	    rate_limit:                  # optional: a rule
//	      unit: minute               # second, minute, hour, day, week, month, year
//	      requests_per_unit: 10      # 0 denies every request
//	      unlimited: false           # true: no limit (no unit then)
//	      name: cluster_limit        # for replaces
//	      replaces: [{name: other}]  # drop the named rules of the same request
//	      algorithm: sliding_window  # hotkeyd only; token_bucket, sliding_window (default), fixed_window, sliding_log
//	      on_store_failure: local    # hotkeyd only; local (default), open, closed
//	      sync: store                # hotkeyd only; store (default), reserve, gossip
//	    shadow_mode: false
//	    quota_mode: false
//	    detailed_metric: false
//	    value_to_metric: false
//	    share_threshold: false       # wildcard values only: one counter for all matches
//	    descriptors: [...]           # nested, same shape
//
// The package has no gRPC or protobuf dependency: the caller converts the
// request's descriptors to Entry lists and the matched rules to responses.
// A Config is immutable and safe for concurrent use.
package envoyconf

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/hotkeyd/hotkey"
	"github.com/hotkeyd/hotkey/counter"
)

// Entry is one (key, value) pair of a request's descriptor.
type Entry struct{ Key, Value string }

// Unit is the unit of a rule's limit, numbered as the values of the RLS
// proto's RateLimitResponse.RateLimit.Unit, so that the caller converts
// it with a cast. The zero value is UNKNOWN (an unlimited rule's unit).
type Unit int

// The units. Month is 30 days and Year 365 days, as envoyproxy/ratelimit
// counts them.
const (
	Second Unit = 1
	Minute Unit = 2
	Hour   Unit = 3
	Day    Unit = 4
	Month  Unit = 5
	Year   Unit = 6
	Week   Unit = 7
)

var unitNames = [...]string{"unknown", "second", "minute", "hour", "day", "month", "year", "week"}

var unitDurations = [...]time.Duration{
	0,
	time.Second,
	time.Minute,
	time.Hour,
	24 * time.Hour,
	30 * 24 * time.Hour,
	365 * 24 * time.Hour,
	7 * 24 * time.Hour,
}

// String returns the unit's name as written in configuration files
// ("second", ...), "unknown" for the zero value.
func (u Unit) String() string {
	if u >= 0 && int(u) < len(unitNames) {
		return unitNames[u]
	}
	return fmt.Sprintf("Unit(%d)", int(u))
}

// Duration returns the length of the unit, 0 for an unknown one.
func (u Unit) Duration() time.Duration {
	if u >= 0 && int(u) < len(unitDurations) {
		return unitDurations[u]
	}
	return 0
}

// parseUnit reads a unit name, case-insensitively as envoyproxy/ratelimit
// does.
func parseUnit(s string) (Unit, bool) {
	for i, n := range unitNames {
		if i > 0 && strings.EqualFold(s, n) {
			return Unit(i), true
		}
	}
	return 0, false
}

// Rule is a descriptor with a rate_limit block.
type Rule struct {
	// Domain is the rule's domain.
	Domain string
	// Path is the rule's stat key as envoyproxy/ratelimit names it: the
	// domain, then per level "." and the key, or key "_" value when the
	// descriptor has a value (a wildcard keeps its "*"), e.g.
	// "rl.foo.bar_bkthomps". Paths are distinct across a Config.
	Path string
	// File and Line are where the descriptor is defined.
	File string
	Line int
	// Name is rate_limit.name, the name replaces refers to.
	Name string
	// Replaces holds the names of the rules this one replaces.
	Replaces []string
	// Unlimited is rate_limit.unlimited: every request is admitted.
	Unlimited bool
	// RequestsPerUnit and Unit are the limit; Unit is zero when Unlimited.
	// RequestsPerUnit 0 means every request is over the limit.
	RequestsPerUnit uint32
	Unit            Unit
	// Multiplier is how many units make the rule's period: only a
	// descriptor's own limit has one (unit_multiplier) other than 1; 0
	// reads as 1.
	Multiplier uint32
	// ShadowMode, QuotaMode and DetailedMetric are the descriptor's flags.
	ShadowMode, QuotaMode, DetailedMetric bool
	// Policy is the hotkey policy enforcing the rule: nil when Unlimited
	// or RequestsPerUnit is 0. Its Name is unique across the Config.
	Policy *hotkey.Policy
	// Override says the rule is the one of a domain's descriptors that
	// carry their own limit (OverrideRule), not the configuration's.
	Override bool

	field *field // the descriptor's field path, for errors
}

// Match is the rule a request's descriptor matched.
type Match struct {
	// Rule is the matched rule.
	Rule *Rule
	// Key is the counter key within Rule.Policy: the entries' values
	// joined with ',' (see Config.Match).
	Key string
	// Metric is the descriptor's label for metrics, as envoyproxy/ratelimit
	// names its stats: Rule.Path, or the path with the runtime values when
	// detailed_metric or value_to_metric ask for them. Its cardinality is
	// the caller's to bound.
	Metric string
}

// Config is a loaded configuration.
type Config struct {
	domains map[string]*level
	rules   []*Rule // by domain, then in file order
}

// level is one descriptor list.
type level struct {
	exact     map[pair]*node // descriptors with a value (wildcards too, under their pattern)
	wildcards []*node        // descriptors whose value ends in '*', in file order
	keyOnly   map[string]*node
}

type pair struct{ key, value string }

// node is one descriptor.
type node struct {
	key, value    string // value "" when the descriptor has none
	wildcard      bool   // value ends in '*'
	prefix        string // value without its '*'
	share         bool   // share_threshold
	valueToMetric bool   // value_to_metric
	rule          *Rule  // nil without rate_limit
	children      level
	hasChildren   bool
}

func (l *level) find(e Entry) (n *node, how matchKind) {
	if e.Value != "" {
		if n := l.exact[pair{e.Key, e.Value}]; n != nil {
			return n, byValue
		}
	}
	for _, w := range l.wildcards {
		if w.key == e.Key && strings.HasPrefix(e.Value, w.prefix) {
			return w, byWildcard
		}
	}
	if n := l.keyOnly[e.Key]; n != nil {
		return n, byKey
	}
	return nil, 0
}

type matchKind uint8

const (
	byValue matchKind = iota + 1
	byWildcard
	byKey
)

// HasDomain reports whether the configuration has rules for domain.
func (c *Config) HasDomain(domain string) bool { return c.domains[domain] != nil }

// Domains returns the configured domains, sorted.
func (c *Config) Domains() []string {
	ds := make([]string, 0, len(c.domains))
	for d := range c.domains {
		ds = append(ds, d)
	}
	slices.Sort(ds)
	return ds
}

// Rules returns every rule (every descriptor with a rate_limit): by
// domain, sorted, then in the order of the file, parents before their
// nested descriptors. The slice is the caller's; the rules are shared.
func (c *Config) Rules() []*Rule {
	return slices.Clone(c.rules)
}

// maxStackEntries is how many entries Match tracks without allocating.
const maxStackEntries = 8

// Match finds the rule for one descriptor of a request in domain, as
// envoyproxy/ratelimit does: from the domain's descriptors, level by
// level, each entry matches the descriptor with its key and value, else
// the first (in file order) whose value ends in '*' and whose key is the
// entry's and the rest of the value a prefix of the entry's, else the one
// with its key and no value. The rule applies when the descriptor matching
// the last entry has one; ok is false when the domain is unknown, an entry
// matches nothing, or the request's depth is not the rule's (a rule for
// one entry does not apply to a descriptor of two).
//
// Key is the counter key: the entries' values, each with '\' and ','
// escaped by a '\', each byte that is not part of valid UTF-8 written
// "\xNN", and joined with ','; an entry matched by a
// share_threshold wildcard counts under the pattern (value with its '*')
// instead, so every value matching it shares one counter. A key starting
// with '~' gets a '\' before it, an empty key reads "~", and a key longer
// than hotkey.DefaultMaxKeyLen is "~" and the hex SHA-256 of it: two
// descriptors matching a rule share a key only through share_threshold.
func (c *Config) Match(domain string, entries []Entry) (m Match, ok bool) {
	lvl := c.domains[domain]
	if lvl == nil || len(entries) == 0 {
		return Match{}, false
	}
	var (
		nodesBuf [maxStackEntries]*node
		howBuf   [maxStackEntries]matchKind
	)
	nodes, hows := nodesBuf[:0], howBuf[:0]
	last := len(entries) - 1
	for i, e := range entries {
		n, how := lvl.find(e)
		if n == nil {
			return Match{}, false
		}
		nodes, hows = append(nodes, n), append(hows, how)
		if i == last {
			break
		}
		if !n.hasChildren {
			return Match{}, false
		}
		lvl = &n.children
	}
	r := nodes[last].rule
	if r == nil {
		return Match{}, false
	}
	return Match{Rule: r, Key: counterKey(entries, nodes), Metric: metric(domain, r, entries, nodes, hows)}, true
}

// OverrideRule returns the rule of the descriptors of domain that carry
// their own limit (RateLimitDescriptor.limit in the RLS protocol):
// requestsPerUnit per unit (not zero), under the sliding-window counter,
// with the local fallback. Its policy is named "envoy-override/" and the
// domain, whatever the limit; the counter key of a descriptor is
// OverrideKey of the unit and its entries, so that a descriptor whose
// requests_per_unit changes keeps its counter and the usage it holds, and
// each unit counts on a counter of its own (a window written under one
// period is empty under another). Its Path, the label its metrics fall
// back to, is the domain and ".(own limit)".
//
// Its period is multiplier units (unit_multiplier). A unit of 0, a
// multiplier of 0 or a period beyond what a store times exactly
// (counter.MaxWindowPeriod) is an error, but for requestsPerUnit 0, whose
// rule has no counter.
func OverrideRule(domain string, requestsPerUnit uint32, unit Unit, multiplier uint32) (*Rule, error) {
	r := &Rule{Domain: domain, Path: domain + ".(own limit)", RequestsPerUnit: requestsPerUnit, Unit: unit, Multiplier: max(1, multiplier), Override: true}
	if requestsPerUnit > 0 {
		switch {
		case unit.Duration() == 0:
			return nil, fmt.Errorf("unit %v: want second, minute, hour, day, week, month or year", unit)
		case multiplier == 0:
			return nil, errors.New("unit_multiplier 0: want 1 or more")
		}
		lim := counter.Limit{Algorithm: counter.SlidingWindow, Rate: int64(requestsPerUnit), Period: r.Period()}
		if r.Period() == 0 {
			return nil, fmt.Errorf("%d × %v: %w", r.Multiplier, unit, counter.ErrPeriodTooLong)
		}
		if err := lim.Validate(); err != nil {
			return nil, fmt.Errorf("%d × %v: %w", r.Multiplier, unit, err)
		}
		r.Policy = &hotkey.Policy{Name: OverridePolicyName(domain), Limit: lim, OnStoreFailure: hotkey.FallbackLocal}
	}
	return r, nil
}

// Period is the length of r's window: Multiplier units (0 if r has no
// unit, or the product overflows).
func (r *Rule) Period() time.Duration {
	d, m := r.Unit.Duration(), time.Duration(max(1, r.Multiplier))
	if d > math.MaxInt64/m {
		return 0
	}
	return d * m
}

// OverrideKey returns the counter key, under an OverrideRule's policy, of
// a descriptor with entries and a limit per multiplier units: the unit's
// name (after the multiplier and "*" when it is over 1), then the entries'
// keys and values, escaped and joined as Match joins values
// ("hour,user,bob", "2*hour,user,bob"), so that two descriptors share a
// counter only if their period, keys and values are the same.
func OverrideKey(unit Unit, multiplier uint32, entries []Entry) string {
	kv := make([]Entry, 0, 1+2*len(entries))
	u := unit.String()
	if multiplier > 1 {
		u = strconv.FormatUint(uint64(multiplier), 10) + "*" + u
	}
	kv = append(kv, Entry{Value: u})
	for _, e := range entries {
		kv = append(kv, Entry{Value: e.Key}, Entry{Value: e.Value})
	}
	return counterKey(kv, nil)
}

// OverridePolicyName returns the name of the policy of OverrideRule's rule
// for domain: "envoy-override/" and the domain, cut as PolicyName cuts.
func OverridePolicyName(domain string) string { return policyName(overridePrefix, domain) }

const hexDigits = "0123456789abcdef"

// counterKey builds Match.Key; nodes nil is no share_threshold match.
func counterKey(entries []Entry, nodes []*node) string {
	size := len(entries)
	for _, e := range entries {
		size += len(e.Value) + 1
	}
	var b strings.Builder
	b.Grow(size)
	for i, e := range entries {
		if i > 0 {
			b.WriteByte(',')
		}
		v := e.Value
		if nodes != nil && nodes[i].share {
			v = nodes[i].value
		}
		if i == 0 && strings.HasPrefix(v, "~") {
			b.WriteByte('\\')
		}
		for j := 0; j < len(v); j++ {
			switch c := v[j]; {
			case c == '\\' || c == ',':
				b.WriteByte('\\')
			case c >= utf8.RuneSelf:
				// A byte that is not part of valid UTF-8 is written
				// \xNN, so that keys stay UTF-8 (leases and /v1/hotkeys
				// carry them as JSON); a value's own '\' is doubled, so
				// no value spells the escape.
				if r, n := utf8.DecodeRuneInString(v[j:]); r != utf8.RuneError || n > 1 {
					b.WriteString(v[j : j+n])
					j += n - 1
				} else {
					b.WriteString(`\x`)
					b.WriteByte(hexDigits[c>>4])
					b.WriteByte(hexDigits[c&0xf])
				}
				continue
			}
			b.WriteByte(v[j])
		}
	}
	key := b.String()
	switch {
	case key == "":
		return "~"
	case len(key) > hotkey.DefaultMaxKeyLen:
		sum := sha256.Sum256([]byte(key))
		return "~" + hex.EncodeToString(sum[:])
	}
	return key
}

// metric builds Match.Metric as envoyproxy/ratelimit names the stats of
// a matched descriptor.
func metric(domain string, r *Rule, entries []Entry, nodes []*node, hows []matchKind) string {
	var b strings.Builder
	b.WriteString(domain)
	if r.DetailedMetric {
		shared := false
		for i := range entries {
			if hows[i] == byWildcard && nodes[i].share {
				shared = true
				break
			}
		}
		for i, e := range entries {
			b.WriteByte('.')
			b.WriteString(e.Key)
			switch {
			case shared && hows[i] == byWildcard && nodes[i].share:
				b.WriteByte('_')
				b.WriteString(nodes[i].value)
			case shared && e.Value == "":
			default:
				// Without share_threshold the reference writes "key_"
				// for an empty value; so does this.
				b.WriteByte('_')
				b.WriteString(e.Value)
			}
		}
		return b.String()
	}
	for i, e := range entries {
		n := nodes[i]
		var v string
		switch hows[i] {
		case byValue:
			v = e.Value
		case byWildcard:
			if n.valueToMetric && !n.share {
				v = e.Value
			} else {
				v = n.value
			}
		case byKey:
			if n.valueToMetric {
				v = e.Value
			}
		}
		b.WriteByte('.')
		b.WriteString(e.Key)
		if v != "" {
			b.WriteByte('_')
			b.WriteString(v)
		}
	}
	return b.String()
}

// Replaced reports which of a request's matched rules (one per
// descriptor, nil for a descriptor that matched none) are dropped because
// another of them replaces their name, as envoyproxy/ratelimit does: the
// replaces of every matched rule count, unlimited ones' too; an unlimited
// rule is never dropped (it admits the request either way).
func Replaced(rules []*Rule) []bool {
	out := make([]bool, len(rules))
	var replacing map[string]bool
	for _, r := range rules {
		if r == nil {
			continue
		}
		for _, name := range r.Replaces {
			if replacing == nil {
				replacing = make(map[string]bool)
			}
			replacing[name] = true
		}
	}
	if replacing == nil {
		return out
	}
	for i, r := range rules {
		if r != nil && !r.Unlimited && r.Name != "" && replacing[r.Name] {
			out[i] = true
		}
	}
	return out
}

// MaxPolicyName bounds the names of the rules' policies.
const MaxPolicyName = 120

const (
	policyPrefix   = "envoy/"
	overridePrefix = "envoy-override/"
)

// PolicyName returns the name of the policy of the rule at path:
// "envoy/" + path when that fits in 120 bytes and holds no '|'; else
// "envoy/", a prefix of path (cut on a rune boundary, '|' read as '_'),
// "~" and the first 16 hex digits of the SHA-256 of path.
func PolicyName(path string) string { return policyName(policyPrefix, path) }

func policyName(prefix, path string) string {
	if len(prefix)+len(path) <= MaxPolicyName && !strings.Contains(path, "|") {
		return prefix + path
	}
	sum := sha256.Sum256([]byte(path))
	suffix := "~" + hex.EncodeToString(sum[:8])
	room := MaxPolicyName - len(prefix) - len(suffix)
	cut := path
	if len(cut) > room {
		n := room
		for n > 0 && !utf8.RuneStart(cut[n]) {
			n--
		}
		cut = cut[:n]
	}
	return prefix + strings.ReplaceAll(cut, "|", "_") + suffix
}
