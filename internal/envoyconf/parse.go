package envoyconf

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/hotkeyd/hotkey"
	"github.com/hotkeyd/hotkey/counter"
	"github.com/hotkeyd/hotkey/internal/yamlerr"
)

// MaxFileSize bounds the size of one configuration file.
const MaxFileSize = 1 << 20

// MaxDepth bounds the nesting of descriptors: a descriptor within
// MaxDepth others is refused.
const MaxDepth = 32

// defaultAlgorithm enforces the rules that do not name an algorithm: the
// closest to envoyproxy/ratelimit's fixed windows without their burst at
// the window boundary.
const defaultAlgorithm = counter.SlidingWindow

// Error is a configuration hotkeyd refuses: the file, the line and the
// field at fault ("descriptors[1].rate_limit.unit").
type Error = yamlerr.Error

// Load reads the configuration at path: one YAML file, or a directory
// whose *.yaml and *.yml files, recursively, are each one domain's
// configuration (names starting with "." are skipped, files and
// directories; path may be a symbolic link to the directory, and links to
// files in it are read, links to directories not followed). The files
// are loaded in the lexical order of their paths.
func Load(path string) (*Config, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if !fi.IsDir() {
		data, err := readFile(path)
		if err != nil {
			return nil, err
		}
		return Parse(map[string][]byte{path: data})
	}
	root := path
	if li, err := os.Lstat(path); err == nil && li.Mode()&fs.ModeSymlink != 0 {
		root += string(filepath.Separator) // walk the directory the link names
	}
	files := make(map[string][]byte)
	err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p == root {
			return nil
		}
		if strings.HasPrefix(d.Name(), ".") {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		if d.IsDir() || !isConfigName(d.Name()) {
			return nil
		}
		if d.Type()&fs.ModeSymlink != 0 {
			fi, err := os.Stat(p)
			if err != nil {
				return err
			}
			if !fi.Mode().IsRegular() {
				return nil
			}
		} else if !d.Type().IsRegular() {
			return nil
		}
		data, err := readFile(p)
		if err != nil {
			return err
		}
		files[p] = data
		return nil
	})
	if err != nil {
		return nil, err
	}
	if len(files) == 0 {
		return nil, &Error{File: path, Msg: "no *.yaml or *.yml files in the directory"}
	}
	return Parse(files)
}

func isConfigName(name string) bool {
	ext := filepath.Ext(name)
	return ext == ".yaml" || ext == ".yml"
}

// readFile reads a file of at most MaxFileSize bytes.
func readFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, MaxFileSize+1))
	if err != nil {
		return nil, err
	}
	if len(data) > MaxFileSize {
		return nil, &Error{File: path, Msg: fmt.Sprintf("file is over the %d bytes allowed", MaxFileSize)}
	}
	return data, nil
}

// Parse parses configuration files given as name -> content, each one
// domain's configuration, in the lexical order of their names (which
// errors use). A domain defined in two files is refused, and so is a file
// with an alias that nests a value in itself, descriptors nested over
// MaxDepth, or more than its size allows through aliases: Parse's time
// and memory are linear in the files' size.
func Parse(files map[string][]byte) (*Config, error) {
	if len(files) == 0 {
		return nil, &Error{Msg: "no configuration files"}
	}
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	slices.Sort(names)
	c := &Config{domains: make(map[string]*level)}
	type origin struct {
		file string
		line int
	}
	domains := make(map[string]origin)
	type domainRules struct {
		domain string
		rules  []*Rule
	}
	var byDomain []domainRules
	for _, name := range names {
		f, err := parseFile(name, files[name])
		if err != nil {
			return nil, err
		}
		if o, ok := domains[f.domain]; ok {
			return nil, yamlerr.New(name, f.domainLine, "domain",
				fmt.Sprintf("domain %s is already defined in %s (line %d): give each domain one file", yamlerr.Quote(f.domain), o.file, o.line))
		}
		domains[f.domain] = origin{name, f.domainLine}
		c.domains[f.domain] = f.root
		byDomain = append(byDomain, domainRules{f.domain, f.rules})
	}
	slices.SortFunc(byDomain, func(a, b domainRules) int { return strings.Compare(a.domain, b.domain) })
	for _, d := range byDomain {
		c.rules = append(c.rules, d.rules...)
	}
	if err := checkNames(c.rules); err != nil {
		return nil, err
	}
	return c, nil
}

// checkNames refuses two rules with one path (keys and values holding
// '.' or '_' can make two descriptors' paths alike, and envoyproxy/ratelimit
// would mix their stats) or one policy name (a shortened name ending like
// another's hash).
func checkNames(rules []*Rule) error {
	byName := make(map[string]*Rule, len(rules))
	for _, r := range rules {
		name := PolicyName(r.Path)
		if o, ok := byName[name]; ok {
			of := yamlerr.New("", 0, o.field.String(), "").Field
			msg := fmt.Sprintf("the rule's path %s is also the path of the rule in %s on line %d (%s): change a key or value so that they differ",
				yamlerr.Quote(r.Path), o.File, o.Line, of)
			if o.Path != r.Path {
				msg = fmt.Sprintf("the rule's policy name %s is also the name of the rule in %s on line %d (%s, path %s): change a key or value",
					yamlerr.Quote(name), o.File, o.Line, of, yamlerr.Quote(o.Path))
			}
			return yamlerr.New(r.File, r.Line, r.field.String(), msg)
		}
		byName[name] = r
	}
	return nil
}

// file is one parsed configuration file.
type file struct {
	domain     string
	domainLine int
	root       *level
	rules      []*Rule
}

// parser parses one file. Its work is linear in the file's size: it
// visits at most budget values, aliases included, and builds at most
// pathBudget bytes of descriptor paths; every other thing it makes is of
// constant size per value visited.
type parser struct {
	file       string
	domain     string
	budget     int          // values left to visit: bounds what aliases expand to
	pathBudget int          // bytes of descriptor paths left to build
	open       []*yaml.Node // the descriptor lists and descriptors being parsed, outermost first
	rules      []*Rule
}

// newParser returns a parser for a file of size bytes.
func newParser(name string, size int) *parser {
	// A value takes at least a byte of the file: only aliases can make the
	// parser visit more values than the file has bytes, or build more
	// bytes of paths than 64 times its size.
	return &parser{file: name, budget: 2*size + 1<<14, pathBudget: 64*size + 1<<16}
}

// field is the path of a value in the file, made into text
// ("descriptors[1].rate_limit.unit") only for an error, so that a deep
// file costs no text per level.
type field struct {
	up    *field
	name  string // the key in a mapping
	index int    // the index in a list, when item
	item  bool
}

func (f *field) dot(name string) *field { return &field{up: f, name: name} }
func (f *field) at(i int) *field        { return &field{up: f, index: i, item: true} }

// String returns the path; a nil field is the file's top.
func (f *field) String() string {
	var up []*field
	for g := f; g != nil; g = g.up {
		up = append(up, g)
	}
	var b strings.Builder
	for i := len(up) - 1; i >= 0; i-- {
		switch g := up[i]; {
		case g.item:
			fmt.Fprintf(&b, "[%d]", g.index)
		case b.Len() > 0:
			b.WriteString("." + g.name)
		default:
			b.WriteString(g.name)
		}
	}
	return b.String()
}

func (p *parser) errf(n *yaml.Node, f *field, format string, args ...any) *Error {
	line := 0
	if n != nil {
		line = n.Line
	}
	return yamlerr.New(p.file, line, f.String(), fmt.Sprintf(format, args...))
}

// visit resolves aliases and charges the budget; every node the parser
// looks at goes through it. An alias to a list or descriptor the parser is
// inside is refused: it would nest the file within itself.
func (p *parser) visit(n *yaml.Node, f *field) (*yaml.Node, error) {
	if n.Kind == yaml.AliasNode && n.Alias != nil {
		for _, o := range p.open {
			if o == n.Alias {
				return nil, p.errf(n, f, "the alias *%s refers to a value it is inside (line %d): YAML aliases cannot nest a value in itself",
					yamlerr.Truncate(n.Value, 40), n.Alias.Line)
			}
		}
		n = n.Alias
	}
	p.budget--
	if p.budget < 0 {
		return nil, p.errf(n, f, "the file expands, through YAML aliases, to too many values")
	}
	return n, nil
}

// enter marks v, a descriptor list or a descriptor, as being parsed,
// refusing a descriptor within MaxDepth others; leave unmarks the last.
func (p *parser) enter(v *yaml.Node, f *field) error {
	if v.Kind == yaml.MappingNode && len(p.open) >= 2*MaxDepth { // MaxDepth lists and MaxDepth-1 descriptors
		return p.errf(v, f, "descriptors nested more than %d deep", MaxDepth)
	}
	p.open = append(p.open, v)
	return nil
}

func (p *parser) leave() { p.open = p.open[:len(p.open)-1] }

func parseFile(name string, data []byte) (*file, error) {
	return newParser(name, len(data)).parse(data)
}

func (p *parser) parse(data []byte) (*file, error) {
	name := p.file
	if len(data) > MaxFileSize {
		return nil, &Error{File: name, Msg: fmt.Sprintf("file is %d bytes, over the %d allowed", len(data), MaxFileSize)}
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, p.errf(nil, nil, "file is empty: want a mapping with \"domain\" and \"descriptors\"")
		}
		return nil, yamlError(name, data, err)
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); err == nil {
		at := &extra
		if len(extra.Content) > 0 {
			at = extra.Content[0]
		}
		return nil, p.errf(at, nil, "a second YAML document: each file holds one domain's configuration")
	} else if !errors.Is(err, io.EOF) {
		return nil, yamlError(name, data, err)
	}
	root := &doc
	if root.Kind == yaml.DocumentNode {
		if len(root.Content) == 0 {
			return nil, p.errf(nil, nil, "file is empty: want a mapping with \"domain\" and \"descriptors\"")
		}
		root = root.Content[0]
	}
	root, err := p.visit(root, nil)
	if err != nil {
		return nil, err
	}
	if root.Kind != yaml.MappingNode {
		return nil, p.errf(root, nil, "want a mapping with \"domain\" and \"descriptors\", found %s", kindName(root))
	}
	f := &file{root: &level{}}
	var domainNode, descNode *yaml.Node
	var top *field
	err = p.eachField(root, top, func(key string, k, v *yaml.Node) error {
		switch key {
		case "domain":
			domainNode = v
		case "descriptors":
			descNode = v
		default:
			return p.errf(k, top.dot(key), "unknown field: want domain or descriptors")
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if domainNode == nil {
		return nil, p.errf(root, top.dot("domain"), "missing: every file names its domain")
	}
	if f.domain, err = p.str(domainNode, top.dot("domain")); err != nil {
		return nil, err
	}
	if f.domain == "" {
		return nil, p.errf(domainNode, top.dot("domain"), "empty: every file names its domain")
	}
	f.domainLine = domainNode.Line
	p.domain = f.domain
	if descNode != nil {
		if err := p.descriptors(descNode, top.dot("descriptors"), f.domain, f.root); err != nil {
			return nil, err
		}
	}
	f.rules = p.rules
	return f, nil
}

// descriptors parses a descriptor list into lvl; path is the stat path of
// the list's parent.
func (p *parser) descriptors(v *yaml.Node, field *field, path string, lvl *level) error {
	v, err := p.visit(v, field)
	if err != nil {
		return err
	}
	if v.Kind == yaml.ScalarNode && v.Tag == "!!null" {
		return nil
	}
	if v.Kind != yaml.SequenceNode {
		return p.errf(v, field, "want a list of descriptors (- key: ...), found %s", kindName(v))
	}
	if err := p.enter(v, field); err != nil {
		return err
	}
	defer p.leave()
	lines := make(map[pair]int, len(v.Content))
	for i, item := range v.Content {
		f := field.at(i)
		if err := p.descriptor(item, f, path, lvl, lines); err != nil {
			return err
		}
	}
	return nil
}

// descriptor parses one descriptor into lvl; lines holds the lines of the
// descriptors already in lvl.
func (p *parser) descriptor(v *yaml.Node, field *field, path string, lvl *level, lines map[pair]int) error {
	v, err := p.visit(v, field)
	if err != nil {
		return err
	}
	if v.Kind != yaml.MappingNode {
		return p.errf(v, field, "want a descriptor (a mapping with key, value, rate_limit, ...), found %s", kindName(v))
	}
	if err := p.enter(v, field); err != nil {
		return err
	}
	defer p.leave()
	n := &node{}
	var (
		keyNode, rlNode, childNode, shareNode *yaml.Node
		shadow, quota, detailed               bool
	)
	err = p.eachField(v, field, func(key string, k, val *yaml.Node) error {
		f := field.dot(key)
		var err error
		switch key {
		case "key":
			keyNode = val
			n.key, err = p.str(val, f)
		case "value":
			n.value, err = p.str(val, f)
		case "rate_limit":
			rlNode = val
		case "descriptors":
			childNode = val
		case "shadow_mode":
			shadow, err = p.bool(val, f)
		case "quota_mode":
			quota, err = p.bool(val, f)
		case "detailed_metric":
			detailed, err = p.bool(val, f)
		case "value_to_metric":
			n.valueToMetric, err = p.bool(val, f)
		case "share_threshold":
			shareNode = val
			n.share, err = p.bool(val, f)
		case "unit", "requests_per_unit", "unlimited", "name", "replaces", "algorithm", "on_store_failure", "sync":
			return p.errf(k, f, "unknown field here: %s belongs inside rate_limit", key)
		default:
			return p.errf(k, f, "unknown field: want key, value, rate_limit, descriptors, shadow_mode, quota_mode, detailed_metric, value_to_metric or share_threshold")
		}
		return err
	})
	if err != nil {
		return err
	}
	if keyNode == nil {
		return p.errf(v, field.dot("key"), "missing: every descriptor has a key")
	}
	if n.key == "" {
		return p.errf(keyNode, field.dot("key"), "empty: every descriptor has a key")
	}
	n.wildcard = strings.HasSuffix(n.value, "*")
	n.prefix = strings.TrimSuffix(n.value, "*")
	if n.share && !n.wildcard {
		return p.errf(shareNode, field.dot("share_threshold"), "applies to wildcard values (ending in '*') only, and value is %s", yamlerr.Quote(n.value))
	}
	id := pair{n.key, n.value}
	if first, ok := lines[id]; ok {
		what := fmt.Sprintf("key %s without a value", yamlerr.Quote(n.key))
		if n.value != "" {
			what = fmt.Sprintf("key %s with value %s", yamlerr.Quote(n.key), yamlerr.Quote(n.value))
		}
		return p.errf(v, field, "%s defined twice (first on line %d)", what, first)
	}
	lines[id] = v.Line
	size := len(path) + 1 + len(n.key)
	if n.value != "" {
		size += 1 + len(n.value)
	}
	if p.pathBudget -= size; p.pathBudget < 0 {
		return p.errf(v, field, "the descriptors' paths (domain.key_value...), through YAML aliases or long keys and values, come to too many bytes")
	}
	path += "." + n.key
	if n.value != "" {
		path += "_" + n.value
	}
	if rlNode != nil {
		rl, err := p.visit(rlNode, field.dot("rate_limit"))
		if err != nil {
			return err
		}
		if !(rl.Kind == yaml.ScalarNode && rl.Tag == "!!null") {
			r := &Rule{Domain: p.domain, Path: path, File: p.file, Line: v.Line, field: field,
				ShadowMode: shadow, QuotaMode: quota, DetailedMetric: detailed}
			if err := p.rateLimit(rl, field.dot("rate_limit"), r); err != nil {
				return err
			}
			n.rule = r
			p.rules = append(p.rules, r)
		}
	}
	if childNode != nil {
		if err := p.descriptors(childNode, field.dot("descriptors"), path, &n.children); err != nil {
			return err
		}
		n.hasChildren = len(n.children.exact)+len(n.children.keyOnly) > 0
	}
	if n.value == "" {
		if lvl.keyOnly == nil {
			lvl.keyOnly = make(map[string]*node)
		}
		lvl.keyOnly[n.key] = n
	} else {
		if lvl.exact == nil {
			lvl.exact = make(map[pair]*node)
		}
		lvl.exact[id] = n
		if n.wildcard {
			lvl.wildcards = append(lvl.wildcards, n)
		}
	}
	return nil
}

// rateLimit parses a rate_limit block into r.
func (p *parser) rateLimit(v *yaml.Node, field *field, r *Rule) error {
	if v.Kind != yaml.MappingNode {
		return p.errf(v, field, "want a mapping (unit, requests_per_unit, ...), found %s", kindName(v))
	}
	var (
		unitNode, rpuNode, algNode, fbNode, syncNode *yaml.Node
		replNodes                                    []*yaml.Node
		unit                                         string
		alg                                          = defaultAlgorithm
		fallback                                     = hotkey.FallbackLocal
		mode                                         hotkey.Sync
	)
	err := p.eachField(v, field, func(key string, k, val *yaml.Node) error {
		f := field.dot(key)
		var err error
		switch key {
		case "unit":
			unitNode = val
			unit, err = p.str(val, f)
		case "requests_per_unit":
			val, err = p.visit(val, f)
			if err != nil {
				return err
			}
			if val.Kind == yaml.ScalarNode && val.Tag == "!!null" {
				return nil // as if missing
			}
			rpuNode = val
			r.RequestsPerUnit, err = p.uint32(val, f)
		case "unlimited":
			r.Unlimited, err = p.bool(val, f)
		case "name":
			r.Name, err = p.str(val, f)
		case "replaces":
			r.Replaces, replNodes, err = p.replaces(val, f)
		case "algorithm":
			algNode = val
			var s string
			if s, err = p.str(val, f); err != nil {
				return err
			}
			if alg, err = counter.ParseAlgorithm(s); err != nil {
				return p.errf(val, f, "unknown algorithm %s: want token_bucket, sliding_window, fixed_window or sliding_log", yamlerr.Quote(s))
			}
		case "on_store_failure":
			fbNode = val
			var s string
			if s, err = p.str(val, f); err != nil {
				return err
			}
			if err = fallback.UnmarshalText([]byte(s)); err != nil || fallback == hotkey.FallbackError {
				return p.errf(val, f, "unknown value %s: want local, open or closed", yamlerr.Quote(s))
			}
		case "sync":
			syncNode = val
			var s string
			if s, err = p.str(val, f); err != nil {
				return err
			}
			if err = mode.UnmarshalText([]byte(s)); err != nil {
				return p.errf(val, f, "unknown value %s: want store, reserve or gossip", yamlerr.Quote(s))
			}
		default:
			return p.errf(k, f, "unknown field: want unit, requests_per_unit, unlimited, name, replaces, algorithm, on_store_failure or sync")
		}
		return err
	})
	if err != nil {
		return err
	}
	for i, name := range r.Replaces {
		if name == r.Name {
			return p.errf(replNodes[i], field.dot("replaces").at(i).dot("name"), "%s is this rule's own name: a rule cannot replace itself", yamlerr.Quote(name))
		}
	}
	if r.Unlimited {
		switch {
		case unit != "":
			return p.errf(unitNode, field.dot("unit"), "given with unlimited: true; an unlimited rule has no unit")
		case algNode != nil:
			return p.errf(algNode, field.dot("algorithm"), "given with unlimited: true; an unlimited rule has no counter")
		case fbNode != nil:
			return p.errf(fbNode, field.dot("on_store_failure"), "given with unlimited: true; an unlimited rule has no counter")
		case syncNode != nil:
			return p.errf(syncNode, field.dot("sync"), "given with unlimited: true; an unlimited rule has no counter")
		}
		return nil
	}
	if unitNode == nil || unit == "" {
		at := unitNode
		if at == nil {
			at = v
		}
		return p.errf(at, field.dot("unit"), "missing: want second, minute, hour, day, week, month or year (or unlimited: true)")
	}
	u, ok := parseUnit(unit)
	if !ok {
		return p.errf(unitNode, field.dot("unit"), "unknown unit %s: want second, minute, hour, day, week, month or year", yamlerr.Quote(unit))
	}
	r.Unit = u
	if rpuNode == nil {
		return p.errf(v, field.dot("requests_per_unit"), "missing: how many requests per %s (write requests_per_unit: 0 to refuse every request)", u)
	}
	if r.RequestsPerUnit == 0 {
		return nil
	}
	lim := counter.Limit{Algorithm: alg, Rate: int64(r.RequestsPerUnit), Period: u.Duration()}
	if alg == counter.TokenBucket {
		lim.Burst = lim.Rate
	}
	if err := lim.Validate(); err != nil {
		at, f := rpuNode, field.dot("requests_per_unit")
		if errors.Is(err, counter.ErrUnknownAlgorithm) && algNode != nil {
			at, f = algNode, field.dot("algorithm")
		}
		return p.errf(at, f, "%v", err)
	}
	if err := mode.Keeps(lim.Algorithm); err != nil {
		return p.errf(syncNode, field.dot("sync"), "%v", err)
	}
	r.Policy = &hotkey.Policy{Name: PolicyName(r.Path), Limit: lim, OnStoreFailure: fallback, Sync: mode}
	return nil
}

// replaces parses a replaces list, [{name: ...}, ...], into the names
// and the nodes holding them.
func (p *parser) replaces(v *yaml.Node, field *field) ([]string, []*yaml.Node, error) {
	v, err := p.visit(v, field)
	if err != nil {
		return nil, nil, err
	}
	if v.Kind == yaml.ScalarNode && v.Tag == "!!null" {
		return nil, nil, nil
	}
	if v.Kind != yaml.SequenceNode {
		return nil, nil, p.errf(v, field, "want a list of {name: ...}, found %s", kindName(v))
	}
	var (
		out   []string
		nodes []*yaml.Node
	)
	for i, item := range v.Content {
		f := field.at(i)
		item, err := p.visit(item, f)
		if err != nil {
			return nil, nil, err
		}
		if item.Kind != yaml.MappingNode {
			return nil, nil, p.errf(item, f, "want a mapping with a name (- name: other_rule), found %s", kindName(item))
		}
		var nameNode *yaml.Node
		name := ""
		err = p.eachField(item, f, func(key string, k, val *yaml.Node) error {
			if key != "name" {
				return p.errf(k, f.dot(key), "unknown field: want name")
			}
			nameNode = val
			var err error
			name, err = p.str(val, f.dot("name"))
			return err
		})
		if err != nil {
			return nil, nil, err
		}
		at := nameNode
		if at == nil {
			at = item
		}
		if name == "" {
			return nil, nil, p.errf(at, f.dot("name"), "empty: name the rule (rate_limit.name) this one replaces")
		}
		out = append(out, name)
		nodes = append(nodes, at)
	}
	return out, nodes, nil
}

// eachField calls f for each key of mapping m, in order, refusing
// duplicate, merge and non-scalar keys. path names m in errors.
func (p *parser) eachField(m *yaml.Node, path *field, f func(key string, k, v *yaml.Node) error) error {
	seen := make(map[string]int, len(m.Content)/2)
	for i := 0; i+1 < len(m.Content); i += 2 {
		k, v := m.Content[i], m.Content[i+1]
		k, err := p.visit(k, path)
		if err != nil {
			return err
		}
		if k.Kind != yaml.ScalarNode {
			return p.errf(k, path, "want a field name as key, found %s", kindName(k))
		}
		key := k.Value
		field := path.dot(key)
		if k.Tag == "!!merge" {
			return p.errf(k, field, "merge keys (<<) are not supported: write the fields out")
		}
		if first, ok := seen[key]; ok {
			return p.errf(k, field, "defined twice (first on line %d)", first)
		}
		seen[key] = k.Line
		if err := f(key, k, v); err != nil {
			return err
		}
	}
	return nil
}

// str reads a scalar as text; nothing (null) reads "", as in
// envoyproxy/ratelimit.
func (p *parser) str(v *yaml.Node, field *field) (string, error) {
	v, err := p.visit(v, field)
	if err != nil {
		return "", err
	}
	if v.Kind != yaml.ScalarNode {
		return "", p.errf(v, field, "want a single value, found %s", kindName(v))
	}
	if v.Tag == "!!null" {
		return "", nil
	}
	return v.Value, nil
}

// bool reads a boolean (YAML 1.1's yes/no/on/off too, as
// envoyproxy/ratelimit reads them); nothing (null) reads false.
func (p *parser) bool(v *yaml.Node, field *field) (bool, error) {
	v, err := p.visit(v, field)
	if err != nil {
		return false, err
	}
	if v.Kind == yaml.ScalarNode && v.Tag == "!!null" {
		return false, nil
	}
	var b bool
	if v.Kind != yaml.ScalarNode || v.Style != 0 && v.Style != yaml.TaggedStyle || v.Decode(&b) != nil {
		return false, p.errf(v, field, "want true or false, found %s", kindName(v))
	}
	return b, nil
}

// uint32 reads a whole number from 0 to 4294967295.
func (p *parser) uint32(v *yaml.Node, field *field) (uint32, error) {
	if v.Kind != yaml.ScalarNode || v.Tag != "!!int" {
		return 0, p.errf(v, field, "want a whole number from 0 to %d, found %s", uint32(math.MaxUint32), kindName(v))
	}
	var x int64
	if err := v.Decode(&x); err != nil || x < 0 || x > math.MaxUint32 {
		return 0, p.errf(v, field, "%s is out of range: want a whole number from 0 to %d", yamlerr.Truncate(v.Value, 40), uint32(math.MaxUint32))
	}
	return uint32(x), nil
}

// yamlError turns a YAML syntax error into an Error with its line.
func yamlError(name string, data []byte, err error) error {
	line, msg := yamlerr.Locate(data, err)
	return &Error{File: name, Line: line, Msg: "invalid YAML: " + msg}
}

// kindName describes a node for errors.
func kindName(n *yaml.Node) string { return yamlerr.KindName(n) }
