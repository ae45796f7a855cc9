package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/hotkeyd/hotkey"
	"github.com/hotkeyd/hotkey/bench/internal/scenario"
	"github.com/hotkeyd/hotkey/coordinator"
	"github.com/hotkeyd/hotkey/counter"
	"github.com/hotkeyd/hotkey/internal/natsserver"
	"github.com/hotkeyd/hotkey/loadgen"
	"github.com/hotkeyd/hotkey/shard"
)

type applied struct {
	engine int
	key    string
	at     time.Time
}

// runConvergence measures how long a hot key announced by one instance
// takes to be applied by the others: 3 engines, each with a NATS
// coordinator on its own node of a 3-node NATS cluster on loopback.
func runConvergence(ctx context.Context, s *setup) (*scenario.Section, error) {
	keys := 300
	if s.quick {
		keys = 60
	}
	c, err := natsserver.StartCluster(3, natsserver.Options{})
	if err != nil {
		return nil, err
	}
	defer c.Close()
	events := make(chan applied, 1024)
	coords := make([]*coordinator.NATS, 3)
	for i := range coords {
		co, err := coordinator.NewNATS(coordinator.Config{URLs: []string{c.URL(i)}, MaxHotKeys: 1 << 20})
		if err != nil {
			return nil, err
		}
		hook := func(key string, level shard.Level) {
			if level > 1 {
				events <- applied{i, key, time.Now()}
			}
		}
		e, err := hotkey.New(counter.NewMemoryStore(counter.MemoryConfig{}),
			hotkey.WithoutDetector(), hotkey.WithCoordinator(co), hotkey.WithLevelHook(hook), hotkey.WithMaxHotKeys(1<<20))
		if err != nil {
			return nil, err
		}
		defer e.Close()
		coords[i] = co
	}
	// Until every node has every subscription, a first key may not reach
	// all three engines.
	for try := 0; ; try++ {
		key := fmt.Sprintf("warmup:%d", try)
		coords[try%3].Announce(key, xxhash.Sum64String(key), 4)
		if waitApplied(events, key, 3, time.Second) {
			break
		}
		if try == 60 {
			return nil, fmt.Errorf("the NATS cluster never delivered to every engine")
		}
	}
	var lat loadgen.Histogram
	for i := range keys {
		key := fmt.Sprintf("conv:%d:%x", i, rand.Uint64())
		from := rand.IntN(3)
		start := time.Now()
		coords[from].Announce(key, xxhash.Sum64String(key), 4)
		for got := 0; got < 3; { // the origin applies it too
			select {
			case ev := <-events:
				if ev.key != key {
					continue // a late warm-up event
				}
				got++
				if ev.engine != from {
					lat.Record(ev.at.Sub(start))
				}
			case <-time.After(30 * time.Second):
				return nil, fmt.Errorf("key %s reached %d of 3 engines in 30 s", key, got)
			}
		}
		coords[from].Announce(key, xxhash.Sum64String(key), 1) // lapses on the others
	}
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	sec := &scenario.Section{Setup: fmt.Sprintf("3 engines in one process, each with a NATS coordinator on its own node of a 3-node NATS cluster on loopback; %d keys, each announced hot by a random engine, one at a time.", keys)}
	sec.Printf("| samples (announcement, other engine) | p50 | p99 | max |\n|---|---|---|---|\n")
	sec.Printf("| %d | %.2f ms | %.2f ms | %.2f ms |\n\n", lat.Count(), ms(lat.Quantile(0.5)), ms(lat.Quantile(0.99)), ms(lat.Max()))
	sec.Printf("From the call to Announce on one engine to the level hook on another: the lease's publication, one route between NATS nodes, and the coordinator's dispatch.\n")
	return sec, nil
}

// waitApplied reports whether key was applied by n engines within d.
func waitApplied(events <-chan applied, key string, n int, d time.Duration) bool {
	deadline := time.After(d)
	seen := map[int]bool{}
	for len(seen) < n {
		select {
		case ev := <-events:
			if ev.key == key {
				seen[ev.engine] = true
			}
		case <-deadline:
			return false
		}
	}
	return true
}
