package yamlerr

import (
	"runtime"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
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

// TestLocateCost: a syntax error in a file of many long lines costs Locate
// a bounded number of prefix parses, not one per line.
func TestLocateCost(t *testing.T) {
	var b strings.Builder
	b.WriteString("a: [\n")
	for i := 0; i < 490; i++ {
		b.WriteString("  " + strings.Repeat("x", 100) + ",\n")
	}
	b.WriteString("  : :\n")
	data := []byte(b.String())
	var n yaml.Node
	err := yaml.Unmarshal(data, &n)
	if err == nil {
		t.Fatal("no error")
	}
	var line int
	alloc := allocated(func() { line, _ = Locate(data, err) })
	t.Logf("Locate of a %d-byte file: line %d, %d bytes allocated", len(data), line, alloc)
	if limit := 64*uint64(len(data)) + 16<<20; alloc > limit {
		t.Errorf("Locate allocated %d bytes for a %d-byte file, want at most %d", alloc, len(data), limit)
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

// allocated returns the bytes f allocates.
func allocated(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}
