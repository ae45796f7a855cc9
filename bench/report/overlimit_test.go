package main

import (
	"slices"
	"testing"
	"time"

	"github.com/hotkeyd/hotkey"
	"github.com/hotkeyd/hotkey/loadgen"
)

func TestExactAdmits(t *testing.T) {
	// 40 requests 50 ms apart from 0.5 s into a 1 s window: 20/s, twice
	// a limit of 10 per second, for 1.95 s.
	const base = int64(1000 * time.Second)
	var recs []olDecision
	for i := range 40 {
		at := 500*time.Millisecond + time.Duration(i)*50*time.Millisecond
		recs = append(recs, olDecision{start: at, end: at})
	}
	tests := []struct {
		give hotkey.Algorithm
		want int64
	}{
		{hotkey.TokenBucket, 29},   // the burst of 10, then one per 100 ms from 1.5 s to 2.4 s
		{hotkey.FixedWindow, 30},   // 10 in each of the three windows touched
		{hotkey.SlidingLog, 20},    // 10 in 0.5–0.95 s, 10 more from 1.5 s
		{hotkey.SlidingWindow, 25}, // 10, then 10 as the first window's weight falls, then 5
	}
	for _, tt := range tests {
		t.Run(tt.give.String(), func(t *testing.T) {
			lim := hotkey.Limit{Algorithm: tt.give, Rate: 10, Period: time.Second}
			if got := exactAdmits(recs, lim, base); got != tt.want {
				t.Errorf("exactAdmits = %d, want %d", got, tt.want)
			}
		})
	}
}

func TestRowWindows(t *testing.T) {
	// The same 40 requests under a token bucket of 10 per second, admitted
	// as an exact bucket admits them (the first 19, then every other one),
	// and again with two more admitted in the second window.
	const base = int64(1000 * time.Second)
	decisions := func(extra ...int) []olDecision {
		var recs []olDecision
		for i := range 40 {
			at := 500*time.Millisecond + time.Duration(i)*50*time.Millisecond
			recs = append(recs, olDecision{start: at, end: at, allowed: i < 19 || i%2 == 0 || slices.Contains(extra, i)})
		}
		return recs
	}
	lim := hotkey.Limit{Algorithm: hotkey.TokenBucket, Rate: 10, Period: time.Second}
	tests := []struct {
		give      []olDecision
		wantOver  int
		wantIdeal int64
	}{
		{decisions(), 0, 29},
		{decisions(19, 21), 1, 29},
	}
	for i, tt := range tests {
		tg := &recordTarget{base: time.Unix(0, base), recs: tt.give}
		r := tg.row(&loadgen.Result{}, lim)
		if r.over != tt.wantOver || r.ideal != tt.wantIdeal {
			t.Errorf("%d: over %d, ideal %d; want %d, %d (worst %d of %d)", i, r.over, r.ideal, tt.wantOver, tt.wantIdeal, r.worstN, r.worstLim)
		}
	}
}

func TestSlidingWorst(t *testing.T) {
	// A sliding log of 10 per second: 10 admissions 50 ms apart from 0.5 s
	// keep every 1 s window of the wall clock within it, but 10 more from
	// 1.0 s do not keep the 1 s from 0.5 s within it.
	at := func(ms int) olDecision {
		d := time.Duration(ms) * time.Millisecond
		return olDecision{start: d, end: d, allowed: true}
	}
	var recs []olDecision
	for i := range 10 {
		recs = append(recs, at(500+50*i))
	}
	for i := range 10 {
		recs = append(recs, at(1000+50*i))
	}
	lim := hotkey.Limit{Algorithm: hotkey.SlidingLog, Rate: 10, Period: time.Second}
	tg := &recordTarget{base: time.Unix(1000, 0), recs: recs}
	r := tg.row(&loadgen.Result{}, lim)
	if r.worstN != 20 || r.over != 10 {
		t.Errorf("worst %d of %d, %d windows over; want 20 of 10, 10 over", r.worstN, r.worstLim, r.over)
	}
}

func TestOverlimitRowFilter(t *testing.T) {
	tests := []struct {
		give string // OVERLIMIT_ROWS
		row  string
		want bool
	}{
		{"", "token_bucket/reserve/1.5", true},
		{"", "ratelimit", true},
		{"/store/", "sliding_log/store/10", true},
		{"/store/", "sliding_log/reserve/10", false},
		{"/store/", "ratelimit", false},
		{"^token_bucket/store/10$", "token_bucket/store/1.5", false},
	}
	for _, tt := range tests {
		t.Setenv("OVERLIMIT_ROWS", tt.give)
		re, err := olRowFilter()
		if err != nil {
			t.Fatal(err)
		}
		if got := re.MatchString(tt.row); got != tt.want {
			t.Errorf("OVERLIMIT_ROWS=%q, row %q: %v, want %v", tt.give, tt.row, got, tt.want)
		}
	}
	t.Setenv("OVERLIMIT_ROWS", "(")
	if _, err := olRowFilter(); err == nil {
		t.Error("OVERLIMIT_ROWS=( did not fail")
	}
}
