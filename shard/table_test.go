package shard

import "testing"

// TestTableParkRoom: a parked entry stays in the table without taking
// room; splitting its key again needs room as a new key would, and then,
// or once removed, it counts as before; no more than the table's room of
// entries is parked.
func TestTableParkRoom(t *testing.T) {
	tb := NewTable(2)
	set := func(k string, l Level) bool { return tb.Set(k, uint64(len(k))<<8|uint64(k[0]), l, Level1, nil) }
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
	if !tb.Park(get("b")) || !set("a", 16) || a.Parked() || a.Level() != Level16 {
		t.Fatal("parked a not split again once there was room")
	}
	// One room: a parked entry removed gives its place back to the count,
	// and one parked entry is the most.
	tb = NewTable(1)
	set("x", 4)
	x := get("x")
	tb.Merge("x", x.Hash)
	if !tb.Park(x) || !set("y", 4) || !tb.Remove(x, Level1) || set("z", 4) {
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
