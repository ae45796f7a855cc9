package namespace

import (
	"strings"
	"testing"
)

func TestAllowSubject(t *testing.T) {
	for _, c := range []struct{ give, want string }{
		{"default", "hotkey.allow"},
		{"staging", "hotkey.staging.api.allow"},
		{"eu-1_b", "hotkey.eu-1_b.api.allow"},
	} {
		if got := AllowSubject(c.give); got != c.want {
			t.Errorf("AllowSubject(%q) = %q, want %q", c.give, got, c.want)
		}
	}
}

func TestValid(t *testing.T) {
	for _, c := range []struct {
		give string
		want bool
	}{
		{"default", true},
		{"eu-1_B", true},
		{strings.Repeat("n", Max), true},
		{strings.Repeat("n", Max+1), false},
		{"", false},
		{"a.b", false},
		{"a b", false},
		{"*", false},
		{">", false},
	} {
		if got := Valid(c.give); got != c.want {
			t.Errorf("Valid(%q) = %v, want %v", c.give, got, c.want)
		}
	}
}
