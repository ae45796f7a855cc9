package yamlerr

import (
	"strings"
	"testing"

	"gopkg.in/yaml.v3"

	"github.com/hotkeyd/hotkey/internal/testkit"
)

// TestLocate: the line named is the one at fault, not the one where
// yaml.v3 says the enclosing block starts.
func TestLocate(t *testing.T) {
	data := []byte("policies:\n  api:\n    limit: 100\n   period: 1s\n")
	var n yaml.Node
	err := yaml.Unmarshal(data, &n)
	if err == nil {
		t.Fatal("no error")
	}
	line, msg := Locate(data, err)
	if line != 4 || msg == "" {
		t.Errorf("line %d, message %q; want line 4", line, msg)
	}
}

func TestKindNameAndTruncate(t *testing.T) {
	var n yaml.Node
	if err := yaml.Unmarshal([]byte("[1, 2]"), &n); err != nil {
		t.Fatal(err)
	}
	if got := KindName(n.Content[0]); got != "a list" {
		t.Errorf("KindName: %q", got)
	}
	if got := Truncate("héllo", 2); got != "h…" {
		t.Errorf("Truncate on a rune boundary: %q", got)
	}
}

// TestLocateLongFile: the line at fault is found early in a long file.
func TestLocateLongFile(t *testing.T) {
	data := []byte("policies:\n  api:\n    limit: 100\n   period: 1s\n" + strings.Repeat("# a comment of some length\n", 200))
	var n yaml.Node
	err := yaml.Unmarshal(data, &n)
	if err == nil {
		t.Fatal("no error")
	}
	if line, _ := Locate(data, err); line != 4 {
		t.Errorf("line %d, want 4", line)
	}
}

// TestLocateCost: a syntax error in a file of many long lines, or deep
// ones, costs Locate a number of prefix parses bounded by the file's size,
// not one per line.
func TestLocateCost(t *testing.T) {
	long := "a: [\n" + strings.Repeat("  "+strings.Repeat("x", 100)+",\n", 490) + "  : :\n"
	deep := "a: " + strings.Repeat("[", 2000) + "\n" + strings.Repeat("  x,\n", 490) + "  : :\n"
	for _, s := range []string{long, deep} {
		data := []byte(s)
		var n yaml.Node
		err := yaml.Unmarshal(data, &n)
		if err == nil {
			t.Fatal("no error")
		}
		parse := testkit.Allocated(func() { yaml.Unmarshal(data, &n) })
		var line int
		alloc := testkit.Allocated(func() { line, _ = Locate(data, err) })
		t.Logf("Locate of a %d-byte file: line %d, %d bytes allocated; one parse %d", len(data), line, alloc, parse)
		if limit := 16*parse + 4<<20; alloc > limit {
			t.Errorf("Locate allocated %d bytes for a %d-byte file that one parse allocates %d for, want at most %d", alloc, len(data), parse, limit)
		}
	}
}

func TestNew(t *testing.T) {
	field := strings.Repeat("descriptors[0].", 100) + "rate_limit.unit"
	e := New("f.yaml", 3, field, strings.Repeat("m", 1000))
	if len(e.Field) > MaxField || !strings.HasPrefix(e.Field, "descriptors[0].") || !strings.HasSuffix(e.Field, ".rate_limit.unit") || !strings.Contains(e.Field, "…") {
		t.Errorf("field %q (%d bytes): want at most %d, its start and end kept", e.Field, len(e.Field), MaxField)
	}
	if len(e.Msg) > MaxMsg+len("…") {
		t.Errorf("message of %d bytes, want at most %d", len(e.Msg), MaxMsg)
	}
	if e := New("f", 1, "a.b", "short"); e.Field != "a.b" || e.Msg != "short" {
		t.Errorf("short field and message changed: %+v", e)
	}
	if got := Quote(strings.Repeat("é", 100)); len(got) > 64+len(`"…"`) {
		t.Errorf("Quote: %d bytes", len(got))
	}
}
