package yamlerr

import (
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
