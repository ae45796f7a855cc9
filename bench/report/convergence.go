package main

import (
	"context"
	"fmt"
	"time"

	"github.com/hotkeyd/hotkey/bench/internal/scenario"
	"github.com/hotkeyd/hotkey/loadgen"
)

// runConvergence measures how long a hot key announced by one instance
// takes to be applied by the others: 3 engines, each with a NATS
// coordinator on its own node of a 3-node NATS cluster on loopback (the
// rig BenchmarkConvergence runs too).
func runConvergence(ctx context.Context, s *setup) (*scenario.Section, error) {
	keys := 300
	if s.quick {
		keys = 60
	}
	c, err := scenario.StartConvergence()
	if err != nil {
		return nil, err
	}
	defer c.Close()
	var lat loadgen.Histogram
	if err := c.Measure(keys, &lat); err != nil {
		return nil, err
	}
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	sec := &scenario.Section{Setup: fmt.Sprintf("3 engines in one process, each with a NATS coordinator on its own node of a 3-node NATS cluster on loopback; %d keys, each announced hot by a random engine, one at a time.", keys)}
	sec.Printf("| samples (announcement, other engine) | p50 | p99 | max |\n|---|---|---|---|\n")
	sec.Printf("| %d | %.2f ms | %.2f ms | %.2f ms |\n\n", lat.Count(), ms(lat.Quantile(0.5)), ms(lat.Quantile(0.99)), ms(lat.Max()))
	sec.Printf("From the call to Announce on one engine to the level hook on another: the lease's publication, one route between NATS nodes, and the coordinator's dispatch.\n")
	return sec, nil
}
