package detector_test

import (
	"fmt"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/hotkeyd/hotkey/detector"
)

// A key at 2000 requests/s, twice the threshold, on a simulated clock:
// it steps up to level 4 once 100 requests, T·SubWindow, have been seen
// within a sub-window. A real owner calls Start instead of Tick.
func Example() {
	start := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	d, err := detector.New(detector.Config{Threshold: 1000}, start)
	if err != nil {
		panic(err)
	}
	defer d.Close()

	key := "tenant:42"
	hash := xxhash.Sum64String(key) // the engine hashes each key once
	now := start
	for range 10 { // 100 ms in steps of 10 ms, 20 requests each
		for range 20 {
			d.Observe(key, hash)
		}
		now = now.Add(10 * time.Millisecond)
		d.Tick(now)
	}
	ev := <-d.Events()
	fmt.Printf("%s: level %d at %.0f requests/s\n", ev.Key, ev.Level, ev.Rate)
	// Output: tenant:42: level 4 at 1000 requests/s
}
