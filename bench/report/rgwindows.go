package main

import (
	"slices"
	"time"
)

// rgDecision is one decision of the regions scenario: its mode and region
// (indexes), when it began and ended (Unix ns), and whether it admitted.
type rgDecision struct {
	mode, region int
	start, end   int64
	allowed      bool
}

// rgWindow is one mode's fixed window of the wall clock, across regions:
// the admissions per region that ended in it (those that began in the
// window before counted here, as edge), and the decisions and denials per
// region that began in it.
type rgWindow struct {
	index    int64 // Unix ns ÷ the period
	admitted []int64
	offered  []int64
	denied   []int64
	edge     int64
}

// total returns the window's admissions, all regions together.
func (w *rgWindow) total() int64 {
	var n int64
	for _, a := range w.admitted {
		n += a
	}
	return n
}

func (w *rgWindow) deniedTotal() int64 {
	var n int64
	for _, d := range w.denied {
		n += d
	}
	return n
}

func (w *rgWindow) offeredTotal() int64 {
	var n int64
	for _, o := range w.offered {
		n += o
	}
	return n
}

// rgWindows returns mode's windows of period that decisions of recs fall
// in, in order, counting regions regions.
func rgWindows(recs []rgDecision, mode, regions int, period time.Duration) []*rgWindow {
	p := int64(period)
	byIndex := map[int64]*rgWindow{}
	at := func(i int64) *rgWindow {
		w := byIndex[i]
		if w == nil {
			w = &rgWindow{index: i, admitted: make([]int64, regions), offered: make([]int64, regions), denied: make([]int64, regions)}
			byIndex[i] = w
		}
		return w
	}
	for _, d := range recs {
		if d.mode != mode {
			continue
		}
		w0 := at(d.start / p)
		w0.offered[d.region]++
		if !d.allowed {
			w0.denied[d.region]++
			continue
		}
		w1 := at(d.end / p)
		w1.admitted[d.region]++
		if w1 != w0 {
			w1.edge++
		}
	}
	var ws []*rgWindow
	for _, w := range byIndex {
		ws = append(ws, w)
	}
	slices.SortFunc(ws, func(a, b *rgWindow) int { return int(a.index - b.index) })
	return ws
}

// between returns the windows of ws that start at or after from and end at
// or before to (Unix ns).
func between(ws []*rgWindow, period time.Duration, from, to int64) []*rgWindow {
	var out []*rgWindow
	for _, w := range ws {
		s := w.index * int64(period)
		if s >= from && s+int64(period) <= to {
			out = append(out, w)
		}
	}
	return out
}

// worstWindow returns the most any of ws admitted, all regions together.
func worstWindow(ws []*rgWindow) int64 {
	var n int64
	for _, w := range ws {
		n = max(n, w.total())
	}
	return n
}

// falseDenials returns the denials in the windows of ws that ended with
// fewer than limit admitted, all regions together, and how many such
// windows had one.
func falseDenials(ws []*rgWindow, limit int64) (denied int64, windows int) {
	for _, w := range ws {
		if d := w.deniedTotal(); d > 0 && w.total() < limit {
			denied += d
			windows++
		}
	}
	return denied, windows
}

// rgBins returns mode's admissions per bin of width bin from the instant
// from (Unix ns) until to, per region, by the decision's end.
func rgBins(recs []rgDecision, mode, regions int, from, to int64, bin time.Duration) [][]int64 {
	n := int((to - from + int64(bin) - 1) / int64(bin))
	out := make([][]int64, regions)
	for r := range out {
		out[r] = make([]int64, n)
	}
	for _, d := range recs {
		if d.mode != mode || !d.allowed || d.end < from {
			continue
		}
		if i := int((d.end - from) / int64(bin)); i < n {
			out[d.region][i]++
		}
	}
	return out
}
