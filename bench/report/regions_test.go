package main

import (
	"math"
	"slices"
	"testing"
	"time"
)

// rgAt is a decision of mode 0 by region, begun at sec seconds and ended
// at end seconds.
func rgAt(region int, sec, end float64, allowed bool) rgDecision {
	return rgDecision{region: region, start: int64(sec * 1e9), end: int64(end * 1e9), allowed: allowed}
}

func TestRgWindows(t *testing.T) {
	recs := []rgDecision{
		rgAt(0, 1, 1, true),
		rgAt(1, 9.9, 10.1, true), // began in window 0, admitted in window 1
		rgAt(2, 5, 5, false),
		{mode: 1, region: 0, start: 2e9, end: 2e9, allowed: true}, // another mode's
		rgAt(0, 15, 15, true),
		rgAt(1, 19.95, 20.05, false), // a denial counts where it began
	}
	ws := rgWindows(recs, 0, 3, 10*time.Second)
	want := []rgWindow{
		{index: 0, admitted: []int64{1, 0, 0}, offered: []int64{1, 1, 1}, denied: []int64{0, 0, 1}},
		{index: 1, admitted: []int64{1, 1, 0}, offered: []int64{1, 1, 0}, denied: []int64{0, 1, 0}, edge: 1},
	}
	if len(ws) != len(want) {
		t.Fatalf("%d windows, want %d", len(ws), len(want))
	}
	for i, w := range ws {
		g := want[i]
		if w.index != g.index || !slices.Equal(w.admitted, g.admitted) || !slices.Equal(w.offered, g.offered) || !slices.Equal(w.denied, g.denied) || w.edge != g.edge {
			t.Errorf("window %d: %+v, want %+v", i, *w, g)
		}
	}
}

func TestFalseDenials(t *testing.T) {
	win := func(admitted, denied int64) *rgWindow {
		return &rgWindow{admitted: []int64{admitted, 0, 0}, denied: []int64{0, denied, 0}, offered: []int64{admitted, denied, 0}}
	}
	tests := []struct {
		give        []*rgWindow
		wantDenied  int64
		wantWindows int
	}{
		{[]*rgWindow{win(9, 3)}, 3, 1},            // ended under the limit of 10 with denials
		{[]*rgWindow{win(10, 5)}, 0, 0},           // reached the limit: its denials are due
		{[]*rgWindow{win(5, 0)}, 0, 0},            // under the limit, nothing denied
		{[]*rgWindow{win(9, 3), win(2, 1)}, 4, 2}, // both
		{nil, 0, 0},
	}
	for i, tt := range tests {
		d, n := falseDenials(tt.give, 10)
		if d != tt.wantDenied || n != tt.wantWindows {
			t.Errorf("%d: falseDenials = %d in %d windows, want %d in %d", i, d, n, tt.wantDenied, tt.wantWindows)
		}
	}
}

func TestRgFigures(t *testing.T) {
	// Windows of 10 s, one a phase, from 1000 s, a limit of 10; the cut
	// in phase 3's window (1020–1030 s).
	g := &rgRun{limit: 10, period: 10 * time.Second, perPhase: 1, t0: time.Unix(1000, 0),
		cutFrom: time.Unix(1022, 0), cutTo: time.Unix(1027, 0)}
	var recs []rgDecision
	admit := func(from float64, perRegion ...int) {
		for ri, n := range perRegion {
			for i := range n {
				at := from + 1 + float64(i)*0.1
				recs = append(recs, rgAt(ri, at, at, true))
			}
		}
	}
	admit(990, 50, 0, 0) // before the first phase: in no phase
	admit(1000, 4, 4, 4) // phase 1: 12
	admit(1010, 6, 2, 1) // phase 2: 9
	admit(1020, 5, 5, 5) // phase 3, the cut's window: 15
	admit(1030, 5, 2, 1) // phase 4: 8, and 2 denials
	recs = append(recs, rgAt(0, 1035, 1035, false), rgAt(1, 1036, 1036, false))

	r := g.figures(recs, 0)
	near := func(a, b float64) bool { return math.Abs(a-b) < 1e-9 }
	if !near(r.worst13, 1.5) || !near(r.worstPart, 1.5) || !near(r.worstOutside, 1.2) {
		t.Errorf("worst %v, the partition's %v, outside it %v; want 1.5, 1.5, 1.2", r.worst13, r.worstPart, r.worstOutside)
	}
	for i, want := range []float64{1.2, 0.9, 1.5, 0.8} {
		if !near(r.phase[i], want) {
			t.Errorf("phase %d: %v, want %v", i+1, r.phase[i], want)
		}
	}
	for i, want := range []float64{0.6, 0.2, 0.1} {
		if !near(r.phase2[i], want) {
			t.Errorf("phase 2, region %d: %v, want %v", i, r.phase2[i], want)
		}
	}
	if r.falseDenied != 2 || r.falseWindows != 1 || r.p4Windows != 1 || r.p4Offered != 10 {
		t.Errorf("false denials %d in %d of %d windows, %d offered; want 2 in 1 of 1, 10", r.falseDenied, r.falseWindows, r.p4Windows, r.p4Offered)
	}
}

func TestRgBins(t *testing.T) {
	recs := []rgDecision{
		rgAt(0, 0.5, 0.5, true),
		rgAt(0, 1.5, 1.5, true),
		rgAt(1, 1.6, 1.6, true),
		rgAt(1, 1.7, 1.7, false), // denied: not admitted
		rgAt(2, 4.5, 4.5, true),  // past the end
	}
	got := rgBins(recs, 0, 3, 0, 3e9, time.Second)
	want := [][]int64{{1, 1, 0}, {0, 1, 0}, {0, 0, 0}}
	for ri := range want {
		if !slices.Equal(got[ri], want[ri]) {
			t.Errorf("region %d: %v, want %v", ri, got[ri], want[ri])
		}
	}
}
