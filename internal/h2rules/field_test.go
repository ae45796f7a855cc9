package h2rules_test

import (
	"testing"

	"github.com/hotkeyd/hotkey/internal/h2rules"
)

func TestValidFieldName(t *testing.T) {
	cases := []struct {
		give string
		want bool
	}{
		{"content-type", true},
		{"x-b3_id.0~!#$%&'*+^`|", true},
		{"", false},
		{"Content-Type", false},
		{"x y", false},
		{"x\ty", false},
		{"x:y", false},
		{":path", false},
		{"x\x7f", false},
		{"x\xc3\xa9", false},
		{"x\x00", false},
	}
	for _, tc := range cases {
		if got := h2rules.ValidFieldName(tc.give); got != tc.want {
			t.Errorf("ValidFieldName(%q) = %v, want %v", tc.give, got, tc.want)
		}
	}
}

func TestValidFieldValue(t *testing.T) {
	cases := []struct {
		give string
		want bool
	}{
		{"", true},
		{"application/grpc", true},
		{" a\tb \x01\x7f\xff", true},
		{"a\rb", false},
		{"a\nb", false},
		{"a\x00b", false},
		{"\r", false},
	}
	for _, tc := range cases {
		if got := h2rules.ValidFieldValue(tc.give); got != tc.want {
			t.Errorf("ValidFieldValue(%q) = %v, want %v", tc.give, got, tc.want)
		}
	}
}
