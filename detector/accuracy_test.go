package detector

import (
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"testing"
	"time"
	"unsafe"

	"github.com/cespare/xxhash/v2"
)

// The accuracy stream, per sub-window of 100 ms: Zipf(s=1.1) over 10M keys
// and as many unique random keys, 1M events in all (10M requests/s at one
// instance), for 20 sub-windows. T = 5000/s, so a key at T has 500 counts
// per sub-window, and the ~80 keys at the head of the Zipf are hot. Under
// the race detector, which makes it ten times slower, the stream is cut to
// 3 sub-windows of 200K events, with T = 1000/s and a sketch a quarter as
// wide: the same distribution, about as many hot keys, the same load per
// counter.
type accParams struct {
	threshold  float64
	zipfEvents int // per sub-window, and as many unique keys
	width      int
	subWindows int
}

func accuracyParams() accParams {
	if raceEnabled {
		return accParams{threshold: 1000, zipfEvents: 100_000, width: 1 << 14, subWindows: 3}
	}
	return accParams{threshold: 5000, zipfEvents: 500_000, width: 1 << 16, subWindows: 20}
}

const (
	zipfKeys  = 10_000_000
	crowdKeys = 1000
)

// TestAccuracy compares the keys the detector steps up with those an exact
// counter finds over the same spans: the count of a key over the last
// sub-window, at every step, reaching T·SubWindow. Precision is the share
// of stepped-up keys that the exact counter finds hot, recall the share of
// hot keys stepped up, and "late" counts hot keys stepped up after the
// first step at which the exact counter saw them hot. The crowd variant adds
// 1000 keys held at 0.9T, evenly spaced, 9% of T·SubWindow every step: each
// sits in the table, 10% under the threshold, and none may step up.
func TestAccuracy(t *testing.T) {
	for _, tt := range []struct {
		name  string
		crowd bool
	}{
		{"zipf", false},
		{"zipf+crowd", true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			res := runAccuracy(t, tt.crowd)
			t.Logf("%d sub-windows of %d events: %d hot, %d stepped up: precision %.4f, recall %.4f, late %d, crowd stepped up %d; promotion threshold %d, rejected %d",
				res.subWindows, res.events, res.hot, res.flagged, res.precision(), res.recall(), res.late, res.crowdFlagged, res.promote, res.rejected)
			if res.hot < 20 {
				t.Errorf("only %d hot keys: the stream does not test much", res.hot)
			}
			if p := res.precision(); p < 0.99 {
				t.Errorf("precision %.4f, want ≥ 0.99", p)
			}
			if r := res.recall(); r != 1 {
				t.Errorf("recall %.4f, want 1", r)
			}
			if res.late != 0 {
				t.Errorf("%d hot keys stepped up late", res.late)
			}
			if res.crowdFlagged != 0 {
				t.Errorf("%d crowd keys at 0.9T stepped up", res.crowdFlagged)
			}
		})
	}
}

type accuracy struct {
	subWindows, events     int
	hot, flagged, tp, late int
	crowdFlagged           int
	promote                uint32
	rejected               uint64
}

func (a accuracy) precision() float64 { return float64(a.tp) / float64(max(1, a.flagged)) }
func (a accuracy) recall() float64    { return float64(a.tp) / float64(max(1, a.hot)) }

func runAccuracy(t *testing.T, crowd bool) accuracy {
	par := accuracyParams()
	s := newSim(t, Config{Threshold: par.threshold, Width: par.width})
	K := s.cfg.Steps
	spanCount := int32(par.threshold * s.cfg.SubWindow.Seconds()) // exact counts reaching this are hot
	r := rand.New(rand.NewPCG(1, 2))
	zipf := rand.NewZipf(r, 1.1, 1, zipfKeys-1)

	// Keys are ids: Zipf rank k is id k, crowd key i is id zipfKeys+i.
	// Unique keys are seen once and so can never be hot: they go to the
	// detector as key "u" with a random hash, and not to the exact counter.
	var buf []byte
	keyOf := func(id int) (uint64, string) {
		if id < zipfKeys {
			buf = strconv.AppendInt(append(buf[:0], 'z'), int64(id), 10)
		} else {
			buf = strconv.AppendInt(append(buf[:0], 'c'), int64(id-zipfKeys), 10)
		}
		// Observe does not keep key, so it may alias buf.
		return xxhash.Sum64(buf), unsafe.String(unsafe.SliceData(buf), len(buf))
	}
	crowdPerStep := 0
	if crowd {
		crowdPerStep = int(spanCount) * 9 / 10 / K // 0.9T, evenly: exactly 450 per sub-window
	}

	// The exact counter: every step's ids, and each key's count over the span.
	ring := make([][]int32, K)
	total := make([]int32, zipfKeys+crowdKeys)
	firstHot := map[int32]time.Time{} // first tick at which the exact count was hot
	perStep := par.zipfEvents / K
	res := accuracy{subWindows: par.subWindows, events: 2*par.zipfEvents + crowdKeys*crowdPerStep*K}
	for step := 0; step < res.subWindows*K; step++ {
		ids := ring[step%K]
		for _, id := range ids { // the step leaving the span
			total[id]--
		}
		ids = ids[:0]
		for range perStep {
			id := int32(zipf.Uint64())
			h, k := keyOf(int(id))
			s.d.Observe(k, h)
			ids = append(ids, id)
			s.d.Observe("u", r.Uint64())
		}
		for i := range crowdKeys * crowdPerStep {
			id := int32(zipfKeys + i%crowdKeys)
			h, k := keyOf(int(id))
			s.d.Observe(k, h)
			ids = append(ids, id)
		}
		ring[step%K] = ids
		s.tick()
		for _, id := range ids {
			if total[id]++; total[id] >= spanCount {
				if _, ok := firstHot[id]; !ok {
					firstHot[id] = s.now
				}
			}
		}
	}

	flagged := map[string]time.Time{}
	for _, ev := range s.events {
		if _, ok := flagged[ev.Key]; !ok && ev.Level > 1 {
			flagged[ev.Key] = ev.At
		}
	}
	res.hot, res.flagged = len(firstHot), len(flagged)
	for id, at := range firstHot {
		k := "z" + strconv.Itoa(int(id))
		if id >= zipfKeys {
			k = "c" + strconv.Itoa(int(id-zipfKeys))
		}
		if up, ok := flagged[k]; ok {
			res.tp++
			if up.After(at) {
				res.late++
			}
		}
	}
	for k := range flagged {
		if k[0] == 'c' {
			res.crowdFlagged++
		}
	}
	res.promote, res.rejected = s.d.promoteAt.Load(), s.d.Rejected()
	return res
}

// TestLatency steps 1000 keys, each from 0 to 1.2T at a random instant, and
// measures how long each takes to be stepped up, over a background of
// unique keys. With evenly spaced arrivals a key reaches T·SubWindow counts
// after 0.83 of a sub-window, and is seen at the next step: the latency is
// within [0.83, 0.93] sub-windows, whatever the phase.
func TestLatency(t *testing.T) {
	const (
		trials   = 1000
		batch    = 50 // keys stepping during one round
		rounds   = trials / batch
		rate     = 1.2 * 1000
		roundLen = 400 * time.Millisecond
	)
	// A narrow sketch: clearing it at every step is what costs under the
	// race detector, and the background is light.
	s := newSim(t, Config{Threshold: 1000, Width: 4096})
	r := rand.New(rand.NewPCG(3, 4))
	type trial struct {
		key   string
		hash  uint64
		start time.Time
		sent  int
	}
	var lat []time.Duration
	for round := range rounds {
		base := s.now
		ts := make([]*trial, batch)
		for i := range ts {
			k := keyName("step", round*batch+i)
			// A random instant in the first sub-window of the round: any
			// phase against steps and sub-windows.
			ts[i] = &trial{key: k, hash: xxhash.Sum64String(k), start: base.Add(time.Duration(r.Int64N(int64(s.cfg.SubWindow))))}
		}
		for s.now.Before(base.Add(roundLen)) {
			end := s.now.Add(s.step)
			for _, tr := range ts {
				// Arrivals at start + j/rate for j = 0, 1, ...: those before end.
				due := 0
				if end.After(tr.start) {
					due = int(math.Ceil(end.Sub(tr.start).Seconds() * rate))
				}
				for ; tr.sent < due; tr.sent++ {
					s.d.Observe(tr.key, tr.hash)
				}
			}
			for range 1000 {
				s.d.Observe("u", r.Uint64())
			}
			s.tick()
		}
		for _, tr := range ts {
			evs := s.eventsOf(tr.key)
			if len(evs) == 0 || evs[0].Level != 4 {
				t.Fatalf("%s: events %+v, want a step up to 4", tr.key, evs)
			}
			lat = append(lat, evs[0].At.Sub(tr.start))
		}
	}
	slices.Sort(lat)
	p50, p99, worst := lat[len(lat)/2], lat[len(lat)*99/100], lat[len(lat)-1]
	sw := s.cfg.SubWindow.Seconds()
	t.Logf("latency from 0 to 1.2T over %d trials: p50 %v (%.2f sub-windows), p99 %v (%.2f), max %v (%.2f)",
		len(lat), p50, p50.Seconds()/sw, p99, p99.Seconds()/sw, worst, worst.Seconds()/sw)
	if p99 > s.cfg.SubWindow {
		t.Errorf("p99 latency %v, want within one sub-window (%v)", p99, s.cfg.SubWindow)
	}
}
