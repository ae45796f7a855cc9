// Command report runs the benchmark scenarios of docs/benchmarks.md in one
// process, on redis-servers and NATS servers it starts on loopback, and
// writes their sections (markdown) and plots (SVG) from what it measured.
//
//	go run . -md ../../docs/benchmarks.md -plots ../../docs/bench   # appends to the file
//	go run . -quick                                                 # short runs, to stdout
//	OVERLIMIT_ROWS='/store/' go run . -run '^overlimit$'            # some of overlimit's rows
//
// It lives in a module of its own so that its plotting dependencies stay
// out of the library's.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"runtime/pprof"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hotkeyd/hotkey/bench/internal/scenario"
	"github.com/hotkeyd/hotkey/internal/redistest"
)

// named is one scenario, by name.
type named struct {
	name  string
	title string
	run   func(ctx context.Context, s *setup) (*scenario.Section, error)
}

var scenarios = []named{
	{"spread", "Hot-key spread on a 3-master Redis Cluster", runSpread},
	{"ramp", "Accuracy through a ramp", runRamp},
	{"redis", "Decisions/s on one redis-server: hotkey, redis_rate and the naive Lua bucket", runRedis},
	{"embedded", "Embedded decision cost against x/time/rate", runEmbedded},
	{"convergence", "Convergence across 3 instances", runConvergence},
	{"denycache", "The deny cache under an attacker at 10× the limit", runDenyCache},
	{"detector", "Detector precision and recall: Zipf traffic with a random-key flood", runDetector},
	{"envoy", "Envoy's gRPC protocol and batches", runEnvoy},
	{"reserve", "sync: reserve against sync: store: 3 engines on one redis-server", runReserve},
	{"gossip", "sync: gossip: 10 engines on a 3-node NATS cluster", runGossip},
	{"overlimit", "One key over its limit: sync: reserve against sync: store, every algorithm", runOverlimit},
	{"ratelimit", "hotkeyd against envoyproxy/ratelimit: the same rules, the same load", runRatelimit},
	{"regions", "A limit across 3 regions: independent, exchange and shares", runRegions},
	{"rlscap", "hotkeyd against envoyproxy/ratelimit at capacity: calls/s from one client", runRatelimitCapacity},
}

// setup is what every scenario runs on.
type setup struct {
	env      *redistest.Env
	quick    bool
	plots    string // directory the plots go to
	format   string // svg or png
	plotLink string // how the markdown names that directory
}

// scale returns full, or quick in quick mode.
func (s *setup) scale(full, quick time.Duration) time.Duration {
	if s.quick {
		return quick
	}
	return full
}

// rounds returns full, or quick in quick mode: how many rounds a scenario
// alternates its measures for.
func (s *setup) rounds(full, quick int) int {
	if s.quick {
		return quick
	}
	return full
}

func main() {
	quick := flag.Bool("quick", false, "short runs (the whole report in under 4 minutes on 2 cores)")
	md := flag.String("md", "", "append the sections to this file (default: stdout)")
	plots := flag.String("plots", "plots", "directory for the plots")
	only := flag.String("run", ".", "run the scenarios whose names match this regexp")
	format := flag.String("format", "svg", "plot format: svg or png")
	cpuProfile := flag.String("cpuprofile", "", "write a CPU profile of the whole run to this file")
	flag.Parse()
	if *format != "svg" && *format != "png" {
		fmt.Fprintln(os.Stderr, "report: -format: want svg or png")
		os.Exit(2)
	}
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err == nil {
			err = pprof.StartCPUProfile(f)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "report: -cpuprofile:", err)
			os.Exit(1)
		}
		defer pprof.StopCPUProfile()
	}
	if err := run(*quick, *md, *plots, *only, *format); err != nil {
		pprof.StopCPUProfile()
		fmt.Fprintln(os.Stderr, "report:", err)
		os.Exit(1)
	}
}

func run(quick bool, md, plots, only, format string) error {
	re, err := regexp.Compile(only)
	if err != nil {
		return fmt.Errorf("-run: %w", err)
	}
	if err := os.MkdirAll(plots, 0o755); err != nil {
		return err
	}
	link := plots
	if md != "" {
		if rel, err := filepath.Rel(filepath.Dir(md), plots); err == nil {
			link = rel
		}
	}
	env, err := redistest.StartEnv(3)
	if err != nil {
		return err
	}
	defer env.Close()
	s := &setup{env: env, quick: quick, plots: plots, plotLink: link, format: format}
	if err := scenario.Append(md, fmt.Sprintf("\n## Scenarios\n\n%s\n", machine(env, quick))); err != nil {
		return err
	}
	ctx := context.Background()
	for _, sc := range scenarios {
		if !re.MatchString(sc.name) {
			continue
		}
		start := time.Now()
		fmt.Fprintf(os.Stderr, "scenario %s...\n", sc.name)
		sec, err := sc.run(ctx, s)
		if err != nil {
			return fmt.Errorf("scenario %s: %w", sc.name, err)
		}
		sec.Title = sc.title
		if err := scenario.Append(md, sec.Markdown(time.Since(start).Seconds())); err != nil {
			return err
		}
	}
	return nil
}

// machine describes what the report ran on.
func machine(env *redistest.Env, quick bool) string {
	cpu := "unknown CPU"
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for line := range strings.Lines(string(b)) {
			if v, ok := strings.CutPrefix(line, "model name"); ok {
				cpu = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(v), ":"))
				break
			}
		}
	}
	version := "unknown"
	c := redis.NewClient(&redis.Options{Addr: env.Server.Addr})
	defer c.Close()
	if info, err := c.Info(context.Background(), "server").Result(); err == nil {
		for line := range strings.Lines(info) {
			if v, ok := strings.CutPrefix(line, "redis_version:"); ok {
				version = strings.TrimSpace(v)
			}
		}
	}
	mode := "full runs"
	if quick {
		mode = "quick runs (QUICK=1: shorter, noisier)"
	}
	return fmt.Sprintf("Measured by `make bench-report` (bench/report) on %s, %d cores (GOMAXPROCS %d), Redis %s, %s, %s. Every figure and plot below comes from that run.",
		cpu, runtime.NumCPU(), runtime.GOMAXPROCS(0), version, runtime.Version(), mode)
}
