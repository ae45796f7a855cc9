// Command benchreport turns `go test -bench` output into the Markdown of
// docs/benchmarks.md: every figure read from one run, every ratio computed
// from figures of that same run, each against its target.
//
//	go test -run '^$' -bench . ./bench/ | tee bench.out
//	go run ./bench/benchreport < bench.out > docs/benchmarks.md
//
// With -against, it compares two runs instead: the figures on stdin ÷ those
// of the file named, benchmark by benchmark (bench/against.sh).
//
//	go run ./bench/benchreport -against base.out < this.out
package main

import (
	"bufio"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
)

func main() {
	against := flag.String("against", "", "compare stdin's figures with this file's (a run of the base)")
	flag.Parse()
	var err error
	if *against != "" {
		var base *os.File
		if base, err = os.Open(*against); err == nil {
			err = compare(base, os.Stdin, os.Stdout)
			base.Close()
		}
	} else {
		err = run(os.Stdin, os.Stdout)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "benchreport:", err)
		os.Exit(1)
	}
}

// result is one benchmark: name (without the -GOMAXPROCS suffix), its
// metrics by unit as the median over the rounds (lines) of the input, and
// every round's figure.
type result struct {
	name    string
	metrics map[string]float64
	rounds  map[string][]float64
}

func median(v []float64) float64 {
	sort.Float64s(v)
	n := len(v)
	if n%2 == 1 {
		return v[n/2]
	}
	return (v[n/2-1] + v[n/2]) / 2
}

var procSuffix = regexp.MustCompile(`-\d+$`)

// parse reads benchmark lines and the environment header (goos, cpu, ...).
// A benchmark met on several lines (rounds, -count) gets the median of each
// metric; rounds is the most lines any benchmark had.
func parse(r io.Reader) (results map[string]result, order, header []string, rounds int, err error) {
	samples := map[string]map[string][]float64{}
	seen := map[string]bool{}
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := sc.Text()
		for _, p := range []string{"goos:", "goarch:", "cpu:"} {
			if strings.HasPrefix(line, p) && !seen[line] {
				seen[line] = true
				header = append(header, line)
			}
		}
		f := strings.Fields(line)
		if len(f) < 4 || !strings.HasPrefix(f[0], "Benchmark") {
			continue
		}
		name := procSuffix.ReplaceAllString(f[0], "")
		if samples[name] == nil {
			samples[name] = map[string][]float64{}
			order = append(order, name)
		}
		for i := 2; i+1 < len(f); i += 2 {
			v, err := strconv.ParseFloat(f[i], 64)
			if err != nil {
				return nil, nil, nil, 0, fmt.Errorf("%s: metric %q: %w", f[0], f[i], err)
			}
			samples[name][f[i+1]] = append(samples[name][f[i+1]], v)
			rounds = max(rounds, len(samples[name][f[i+1]]))
		}
	}
	results = map[string]result{}
	for name, byUnit := range samples {
		res := result{name: name, metrics: map[string]float64{}, rounds: byUnit}
		for u, v := range byUnit {
			res.metrics[u] = median(slices.Clone(v))
		}
		results[name] = res
	}
	return results, order, header, rounds, sc.Err()
}

// target is one ratio the project commits to.
type target struct {
	what      string
	num, den  string // benchmark names; den empty for a plain figure
	unit      string
	atMost    bool // the ratio must be ≤ bound (else ≥)
	bound     float64
	reproduce string
}

var targets = []target{
	{"engine+memory ns/op ÷ map+mutex of x/time/rate", "BenchmarkAllowMemory/detector=true", "BenchmarkAllowXTimeRate", "ns/op", true, 1.0,
		"make bench BENCH='AllowMemory|AllowXTimeRate'"},
	{"engine+memory allocs/op (existing key)", "BenchmarkAllowMemory/detector=true", "", "allocs/op", true, 0,
		"make bench BENCH=AllowMemory"},
	{"engine+memory with the detector ÷ without", "BenchmarkAllowMemory/detector=true", "BenchmarkAllowMemory/detector=false", "ns/op", true, 1.15,
		"make bench BENCH=AllowMemory"},
	{"engine+memory with a NATS coordinator ÷ the Local one", "BenchmarkAllowMemory/coordinator=nats", "BenchmarkAllowMemory/detector=true", "ns/op", true, 1.1,
		"make bench BENCH=AllowMemory"},
	{"engine+memory sync: gossip ÷ sync: store, ns/op (10,000 keys, rounds published to NATS)", "BenchmarkGossipDecision/sync=gossip", "BenchmarkGossipDecision/sync=store", "ns/op", true, 1.15,
		"make bench BENCH=GossipDecision"},
	{"hot key announced → applied on the other instances, p99 (ms, 3-node NATS on loopback)", "BenchmarkConvergence", "", "p99-ms", true, 10,
		"make bench BENCH=Convergence"},
	{"detector Observe ÷ xxhash alone", "BenchmarkObserve", "BenchmarkObserveHashOnly", "ns/op", true, 6,
		"make bench BENCH=Observe"},
	{"detector Observe ÷ map+mutex count", "BenchmarkObserve", "BenchmarkObserveMapMutex", "ns/op", true, 0.5,
		"make bench BENCH=Observe"},
	{"engine+Redis decisions/s ÷ redis_rate", "BenchmarkAllowRedis", "BenchmarkAllowRedisRate", "decisions/s", false, 3.0,
		"make bench BENCH='AllowRedis'"},
	{"hotkeyd over NATS ÷ over HTTP, decisions/s (64 clients, Redis 1 ms away)", "BenchmarkDaemon/rtt=1ms/api=nats", "BenchmarkDaemon/rtt=1ms/api=http", "decisions/s", false, 0.8,
		"make bench BENCH=Daemon"},
	{"hotkeyd over NATS ÷ over HTTP, decisions/s (64 clients, local Redis)", "BenchmarkDaemon/rtt=local/api=nats", "BenchmarkDaemon/rtt=local/api=http", "decisions/s", false, 0.8,
		"make bench BENCH=Daemon"},
	{"hot key at level 16: busiest master ÷ mean", "BenchmarkHotKeyCluster/level=16", "", "max/mean-node-ops", true, 1.15,
		"make bench BENCH=HotKeyCluster"},
	{"hot key unsplit (level 1): busiest master ÷ mean", "BenchmarkHotKeyCluster/level=1", "", "max/mean-node-ops", false, 0,
		"make bench BENCH=HotKeyCluster"},
}

func run(r io.Reader, w io.Writer) error {
	results, order, header, rounds, err := parse(r)
	if err != nil {
		return err
	}
	if len(results) == 0 {
		return fmt.Errorf("no benchmark lines on stdin")
	}
	fmt.Fprintln(w, "# Benchmarks")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Generated by `make bench-report` from one `go test -bench` run; do not edit by hand.")
	fmt.Fprintf(w, "Each figure is the median of %d round(s); a round runs every benchmark once, so a\n", rounds)
	fmt.Fprintln(w, "benchmark and its baseline run minutes apart at most and the load of a shared machine")
	fmt.Fprintln(w, "weighs on both. A ratio is the median of the rounds' ratios.")
	fmt.Fprintln(w)
	for _, h := range header {
		fmt.Fprintf(w, "- %s\n", h)
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "## Targets")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| figure | measured | target | met | reproduce |")
	fmt.Fprintln(w, "|---|---|---|---|---|")
	for _, t := range targets {
		num, ok := results[t.num].metrics[t.unit]
		if !ok {
			continue
		}
		v := num
		if t.den != "" {
			// The median of the rounds' ratios: a benchmark and its
			// baseline of one round ran under the same load.
			ns, ds := results[t.num].rounds[t.unit], results[t.den].rounds[t.unit]
			var ratios []float64
			for i := range min(len(ns), len(ds)) {
				if ds[i] != 0 {
					ratios = append(ratios, ns[i]/ds[i])
				}
			}
			if len(ratios) == 0 {
				continue
			}
			v = median(ratios)
		}
		want, met := "—", "—"
		if t.bound != 0 || t.atMost {
			op := "≥"
			if t.atMost {
				op = "≤"
			}
			want = fmt.Sprintf("%s %s", op, fmtNum(t.bound))
			met = "no"
			if (t.atMost && v <= t.bound) || (!t.atMost && v >= t.bound) {
				met = "yes"
			}
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s | `%s` |\n", t.what, fmtNum(v), want, met, t.reproduce)
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "## All results")
	fmt.Fprintln(w)
	units := map[string]bool{}
	for _, res := range results {
		for u := range res.metrics {
			units[u] = true
		}
	}
	var cols []string
	for u := range units {
		cols = append(cols, u)
	}
	sort.Strings(cols)
	fmt.Fprintf(w, "| benchmark | %s |\n|---|%s\n", strings.Join(cols, " | "), strings.Repeat("---|", len(cols)))
	for _, name := range order {
		var cells []string
		for _, u := range cols {
			if v, ok := results[name].metrics[u]; ok {
				cells = append(cells, fmtNum(v))
			} else {
				cells = append(cells, "")
			}
		}
		fmt.Fprintf(w, "| %s | %s |\n", name, strings.Join(cells, " | "))
	}
	return nil
}

// compare writes, for every benchmark and unit of this run that base has too,
// both medians and this ÷ base: the median of the rounds' ratios, round i of
// one paired with round i of the other, as bench/against.sh runs them.
func compare(base, this io.Reader, w io.Writer) error {
	b, _, _, _, err := parse(base)
	if err != nil {
		return fmt.Errorf("base: %w", err)
	}
	t, order, header, rounds, err := parse(this)
	if err != nil {
		return err
	}
	if len(t) == 0 || len(b) == 0 {
		return fmt.Errorf("no benchmark lines to compare (%d here, %d in the base)", len(t), len(b))
	}
	for _, h := range header {
		fmt.Fprintf(w, "- %s\n", h)
	}
	fmt.Fprintf(w, "- %d round(s); a ratio is the median of the rounds' ratios\n\n", rounds)
	fmt.Fprintln(w, "| benchmark | unit | base | this | this ÷ base |")
	fmt.Fprintln(w, "|---|---|---|---|---|")
	for _, name := range order {
		old, ok := b[name]
		if !ok {
			continue
		}
		units := slices.Sorted(maps.Keys(t[name].metrics))
		for _, u := range units {
			ov, ok := old.metrics[u]
			if !ok {
				continue
			}
			ratio := "—"
			ns, ds := t[name].rounds[u], old.rounds[u]
			var ratios []float64
			for i := range min(len(ns), len(ds)) {
				if ds[i] != 0 {
					ratios = append(ratios, ns[i]/ds[i])
				}
			}
			if len(ratios) > 0 {
				ratio = fmtNum(median(ratios))
			}
			fmt.Fprintf(w, "| %s | %s | %s | %s | %s |\n", name, u, fmtNum(ov), fmtNum(t[name].metrics[u]), ratio)
		}
	}
	return nil
}

func fmtNum(v float64) string {
	switch {
	case v == 0:
		return "0"
	case v >= 1000:
		return strconv.FormatFloat(v, 'f', 0, 64)
	case v >= 10:
		return strconv.FormatFloat(v, 'f', 1, 64)
	}
	return strconv.FormatFloat(v, 'f', 3, 64)
}
