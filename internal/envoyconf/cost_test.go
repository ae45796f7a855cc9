package envoyconf

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hotkeyd/hotkey/internal/testkit"
)

// cyclicFile nests a descriptor list in itself through an alias.
const cyclicFile = "domain: d\ndescriptors: &x\n  - key: k\n    descriptors: *x\n"

// deepFile nests descriptors depth levels deep.
func deepFile(depth int) string {
	return "domain: d\ndescriptors: " + strings.Repeat("[{key: k, descriptors: ", depth) + "[]" + strings.Repeat("}]", depth) + "\n"
}

// deepAliasFile nests descriptors depth levels deep through aliases, each
// list an alias of the one before inside one new descriptor.
func deepAliasFile(depth int) string {
	var b strings.Builder
	b.WriteString("domain: d\ndescriptors:\n  - key: l0\n    descriptors: &a0 [{key: k}]\n")
	for i := 1; i < depth-1; i++ {
		fmt.Fprintf(&b, "  - key: l%d\n    descriptors: &a%d [{key: k, descriptors: *a%d}]\n", i, i, i-1)
	}
	return b.String()
}

// longPathFile has a descriptor of a long key with n descriptors under it,
// whose paths all start with that key.
func longPathFile(keyLen, n int) string {
	var b strings.Builder
	b.WriteString("domain: d\ndescriptors:\n  - key: " + strings.Repeat("k", keyLen) + "\n    descriptors:\n")
	for i := range n {
		fmt.Fprintf(&b, "      - key: a%d\n", i)
	}
	return b.String()
}

// costLimit bounds the bytes reading a file of size bytes may allocate,
// whether it is loaded or refused.
func costLimit(size int) uint64 { return 512*uint64(size) + 8<<20 }

// fuzzCostLimit bounds the bytes reading any file of size bytes may
// allocate. It is looser than costLimit: yaml.v3 allocates up to about
// 750 bytes per byte of deeply nested flow lists ([[[...), and a syntax
// error costs up to 14 more parses to find the line at fault.
func fuzzCostLimit(size int) uint64 { return 16384*uint64(size) + 16<<20 }

// maxErrorLen bounds the length of an error's text.
const maxErrorLen = 1000

// TestRefusedCheaply: a file whose aliases or nesting would make it cost
// far more than its size is refused, at a cost linear in its size, with
// a short error naming the line and field.
func TestRefusedCheaply(t *testing.T) {
	for _, tc := range []struct {
		name, file string
		line       int
		field, msg string
	}{
		{"cyclic list", cyclicFile, 4, "descriptors[0].descriptors", "the alias *x refers to a value it is inside (line 2)"},
		{"cyclic descriptor", "domain: d\ndescriptors:\n  - &d\n    key: k\n    descriptors: [*d]\n", 5, "descriptors[0].descriptors[0]", "the alias *d refers to a value it is inside (line 3)"},
		{"rate_limit in itself", "domain: d\ndescriptors:\n  - &d\n    key: k\n    rate_limit: *d\n", 5, "descriptors[0].rate_limit", "refers to a value it is inside"},
		{"deep", deepFile(MaxDepth + 1), 2, "", fmt.Sprintf("nested more than %d deep", MaxDepth)},
		{"deep through aliases", deepAliasFile(MaxDepth + 1), 4, "", fmt.Sprintf("nested more than %d deep", MaxDepth)},
		{"billion laughs", aliasBomb(), 4, "", "through YAML aliases, to too many values"},
		{"long paths", longPathFile(40000, 2000), 0, "", "paths"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var err error
			alloc := testkit.Allocated(func() { _, err = Parse(map[string][]byte{"bad.yaml": []byte(tc.file)}) })
			t.Logf("%d bytes allocated for a %d-byte file: %.100v", alloc, len(tc.file), err)
			if limit := costLimit(len(tc.file)); alloc > limit {
				t.Errorf("%d bytes allocated for a %d-byte file, want at most %d", alloc, len(tc.file), limit)
			}
			var e *Error
			if !errors.As(err, &e) {
				t.Fatalf("got %v, want an *Error", err)
			}
			if n := len(e.Error()); n > maxErrorLen {
				t.Errorf("error of %d bytes, want at most %d", n, maxErrorLen)
			}
			wantField := tc.field
			if len(wantField) > 200 {
				wantField = ""
			}
			if e.File != "bad.yaml" || tc.line > 0 && e.Line != tc.line || wantField != "" && e.Field != wantField || e.Field == "" || !strings.Contains(e.Msg, tc.msg) {
				t.Errorf("got %.300v\nwant bad.yaml, line %d, field %q, %q", e, tc.line, tc.field, tc.msg)
			}
		})
	}
}

// TestDepthAndAliases: descriptors nested MaxDepth deep, directly or
// through aliases, and aliases that do not nest a value in itself, load.
func TestDepthAndAliases(t *testing.T) {
	for _, tc := range []struct {
		file  string
		rules int
	}{
		{deepFile(MaxDepth), 0},
		{deepAliasFile(MaxDepth), 0},
		{"domain: d\ndescriptors:\n  - key: a\n    descriptors: &x [{key: b, rate_limit: &r {unit: second, requests_per_unit: 1}}]\n  - key: c\n    descriptors: *x\n    rate_limit: *r\n", 3},
	} {
		c, err := Parse(map[string][]byte{"ok.yaml": []byte(tc.file)})
		if err != nil {
			t.Fatalf("%v\n%s", err, tc.file)
		}
		if len(c.rules) != tc.rules {
			t.Errorf("%d rules, want %d, from\n%s", len(c.rules), tc.rules, tc.file)
		}
	}
}

// FuzzParse: any file is loaded or refused with an *Error of bounded
// length, allocating at most fuzzCostLimit of its size.
func FuzzParse(f *testing.F) {
	for _, s := range []string{cyclicFile, deepFile(MaxDepth + 1), deepAliasFile(MaxDepth + 1), aliasBomb(), longPathFile(200, 50)} {
		f.Add([]byte(s))
	}
	paths, _ := filepath.Glob("testdata/*/*.yaml")
	for _, p := range paths {
		data, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var err error
		alloc := testkit.Allocated(func() { _, err = Parse(map[string][]byte{"f.yaml": data}) })
		if limit := fuzzCostLimit(len(data)); alloc > limit {
			t.Errorf("%d bytes allocated for a %d-byte file, want at most %d", alloc, len(data), limit)
		}
		if err == nil {
			return
		}
		var e *Error
		if !errors.As(err, &e) {
			t.Fatalf("got %T %v, want an *Error", err, err)
		}
		if n := len(e.Error()); n > maxErrorLen {
			t.Errorf("error of %d bytes, want at most %d", n, maxErrorLen)
		}
	})
}
