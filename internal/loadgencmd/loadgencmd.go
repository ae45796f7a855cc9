// Package loadgencmd is `hotkeyd loadgen`: the load generator (package
// loadgen) aimed at a running hotkeyd, over HTTP or NATS, with a progress
// line, a summary table and a JSON result.
package loadgencmd

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os/signal"
	"strings"
	"sync/atomic"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/schollz/progressbar/v3"

	"github.com/hotkeyd/hotkey/internal/namespace"
	"github.com/hotkeyd/hotkey/loadgen"
)

// config is what the flags say.
type config struct {
	target, policy, workload, key, status string
	namespace                             string
	rate, hotRate, zipfS                  float64
	duration                              time.Duration
	concurrency, keys                     int
	cost                                  int64
	seed                                  uint64
	json, progress                        bool
}

const usage = `hotkeyd loadgen: send load to a running hotkeyd and measure its decisions.

Usage:
  hotkeyd loadgen [flags]

Requests go out at --rate, whatever the daemon answers (an open loop), and
each one's latency counts from when it was meant to be sent. The progress
line shows the decisions/s and the share admitted since the start, the p99
latency of the last second, and the level of --key (how many subcounters it
is split into at most) as the daemon's /v1/hotkeys reports it, on the admin
listener that --status names (else as its decisions report it).

Workloads:
  hotspot   --key at --hot-rate over --keys background keys (uniform)
  ramp      --key rising to --hot-rate over a third of --duration, holding a
            third and falling a third, over the background: the key splits as
            it rises, and merges back a cool-down (the daemon's --cool-down,
            1m by default) after it falls, so run it for longer than that to
            see the merge
  uniform   --keys keys, evenly
  zipf      --keys keys by Zipf's law with exponent --zipf-s
  flood     a new random key every request

Flags:
`

// parse reads args; errors are for the user, and want exit code 2.
func parse(args []string, out io.Writer) (config, error) {
	var c config
	fs := flag.NewFlagSet("hotkeyd loadgen", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	var seed int64
	fs.StringVar(&c.target, "target", "http://127.0.0.1:8080", "the daemon: http://host:port, or nats://host:port for its NATS API")
	fs.StringVar(&c.policy, "policy", "default", "the policy each request names")
	fs.StringVar(&c.namespace, "namespace", namespace.Default, "with a nats:// target, the --namespace of the daemons to ask: decisions go to hotkey.allow for \"default\", hotkey.NAME.api.allow for NAME")
	fs.StringVar(&c.workload, "workload", "hotspot", "hotspot, ramp, uniform, zipf or flood")
	fs.Float64Var(&c.rate, "rate", 1000, "requests per second sent")
	fs.DurationVar(&c.duration, "duration", 10*time.Second, "how long to send")
	fs.IntVar(&c.concurrency, "concurrency", 64, "requests in flight at most; more wait, and the wait counts in their latency")
	fs.IntVar(&c.keys, "keys", 1000, "background keys (hotspot, ramp, uniform, zipf)")
	fs.StringVar(&c.key, "key", "hot", "the hot key (hotspot, ramp), followed in the progress line")
	fs.Float64Var(&c.hotRate, "hot-rate", 0, "the hot key's requests per second (hotspot), or its peak (ramp); default half of --rate")
	fs.Float64Var(&c.zipfS, "zipf-s", 1.1, "Zipf exponent, above 1 (zipf)")
	fs.Int64Var(&c.cost, "cost", 1, "each request's cost")
	fs.Int64Var(&seed, "seed", 1, "seed of the workload's random keys")
	fs.StringVar(&c.status, "status", "", "the daemon's admin listener, http://host:port (its --admin-listen, 127.0.0.1:8082 by default), for the level of --key in /v1/hotkeys; off by default: the level is then the decisions' shards")
	fs.BoolVar(&c.json, "json", false, "print the full result as JSON instead of the table")
	fs.BoolVar(&c.progress, "progress", true, "show the progress line (on stderr)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprint(out, usage)
			fs.SetOutput(out)
			fs.PrintDefaults()
			return c, err
		}
		return c, fmt.Errorf("%v (hotkeyd loadgen --help lists the flags)", err)
	}
	nsSet := false
	fs.Visit(func(f *flag.Flag) { nsSet = nsSet || f.Name == "namespace" })
	if fs.NArg() > 0 {
		return c, fmt.Errorf("unexpected argument %q: hotkeyd loadgen takes flags only (hotkeyd loadgen --help lists them)", fs.Arg(0))
	}
	c.seed = uint64(seed)
	if c.hotRate == 0 {
		c.hotRate = c.rate / 2
	}
	u, err := url.Parse(c.target)
	switch {
	case err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https" && u.Scheme != "nats"):
		return c, fmt.Errorf("--target %q: want http://host:port or nats://host:port", c.target)
	case !(c.rate > 0) || c.rate > 1e7:
		return c, fmt.Errorf("--rate %v: want 0 < rate ≤ 10,000,000 requests per second", c.rate)
	case c.duration <= 0:
		return c, fmt.Errorf("--duration %v: want a positive duration, e.g. 30s", c.duration)
	case c.concurrency < 1 || c.concurrency > 1<<16:
		return c, fmt.Errorf("--concurrency %d: want 1 to 65536", c.concurrency)
	case c.keys < 1:
		return c, fmt.Errorf("--keys %d: want at least 1", c.keys)
	case c.cost < 1:
		return c, fmt.Errorf("--cost %d: want at least 1", c.cost)
	case !(c.hotRate > 0) || c.hotRate > c.rate:
		return c, fmt.Errorf("--hot-rate %v: want above 0 and at most --rate (%v)", c.hotRate, c.rate)
	case c.key == "":
		return c, errors.New("--key: want a non-empty key")
	case !namespace.Valid(c.namespace):
		return c, fmt.Errorf("--namespace %q: want 1 to %d of A-Z a-z 0-9 - _, as the daemons' --namespace", c.namespace, namespace.Max)
	case nsSet && u.Scheme != "nats":
		return c, fmt.Errorf("--namespace names NATS subjects: it applies to a nats:// --target, not %s", c.target)
	}
	if c.status != "" {
		if s, err := url.Parse(c.status); err != nil || s.Host == "" || (s.Scheme != "http" && s.Scheme != "https") {
			return c, fmt.Errorf("--status %q: want the daemon's admin listener as http://host:port (its --admin-listen)", c.status)
		}
	}
	return c, nil
}

// workload builds c's workload.
func (c config) workloadOf() (loadgen.Workload, error) {
	bg := loadgen.Uniform("k", c.keys, c.seed)
	switch c.workload {
	case "hotspot":
		return loadgen.Hotspot(c.key, c.hotRate, bg), nil
	case "ramp":
		third := c.duration / 3
		return loadgen.Ramp(c.key, c.hotRate, third, third, third, bg), nil
	case "uniform":
		return bg, nil
	case "zipf":
		w, err := loadgen.Zipf("k", c.keys, c.zipfS, c.seed)
		if err != nil {
			return nil, fmt.Errorf("--zipf-s %v: want an exponent above 1", c.zipfS)
		}
		return w, nil
	case "flood":
		return loadgen.Flood("flood:", c.seed), nil
	}
	return nil, fmt.Errorf("--workload %q: want hotspot, ramp, uniform, zipf or flood", c.workload)
}

// Main runs `hotkeyd loadgen args`: 0 when the run completed, 1 when it
// could not run (the daemon unreachable), 2 for bad flags.
func Main(args []string, stdout, stderr io.Writer) int {
	c, err := parse(args, stdout)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	var wl loadgen.Workload
	if err == nil {
		wl, err = c.workloadOf()
	}
	if err != nil {
		fmt.Fprintf(stderr, "hotkeyd loadgen: %v\n", err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	target, closeTarget, err := c.connect()
	if err != nil {
		fmt.Fprintf(stderr, "hotkeyd loadgen: %v\n", err)
		return 1
	}
	defer closeTarget()
	// One decision first: a daemon that is not there, or a policy it does
	// not have, is an error before the run rather than a run of errors.
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	_, err = target.Decide(pctx, c.key, c.cost)
	cancel()
	if err != nil {
		fmt.Fprintf(stderr, "hotkeyd loadgen: %s does not decide: %v\n", c.target, err)
		return 1
	}
	cfg := loadgen.Config{
		Target: target, Workload: wl, Rate: c.rate, Duration: c.duration,
		Concurrency: c.concurrency, Cost: c.cost, Watch: c.key, Period: time.Second,
	}
	// Each second: the key's level from /v1/hotkeys (for the summary too),
	// and the progress line.
	var levels levelWatch
	var bar *progressbar.ProgressBar
	if c.progress {
		bar = progressbar.NewOptions64(c.duration.Milliseconds(),
			progressbar.OptionSetWriter(stderr), progressbar.OptionSetWidth(20),
			progressbar.OptionThrottle(200*time.Millisecond), progressbar.OptionClearOnFinish())
	}
	progress := func(s loadgen.Snapshot) {
		shards := levels.poll(c)
		if shards == 0 {
			shards = s.Shards
		}
		if bar != nil {
			bar.Describe(progressLine(s, shards))
			bar.Set64(min(s.Elapsed.Milliseconds(), c.duration.Milliseconds()))
		}
	}
	res, err := loadgen.Run(ctx, cfg, progress, time.Second)
	if bar != nil {
		bar.Finish()
		fmt.Fprintln(stderr)
	}
	if res == nil {
		fmt.Fprintf(stderr, "hotkeyd loadgen: %v\n", err)
		return 1
	}
	sum := summarize(c, res, levels.most.Load())
	if c.json {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		enc.Encode(sum)
	} else {
		sum.table(stdout)
	}
	if err != nil {
		fmt.Fprintf(stderr, "hotkeyd loadgen: stopped early: %v\n", err)
	}
	return 0
}

// connect returns the target c names, and what closes it.
func (c config) connect() (loadgen.Target, func(), error) {
	if strings.HasPrefix(c.target, "nats://") {
		nc, err := nats.Connect(c.target, nats.Name("hotkeyd loadgen"), nats.Timeout(5*time.Second))
		if err != nil {
			return nil, nil, fmt.Errorf("connect to NATS at %s: %w", c.target, err)
		}
		return loadgen.NATSNamespace(nc, c.namespace, c.policy), nc.Close, nil
	}
	return loadgen.HTTP(c.target, c.policy, nil), func() {}, nil
}

func progressLine(s loadgen.Snapshot, shards int) string {
	answered := s.Allowed + s.Denied
	admitted := 0.0
	if answered > 0 {
		admitted = 100 * float64(s.Allowed) / float64(answered)
	}
	rate := 0.0
	if s.Elapsed > 0 {
		rate = float64(answered) / s.Elapsed.Seconds()
	}
	line := fmt.Sprintf("%8.0f decisions/s  admitted %5.1f%%  p99 %-8v  level %-2d", rate, admitted, s.P99.Round(10*time.Microsecond), shards)
	if s.Errors > 0 {
		line += fmt.Sprintf("  errors %d", s.Errors)
	}
	return line
}

// levelWatch reads the watched key's level from the daemon's /v1/hotkeys.
type levelWatch struct {
	client http.Client
	most   atomic.Int64 // the highest level seen
}

// poll returns the key's level now (1 if the daemon lists it not), or 0 if
// there is no status address or it does not answer.
func (l *levelWatch) poll(c config) int {
	if c.status == "" {
		return 0
	}
	l.client.Timeout = 500 * time.Millisecond
	resp, err := l.client.Get(strings.TrimRight(c.status, "/") + "/v1/hotkeys")
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	var hk struct {
		HotKeys []struct {
			Policy string `json:"policy"`
			Key    string `json:"key"`
			Level  int    `json:"level"`
		} `json:"hotkeys"`
	}
	if resp.StatusCode != http.StatusOK || json.NewDecoder(resp.Body).Decode(&hk) != nil {
		return 0
	}
	level := 1
	for _, h := range hk.HotKeys {
		if h.Policy == c.policy && h.Key == c.key {
			level = h.Level
		}
	}
	for m := l.most.Load(); int64(level) > m && !l.most.CompareAndSwap(m, int64(level)); m = l.most.Load() {
	}
	return level
}

// summary is a run's result as the table and --json give it.
type summary struct {
	Target      string  `json:"target"`
	Policy      string  `json:"policy"`
	Workload    string  `json:"workload"`
	Rate        float64 `json:"rate"`
	DurationSec float64 `json:"duration_s"`
	ElapsedSec  float64 `json:"elapsed_s"`
	Sent        int64   `json:"sent"`
	Allowed     int64   `json:"allowed"`
	Denied      int64   `json:"denied"`
	Errors      int64   `json:"errors"`
	FirstError  string  `json:"first_error,omitempty"`
	Decisions   float64 `json:"decisions_per_s"`
	LatencyMs   struct {
		P50  float64 `json:"p50"`
		P90  float64 `json:"p90"`
		P99  float64 `json:"p99"`
		P999 float64 `json:"p99_9"`
		Max  float64 `json:"max"`
		Mean float64 `json:"mean"`
	} `json:"latency_ms"`
	Key struct {
		Name string `json:"name"`
		// MaxLevel is the highest level /v1/hotkeys reported during the
		// run (0 without --status).
		MaxLevel int `json:"max_level"`
		// PerSecond is the key's decisions in each second of the run.
		PerSecond []loadgen.Bucket `json:"per_second"`
	} `json:"key"`
}

func summarize(c config, r *loadgen.Result, maxLevel int64) summary {
	s := summary{
		Target: c.target, Policy: c.policy, Workload: c.workload, Rate: c.rate,
		DurationSec: c.duration.Seconds(), ElapsedSec: r.Elapsed.Seconds(),
		Sent: r.Sent, Allowed: r.Allowed, Denied: r.Denied, Errors: r.Errors,
		Decisions: r.Rate(),
	}
	if r.FirstError != nil {
		s.FirstError = r.FirstError.Error()
	}
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	l := &r.Latency
	s.LatencyMs.P50, s.LatencyMs.P90, s.LatencyMs.P99 = ms(l.Quantile(0.5)), ms(l.Quantile(0.9)), ms(l.Quantile(0.99))
	s.LatencyMs.P999, s.LatencyMs.Max, s.LatencyMs.Mean = ms(l.Quantile(0.999)), ms(l.Max()), ms(l.Mean())
	s.Key.Name, s.Key.MaxLevel, s.Key.PerSecond = c.key, int(maxLevel), r.Watched
	return s
}

func (s summary) table(w io.Writer) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "target\t%s (policy %q, workload %s)\n", s.Target, s.Policy, s.Workload)
	fmt.Fprintf(tw, "sent\t%d in %.1f s (%.0f/s asked)\n", s.Sent, s.ElapsedSec, s.Rate)
	fmt.Fprintf(tw, "decided\t%.0f/s: %d allowed, %d denied\n", s.Decisions, s.Allowed, s.Denied)
	if s.Errors > 0 {
		fmt.Fprintf(tw, "errors\t%d, first: %s\n", s.Errors, s.FirstError)
	}
	fmt.Fprintf(tw, "latency (ms)\tp50 %.2f  p90 %.2f  p99 %.2f  p99.9 %.2f  max %.2f\n",
		s.LatencyMs.P50, s.LatencyMs.P90, s.LatencyMs.P99, s.LatencyMs.P999, s.LatencyMs.Max)
	var allowed, denied int64
	shards := 0
	for _, b := range s.Key.PerSecond {
		allowed += b.Allowed
		denied += b.Denied
		shards = max(shards, b.Shards)
	}
	fmt.Fprintf(tw, "key %q\t%d allowed, %d denied; decided on up to %d subcounters", s.Key.Name, allowed, denied, shards)
	if s.Key.MaxLevel > 0 {
		// The level in force can be above the subcounters a decision
		// uses: a limit too small to split that far is split less.
		fmt.Fprintf(tw, "; level %d at most in /v1/hotkeys", s.Key.MaxLevel)
	}
	fmt.Fprintln(tw)
	tw.Flush()
}
