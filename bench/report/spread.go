package main

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
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

// runSpread drives one hot key and background keys through two engines on
// a 3-master Redis Cluster, three ways: never split (static level 1), always
// split 64 ways (static level 64), and split as the detector finds it hot
// (adaptive). It reports how evenly the masters share the script calls, how
// many calls a decision costs, and how much of its limit the hot key gets.
func runSpread(ctx context.Context, s *setup) (*scenario.Section, error) {
	const (
		rate, hotRate = 4000.0, 3000.0
		bgKeys        = 1000
		threshold     = 200.0
	)
	hotLimit := hotkey.PerSecond(1500)
	d := s.scale(15*time.Second, 3*time.Second)
	client := redis.NewClusterClient(&redis.ClusterOptions{Addrs: s.env.Cluster.Addrs})
	defer client.Close()
	store, err := counter.NewRedisStore(ctx, client, counter.RedisConfig{})
	if err != nil {
		return nil, err
	}
	defer store.Close()
	masters, err := masterClients(ctx, client)
	if err != nil {
		return nil, err
	}
	defer func() {
		for _, m := range masters {
			m.Close()
		}
	}()

	sec := &scenario.Section{Setup: fmt.Sprintf("2 engines (NATS coordinator, in process) sharing one Redis store on a 3-master Redis Cluster; one key at %.0f/s with a limit of %d/s, and %d background keys at %.0f/s in all, for %v per mode; the detector's threshold is %.0f/s.",
		hotRate, hotLimit.Rate, bgKeys, rate-hotRate, d, threshold)}
	sec.Printf("| mode | busiest master ÷ mean | Redis calls per decision | hot key admitted ÷ limit | decisions/s | p99 latency |\n|---|---|---|---|---|---|\n")
	var plots strings.Builder
	for _, mode := range []struct {
		name, file string
		opts       func(p *hotkey.Policy, key string) []hotkey.Option
	}{
		{"static level 1 (never split)", "spread-static1", func(*hotkey.Policy, string) []hotkey.Option { return []hotkey.Option{hotkey.WithoutDetector()} }},
		{"static level 64", "spread-static64", func(p *hotkey.Policy, k string) []hotkey.Option {
			return []hotkey.Option{hotkey.WithoutDetector(), hotkey.WithSplitKeys(64, p, k)}
		}},
		{"adaptive", "spread-adaptive", func(*hotkey.Policy, string) []hotkey.Option {
			cfg := detector.DefaultConfig()
			cfg.Threshold = threshold
			return []hotkey.Option{hotkey.WithDetector(cfg)}
		}},
	} {
		hot := fmt.Sprintf("hot:%s:%d", mode.file, time.Now().UnixNano())
		p := &hotkey.Policy{Name: "api", Limit: hotLimit}
		c, err := embedded.Start(embedded.Config{
			Instances: 2,
			Store:     func(int) (counter.Store, error) { return store, nil },
			Options:   mode.opts(p, hot),
		})
		if err != nil {
			return nil, err
		}
		target, err := c.Target(p)
		if err != nil {
			c.Close()
			return nil, err
		}
		if err := resetStats(ctx, masters); err != nil {
			c.Close()
			return nil, err
		}
		samples := sampleCalls(masters, 250*time.Millisecond)
		res, err := loadgen.Run(ctx, loadgen.Config{
			Target: target, Workload: loadgen.Hotspot(hot, hotRate, loadgen.Uniform("bg:"+mode.file+":", bgKeys, 1)),
			Rate: rate, Duration: d, Watch: hot, Period: time.Second,
		}, nil, 0)
		trace := samples.stop()
		c.Close()
		if err != nil {
			return nil, err
		}
		if res.Errors > 0 {
			return nil, fmt.Errorf("%s: %d errors, first %v", mode.name, res.Errors, res.FirstError)
		}
		total, top := 0.0, 0.0
		last := trace[len(trace)-1]
		for _, n := range last.calls {
			total += n
			top = max(top, n)
		}
		var hotAllowed int64
		for _, b := range res.Watched {
			hotAllowed += b.Allowed
		}
		ideal := float64(hotLimit.Capacity()) + float64(hotLimit.Rate)*res.Elapsed.Seconds()
		sec.Printf("| %s | %.2f | %.2f | %.3f | %.0f | %v |\n", mode.name, top/(total/float64(len(last.calls))), total/float64(res.Allowed+res.Denied),
			float64(hotAllowed)/ideal, res.Rate(), res.Latency.Quantile(0.99).Round(10*time.Microsecond))
		md, err := s.savePlot(mode.file, "Script calls/s per master: "+mode.name, "seconds", "calls/s", trace.perNode(masters))
		if err != nil {
			return nil, err
		}
		plots.WriteString(md)
	}
	sec.Printf("\nThe hot key admitted ÷ limit compares its admissions with a perfect limiter's over the run: the burst plus the rate times the run's length.\n\n%s", plots.String())
	return sec, nil
}

// masterClients returns a client for each master of the cluster.
func masterClients(ctx context.Context, c *redis.ClusterClient) ([]*redis.Client, error) {
	var mu sync.Mutex
	var addrs []string
	err := c.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
		mu.Lock()
		addrs = append(addrs, m.Options().Addr)
		mu.Unlock()
		return nil
	})
	slices.Sort(addrs)
	var out []*redis.Client
	for _, a := range addrs {
		out = append(out, redis.NewClient(&redis.Options{Addr: a}))
	}
	return out, err
}

func resetStats(ctx context.Context, ms []*redis.Client) error {
	for _, m := range ms {
		if err := m.ConfigResetStat(ctx).Err(); err != nil {
			return err
		}
	}
	return nil
}

// callSample is each master's script calls so far, at an instant.
type callSample struct {
	at    time.Duration
	calls []float64
}

type callTrace []callSample

// perNode returns each master's calls per second between samples.
func (tr callTrace) perNode(ms []*redis.Client) []series {
	out := make([]series, len(ms))
	for i, m := range ms {
		out[i].name = "master " + m.Options().Addr
		// The last sample is read after the load stops: its interval is
		// cut short and half idle, so it is left out of the plot.
		for j := 1; j < len(tr)-1; j++ {
			dt := (tr[j].at - tr[j-1].at).Seconds()
			out[i].pts = append(out[i].pts, plotter.XY{X: tr[j].at.Seconds(), Y: (tr[j].calls[i] - tr[j-1].calls[i]) / dt})
		}
	}
	return out
}

type sampler struct {
	done  chan struct{}
	wg    sync.WaitGroup
	trace callTrace
}

// sampleCalls reads every master's script calls every interval until stop.
func sampleCalls(ms []*redis.Client, every time.Duration) *sampler {
	sm := &sampler{done: make(chan struct{})}
	start := time.Now()
	read := func() {
		smp := callSample{at: time.Since(start), calls: make([]float64, len(ms))}
		for i, m := range ms {
			smp.calls[i], _ = scenario.ScriptCalls(context.Background(), m)
		}
		sm.trace = append(sm.trace, smp)
	}
	read()
	sm.wg.Go(func() {
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-t.C:
				read()
			case <-sm.done:
				read()
				return
			}
		}
	})
	return sm
}

func (sm *sampler) stop() callTrace {
	close(sm.done)
	sm.wg.Wait()
	return sm.trace
}
