package split

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hotkeyd/hotkey/counter"
	"github.com/hotkeyd/hotkey/shard"
)

// TestTableParkRoom: a parked entry stays in the table without taking
// room; splitting its key again needs room as a new key would, and then,
// or once removed, it counts as before; no more than the table's room of
// entries is parked.
func TestTableParkRoom(t *testing.T) {
	tb := NewTable(Config{MaxKeys: 2})
	set := func(k string, l shard.Level) bool {
		return tb.Set(k, uint64(len(k))<<8|uint64(k[0]), l, shard.Level1, nil)
	}
	get := func(k string) *Entry { return tb.Lookup(k, uint64(len(k))<<8|uint64(k[0])) }
	if !set("a", 4) || !set("b", 4) || set("c", 4) {
		t.Fatal("a table of 2 did not hold exactly a and b")
	}
	a := get("a")
	if tb.Park(a) {
		t.Fatal("parked a key still split")
	}
	tb.Merge("a", a.Hash)
	if !tb.Park(a) || !a.Parked() || !set("c", 4) || tb.Len() != 3 || get("a") != a {
		t.Fatalf("a parked: parked %v, c split %v, %d entries", a.Parked(), get("c") != nil, tb.Len())
	}
	if set("a", 16) || !a.Parked() {
		t.Fatal("parked a split again in a full table")
	}
	tb.Merge("b", get("b").Hash)
	if !tb.Park(get("b")) || !set("a", 16) || a.Parked() || a.Level() != shard.Level16 {
		t.Fatal("parked a not split again once there was room")
	}
	// One room: a parked entry removed gives its place back to the count,
	// and one parked entry is the most.
	tb = NewTable(Config{MaxKeys: 1})
	set("x", 4)
	x := get("x")
	tb.Merge("x", x.Hash)
	if !tb.Park(x) || !set("y", 4) || !tb.Remove(x, shard.Level1) || set("z", 4) {
		t.Fatal("removing a parked entry did not count the rest against the room")
	}
	y := get("y")
	tb.Merge("y", y.Hash)
	if !tb.Park(y) || !set("z", 4) {
		t.Fatal("z not split beside parked y")
	}
	z := get("z")
	tb.Merge("z", z.Hash)
	if tb.Park(z) {
		t.Error("more entries parked than the table's room")
	}
}

func TestPickRoundRobinIsEven(t *testing.T) {
	e := NewEntry("k", 42, shard.Level16, shard.Level16, nil)
	counts := make([]int, 16)
	for range 16 * 100 {
		counts[e.Pick(16, shard.RoundRobin, 7)]++
	}
	for i, c := range counts {
		if c != 100 {
			t.Errorf("subcounter %d picked %d times, want 100", i, c)
		}
	}
	counts = make([]int, 16)
	for range 16 * 1000 {
		counts[e.Pick(16, shard.Random, 7)]++
	}
	for i, c := range counts {
		if c < 800 || c > 1200 {
			t.Errorf("random: subcounter %d picked %d times of 16000", i, c)
		}
	}
}

func TestTable(t *testing.T) {
	tb := NewTable(Config{MaxKeys: 2})
	h := func(k string) uint64 { return shard.NameHash(k) }
	if tb.Lookup("a", h("a")) != nil {
		t.Fatal("empty table found a key")
	}
	if !tb.Set("a", h("a"), shard.Level4, shard.Level1, nil) || !tb.Set("b", h("b"), shard.Level16, shard.Level1, nil) {
		t.Fatal("Set failed below the cap")
	}
	if tb.Set("c", h("c"), shard.Level4, shard.Level1, nil) {
		t.Error("Set beyond the cap succeeded")
	}
	if tb.Set("a", h("a"), 3, shard.Level1, nil) || tb.Set("a", h("a"), shard.Level1, shard.Level1, nil) {
		t.Error("Set accepted an invalid level")
	}
	e := tb.Lookup("a", h("a"))
	if e == nil || e.Level() != shard.Level4 {
		t.Fatalf("Lookup(a) = %v", e)
	}
	if !tb.Set("a", h("a"), shard.Level64, shard.Level1, nil) || e.Level() != shard.Level64 {
		t.Error("level change did not reach the existing entry")
	}
	if tb.Lookup("a", h("b")) != nil {
		t.Error("Lookup matched on hash alone")
	}
	tb.Merge("a", h("a"))
	tb.Remove(e, shard.Level1)
	if tb.Lookup("a", h("a")) != nil || tb.Len() != 1 {
		t.Errorf("after Merge and Remove: len %d", tb.Len())
	}
}

func TestTableConcurrent(t *testing.T) {
	tb := NewTable(Config{})
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := range 200 {
				k := fmt.Sprintf("k%d-%d", g, i)
				tb.Set(k, shard.NameHash(k), shard.Level4, shard.Level1, nil)
				if tb.Lookup(k, shard.NameHash(k)) == nil {
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
	e := NewEntry("k", 9, shard.Level16, shard.Level16, nil)
	a := e.Names(16, versioned(3))
	b := e.Names(16, versioned(3))
	if &a[0] != &b[0] {
		t.Error("names recomputed for the same placement version")
	}
	c := e.Names(16, versioned(5))
	if &a[0] == &c[0] {
		t.Error("names not recomputed after the placement changed")
	}
}

func BenchmarkTableLookup(b *testing.B) {
	tb := NewTable(Config{})
	for i := range 1000 {
		k := fmt.Sprintf("hot%d", i)
		tb.Set(k, shard.NameHash(k), shard.Level16, shard.Level1, nil)
	}
	key := "hot500"
	h := shard.NameHash(key)
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
	e := NewEntry("k", 1, shard.Level16, shard.Level1, nil)
	var moves, after atomic.Int32
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := transfer(e, shard.Level16, nil, func(from shard.Level, _ shard.Placement, to shard.Level) error {
				if from != shard.Level1 || to != shard.Level16 {
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
	if moves.Load() != 1 || held(e) != shard.Level16 {
		t.Fatalf("%d moves, held %d; want 1 move, held 16", moves.Load(), held(e))
	}
	// A failed move leaves the usage where it was, and is tried again.
	fail := errors.New("store down")
	if err := transfer(e, shard.Level4, nil, func(shard.Level, shard.Placement, shard.Level) error { return fail }); !errors.Is(err, fail) || held(e) != shard.Level16 {
		t.Fatalf("failed move: %v, held %d; want the error, held 16", err, held(e))
	}
	if err := transfer(e, shard.Level4, nil, func(shard.Level, shard.Placement, shard.Level) error { return nil }); err != nil || held(e) != shard.Level4 {
		t.Fatalf("retried move: %v, held %d; want held 4", err, held(e))
	}
}

// TestEnterHeld: after a failed move, a decision enters on the counters
// that hold the usage, which Enter refuses since the key's level changed;
// none enters while a move is under way, and a move waits for those that
// entered.
func TestEnterHeld(t *testing.T) {
	e := NewEntry("k", 1, shard.Level1, shard.Level1, nil)
	e.SetLevel(shard.Level16)
	full := errors.New("no room")
	if err := transfer(e, shard.Level16, nil, func(shard.Level, shard.Placement, shard.Level) error { return full }); !errors.Is(err, full) {
		t.Fatalf("failed move: %v", err)
	}
	if e.enter(Counters{shard.Level1, nil}) {
		t.Fatal("Enter on the held level of a key set to another")
	}
	c, ok := e.enterHeld()
	if level := c.Level; !ok || level != shard.Level1 {
		t.Fatalf("EnterHeld: level %d, %v; want 1, true", level, ok)
	}
	moved := make(chan struct{})
	go func() {
		defer close(moved)
		transfer(e, shard.Level16, nil, func(shard.Level, shard.Placement, shard.Level) error {
			if _, ok := e.enterHeld(); ok {
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
	e.inflight.Add(-1)
	<-moved
	if c, ok := e.enterHeld(); !ok || c.Level != shard.Level16 {
		t.Fatalf("after the move, EnterHeld: level %d, %v; want 16, true", c.Level, ok)
	}
	e.inflight.Add(-1)
}

// TestTransferPlacement: a split key's usage is held at a level under one
// placement; another version of the placement renames the subcounters, so
// the usage must move, from the old placement's counters. The unsplit
// counter is the key's name under every placement.
func TestTransferPlacement(t *testing.T) {
	v1, v2 := versioned(1), versioned(2)
	e := NewEntry("k", 1, shard.Level16, shard.Level16, v1)
	if !e.Holds(shard.Level16, v1) || e.Holds(shard.Level16, v2) || e.Holds(shard.Level16, nil) || e.Holds(shard.Level4, v1) {
		t.Fatal("Holds: want level 16 under v1 only")
	}
	var gotFrom shard.Level
	var gotP shard.Placement
	if err := transfer(e, shard.Level16, v2, func(from shard.Level, fromP shard.Placement, to shard.Level) error {
		gotFrom, gotP = from, fromP
		return nil
	}); err != nil || gotFrom != shard.Level16 || gotP != v1 || !e.Holds(shard.Level16, v2) {
		t.Fatalf("move under v2: from %d under %v, holds under v2 %v; want from 16 under v1", gotFrom, gotP, e.Holds(shard.Level16, v2))
	}
	if lvl, p := e.HeldAt(); lvl != shard.Level16 || p != v2 {
		t.Fatalf("HeldAt %d, %v; want 16, v2", lvl, p)
	}
	if err := transfer(e, shard.Level1, nil, func(shard.Level, shard.Placement, shard.Level) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if !e.Holds(shard.Level1, v1) || !e.Holds(shard.Level1, nil) {
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
	e := NewEntry("k", 1, shard.Level16, shard.Level16, v1)
	e.SetLevel(shard.Level4)
	e.NotePlacement(v1)
	e.SetLevel(shard.Level16)
	e.NotePlacement(v2)
	type read struct {
		level shard.Level
		v     uint64
	}
	var reads []read
	if err := transfer(e, shard.Level16, v2, func(from shard.Level, fromP shard.Placement, to shard.Level) error {
		if to != shard.Level16 {
			t.Errorf("a move to %d, want 16", to)
		}
		reads = append(reads, read{from, version(fromP)})
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if want := []read{{shard.Level16, 1}, {shard.Level4, 1}, {shard.Level4, 2}}; !slices.Equal(reads, want) {
		t.Errorf("read %v, want %v", reads, want)
	}
	for v := range uint64(6) {
		e.NotePlacement(versioned(v + 10))
	}
	e.NotePlacement(versioned(12)) // noted again: newest
	var vs []uint64
	for _, p := range e.Placements() {
		vs = append(vs, version(p))
	}
	if want := []uint64{13, 14, 15, 12}; !slices.Equal(vs, want) {
		t.Errorf("placements %v, want %v", vs, want)
	}
}

// placerFunc is a Placer that calls itself.
type placerFunc func() shard.Placement

func (f placerFunc) Placement() shard.Placement { return f() }

// TestEnterNotesPlacementOnEveryKey: the node map was v2 while this
// instance decided on another key only; others may have written k's
// counters under it. When the map is v3, k's move reads level 4 under v1,
// where this instance held it, and under v2.
func TestEnterNotesPlacementOnEveryKey(t *testing.T) {
	v1, v2, v3 := versioned(1), versioned(2), versioned(3)
	var p shard.Placement = v1
	type read struct {
		key   string
		level shard.Level
		v     uint64
	}
	var reads []read
	var mover moverFunc = func(e *Entry, from Counters) error {
		reads = append(reads, read{e.Key, from.Level, version(from.P)})
		return nil
	}
	tb := NewTable(Config{Mover: mover, Placer: placerFunc(func() shard.Placement { return p })})
	tb.Set("k", 1, shard.Level4, shard.Level4, v1)
	tb.Set("o", 2, shard.Level4, shard.Level4, v1)
	lim := counter.Limit{Algorithm: counter.FixedWindow, Rate: 320, Period: time.Minute}
	enter := func(key string, hash uint64) {
		t.Helper()
		e := tb.Lookup(key, hash)
		if _, err := tb.Enter(context.Background(), e, lim); err != nil {
			t.Fatal(err)
		}
		tb.Exit(e)
	}
	p = v2
	enter("o", 2)
	p = v3
	enter("k", 1)
	if want := []read{{"o", shard.Level4, 1}, {"k", shard.Level4, 1}, {"k", shard.Level4, 2}}; !slices.Equal(reads, want) {
		t.Errorf("read %v, want %v", reads, want)
	}
}

// moverFunc is a Mover that calls itself with the entry and the counters
// moved from.
type moverFunc func(e *Entry, from Counters) error

func (f moverFunc) Move(_ context.Context, e *Entry, from, _ Counters, _, _ counter.Limit) error {
	return f(e, from)
}

// TestTableMerge: a merged key stays in the table at level 1 until Remove,
// which leaves a key that was split again meanwhile alone.
func TestTableMerge(t *testing.T) {
	tb := NewTable(Config{})
	tb.Set("k", 7, shard.Level16, shard.Level1, nil)
	e := tb.Lookup("k", 7)
	if e == nil || held(e) != shard.Level1 {
		t.Fatalf("new entry %+v, want its usage held unsplit", e)
	}
	if !tb.Merge("k", 7) || tb.Lookup("k", 7) != e || e.Level() != shard.Level1 {
		t.Fatalf("after Merge: entry %v at level %d, want the same entry at 1", tb.Lookup("k", 7), e.Level())
	}
	if tb.Merge("other", 8) {
		t.Fatal("Merge of a key not in the table reported true")
	}
	tb.Set("k", 7, shard.Level4, shard.Level1, nil) // split again before any decision
	if tb.Remove(e, shard.Level1) || tb.Lookup("k", 7) != e {
		t.Fatal("Remove took out a key split again")
	}
	if tb.Remove(e, shard.Level16) || tb.Lookup("k", 7) != e {
		t.Fatal("Remove at 16 took out a key at level 4")
	}
	tb.Merge("k", 7)
	if !tb.Remove(e, shard.Level1) || tb.Len() != 0 {
		t.Fatalf("Remove of a merged key: table has %d keys, want 0", tb.Len())
	}
	n := 0
	tb.Set("a", 1, shard.Level4, shard.Level1, nil)
	tb.Set("b", 2, shard.Level4, shard.Level1, nil)
	tb.Range(func(*Entry) bool { n++; return false })
	if n != 1 {
		t.Fatalf("Range went on after false: %d calls", n)
	}
}

// held returns the level whose counters hold e's usage.
func held(e *Entry) shard.Level {
	l, _ := e.HeldAt()
	return l
}

// moveFunc is a Mover that calls itself with the counters moved from.
type moveFunc func(from shard.Level, fromP shard.Placement, to shard.Level) error

func (f moveFunc) Move(_ context.Context, _ *Entry, from, to Counters, _, _ counter.Limit) error {
	return f(from.Level, from.P, to.Level)
}

// transfer moves e's usage to level under p, reading with move.
func transfer(e *Entry, level shard.Level, p shard.Placement, move moveFunc) error {
	return NewTable(Config{Mover: move}).Transfer(context.Background(), e, Counters{level, p}, counter.Limit{}, counter.Limit{})
}
