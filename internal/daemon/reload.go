package daemon

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/hotkeyd/hotkey"
	"github.com/hotkeyd/hotkey/internal/envoyconf"
	"github.com/hotkeyd/hotkey/internal/yamlerr"
)

// rules are what a reload replaces, as one: the policies and the Envoy
// rules. A request (a batch, a gRPC request) reads them once, so that it
// never sees half a reload.
type rules struct {
	policies Policies
	origins  map[string]origin // where each policy of the file is defined
	known    string            // the policies' names, quoted, for the 404 of an unknown one
	envoy    *envoyconf.Config // nil without --envoy-config
	// gossip names the policies and Envoy rules of sync: gossip, sorted;
	// apart those of another mode, whose counters daemons on the memory
	// store keep apart.
	gossip, apart []string
	// generation counts the loads up to this one: 1 at start.
	generation uint64
	loadedAt   time.Time // when the files were read
}

// origin is where a policy is defined: its file and the line of its name.
type origin struct {
	file string
	line int
}

// loadRules reads the policies and the Envoy rules the flags name.
func loadRules(cfg Config) (*rules, error) {
	ps, origins := Policies{DefaultPolicy: BuiltinPolicy()}, map[string]origin(nil)
	if cfg.Policies != "" {
		var err error
		if ps, origins, err = loadPolicies(cfg.Policies); err != nil {
			return nil, fmt.Errorf("policies, set by %s, refused: %w", flagName("policies"), err)
		}
	}
	var envoy *envoyconf.Config
	if cfg.EnvoyConfig != "" {
		var err error
		if envoy, err = envoyconf.Load(cfg.EnvoyConfig); err != nil {
			return nil, fmt.Errorf("envoy configuration, set by %s, refused: %w", flagName("envoy-config"), err)
		}
	}
	if cfg.Shadow {
		shadowAll(ps, envoy)
	}
	if len(cfg.Regions) == 0 {
		for _, name := range ps.Names() {
			if ps[name].Regions != hotkey.RegionsIndependent {
				o := origins[name]
				return nil, fmt.Errorf("policies, set by %s, refused: %w", flagName("policies"), &PolicyError{File: o.file, Line: o.line, Field: "policies." + name + ".regions",
					Msg: fmt.Sprintf("regions %v needs the fleet's regions: set %s and %s (or %s)", ps[name].Regions, flagName("region"), flagName("regions"), flagName("nats-gateways"))})
			}
		}
	}
	r := &rules{policies: ps, origins: origins, known: strings.Join(quoteAll(ps.Names()), ", "), envoy: envoy, loadedAt: time.Now()}
	r.gossip, r.apart = bySync(ps, envoy)
	return r, nil
}

// shadowAll puts the policies of ps and those of envoy's rules (nil:
// none), not yet in use, in shadow mode (--shadow).
func shadowAll(ps Policies, envoy *envoyconf.Config) {
	for _, p := range ps {
		p.Shadow = true
	}
	if envoy != nil {
		for _, rule := range envoy.Rules() {
			if rule.Policy != nil {
				rule.Policy.Shadow = true
			}
		}
	}
}

// bySync names the policies of ps and the rules of envoy (nil: none) that
// have sync: gossip, and those that have another mode, each sorted. Rules
// without a counter (unlimited, 0 per unit) are in neither.
func bySync(ps Policies, envoy *envoyconf.Config) (gossip, apart []string) {
	add := func(p *hotkey.Policy) {
		if p.Sync == hotkey.SyncGossip {
			gossip = append(gossip, p.Name)
		} else {
			apart = append(apart, p.Name)
		}
	}
	for _, name := range ps.Names() {
		add(ps[name])
	}
	if envoy != nil {
		for _, rule := range envoy.Rules() {
			if rule.Policy != nil {
				add(rule.Policy)
			}
		}
	}
	slices.Sort(gossip)
	slices.Sort(apart)
	return gossip, apart
}

// nameList names at most 5 of names, for a warning: "a, b and 4 more".
func nameList(names []string) string {
	const most = 5
	if len(names) <= most {
		if len(names) < 2 {
			return strings.Join(names, "")
		}
		return strings.Join(names[:len(names)-1], ", ") + " and " + names[len(names)-1]
	}
	return strings.Join(names[:most], ", ") + fmt.Sprintf(" and %d more", len(names)-most)
}

// LoadPolicies reads the policies at path: one YAML file (see
// ParsePolicies), or a directory whose *.yaml and *.yml files (names
// starting with "." skipped; links to files followed, so a Kubernetes
// ConfigMap's directory reads as its keys) together hold the policies. A
// name defined in two files is refused. Without a "default" policy in any
// file, the built-in one is added. Errors are a *PolicyError naming the
// file, or the error of reading it.
func LoadPolicies(path string) (Policies, error) {
	ps, _, err := loadPolicies(path)
	return ps, err
}

// loadPolicies is LoadPolicies, with where each policy of the files is
// defined.
func loadPolicies(path string) (Policies, map[string]origin, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, nil, err
	}
	files := []string{path}
	if fi.IsDir() {
		if files, err = policyFiles(path); err != nil {
			return nil, nil, err
		}
		if len(files) == 0 {
			return nil, nil, &PolicyError{File: path, Msg: "no *.yaml or *.yml files in the directory"}
		}
	}
	all := make(Policies)
	from := make(map[string]origin)
	for _, f := range files {
		ps, lines, err := loadPoliciesFile(f)
		if err != nil {
			return nil, nil, err
		}
		for _, name := range ps.Names() {
			if prev, dup := from[name]; dup {
				return nil, nil, &PolicyError{File: f, Line: lines[name], Field: "policies." + name, Msg: "defined in " + prev.file + " too: a policy name must be defined once"}
			}
			from[name] = origin{f, lines[name]}
			all[name] = ps[name]
		}
	}
	if _, ok := all[DefaultPolicy]; !ok {
		all[DefaultPolicy] = BuiltinPolicy()
	}
	return all, from, nil
}

// policyFiles lists the policy files of directory dir, sorted.
func policyFiles(dir string) ([]string, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var files []string
	for _, e := range ents {
		name := e.Name()
		if strings.HasPrefix(name, ".") || !(strings.HasSuffix(name, ".yaml") || strings.HasSuffix(name, ".yml")) {
			continue
		}
		p := filepath.Join(dir, name)
		fi, err := os.Stat(p) // through a link
		if err != nil {
			return nil, err
		}
		if fi.Mode().IsRegular() {
			files = append(files, p)
		}
	}
	slices.Sort(files)
	return files, nil
}

// loadPoliciesFile reads and parses one policies file, without the built-in
// default; it also returns the line of each policy's name.
func loadPoliciesFile(file string) (Policies, map[string]int, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxPoliciesFile+1))
	if err != nil {
		return nil, nil, err
	}
	ps, lines, err := parsePolicies(data)
	if pe, ok := errors.AsType[*PolicyError](err); ok {
		pe.File = file
	}
	return ps, lines, err
}

// reloadMetrics count the reloads.
type reloadMetrics struct {
	ok, failed prometheus.Counter
	success    prometheus.Gauge
}

func newReloadMetrics(reg prometheus.Registerer) *reloadMetrics {
	v := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "hotkeyd_policy_reloads_total",
		Help: "Reloads of the policies and Envoy rules (on SIGHUP or a change of their files), by result: ok, or error (the files were refused and the rules in force stay).",
	}, []string{"result"})
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "hotkeyd_policy_last_reload_successful",
		Help: "1 if the last reload of the policies and Envoy rules (or the start) read them, 0 if it refused them and older rules are in force.",
	})
	g.Set(1)
	reg.MustRegister(v, g)
	return &reloadMetrics{ok: v.WithLabelValues("ok"), failed: v.WithLabelValues("error"), success: g}
}

// Reload reads the policies and the Envoy rules again and puts them in
// force at once, both together: decisions from then on use them, those in
// flight finish on the old ones. A file refused keeps all the rules in
// force; its error (naming the file, line and field) is logged and
// returned. cause says what asked for it, for the log.
func (d *Daemon) Reload(cause string) error {
	d.reloadMu.Lock()
	defer d.reloadMu.Unlock()
	old := d.rules.Load()
	r, err := loadRules(d.cfg)
	if err == nil {
		err = keepsState(old, r)
	}
	// The log comes before the count: whoever sees the count finds the
	// log line.
	if err != nil {
		attrs := []any{"cause", cause, "err", err}
		if fe, ok := errors.AsType[*yamlerr.Error](err); ok { // policies and Envoy rules alike
			attrs = append(attrs, "file", fe.File, "line", fe.Line, "field", fe.Field)
		}
		d.log.Error("reload refused: the rules in force stay", attrs...)
		d.reloads.failed.Inc()
		d.reloads.success.Set(0)
		return err
	}
	r.generation = old.generation + 1
	d.rules.Store(r)
	d.engine.KnowPolicies(r.policyList()...)
	added, removed, changed := diffPolicies(old.policies, r.policies)
	attrs := []any{"cause", cause, "policies", strings.Join(r.policies.Names(), ","),
		"added", strings.Join(added, ","), "removed", strings.Join(removed, ","), "changed", strings.Join(changed, ",")}
	if r.envoy != nil {
		attrs = append(attrs, "envoy_domains", strings.Join(r.envoy.Domains(), ","))
	}
	d.log.Info("reloaded", attrs...)
	d.warnUnsignedGossip(old, r)
	d.reloads.ok.Inc()
	d.reloads.success.Set(1)
	return nil
}

// keepsState refuses new rules that change the algorithm, the period or
// the sync mode of a policy (or Envoy rule) that old has: its counters'
// state is written in the first two, and a take under others reads it as
// no usage, so that until every daemon (and every decision in flight) has
// the new rules, daemons on old and new would each wipe the other's counts
// and admit without limit; and a change of sync mode would have daemons
// decide one key in two modes at once, each blind to the other's usage.
func keepsState(old, r *rules) error {
	for _, name := range r.policies.Names() {
		p, q := old.policies[name], r.policies[name]
		if p == nil {
			continue
		}
		if msg := stateChange(p, q, "policy", "rename it"); msg != "" {
			o := r.origins[name]
			return &PolicyError{File: o.file, Line: o.line, Field: "policies." + name, Msg: msg}
		}
	}
	if old.envoy == nil || r.envoy == nil {
		return nil
	}
	before := make(map[string]*hotkey.Policy)
	for _, rule := range old.envoy.Rules() {
		if rule.Policy != nil {
			before[rule.Policy.Name] = rule.Policy
		}
	}
	for _, rule := range r.envoy.Rules() {
		p := before[policyName(rule.Policy)]
		if p == nil {
			continue
		}
		if msg := stateChange(p, rule.Policy, "rule", "give the descriptor another key or value"); msg != "" {
			return &envoyconf.Error{File: rule.File, Line: rule.Line, Field: rule.Path, Msg: msg}
		}
	}
	return nil
}

func policyName(p *hotkey.Policy) string {
	if p == nil {
		return ""
	}
	return p.Name
}

// stateChange explains why a reload may not change p to q, or returns ""
// when it may.
func stateChange(p, q *hotkey.Policy, what, rename string) string {
	if p.Limit.Algorithm == q.Limit.Algorithm && p.Limit.Period == q.Limit.Period {
		if p.Sync == q.Sync {
			return ""
		}
		return fmt.Sprintf("sync %v, was %v: a reload keeps the sync mode of a %s (daemons on old and new would decide its keys in two modes at once, each counting apart from the other: from leased blocks, take by take on the store, or on gossiped memory counters); to change it, %s, or restart the daemons",
			q.Sync, p.Sync, what, rename)
	}
	return fmt.Sprintf("%s per %v, was %s per %v: a reload keeps the algorithm and period of a %s, which its counters' state is written in (daemons that read it under others would count it as nothing); to change them, %s, or restart the daemons (either way its counters start afresh)",
		q.Limit.Algorithm, q.Limit.Period, p.Limit.Algorithm, p.Limit.Period, what, rename)
}

// diffPolicies names the policies of b that a lacks, those of a that b
// lacks, and those of both that differ.
func diffPolicies(a, b Policies) (added, removed, changed []string) {
	for _, n := range b.Names() {
		pa, ok := a[n]
		switch {
		case !ok:
			added = append(added, n)
		case !samePolicy(pa, b[n]):
			changed = append(changed, n)
		}
	}
	for _, n := range a.Names() {
		if _, ok := b[n]; !ok {
			removed = append(removed, n)
		}
	}
	return added, removed, changed
}

func samePolicy(a, b *hotkey.Policy) bool {
	return a.Name == b.Name && a.Limit == b.Limit && a.OnStoreFailure == b.OnStoreFailure && a.Sync == b.Sync && a.Shadow == b.Shadow && slices.Equal(a.Allowlist, b.Allowlist)
}

// watch reloads when the files of --policies or --envoy-config change,
// looking every interval, until stop is closed. A change is seen in the
// files' sizes, times and inodes (a ConfigMap's update swaps a link,
// which changes the inode the path reads), so that nothing is parsed
// while nothing changed; and acted on once the files have stayed the same
// for one more interval, so that a file being written is not read half
// written. A reload that finds the same rules changes nothing.
func (d *Daemon) watch(interval time.Duration, last uint64, stop <-chan struct{}) {
	seen := last // the files as the last look found them
	every(stop, interval, func() bool {
		now := sourcesPrint(d.cfg)
		if now != last && now == seen {
			last = now
			_ = d.Reload("file change") // logged and counted
		}
		seen = now
		return true
	})
}

// sourcesPrint is a digest of what the files of --policies and
// --envoy-config are now: each file's path, size, time and inode, through
// links, a directory's recursively (names starting with "." skipped).
// Files that cannot be read enter it as their error.
func sourcesPrint(cfg Config) uint64 {
	h := xxhash.New()
	for _, root := range []string{cfg.Policies, cfg.EnvoyConfig} {
		if root == "" {
			continue
		}
		walk := root
		if fi, err := os.Lstat(root); err == nil && fi.Mode()&fs.ModeSymlink != 0 {
			if fi, err := os.Stat(root); err == nil && fi.IsDir() {
				walk += string(filepath.Separator) // walk the directory a link names
			}
		}
		err := filepath.WalkDir(walk, func(p string, e fs.DirEntry, err error) error {
			if err != nil {
				fmt.Fprintf(h, "%s: %v\n", p, err)
				return nil
			}
			if p != walk && strings.HasPrefix(e.Name(), ".") {
				if e.IsDir() {
					return filepath.SkipDir
				}
				return nil
			}
			fi, err := os.Stat(p)
			if err != nil {
				fmt.Fprintf(h, "%s: %v\n", p, err)
				return nil
			}
			if !fi.IsDir() {
				fmt.Fprintf(h, "%s %d %d %d\n", p, fi.Size(), fi.ModTime().UnixNano(), inode(fi))
			}
			return nil
		})
		if err != nil {
			fmt.Fprintf(h, "%s: %v\n", root, err)
		}
	}
	return h.Sum64()
}

// policyList returns r's policies, those of the file and of the Envoy
// rules.
func (r *rules) policyList() []*hotkey.Policy {
	var ps []*hotkey.Policy
	for _, name := range r.policies.Names() {
		ps = append(ps, r.policies[name])
	}
	if r.envoy != nil {
		for _, rule := range r.envoy.Rules() {
			if rule.Policy != nil {
				ps = append(ps, rule.Policy)
			}
		}
	}
	return ps
}
