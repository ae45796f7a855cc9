package shard

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/cespare/xxhash/v2"
)

func TestShareSumsExactly(t *testing.T) {
	for _, total := range []int64{1, 3, 10, 63, 64, 65, 100, 1000, 1001, 123457} {
		for _, n := range []int{1, 4, 16, 64} {
			var sum, lo, hi int64 = 0, total, 0
			for i := range n {
				s := Share(total, n, i)
				sum += s
				lo, hi = min(lo, s), max(hi, s)
			}
			if sum != total {
				t.Errorf("Share(%d, %d): sum %d", total, n, sum)
			}
			if hi-lo > 1 {
				t.Errorf("Share(%d, %d): shares differ by %d", total, n, hi-lo)
			}
		}
	}
	tests := []struct {
		total int64
		n, i  int
		want  int64
	}{
		{10, 4, 0, 3}, {10, 4, 1, 3}, {10, 4, 2, 2}, {10, 4, 3, 2}, {16, 16, 15, 1},
	}
	for _, tt := range tests {
		if got := Share(tt.total, tt.n, tt.i); got != tt.want {
			t.Errorf("Share(%d, %d, %d) = %d, want %d", tt.total, tt.n, tt.i, got, tt.want)
		}
	}
}

func TestFit(t *testing.T) {
	tests := []struct {
		level                          Level
		rate, capacity, minShare, cost int64
		want                           Level
	}{
		{64, 1000, 1000, 10, 1, 64},
		{64, 639, 639, 10, 1, 16},
		{64, 159, 159, 10, 1, 4},
		{64, 39, 39, 10, 1, 1},
		{16, 100000, 100000, 10, 1, 16},
		{16, 1000, 32, 10, 3, 4}, // burst 32 split 16 ways gives 2 < cost 3
		{4, 1000, 1000, 0, 1, 4}, // minShare ≤ 0 counts as 1
		{1, 1000, 1000, 10, 1, 1},
	}
	for _, tt := range tests {
		if got := Fit(tt.level, tt.rate, tt.capacity, tt.minShare, tt.cost); got != tt.want {
			t.Errorf("Fit(%d, %d, %d, %d, %d) = %d, want %d", tt.level, tt.rate, tt.capacity, tt.minShare, tt.cost, got, tt.want)
		}
	}
}

func TestLevels(t *testing.T) {
	tests := []struct{ give, up, down Level }{{1, 4, 1}, {4, 16, 1}, {16, 64, 4}, {64, 64, 16}}
	for _, tt := range tests {
		if tt.give.Up() != tt.up || tt.give.Down() != tt.down {
			t.Errorf("level %d: up %d down %d, want %d %d", tt.give, tt.give.Up(), tt.give.Down(), tt.up, tt.down)
		}
		if got, want := tt.give.String(), strconv.Itoa(int(tt.give)); got != want {
			t.Errorf("Level(%d).String() = %q, want %q", int(tt.give), got, want)
		}
	}
	for l := Level(-1); l < 100; l++ {
		valid := l == 1 || l == 4 || l == 16 || l == 64
		if l.Valid() != valid || l.Split() != (valid && l != 1) {
			t.Errorf("Level(%d): Valid %v, Split %v", int(l), l.Valid(), l.Split())
		}
		err := CheckSplit(l)
		if (err == nil) != l.Split() || err != nil && (!errors.Is(err, ErrInvalidLevel) || !strings.Contains(err.Error(), strconv.Itoa(int(l)))) {
			t.Errorf("CheckSplit(%d) = %v", int(l), err)
		}
	}
}

// modPlacement puts a name on node xxhash(name) % nodes.
type modPlacement struct{ nodes int }

func (p modPlacement) Nodes() int           { return p.nodes }
func (p modPlacement) Node(name string) int { return int(xxhash.Sum64String(name) % uint64(p.nodes)) }
func (p modPlacement) Version() uint64      { return uint64(p.nodes) }

func TestNamesSpreadOverNodes(t *testing.T) {
	for _, nodes := range []int{1, 2, 3, 5, 7} {
		p := modPlacement{nodes}
		for k := range 50 {
			key := fmt.Sprintf("user:%d", k)
			h := NameHash(key)
			for _, n := range []Level{4, 16, 64} {
				names := Names(key, h, n, p)
				if len(names) != int(n) {
					t.Fatalf("%d names, want %d", len(names), n)
				}
				per := make([]int, nodes)
				seen := map[string]bool{}
				for _, name := range names {
					if seen[name] {
						t.Fatalf("duplicate name %q", name)
					}
					seen[name] = true
					if !strings.HasPrefix(name, key+"|") {
						t.Fatalf("name %q does not start with the key", name)
					}
					per[p.Node(name)]++
				}
				limit := (int(n) + nodes - 1) / nodes
				for node, c := range per {
					if c > limit {
						t.Errorf("nodes=%d n=%d key %s: node %d holds %d > %d", nodes, n, key, node, c, limit)
					}
				}
				again := Names(key, h, n, p)
				for i := range names {
					if names[i] != again[i] {
						t.Fatalf("names not deterministic: %q vs %q", names[i], again[i])
					}
				}
			}
		}
	}
}

func TestNamesBreakHashTags(t *testing.T) {
	tests := []struct {
		give    string
		wantTag bool
	}{
		{"plain", false}, {"a{b}c", true}, {"a{}b", false}, {"{x}", true}, {"a{b", false}, {"}{a}", true}, {"{}{a}", false},
	}
	for _, tt := range tests {
		if _, got := HashTag(tt.give); got != tt.wantTag {
			t.Errorf("HashTag(%q) ok = %v", tt.give, got)
		}
		for _, name := range Names(tt.give, 1, 4, nil) {
			if _, tagged := HashTag(name); tagged {
				t.Errorf("Names(%q) gave %q, which has a hash tag", tt.give, name)
			}
		}
	}
	if got := Names("k", 1, 1, nil); len(got) != 1 || got[0] != "k" {
		t.Errorf("level 1 names = %q, want the key", got)
	}
}

func TestSecondChanceDiffers(t *testing.T) {
	for _, n := range []int{4, 16, 64} {
		hit := make([]bool, n)
		for i := range n {
			for r := range uint64(3 * n) {
				j := SecondChance(i, n, r)
				if j == i || j < 0 || j >= n {
					t.Fatalf("SecondChance(%d, %d, %d) = %d", i, n, r, j)
				}
				hit[j] = true
			}
		}
		for j, ok := range hit {
			if !ok {
				t.Errorf("n=%d: subcounter %d never chosen", n, j)
			}
		}
	}
}
