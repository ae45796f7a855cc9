package daemon

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/hotkeyd/hotkey/internal/testkit"
)

// policiesBomb is a small file of aliases of aliases that would expand to
// a billion keys.
func policiesBomb() string {
	var b strings.Builder
	b.WriteString("policies:\n  p0: {limit: 1, period: 1s, allowlist: &a0 [x, x, x, x, x, x, x, x, x, x]}\n")
	for i := 1; i < 10; i++ {
		a := fmt.Sprintf("*a%d", i-1)
		fmt.Fprintf(&b, "  p%d: {limit: 1, period: 1s, allowlist: &a%d [%s]}\n", i, i, strings.Repeat(a+", ", 9)+a)
	}
	return b.String()
}

// longLinesFile is a syntax error after many long lines.
func longLinesFile() string {
	var b strings.Builder
	b.WriteString("policies: [\n")
	for range 490 {
		b.WriteString("  " + strings.Repeat("x", 100) + ",\n")
	}
	b.WriteString("  : :\n")
	return b.String()
}

// policiesCostLimit bounds the bytes reading a policies file of size bytes
// may allocate, whether it is loaded or refused.
func policiesCostLimit(size int) uint64 { return 512*uint64(size) + 8<<20 }

// fuzzPoliciesCostLimit bounds the bytes reading any file of size bytes may
// allocate. It is looser than policiesCostLimit: yaml.v3 allocates up to about
// 750 bytes per byte of deeply nested flow lists ([[[...), and a syntax
// error costs up to 14 more parses to find the line at fault.
func fuzzPoliciesCostLimit(size int) uint64 { return 16384*uint64(size) + 16<<20 }

// maxPolicyErrorLen bounds the length of an error's text.
const maxPolicyErrorLen = 1000

// TestPoliciesRefusedCheaply: a policies file whose aliases, nesting or
// long names could make it cost far more than its size is refused, at a
// cost linear in its size, with a short error naming the line and field.
func TestPoliciesRefusedCheaply(t *testing.T) {
	long := strings.Repeat("n", 100000)
	for _, tc := range []struct {
		name, file string
		line       int
		field, msg string
	}{
		{"cyclic", "policies: &x\n  a: *x\n", 2, "policies.a", "found an alias"},
		{"cyclic allowlist", "policies:\n  a: &x\n    allowlist: *x\n", 3, "policies.a.allowlist", "found an alias"},
		{"billion laughs", policiesBomb(), 3, "policies.p1.allowlist[0]", "found an alias"},
		{"deep", "policies:\n  a:\n    limit: 1\n    period: 1s\n    allowlist: " + strings.Repeat("[", 9000) + strings.Repeat("]", 9000) + "\n", 5, "policies.a.allowlist[0]", "found a list"},
		{"too deep for yaml.v3", "policies:\n  a:\n    allowlist: " + strings.Repeat("[", 40000) + "\n", 3, "", "exceeded max depth"},
		{"long name", "policies:\n  ? " + long + "\n  : {limit: 1, period: 1s}\n", 2, "", "policy name must be 1 to 64 characters"},
		{"long field", "policies:\n  a:\n    ? " + long + "\n    : 1\n", 3, "", "unknown field"},
		{"long algorithm", "policies:\n  a: {limit: 1, period: 1s, algorithm: " + long + "}\n", 2, "policies.a.algorithm", "unknown algorithm"},
		{"syntax error after long lines", longLinesFile(), 0, "", "invalid YAML"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var err error
			alloc := testkit.Allocated(func() { _, err = ParsePolicies([]byte(tc.file)) })
			t.Logf("%d bytes allocated for a %d-byte file: %.100v", alloc, len(tc.file), err)
			if limit := policiesCostLimit(len(tc.file)); alloc > limit {
				t.Errorf("%d bytes allocated for a %d-byte file, want at most %d", alloc, len(tc.file), limit)
			}
			var e *PolicyError
			if !errors.As(err, &e) {
				t.Fatalf("got %v, want a *PolicyError", err)
			}
			if n := len(e.Error()); n > maxPolicyErrorLen {
				t.Errorf("error of %d bytes, want at most %d", n, maxPolicyErrorLen)
			}
			if tc.line > 0 && e.Line != tc.line || tc.field != "" && e.Field != tc.field || !strings.Contains(e.Msg, tc.msg) {
				t.Errorf("got %.300v\nwant line %d, field %q, %q", e, tc.line, tc.field, tc.msg)
			}
		})
	}
}
