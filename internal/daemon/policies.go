package daemon

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"slices"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/hotkeyd/hotkey"
	"github.com/hotkeyd/hotkey/counter"
	"github.com/hotkeyd/hotkey/internal/yamlerr"
)

// DefaultPolicy is the name of the policy a request without one uses.
const DefaultPolicy = "default"

// maxPolicyName bounds a policy's name, which travels in headers and metric
// labels.
const maxPolicyName = 64

// maxPoliciesFile bounds the size of a policies file.
const maxPoliciesFile = 1 << 20

// BuiltinPolicy returns the policy the daemon serves as "default" when the
// policies file has none: token bucket, 100 per second, burst 100, local
// fallback.
func BuiltinPolicy() *hotkey.Policy {
	return &hotkey.Policy{
		Name:           DefaultPolicy,
		Limit:          counter.Limit{Algorithm: counter.TokenBucket, Rate: 100, Period: time.Second, Burst: 100},
		OnStoreFailure: hotkey.FallbackLocal,
	}
}

// Policies are the named policies a daemon serves.
type Policies map[string]*hotkey.Policy

// Names returns the policy names, sorted.
func (p Policies) Names() []string {
	names := make([]string, 0, len(p))
	for n := range p {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// PolicyError is a policies file the daemon refuses: its file (empty for
// ParsePolicies), the line and the field at fault ("policies.login.period").
type PolicyError = yamlerr.Error

func perr(n *yaml.Node, field, format string, args ...any) *PolicyError {
	line := 0
	if n != nil {
		line = n.Line
	}
	return yamlerr.New("", line, field, fmt.Sprintf(format, args...))
}

// ParsePolicies parses a policies file:
//
//	policies:
//	  default:
//	    algorithm: token_bucket    # token_bucket (default), sliding_window, fixed_window, sliding_log
//	    limit: 100                 # requests per period, required; at most 2^53-1
//	    period: 1s                 # Go duration, required; at most 2^53-1 µs
//	    burst: 100                 # token_bucket only; default = limit; period/limit × burst at most 2^37 ms
//	    on_store_failure: local    # local (default), open, closed
//	    allowlist: [health_check]  # keys a closed policy still admits
//	    sync: store                # store (default), reserve, gossip
//	    regions: independent       # independent (default: each region the whole limit), exchange or shares (one limit for all: need --regions; shares a fixed_window only)
//	    shadow: false              # true: decide and count, but admit every request
//
// Unknown fields, duplicate names or fields, YAML aliases and merge keys,
// and values the engine cannot enforce are errors (a *PolicyError naming
// the line and field, its text bounded). A file
// without a "default" policy gets the built-in one.
func ParsePolicies(data []byte) (Policies, error) {
	ps, _, err := parsePolicies(data)
	if err != nil {
		return nil, err
	}
	if _, ok := ps[DefaultPolicy]; !ok {
		ps[DefaultPolicy] = BuiltinPolicy()
	}
	return ps, nil
}

// parsePolicies is ParsePolicies without the built-in default; it also
// returns the line of each policy's name.
func parsePolicies(data []byte) (Policies, map[string]int, error) {
	if len(data) > maxPoliciesFile {
		return nil, nil, &PolicyError{Msg: fmt.Sprintf("file is %d bytes, over the %d allowed", len(data), maxPoliciesFile)}
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, nil, &PolicyError{Msg: "file is empty: want a top-level \"policies:\" mapping"}
		}
		return nil, nil, yamlError(data, err)
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); err == nil {
		at := &extra
		if len(extra.Content) > 0 {
			at = extra.Content[0]
		}
		return nil, nil, perr(at, "", "a second YAML document: the file must hold one")
	} else if !errors.Is(err, io.EOF) {
		return nil, nil, yamlError(data, err)
	}
	root := &doc
	if root.Kind == yaml.DocumentNode {
		if len(root.Content) == 0 {
			return nil, nil, &PolicyError{Msg: "file is empty: want a top-level \"policies:\" mapping"}
		}
		root = root.Content[0]
	}
	if root.Kind != yaml.MappingNode {
		return nil, nil, perr(root, "", "want a mapping with a \"policies\" key, found %s", kindName(root))
	}
	var list *yaml.Node
	if err := eachField(root, "", func(key string, k, v *yaml.Node) error {
		if key != "policies" {
			return perr(k, key, "unknown field (the only top-level field is \"policies\")")
		}
		list = v
		return nil
	}); err != nil {
		return nil, nil, err
	}
	if list == nil {
		return nil, nil, perr(root, "policies", "missing: want a \"policies:\" mapping of names to policies")
	}
	if list.Kind != yaml.MappingNode {
		return nil, nil, perr(list, "policies", "want a mapping of names to policies, found %s", kindName(list))
	}
	if len(list.Content) == 0 {
		return nil, nil, perr(list, "policies", "no policies: define at least one, or leave --policies out for the built-in default")
	}
	ps := make(Policies)
	lines := make(map[string]int)
	if err := eachField(list, "policies", func(name string, k, v *yaml.Node) error {
		if err := checkPolicyName(name); err != nil {
			return perr(k, "policies."+name, "%v", err)
		}
		p, err := parsePolicy(name, v)
		if err != nil {
			return err
		}
		ps[name] = p
		lines[name] = k.Line
		return nil
	}); err != nil {
		return nil, nil, err
	}
	return ps, lines, nil
}

// yamlError turns a YAML syntax error into a PolicyError with its line.
func yamlError(data []byte, err error) error {
	line, msg := yamlerr.Locate(data, err)
	return &PolicyError{Line: line, Msg: "invalid YAML: " + msg}
}

// eachField calls f for each key of mapping m, in order, refusing
// duplicate and non-scalar keys. path names m in errors.
func eachField(m *yaml.Node, path string, f func(key string, k, v *yaml.Node) error) error {
	seen := make(map[string]int, len(m.Content)/2)
	for i := 0; i+1 < len(m.Content); i += 2 {
		k, v := m.Content[i], m.Content[i+1]
		if k.Kind != yaml.ScalarNode {
			return perr(k, path, "want a name as key, found %s", kindName(k))
		}
		key := k.Value
		field := key
		if path != "" {
			field = path + "." + key
		}
		if k.Tag == "!!merge" {
			return perr(k, field, "merge keys (<<) are not supported")
		}
		if first, ok := seen[key]; ok {
			return perr(k, field, "defined twice (first on line %d)", first)
		}
		seen[key] = k.Line
		if err := f(key, k, v); err != nil {
			return err
		}
	}
	return nil
}

// checkPolicyName accepts 1 to 64 of A-Z a-z 0-9 _ - . : (names appear in
// HTTP headers and metric labels).
func checkPolicyName(name string) error {
	if name == "" || len(name) > maxPolicyName {
		return fmt.Errorf("policy name must be 1 to %d characters", maxPolicyName)
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '-' || c == '.' || c == ':') {
			return fmt.Errorf("policy name %s: use only letters, digits and _ - . :", yamlerr.Quote(name))
		}
	}
	return nil
}

func parsePolicy(name string, n *yaml.Node) (*hotkey.Policy, error) {
	path := "policies." + name
	if n.Kind != yaml.MappingNode {
		return nil, perr(n, path, "want a mapping (algorithm, limit, period, ...), found %s", kindName(n))
	}
	p := &hotkey.Policy{Name: name, OnStoreFailure: hotkey.FallbackLocal}
	var (
		limitNode, periodNode, burstNode, algNode, syncNode, regionsNode *yaml.Node
		haveBurst                                                        bool
	)
	err := eachField(n, path, func(key string, k, v *yaml.Node) error {
		field := path + "." + key
		switch key {
		case "algorithm":
			s, err := scalarString(v, field)
			if err != nil {
				return err
			}
			a, err := counter.ParseAlgorithm(s)
			if err != nil {
				return perr(v, field, "unknown algorithm %s: want token_bucket, sliding_window, fixed_window or sliding_log", yamlerr.Quote(s))
			}
			p.Limit.Algorithm, algNode = a, v
		case "limit":
			x, err := scalarInt(v, field)
			if err != nil {
				return err
			}
			if x <= 0 {
				return perr(v, field, "must be a positive number of requests per period, got %d", x)
			}
			p.Limit.Rate, limitNode = x, v
		case "period":
			s, err := scalarString(v, field)
			if err != nil {
				return err
			}
			d, err := time.ParseDuration(s)
			if err != nil {
				return perr(v, field, "%s is not a duration: write e.g. 1s, 1m, 500ms, 1h", yamlerr.Quote(s))
			}
			if d <= 0 {
				return perr(v, field, "must be positive, got %v", d)
			}
			p.Limit.Period, periodNode = d, v
		case "burst":
			x, err := scalarInt(v, field)
			if err != nil {
				return err
			}
			if x <= 0 {
				return perr(v, field, "must be positive, got %d (leave it out for burst = limit)", x)
			}
			p.Limit.Burst, burstNode, haveBurst = x, v, true
		case "on_store_failure":
			s, err := scalarString(v, field)
			if err != nil {
				return err
			}
			var f hotkey.Fallback
			if err := f.UnmarshalText([]byte(s)); err != nil || f == hotkey.FallbackError {
				return perr(v, field, "unknown value %s: want local, open or closed", yamlerr.Quote(s))
			}
			p.OnStoreFailure = f
		case "allowlist":
			list, err := stringList(v, field)
			if err != nil {
				return err
			}
			p.Allowlist = list
		case "sync":
			syncNode = v
			s, err := scalarString(v, field)
			if err != nil {
				return err
			}
			var m hotkey.Sync
			if err := m.UnmarshalText([]byte(s)); err != nil {
				return perr(v, field, "unknown value %s: want store, reserve or gossip", yamlerr.Quote(s))
			}
			p.Sync = m
		case "regions":
			regionsNode = v
			s, err := scalarString(v, field)
			if err != nil {
				return err
			}
			var m hotkey.RegionMode
			if err := m.UnmarshalText([]byte(s)); err != nil {
				return perr(v, field, "unknown value %s: want independent, exchange or shares", yamlerr.Quote(s))
			}
			p.Regions = m
		case "shadow":
			b, err := scalarBool(v, field)
			if err != nil {
				return err
			}
			p.Shadow = b
		default:
			return perr(k, field, "unknown field: want algorithm, limit, period, burst, on_store_failure, allowlist, sync, regions or shadow")
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if limitNode == nil {
		return nil, perr(n, path+".limit", "missing: how many requests per period")
	}
	if periodNode == nil {
		return nil, perr(n, path+".period", "missing: the period of the limit, e.g. 1s or 1m")
	}
	if haveBurst && p.Limit.Algorithm != counter.TokenBucket {
		return nil, perr(burstNode, path+".burst", "applies to token_bucket only, not %v", p.Limit.Algorithm)
	}
	if err := p.Sync.Keeps(p.Limit.Algorithm); err != nil {
		return nil, perr(syncNode, path+".sync", "%v", err)
	}
	if p.Regions == hotkey.RegionsShares && p.Limit.Algorithm != counter.FixedWindow {
		return nil, perr(regionsNode, path+".regions", "regions shares splits a fixed window's limit into the regions' shares: use algorithm fixed_window, or regions exchange")
	}
	if err := p.Limit.Validate(); err != nil {
		at, field := limitNode, path+".limit"
		if errors.Is(err, counter.ErrInvalidPeriod) || errors.Is(err, counter.ErrPeriodTooLong) {
			at, field = periodNode, path+".period"
		} else if (errors.Is(err, counter.ErrInvalidBurst) || errors.Is(err, counter.ErrBurstTooLarge)) && burstNode != nil {
			at, field = burstNode, path+".burst"
		} else if errors.Is(err, counter.ErrUnknownAlgorithm) && algNode != nil {
			at, field = algNode, path+".algorithm"
		}
		return nil, perr(at, field, "%v", err)
	}
	return p, nil
}

func scalarString(v *yaml.Node, field string) (string, error) {
	if v.Kind != yaml.ScalarNode || v.Tag == "!!null" {
		return "", perr(v, field, "want a single value, found %s", kindName(v))
	}
	return v.Value, nil
}

func scalarInt(v *yaml.Node, field string) (int64, error) {
	if v.Kind != yaml.ScalarNode || v.Tag != "!!int" {
		return 0, perr(v, field, "want a whole number, found %s", kindName(v))
	}
	var x int64
	if err := v.Decode(&x); err != nil {
		return 0, perr(v, field, "%s is not a whole number in range", yamlerr.Quote(v.Value))
	}
	return x, nil
}

func scalarBool(v *yaml.Node, field string) (bool, error) {
	var b bool
	if v.Kind != yaml.ScalarNode || v.Tag != "!!bool" || v.Style != 0 || v.Decode(&b) != nil {
		return false, perr(v, field, "want true or false, found %s", kindName(v))
	}
	return b, nil
}

func stringList(v *yaml.Node, field string) ([]string, error) {
	if v.Kind != yaml.SequenceNode {
		return nil, perr(v, field, "want a list of keys, e.g. [health_check], found %s", kindName(v))
	}
	out := make([]string, 0, len(v.Content))
	for i, it := range v.Content {
		f := fmt.Sprintf("%s[%d]", field, i)
		if it.Kind != yaml.ScalarNode || it.Tag == "!!null" {
			return nil, perr(it, f, "want a key, found %s", kindName(it))
		}
		switch {
		case it.Value == "":
			return nil, perr(it, f, "empty key")
		case len(it.Value) > hotkey.DefaultMaxKeyLen:
			return nil, perr(it, f, "key is %d bytes, over the %d allowed", len(it.Value), hotkey.DefaultMaxKeyLen)
		}
		out = append(out, it.Value)
	}
	return out, nil
}

// kindName describes a node for errors.
func kindName(n *yaml.Node) string { return yamlerr.KindName(n) }

// truncate shortens s to at most n bytes (on a rune boundary) for messages.
func truncate(s string, n int) string { return yamlerr.Truncate(s, n) }
