package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/hotkeyd/hotkey/bench/internal/scenario"
	"github.com/hotkeyd/hotkey/detector"
)

// runDetector feeds one instance's detector a Zipf stream (s = 1.1 over 10M
// keys) and as many requests for new random keys (a flood), on a simulated
// clock ticked every step, and compares the keys it steps up with those an
// exact counter finds hot: a count over the last sub-window reaching
// T·SubWindow at some step.
func runDetector(ctx context.Context, s *setup) (*scenario.Section, error) {
	const zipfKeys = 10_000_000
	threshold, perSub, subWindows := 5000.0, 500_000, 20 // 10M requests/s at one instance
	if s.quick {
		perSub, subWindows = 200_000, 5
		threshold = 2000
	}
	cfg := detector.DefaultConfig()
	cfg.Threshold = threshold
	cfg.QueueSize = 1 << 16
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	d, err := detector.New(cfg, now)
	if err != nil {
		return nil, err
	}
	defer d.Close()
	k := cfg.Steps
	step := cfg.SubWindow / time.Duration(k)
	spanCount := int32(threshold * cfg.SubWindow.Seconds())
	r := rand.New(rand.NewPCG(1, 2))
	zipf := rand.NewZipf(r, 1.1, 1, zipfKeys-1)
	ring := make([][]int32, k)
	total := make([]int32, zipfKeys)
	hot := map[int32]bool{}
	flagged := map[string]bool{}
	var buf []byte
	perStep := perSub / k
	for st := 0; st < subWindows*k; st++ {
		ids := ring[st%k]
		for _, id := range ids {
			total[id]--
		}
		ids = ids[:0]
		for range perStep {
			id := int32(zipf.Uint64())
			buf = strconv.AppendInt(append(buf[:0], 'z'), int64(id), 10)
			d.Observe(string(buf), xxhash.Sum64(buf))
			ids = append(ids, id)
			d.Observe("flood", r.Uint64()) // a new key each time: its own hash
		}
		ring[st%k] = ids
		now = now.Add(step)
		d.Tick(now)
		for _, id := range ids {
			if total[id]++; total[id] >= spanCount {
				hot[id] = true
			}
		}
		for drained := false; !drained; {
			select {
			case ev := <-d.Events():
				if ev.Level > 1 {
					flagged[ev.Key] = true
				}
			default:
				drained = true
			}
		}
	}
	tp := 0
	for id := range hot {
		if flagged["z"+strconv.Itoa(int(id))] {
			tp++
		}
	}
	sec := &scenario.Section{Setup: fmt.Sprintf("one detector (default sketch: 4 rows of 65,536 counters per stripe, an exact table of 4,096 keys), T = %.0f/s; %d sub-windows of 100 ms, each %d requests by Zipf's law (s = 1.1, 10M keys) and as many for new random keys: %.0fM requests/s at this instance, on a simulated clock.", threshold, subWindows, perSub, float64(2*perSub)/cfg.SubWindow.Seconds()/1e6)}
	sec.Printf("| hot keys (exact) | stepped up | precision | recall | keys the exact table refused |\n|---|---|---|---|---|\n")
	sec.Printf("| %d | %d | %.4f | %.4f | %d |\n\n",
		len(hot), len(flagged), float64(tp)/float64(max(1, len(flagged))), float64(tp)/float64(max(1, len(hot))), d.Rejected())
	sec.Printf("Precision is the share of the keys stepped up that the exact counter finds hot; recall, the share of the hot keys stepped up.\n")
	return sec, nil
}
