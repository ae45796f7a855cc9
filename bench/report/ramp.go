package main

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
	"gonum.org/v1/plot/plotter"

	"github.com/hotkeyd/hotkey"
	"github.com/hotkeyd/hotkey/bench/internal/scenario"
	"github.com/hotkeyd/hotkey/counter"
	"github.com/hotkeyd/hotkey/detector"
	"github.com/hotkeyd/hotkey/loadgen"
	"github.com/hotkeyd/hotkey/loadgen/embedded"
)

// runRamp drives one key up to 8 times its limit, holds it there and brings
// it back, through two engines on one redis-server, and compares what they
// admitted in each period with what a perfect limiter admits of the same
// requests: a token bucket on one exact clock, fed each request at the
// instant it was meant to be sent.
func runRamp(ctx context.Context, s *setup) (*scenario.Section, error) {
	const (
		rate, peak = 4500.0, 4000.0
		threshold  = 200.0
	)
	lim := hotkey.PerSecond(500)
	d := s.scale(30*time.Second, 6*time.Second)
	period := s.scale(time.Second, 500*time.Millisecond)
	rise, hold, fall := d/3, d/3, d-2*(d/3)
	client := redis.NewClient(&redis.Options{Addr: s.env.Server.Addr})
	defer client.Close()
	store, err := counter.NewRedisStore(ctx, client, counter.RedisConfig{})
	if err != nil {
		return nil, err
	}
	defer store.Close()
	cfg := detector.DefaultConfig()
	cfg.Threshold = threshold
	c, err := embedded.Start(embedded.Config{
		Instances: 2,
		Store:     func(int) (counter.Store, error) { return store, nil },
		Options:   []hotkey.Option{hotkey.WithDetector(cfg)},
	})
	if err != nil {
		return nil, err
	}
	defer c.Close()
	p := &hotkey.Policy{Name: "api", Limit: lim}
	target, err := c.Target(p)
	if err != nil {
		return nil, err
	}
	hot := fmt.Sprintf("ramp:%d", time.Now().UnixNano())
	workload := func() loadgen.Workload {
		return loadgen.Ramp(hot, peak, rise, hold, fall, loadgen.Uniform("rampbg:", 1000, 1))
	}
	res, err := loadgen.Run(ctx, loadgen.Config{
		Target: target, Workload: workload(), Rate: rate, Duration: d, Watch: hot, Period: period,
	}, nil, 0)
	if err != nil {
		return nil, err
	}
	if res.Errors > 0 {
		return nil, fmt.Errorf("%d errors, first %v", res.Errors, res.FirstError)
	}
	ideal, offered, err := perfect(workload(), hot, lim, rate, d, period)
	if err != nil {
		return nil, err
	}

	var got, want int64
	worst := 0.0
	var admitted, perfectLine, offeredLine, levels plotter.XYs
	for i, b := range res.Watched {
		x := (time.Duration(i)*period + period/2).Seconds()
		got += b.Allowed
		want += ideal[i]
		admitted = append(admitted, plotter.XY{X: x, Y: float64(b.Allowed) / period.Seconds()})
		perfectLine = append(perfectLine, plotter.XY{X: x, Y: float64(ideal[i]) / period.Seconds()})
		offeredLine = append(offeredLine, plotter.XY{X: x, Y: float64(offered[i]) / period.Seconds()})
		levels = append(levels, plotter.XY{X: x, Y: float64(max(b.Shards, 1))})
		if ideal[i] > 0 {
			worst = max(worst, float64(b.Allowed)/float64(ideal[i]))
		}
	}
	sec := &scenario.Section{Setup: fmt.Sprintf("2 engines (NATS coordinator, in process) sharing one redis-server; one key with a token-bucket limit of %d/s (burst %d) ramped from 0 to %.0f/s over %v, held %v, brought back to 0 over %v, among background keys (%.0f/s in all); the detector's threshold is %.0f/s; periods of %v.",
		lim.Rate, lim.Capacity(), peak, rise, hold, fall, rate, threshold, period)}
	sec.Printf("| admitted ÷ perfect, whole run | worst period ÷ perfect | highest level |\n|---|---|---|\n")
	top := 1
	for _, b := range res.Watched {
		top = max(top, b.Shards)
	}
	sec.Printf("| %.3f | %.3f | %d |\n\n", float64(got)/float64(want), worst, top)
	sec.Printf("The perfect limiter is a token bucket on the memory store with a simulated clock, fed the key's requests at the instants they were meant to be sent.\n\n")
	md, err := s.savePlot("ramp-admitted", "Hot key: admitted per second", "seconds", "requests/s", []series{
		{name: "offered", pts: offeredLine, dash: true},
		{name: "perfect limiter", pts: perfectLine},
		{name: "admitted (2 engines, Redis)", pts: admitted},
	})
	if err != nil {
		return nil, err
	}
	sec.Printf("%s", md)
	md, err = s.savePlot("ramp-level", "Hot key: subcounters deciding it", "seconds", "subcounters", []series{{name: "subcounters", pts: levels}})
	if err != nil {
		return nil, err
	}
	sec.Printf("%s", md)
	return sec, nil
}

// perfect feeds w's requests for key, paced at rate for d, to a token
// bucket of lim on a simulated clock, and returns what it admitted and what
// was offered in each period.
func perfect(w loadgen.Workload, key string, lim hotkey.Limit, rate float64, d, period time.Duration) (admitted, offered []int64, err error) {
	n := int((d + period - 1) / period)
	admitted, offered = make([]int64, n), make([]int64, n)
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	now := start
	store := counter.NewMemoryStore(counter.MemoryConfig{Clock: func() time.Time { return now }})
	for i := int64(0); ; i++ {
		at := time.Duration(float64(i) / rate * float64(time.Second))
		if at >= d {
			return admitted, offered, nil
		}
		if w.Key(i, at) != key {
			continue
		}
		now = start.Add(at)
		r, err := store.Take(context.Background(), key, counter.Hash(key), lim, 1)
		if err != nil {
			return nil, nil, err
		}
		offered[at/period]++
		if r.Allowed {
			admitted[at/period]++
		}
	}
}
