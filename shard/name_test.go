package shard

import (
	"math/rand/v2"
	"strings"
	"testing"
)

// TestNamesKeepOrdinaryNames: keys that cannot be taken for a subcounter's
// name keep the names they always had, so a store's counters keep their
// meaning; the others are escaped, in their unsplit or subcounter names
// only as needed.
func TestNamesKeepOrdinaryNames(t *testing.T) {
	tests := []struct {
		give  string
		level Level
		i     int
		want  string
	}{
		{"p|bob", 1, 0, "p|bob"},
		{"p|bob", 4, 3, "p|bob|4|3"},
		{"api|user_123", 16, 3, "api|user_123|16|3"},
		{"api|12345", 1, 0, "api|12345"},
		{"api|12|34", 1, 0, "api|12|34"}, // 12 is no level
		{"api|64", 1, 0, "api|64"},
		{"api|4|x", 4, 0, "api|4|x|4|0"},
		{"{t}x", 1, 0, "{t}x"},
		{"{t}x", 4, 1, "{}{t}x|4|1"},
		// Unsplit counters of keys that end like a subcounter's name.
		{"p|bob|4|0", 1, 0, "p|bob|4|0\x00"},
		{"p|bob|64|7|2", 1, 0, "p|bob|64|7|2\x00"},
		{"a\x00b", 1, 0, "a\x00\x00b\x00"},
		// Subcounters of keys that end in a level, or hold the escape.
		{"api|64", 4, 2, "api|64\x00|4|2"},
		{"a\x00b", 4, 0, "a\x00\x00b\x00|4|0"},
		{"p|bob|4|0", 4, 1, "p|bob|4|0|4|1"},
		// A "{}" before a key is always Names'.
		{"{}{t}x", 4, 0, "{}{}{t}x|4|0"},
	}
	for _, tt := range tests {
		if got := Names(tt.give, NameHash(tt.give), tt.level, nil)[tt.i]; got != tt.want {
			t.Errorf("Names(%q, %d)[%d] = %q, want %q", tt.give, tt.level, tt.i, got, tt.want)
		}
	}
}

// TestNamesCollision: under policy p, the key "bob|4|0" is counted apart
// from subcounter 0 of "bob" at level 4.
func TestNamesCollision(t *testing.T) {
	cold := Names("p|bob|4|0", NameHash("p|bob|4|0"), Level1, nil)[0]
	sub := Names("p|bob", NameHash("p|bob"), Level4, nil)[0]
	if cold == sub {
		t.Errorf("key p|bob|4|0 and subcounter 0 of p|bob at level 4 are both named %q", cold)
	}
}

// nameOwner is what a counter name names: a key, a level and an index.
type nameOwner struct {
	key   string
	level Level
	i     int
}

// namesOf adds the names of key at every level and index, under each of
// ps, to seen, and returns the names already seen for another (key, level,
// index).
func namesOf(key string, ps []Placement, seen map[string]nameOwner) (clashes []string) {
	h := NameHash(key)
	for _, p := range ps {
		for _, l := range []Level{Level1, Level4, Level16, Level64} {
			for i, name := range Names(key, h, l, p) {
				o := nameOwner{key, l, i}
				if prev, ok := seen[name]; ok && prev != o {
					clashes = append(clashes, name)
					continue
				}
				seen[name] = o
			}
		}
	}
	return clashes
}

// TestNamesInjective: every (key, level, index) has a name of its own,
// under any node map, for keys made of '|', digits, braces and the escape
// byte: every short one, and longer ones of pieces that look like levels,
// indexes and probes.
func TestNamesInjective(t *testing.T) {
	ps := []Placement{nil, modPlacement{3}}
	seen := make(map[string]nameOwner)
	var clashes []string
	keys := 0
	try := func(key string) {
		keys++
		clashes = append(clashes, namesOf(key, ps, seen)...)
	}
	const alphabet = "|461{}a\x00"
	var every func(prefix string, n int)
	every = func(prefix string, n int) {
		try(prefix)
		if n == 0 {
			return
		}
		for i := range len(alphabet) {
			every(prefix+alphabet[i:i+1], n-1)
		}
	}
	every("", 3)
	pieces := []string{"|", "4", "16", "64", "0", "1", "3", "12", "{", "}", "{}", "{t}", "a", "\x00", "|4", "|16|3", "|64|1|2"}
	r := rand.New(rand.NewPCG(1, 2))
	for range 3000 {
		var b strings.Builder
		for range r.IntN(7) {
			b.WriteString(pieces[r.IntN(len(pieces))])
		}
		try(b.String())
	}
	if len(clashes) > 0 {
		t.Errorf("%d of %d names name two (key, level, index) of %d keys; first: %q", len(clashes), len(seen)+len(clashes), keys, clashes[:min(5, len(clashes))])
	}
}

// FuzzNames: two names are equal only for the same key, level and index.
func FuzzNames(f *testing.F) {
	f.Add("p|bob|4|0", "p|bob", uint16(0), uint16(1))
	f.Add("a|16", "a", uint16(1+4*3), uint16(2+4*4))
	f.Add("{}{t}x", "{t}x", uint16(1), uint16(1))
	f.Add("a\x00", "a", uint16(0), uint16(0))
	f.Fuzz(func(t *testing.T, k1, k2 string, a, b uint16) {
		levels := []Level{Level1, Level4, Level16, Level64}
		l1, l2 := levels[a%4], levels[b%4]
		i1, i2 := int(a/4)%int(l1), int(b/4)%int(l2)
		for _, p := range []Placement{nil, modPlacement{3}} {
			n1 := Names(k1, NameHash(k1), l1, p)[i1]
			n2 := Names(k2, NameHash(k2), l2, p)[i2]
			if n1 == n2 && (k1 != k2 || l1 != l2 || i1 != i2) {
				t.Errorf("(%q, %d, %d) and (%q, %d, %d) are both named %q", k1, l1, i1, k2, l2, i2, n1)
			}
		}
	})
}
