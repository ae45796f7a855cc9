package envoyconf

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestRefused: each bad file is refused with its name, the line and the
// field at fault.
func TestRefused(t *testing.T) {
	const head = "domain: d\ndescriptors:\n"
	long := strings.Repeat("k", 200)
	// A key making the path "d." + key spell the shortened policy name of
	// the path "d." + long.
	spoof := strings.TrimPrefix(PolicyName("d."+long), "envoy/d.")
	bomb := aliasBomb()
	cases := []struct {
		name, file string
		line       int
		field, msg string
	}{
		{"empty file", "# nothing\n", 0, "", "file is empty"},
		{"not a mapping", "- a\n- b\n", 1, "", "want a mapping with \"domain\""},
		{"missing domain", "descriptors: []\n", 1, "domain", "missing"},
		{"empty domain", "domain: \"\"\ndescriptors: []\n", 1, "domain", "empty"},
		{"domain a list", "domain: [a]\n", 1, "domain", "want a single value, found a list"},
		{"unknown top-level", "domain: d\ndescriptor: []\n", 2, "descriptor", "unknown field"},
		{"second document", "domain: d\n---\ndomain: e\n", 3, "", "a second YAML document"},
		{"invalid YAML", "domain: d\ndescriptors:\n  - key: a\n   value: b\n", 4, "", "invalid YAML"},
		{"descriptors not a list", head + "  key: a\n", 3, "descriptors", "want a list of descriptors"},
		{"descriptor not a mapping", head + "  - a\n  - b\n", 3, "descriptors[0]", "want a descriptor"},
		{"missing key", head + "  - value: x\n", 3, "descriptors[0].key", "missing"},
		{"empty key", head + "  - key: \"\"\n", 3, "descriptors[0].key", "empty"},
		{"key a mapping", head + "  - key: {a: b}\n", 3, "descriptors[0].key", "want a single value"},
		{"unknown descriptor field", head + "  - key: a\n    rate_limits: {}\n", 4, "descriptors[0].rate_limits", "unknown field"},
		{"misplaced unit", head + "  - key: a\n    unit: second\n", 4, "descriptors[0].unit", "belongs inside rate_limit"},
		{"field twice", head + "  - key: a\n    value: b\n    value: c\n", 5, "descriptors[0].value", "defined twice (first on line 4)"},
		{"merge key", head + "  - &b {key: a}\n  - <<: *b\n    value: c\n", 4, "descriptors[1].<<", "merge keys"},
		{"duplicate descriptor", head + "  - key: a\n    value: b\n  - key: c\n  - key: a\n    value: b\n", 6, "descriptors[2]", `key "a" with value "b" defined twice (first on line 3)`},
		{"duplicate key-only", head + "  - key: a\n    descriptors:\n      - key: b\n      - key: b\n", 6, "descriptors[0].descriptors[1]", `key "b" without a value defined twice (first on line 5)`},
		{"nested bad unit", head + "  - key: a\n  - key: b\n    descriptors:\n      - key: c\n        rate_limit:\n          unit: minutes\n          requests_per_unit: 1\n", 8,
			"descriptors[1].descriptors[0].rate_limit.unit", `unknown unit "minutes"`},
		{"unit unknown", head + "  - key: a\n    rate_limit: {unit: unknown, requests_per_unit: 1}\n", 4, "descriptors[0].rate_limit.unit", `unknown unit "unknown"`},
		{"unit missing", head + "  - key: a\n    rate_limit:\n      requests_per_unit: 1\n", 5, "descriptors[0].rate_limit.unit", "missing"},
		{"unit with unlimited", head + "  - key: a\n    rate_limit:\n      unlimited: true\n      unit: second\n", 6, "descriptors[0].rate_limit.unit", "unlimited"},
		{"algorithm with unlimited", head + "  - key: a\n    rate_limit:\n      unlimited: true\n      algorithm: fixed_window\n", 6, "descriptors[0].rate_limit.algorithm", "unlimited"},
		{"requests_per_unit missing", head + "  - key: a\n    rate_limit:\n      unit: second\n", 5, "descriptors[0].rate_limit.requests_per_unit", "requests_per_unit: 0"},
		{"requests_per_unit nothing", head + "  - key: a\n    rate_limit:\n      unit: second\n      requests_per_unit:\n", 5, "descriptors[0].rate_limit.requests_per_unit", "requests_per_unit: 0"},
		{"requests_per_unit negative", head + "  - key: a\n    rate_limit:\n      unit: second\n      requests_per_unit: -1\n", 6, "descriptors[0].rate_limit.requests_per_unit", "out of range"},
		{"requests_per_unit too big", head + "  - key: a\n    rate_limit:\n      unit: second\n      requests_per_unit: 4294967296\n", 6, "descriptors[0].rate_limit.requests_per_unit", "out of range"},
		{"requests_per_unit text", head + "  - key: a\n    rate_limit:\n      unit: second\n      requests_per_unit: \"10\"\n", 6, "descriptors[0].rate_limit.requests_per_unit", "want a whole number"},
		{"requests_per_unit fraction", head + "  - key: a\n    rate_limit:\n      unit: second\n      requests_per_unit: 1.5\n", 6, "descriptors[0].rate_limit.requests_per_unit", "want a whole number"},
		{"sliding_log too large", head + "  - key: a\n    rate_limit:\n      unit: second\n      algorithm: sliding_log\n      requests_per_unit: 200000\n", 7, "descriptors[0].rate_limit.requests_per_unit", "too large"},
		{"unknown algorithm", head + "  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1, algorithm: leaky}\n", 4, "descriptors[0].rate_limit.algorithm", `unknown algorithm "leaky"`},
		{"on_store_failure error", head + "  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1, on_store_failure: error}\n", 4, "descriptors[0].rate_limit.on_store_failure", `unknown value "error"`},
		{"reserve sliding log", head + "  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1, algorithm: sliding_log, sync: reserve}\n", 4, "descriptors[0].rate_limit.sync", `sync reserve cannot keep a sliding_log`},
		{"unknown sync", head + "  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1, sync: gossipy}\n", 4, "descriptors[0].rate_limit.sync", `unknown value "gossipy": want store, reserve or gossip`},
		{"sync with unlimited", head + "  - key: a\n    rate_limit: {unlimited: true, sync: reserve}\n", 4, "descriptors[0].rate_limit.sync", "unlimited"},
		{"sync outside rate_limit", head + "  - key: a\n    sync: reserve\n", 4, "descriptors[0].sync", "belongs inside rate_limit"},
		{"unknown rate_limit field", head + "  - key: a\n    rate_limit:\n      unit: second\n      burst: 3\n", 6, "descriptors[0].rate_limit.burst", "unknown field"},
		{"rate_limit a list", head + "  - key: a\n    rate_limit: [1]\n", 4, "descriptors[0].rate_limit", "want a mapping"},
		{"unlimited not a bool", head + "  - key: a\n    rate_limit: {unlimited: maybe}\n", 4, "descriptors[0].rate_limit.unlimited", "want true or false"},
		{"shadow_mode quoted", head + "  - key: a\n    shadow_mode: \"true\"\n", 4, "descriptors[0].shadow_mode", "want true or false"},
		{"replaces empty name", head + "  - key: a\n    rate_limit:\n      unit: second\n      requests_per_unit: 1\n      replaces:\n        - name: x\n        - name: \"\"\n", 9, "descriptors[0].rate_limit.replaces[1].name", "empty"},
		{"replaces without name", head + "  - key: a\n    rate_limit:\n      unit: second\n      requests_per_unit: 1\n      replaces:\n        - {}\n", 8, "descriptors[0].rate_limit.replaces[0].name", "empty"},
		{"replaces itself", head + "  - key: a\n    rate_limit:\n      name: me\n      unit: second\n      requests_per_unit: 1\n      replaces:\n        - name: me\n", 9, "descriptors[0].rate_limit.replaces[0].name", "own name"},
		{"replaces not a list", head + "  - key: a\n    rate_limit:\n      unit: second\n      requests_per_unit: 1\n      replaces: me\n", 7, "descriptors[0].rate_limit.replaces", "want a list"},
		{"replaces of names", head + "  - key: a\n    rate_limit:\n      unit: second\n      requests_per_unit: 1\n      replaces: [me]\n", 7, "descriptors[0].rate_limit.replaces[0]", "want a mapping with a name"},
		{"replaces unknown field", head + "  - key: a\n    rate_limit:\n      unit: second\n      requests_per_unit: 1\n      replaces: [{nam: me}]\n", 7, "descriptors[0].rate_limit.replaces[0].nam", "unknown field"},
		{"share_threshold without wildcard", head + "  - key: a\n    value: b\n    share_threshold: true\n", 5, "descriptors[0].share_threshold", "wildcard"},
		{"share_threshold without value", head + "  - key: a\n    share_threshold: true\n", 4, "descriptors[0].share_threshold", "wildcard"},
		{"nested descriptors not a list", head + "  - key: a\n    descriptors: b\n", 4, "descriptors[0].descriptors", "want a list"},
		{"same path", head + "  - key: a_b\n    rate_limit: {unit: second, requests_per_unit: 1}\n  - key: a\n    value: b\n    rate_limit: {unit: second, requests_per_unit: 1}\n", 5,
			"descriptors[1]", `path "d.a_b" is also the path of the rule in bad.yaml on line 3 (descriptors[0])`},
		{"same path across levels", head + "  - key: a.b\n    rate_limit: {unlimited: true}\n  - key: a\n    descriptors:\n      - key: b\n        rate_limit: {unlimited: true}\n", 7,
			"descriptors[1].descriptors[0]", `path "d.a.b" is also the path`},
		{"same policy name", head + "  - key: " + long + "\n    rate_limit: {unit: second, requests_per_unit: 1}\n  - key: " + spoof + "\n    rate_limit: {unit: second, requests_per_unit: 1}\n", 5,
			"descriptors[1]", "policy name"},
		{"alias bomb", bomb, 0, "", "aliases"},
		{"too large", head + strings.Repeat("# padding\n", MaxFileSize/10+1), 0, "", "over the"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse(map[string][]byte{"bad.yaml": []byte(tc.file)})
			if err == nil {
				t.Fatalf("accepted:\n%s", tc.file)
			}
			var e *Error
			if !errors.As(err, &e) {
				t.Fatalf("%T %v, want *Error", err, err)
			}
			prefix := "bad.yaml: "
			if tc.line > 0 {
				prefix += fmt.Sprintf("line %d: ", tc.line)
			}
			if tc.field != "" {
				prefix += tc.field + ": "
			}
			if tc.name == "alias bomb" {
				if e.File != "bad.yaml" || !strings.Contains(e.Msg, tc.msg) {
					t.Errorf("got %v", err)
				}
				return
			}
			if !strings.HasPrefix(err.Error(), prefix) || !strings.Contains(e.Msg, tc.msg) {
				t.Errorf("got  %v\nwant %s...%s...", err, prefix, tc.msg)
			}
			if e.File != "bad.yaml" || e.Line != tc.line || e.Field != tc.field {
				t.Errorf("got file %q line %d field %q", e.File, e.Line, e.Field)
			}
		})
	}
}

// aliasBomb is a small file whose aliases expand to a billion
// descriptors.
func aliasBomb() string {
	var b strings.Builder
	b.WriteString("domain: d\ndescriptors:\n")
	for i := 0; i < 10; i++ {
		fmt.Fprintf(&b, "  - key: l%d\n    descriptors: &a%d [", i, i)
		for j := 0; j < 10; j++ {
			if j > 0 {
				b.WriteString(", ")
			}
			if i == 0 {
				fmt.Fprintf(&b, "{key: k%d}", j)
			} else {
				fmt.Fprintf(&b, "{key: k%d, descriptors: *a%d}", j, i-1)
			}
		}
		b.WriteString("]\n")
	}
	return b.String()
}

func TestErrorString(t *testing.T) {
	for _, tc := range []struct {
		e    Error
		want string
	}{
		{Error{File: "f.yaml", Line: 3, Field: "domain", Msg: "empty"}, "f.yaml: line 3: domain: empty"},
		{Error{File: "f.yaml", Msg: "too big"}, "f.yaml: too big"},
		{Error{Line: 2, Msg: "m"}, "line 2: m"},
		{Error{Field: "x", Msg: "m"}, "x: m"},
		{Error{Msg: "m"}, "m"},
	} {
		if got := tc.e.Error(); got != tc.want {
			t.Errorf("%q, want %q", got, tc.want)
		}
	}
}

func TestDuplicateDomain(t *testing.T) {
	_, err := Parse(map[string][]byte{
		"b.yaml": []byte("# b\ndomain: d\n"),
		"a.yaml": []byte("domain: d\n"),
	})
	want := `b.yaml: line 2: domain: domain "d" is already defined in a.yaml (line 1)`
	if err == nil || !strings.HasPrefix(err.Error(), want) {
		t.Errorf("got %v, want %s", err, want)
	}
	if _, err := Parse(nil); err == nil {
		t.Error("no files accepted")
	}
	// A policy name collision across domains names both files.
	_, err = Parse(map[string][]byte{
		"a.yaml": []byte("domain: a.b\ndescriptors:\n  - key: c\n    rate_limit: {unlimited: true}\n"),
		"b.yaml": []byte("domain: a\ndescriptors:\n  - key: b\n    descriptors:\n      - key: c\n        rate_limit: {unlimited: true}\n"),
	})
	want = `a.yaml: line 3: descriptors[0]: the rule's path "a.b.c" is also the path of the rule in b.yaml on line 5 (descriptors[0].descriptors[0])`
	if err == nil || !strings.HasPrefix(err.Error(), want) {
		t.Errorf("got %v, want %s", err, want)
	}
}

// TestLoadDirectory: *.yaml and *.yml files, recursively, without dot
// files and directories, following links to files.
func TestLoadDirectory(t *testing.T) {
	dir := t.TempDir()
	rule := func(domain string) string {
		return "domain: " + domain + "\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n"
	}
	writeFile(t, filepath.Join(dir, "a.yaml"), rule("a"))
	writeFile(t, filepath.Join(dir, "sub", "deeper", "b.yml"), rule("b"))
	writeFile(t, filepath.Join(dir, ".hidden.yaml"), "not: valid")
	writeFile(t, filepath.Join(dir, ".git", "c.yaml"), "not: valid")
	writeFile(t, filepath.Join(dir, "notes.txt"), "not: valid")
	writeFile(t, filepath.Join(dir, "yaml"), "not: valid")
	// A ConfigMap-style mount: the file is a link into a dot directory.
	writeFile(t, filepath.Join(dir, "..data", "c.yaml"), rule("c"))
	if err := os.Symlink(filepath.Join("..data", "c.yaml"), filepath.Join(dir, "c.yaml")); err != nil {
		t.Skip("no symbolic links:", err)
	}
	c := mustLoad(t, dir)
	if got := strings.Join(c.Domains(), ","); got != "a,b,c" {
		t.Errorf("domains %s, want a,b,c", got)
	}
	r := c.Rules()[1]
	if r.Domain != "b" || r.File != filepath.Join(dir, "sub", "deeper", "b.yml") || r.Line != 3 {
		t.Errorf("rule %s at %s:%d", r.Domain, r.File, r.Line)
	}

	// A link to the directory loads it too.
	link := filepath.Join(t.TempDir(), "current")
	if err := os.Symlink(dir, link); err != nil {
		t.Fatal(err)
	}
	if c := mustLoad(t, link); len(c.Domains()) != 3 {
		t.Errorf("through a link: domains %v", c.Domains())
	}

	// An error names the file.
	writeFile(t, filepath.Join(dir, "sub", "bad.yaml"), "domain: x\ndescriptors:\n  - key: \"\"\n")
	_, err := Load(dir)
	want := filepath.Join(dir, "sub", "bad.yaml") + ": line 3: descriptors[0].key: empty"
	if err == nil || !strings.HasPrefix(err.Error(), want) {
		t.Errorf("got %v, want %s", err, want)
	}

	empty := t.TempDir()
	writeFile(t, filepath.Join(empty, "README.md"), "# none\n")
	if _, err := Load(empty); err == nil || !strings.Contains(err.Error(), "no *.yaml or *.yml files") {
		t.Errorf("empty directory: %v", err)
	}
	if _, err := Load(filepath.Join(empty, "missing.yaml")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing file: %v", err)
	}
	big := filepath.Join(empty, "big.yaml")
	writeFile(t, big, "domain: d\n"+strings.Repeat("#", MaxFileSize))
	if _, err := Load(big); err == nil || !strings.HasPrefix(err.Error(), big+": ") || !strings.Contains(err.Error(), "over the") {
		t.Errorf("big file: %v", err)
	}
	// One file loads by its name, whatever its extension.
	one := filepath.Join(empty, "limits.conf")
	writeFile(t, one, rule("one"))
	if c := mustLoad(t, one); strings.Join(c.Domains(), ",") != "one" || c.Rules()[0].File != one {
		t.Errorf("single file: %v", c.Domains())
	}
}

// TestLargestRulesAccepted checks that the largest rules a file can hold
// (requests_per_unit 2^32-1, or 100,000 for sliding_log, per unit up to a
// year) are within the bounds of what a store enforces exactly: Validate
// accepts their limits, so no rule is refused for a number Envoy allows.
func TestLargestRulesAccepted(t *testing.T) {
	for _, alg := range []string{"token_bucket", "sliding_window", "fixed_window", "sliding_log"} {
		for _, unit := range []string{"second", "minute", "hour", "day", "week", "month", "year"} {
			rpu := "4294967295"
			if alg == "sliding_log" {
				rpu = "100000"
			}
			file := fmt.Sprintf("domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: %s, requests_per_unit: %s, algorithm: %s}\n", unit, rpu, alg)
			c, err := Parse(map[string][]byte{"rules.yaml": []byte(file)})
			if err != nil {
				t.Errorf("%s per %s: %v", alg, unit, err)
				continue
			}
			for _, r := range c.Rules() {
				if err := r.Policy.Limit.Validate(); err != nil {
					t.Errorf("%s per %s: %v", alg, unit, err)
				}
			}
		}
	}
}
