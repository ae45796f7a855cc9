package shard

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

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
		if got := hasHashTag(tt.give); got != tt.wantTag {
			t.Errorf("hasHashTag(%q) = %v", tt.give, got)
		}
		for _, name := range Names(tt.give, 1, 4, nil) {
			if hasHashTag(name) {
				t.Errorf("Names(%q) gave %q, which has a hash tag", tt.give, name)
			}
		}
	}
	if got := Names("k", 1, 1, nil); len(got) != 1 || got[0] != "k" {
		t.Errorf("level 1 names = %q, want the key", got)
	}
}

func TestPickRoundRobinIsEven(t *testing.T) {
	e := NewEntry("k", 42, Level16, Level16, nil)
	counts := make([]int, 16)
	for range 16 * 100 {
		counts[e.Pick(16, RoundRobin, 7)]++
	}
	for i, c := range counts {
		if c != 100 {
			t.Errorf("subcounter %d picked %d times, want 100", i, c)
		}
	}
	counts = make([]int, 16)
	for range 16 * 1000 {
		counts[e.Pick(16, Random, 7)]++
	}
	for i, c := range counts {
		if c < 800 || c > 1200 {
			t.Errorf("random: subcounter %d picked %d times of 16000", i, c)
		}
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

func TestTable(t *testing.T) {
	tb := NewTable(2)
	h := func(k string) uint64 { return NameHash(k) }
	if tb.Lookup("a", h("a")) != nil {
		t.Fatal("empty table found a key")
	}
	if !tb.Set("a", h("a"), Level4, Level1, nil) || !tb.Set("b", h("b"), Level16, Level1, nil) {
		t.Fatal("Set failed below the cap")
	}
	if tb.Set("c", h("c"), Level4, Level1, nil) {
		t.Error("Set beyond the cap succeeded")
	}
	if tb.Set("a", h("a"), 3, Level1, nil) || tb.Set("a", h("a"), Level1, Level1, nil) {
		t.Error("Set accepted an invalid level")
	}
	e := tb.Lookup("a", h("a"))
	if e == nil || e.Level() != Level4 {
		t.Fatalf("Lookup(a) = %v", e)
	}
	if !tb.Set("a", h("a"), Level64, Level1, nil) || e.Level() != Level64 {
		t.Error("level change did not reach the existing entry")
	}
	if tb.Lookup("a", h("b")) != nil {
		t.Error("Lookup matched on hash alone")
	}
	tb.Merge("a", h("a"))
	tb.Remove(e, Level1)
	if tb.Lookup("a", h("a")) != nil || tb.Len() != 1 {
		t.Errorf("after Merge and Remove: len %d", tb.Len())
	}
}

func TestTableConcurrent(t *testing.T) {
	tb := NewTable(0)
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := range 200 {
				k := fmt.Sprintf("k%d-%d", g, i)
				tb.Set(k, NameHash(k), Level4, Level1, nil)
				if tb.Lookup(k, NameHash(k)) == nil {
					t.Errorf("lost %s", k)
				}
			}
		})
	}
	wg.Wait()
	if tb.Len() != 800 {
		t.Errorf("len %d, want 800", tb.Len())
	}
}

func TestEntryNamesCachedPerVersion(t *testing.T) {
	e := NewEntry("k", 9, Level16, Level16, nil)
	a := e.Names(16, modPlacement{3})
	b := e.Names(16, modPlacement{3})
	if &a[0] != &b[0] {
		t.Error("names recomputed for the same placement version")
	}
	c := e.Names(16, modPlacement{5})
	if &a[0] == &c[0] {
		t.Error("names not recomputed after the placement changed")
	}
}

func BenchmarkTableLookup(b *testing.B) {
	tb := NewTable(0)
	for i := range 1000 {
		k := fmt.Sprintf("hot%d", i)
		tb.Set(k, NameHash(k), Level16, Level1, nil)
	}
	key := "hot500"
	h := NameHash(key)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if tb.Lookup(key, h) == nil {
				b.Fatal("miss")
			}
		}
	})
}

// TestTransferOnce: concurrent decisions on a key whose level changed move
// its usage once, and none decides before the move is done.
func TestTransferOnce(t *testing.T) {
	e := NewEntry("k", 1, Level16, Level1, nil)
	var moves, after atomic.Int32
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := e.Transfer(Level16, nil, func(from Level, _ Placement, to Level) error {
				if from != Level1 || to != Level16 {
					t.Errorf("move from %d to %d, want 1 to 16", from, to)
				}
				time.Sleep(10 * time.Millisecond)
				moves.Add(1)
				return nil
			})
			if err != nil || moves.Load() != 1 {
				t.Errorf("Transfer returned %v with %d moves done, want nil after 1", err, moves.Load())
			}
			after.Add(1)
		}()
	}
	wg.Wait()
	if moves.Load() != 1 || held(e) != Level16 {
		t.Fatalf("%d moves, held %d; want 1 move, held 16", moves.Load(), held(e))
	}
	// A failed move leaves the usage where it was, and is tried again.
	fail := errors.New("store down")
	if err := e.Transfer(Level4, nil, func(Level, Placement, Level) error { return fail }); !errors.Is(err, fail) || held(e) != Level16 {
		t.Fatalf("failed move: %v, held %d; want the error, held 16", err, held(e))
	}
	if err := e.Transfer(Level4, nil, func(Level, Placement, Level) error { return nil }); err != nil || held(e) != Level4 {
		t.Fatalf("retried move: %v, held %d; want held 4", err, held(e))
	}
}

// TestEnterHeld: after a failed move, a decision enters on the counters
// that hold the usage, which Enter refuses since the key's level changed;
// none enters while a move is under way, and a move waits for those that
// entered.
func TestEnterHeld(t *testing.T) {
	e := NewEntry("k", 1, Level1, Level1, nil)
	e.SetLevel(Level16)
	full := errors.New("no room")
	if err := e.Transfer(Level16, nil, func(Level, Placement, Level) error { return full }); !errors.Is(err, full) {
		t.Fatalf("failed move: %v", err)
	}
	if e.Enter(Level1, nil) {
		t.Fatal("Enter on the held level of a key set to another")
	}
	level, _, ok := e.EnterHeld()
	if !ok || level != Level1 {
		t.Fatalf("EnterHeld: level %d, %v; want 1, true", level, ok)
	}
	moved := make(chan struct{})
	go func() {
		defer close(moved)
		e.Transfer(Level16, nil, func(Level, Placement, Level) error {
			if _, _, ok := e.EnterHeld(); ok {
				t.Error("EnterHeld during a move")
			}
			return nil
		})
	}()
	select {
	case <-moved:
		t.Fatal("the move did not wait for the decision that entered")
	case <-time.After(10 * time.Millisecond):
	}
	e.Exit()
	<-moved
	if level, _, ok := e.EnterHeld(); !ok || level != Level16 {
		t.Fatalf("after the move, EnterHeld: level %d, %v; want 16, true", level, ok)
	}
	e.Exit()
}

// versioned is a placement that differs from another only by its version.
type versioned uint64

func (versioned) Nodes() int        { return 1 }
func (versioned) Node(string) int   { return 0 }
func (v versioned) Version() uint64 { return uint64(v) }

// TestTransferPlacement: a split key's usage is held at a level under one
// placement; another version of the placement renames the subcounters, so
// the usage must move, from the old placement's counters. The unsplit
// counter is the key's name under every placement.
func TestTransferPlacement(t *testing.T) {
	v1, v2 := versioned(1), versioned(2)
	e := NewEntry("k", 1, Level16, Level16, v1)
	if !e.Holds(Level16, v1) || e.Holds(Level16, v2) || e.Holds(Level16, nil) || e.Holds(Level4, v1) {
		t.Fatal("Holds: want level 16 under v1 only")
	}
	var gotFrom Level
	var gotP Placement
	if err := e.Transfer(Level16, v2, func(from Level, fromP Placement, to Level) error {
		gotFrom, gotP = from, fromP
		return nil
	}); err != nil || gotFrom != Level16 || gotP != v1 || !e.Holds(Level16, v2) {
		t.Fatalf("move under v2: from %d under %v, holds under v2 %v; want from 16 under v1", gotFrom, gotP, e.Holds(Level16, v2))
	}
	if lvl, p := e.HeldAt(); lvl != Level16 || p != v2 {
		t.Fatalf("HeldAt %d, %v; want 16, v2", lvl, p)
	}
	if err := e.Transfer(Level1, nil, func(Level, Placement, Level) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if !e.Holds(Level1, v1) || !e.Holds(Level1, nil) {
		t.Fatal("the unsplit counter holds the usage under any placement")
	}
}

// TestTransferReadsNotedPlacements: the key was at 4 while this instance
// knew the node map v1, and others may have written level 4's counters
// under it; the map is v2 when the key is back at 16. The move reads 16
// where this instance held it, and level 4 under both v1 and v2, each
// once. An entry remembers the latest maxPlaces placements.
func TestTransferReadsNotedPlacements(t *testing.T) {
	v1, v2 := versioned(1), versioned(2)
	e := NewEntry("k", 1, Level16, Level16, v1)
	e.SetLevel(Level4)
	e.NotePlacement(v1)
	e.SetLevel(Level16)
	e.NotePlacement(v2)
	type read struct {
		level Level
		v     uint64
	}
	var reads []read
	if err := e.Transfer(Level16, v2, func(from Level, fromP Placement, to Level) error {
		if to != Level16 {
			t.Errorf("a move to %d, want 16", to)
		}
		reads = append(reads, read{from, version(fromP)})
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if want := []read{{Level16, 1}, {Level4, 1}, {Level4, 2}}; !slices.Equal(reads, want) {
		t.Errorf("read %v, want %v", reads, want)
	}
	for v := range uint64(6) {
		e.NotePlacement(versioned(v + 10))
	}
	e.NotePlacement(versioned(12)) // noted again: newest
	var vs []uint64
	for _, p := range e.placements(versioned(15)) {
		vs = append(vs, version(p))
	}
	if want := []uint64{13, 14, 15, 12}; !slices.Equal(vs, want) {
		t.Errorf("placements %v, want %v", vs, want)
	}
}

// TestTableMerge: a merged key stays in the table at level 1 until Remove,
// which leaves a key that was split again meanwhile alone.
func TestTableMerge(t *testing.T) {
	tb := NewTable(0)
	tb.Set("k", 7, Level16, Level1, nil)
	e := tb.Lookup("k", 7)
	if e == nil || held(e) != Level1 {
		t.Fatalf("new entry %+v, want its usage held unsplit", e)
	}
	if !tb.Merge("k", 7) || tb.Lookup("k", 7) != e || e.Level() != Level1 {
		t.Fatalf("after Merge: entry %v at level %d, want the same entry at 1", tb.Lookup("k", 7), e.Level())
	}
	if tb.Merge("other", 8) {
		t.Fatal("Merge of a key not in the table reported true")
	}
	tb.Set("k", 7, Level4, Level1, nil) // split again before any decision
	if tb.Remove(e, Level1) || tb.Lookup("k", 7) != e {
		t.Fatal("Remove took out a key split again")
	}
	if tb.Remove(e, Level16) || tb.Lookup("k", 7) != e {
		t.Fatal("Remove at 16 took out a key at level 4")
	}
	tb.Merge("k", 7)
	if !tb.Remove(e, Level1) || tb.Len() != 0 {
		t.Fatalf("Remove of a merged key: table has %d keys, want 0", tb.Len())
	}
	n := 0
	tb.Set("a", 1, Level4, Level1, nil)
	tb.Set("b", 2, Level4, Level1, nil)
	tb.Range(func(*Entry) bool { n++; return false })
	if n != 1 {
		t.Fatalf("Range went on after false: %d calls", n)
	}
}

// held returns the level whose counters hold e's usage.
func held(e *Entry) Level {
	l, _ := e.HeldAt()
	return l
}
