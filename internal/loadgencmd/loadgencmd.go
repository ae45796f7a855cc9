// Package loadgencmd is `hotkeyd loadgen`: the load generator (package
// loadgen) aimed at a running hotkeyd over HTTP or NATS, at any Envoy
// rate-limit service over gRPC, or at any HTTP endpoint behind a limit,
// with a progress line, a summary table and a JSON result.
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
	"time"

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

	api                         string // hotkeyd, plain or envoy
	method, keyHeader, keyParam string // plain
	domain                      string // envoy
	grpcClient                  string // envoy: lean or grpc-go
	descriptors                 descriptors
	limit                       int64 // the limit --key is measured against; 0: none
	period                      time.Duration
}

const usage = `hotkeyd loadgen: send load to a rate limiter and measure its decisions.

Usage:
  hotkeyd loadgen [flags]

Targets (--target):
  http://host:port        a hotkeyd's POST /v1/allow (--api hotkeyd, the
                          default; a URL with a path needs --api)
  http(s)://host/path     with --api plain: any HTTP endpoint behind a limit;
                          a --method request a decision, the key in
                          --key-header or --key-param; 2xx is admitted, 429
                          denied, any other status an error
  nats://host:port        a hotkeyd's NATS API (--namespace)
  grpc://host:port        any Envoy rate-limit service (envoyproxy/ratelimit,
                          a hotkeyd's --grpc-listen): ShouldRateLimit in
                          --domain with each --descriptor, {key} in a value
                          replaced by the workload's key, hits_addend --cost;
                          OK is admitted, OVER_LIMIT denied (grpcs:// for TLS);
                          over loadgen's own lean client, or grpc-go's with
                          --grpc-client grpc-go

Requests go out at --rate, whatever the target answers (an open loop), and
each one's latency counts from when it was meant to be sent. The progress
line shows the decisions/s and the share admitted since the start, the p99
latency of the last second, and for a hotkeyd the level of --key (how many
subcounters it is split into at most) as the daemon's /v1/hotkeys reports
it, on the admin listener that --status names (else as its decisions
report it). With --limit, the summary sets --key's admitted requests
against what a perfect token bucket of --limit per --period, full at the
start, would have admitted of them: admitted ÷ ideal.

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
  key       every request to --key

Flags:
`

// parse reads args; errors are for the user, and want exit code 2.
func parse(args []string, out io.Writer) (config, error) {
	var c config
	fs := flag.NewFlagSet("hotkeyd loadgen", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	var seed int64
	fs.StringVar(&c.target, "target", "http://127.0.0.1:8080", "the rate limiter: a hotkeyd at http://host:port or nats://host:port, an Envoy rate-limit service at grpc://host:port, an HTTP endpoint with --api plain")
	fs.StringVar(&c.api, "api", apiHotkeyd, "with an http(s):// target: hotkeyd (POST /v1/allow under the URL) or plain (the URL itself, any HTTP endpoint)")
	fs.StringVar(&c.policy, "policy", "default", "the hotkeyd policy each request names")
	fs.StringVar(&c.method, "method", "GET", "--api plain: each request's method")
	fs.StringVar(&c.keyHeader, "key-header", "", "--api plain: the header that carries the key, e.g. X-Api-Key")
	fs.StringVar(&c.keyParam, "key-param", "", "--api plain: the query parameter that carries the key")
	fs.StringVar(&c.domain, "domain", "", "grpc:// target: the rate-limit domain of each request")
	fs.StringVar(&c.grpcClient, "grpc-client", grpcLean, "grpc:// target: the gRPC client, lean (loadgen's own, a fraction of the CPU a call) or grpc-go (google.golang.org/grpc's ClientConn)")
	fs.Var(&c.descriptors, "descriptor", "grpc:// target: a descriptor of each request, key=value[,key=value…]; {key} in a value is the workload's key; repeat for more descriptors")
	fs.Int64Var(&c.limit, "limit", 0, "the limit --key is measured against, in units per --period: the summary gives admitted ÷ ideal; 0: none")
	fs.DurationVar(&c.period, "period", time.Second, "--limit's period")
	fs.StringVar(&c.namespace, "namespace", namespace.Default, "with a nats:// target, the --namespace of the daemons to ask: decisions go to hotkey.allow for \"default\", hotkey.NAME.api.allow for NAME")
	fs.StringVar(&c.workload, "workload", "hotspot", "hotspot, ramp, uniform, zipf, flood or key")
	fs.Float64Var(&c.rate, "rate", 1000, "requests per second sent")
	fs.DurationVar(&c.duration, "duration", 10*time.Second, "how long to send")
	fs.IntVar(&c.concurrency, "concurrency", 64, "requests in flight at most; more wait, and the wait counts in their latency")
	fs.IntVar(&c.keys, "keys", 1000, "background keys (hotspot, ramp, uniform, zipf)")
	fs.StringVar(&c.key, "key", "hot", "the hot key (hotspot, ramp, key), followed in the progress line and measured against --limit")
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
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if fs.NArg() > 0 {
		return c, fmt.Errorf("unexpected argument %q: hotkeyd loadgen takes flags only (hotkeyd loadgen --help lists them)", fs.Arg(0))
	}
	c.seed = uint64(seed)
	if c.hotRate == 0 {
		c.hotRate = c.rate / 2
	}
	if err := c.checkTarget(set); err != nil {
		return c, err
	}
	switch {
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
	case c.limit < 0:
		return c, fmt.Errorf("--limit %d: want the units --key may take per --period, or 0 for none", c.limit)
	case c.period <= 0:
		return c, fmt.Errorf("--period %v: want a positive duration, e.g. 1s", c.period)
	case set["namespace"] && !strings.HasPrefix(c.target, "nats://"):
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
	case "key":
		return loadgen.Fixed(c.key), nil
	}
	return nil, fmt.Errorf("--workload %q: want hotspot, ramp, uniform, zipf, flood or key", c.workload)
}

// Main runs `hotkeyd loadgen args`: 0 when the run completed, 1 when it
// could not run (the target unreachable, or not deciding), 2 for bad flags.
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
	// One decision first, of a key of its own: a target that is not there,
	// or a policy it does not have, is an error before the run rather than
	// a run of errors.
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	_, err = target.Decide(pctx, probeKey, c.cost)
	cancel()
	if err != nil {
		fmt.Fprintf(stderr, "hotkeyd loadgen: %s does not decide: %v\n", c.target, err)
		return 1
	}
	cfg := loadgen.Config{
		Target: target, Workload: wl, Rate: c.rate, Duration: c.duration,
		Concurrency: c.concurrency, Cost: c.cost, Watch: c.key, Period: time.Second,
	}
	if c.limit > 0 {
		cfg.Limit = loadgen.Limit{Units: c.limit, Period: c.period}
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
			bar.Describe(progressLine(s, shards, c.api == apiHotkeyd))
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

func progressLine(s loadgen.Snapshot, shards int, level bool) string {
	answered := s.Allowed + s.Denied
	admitted := 0.0
	if answered > 0 {
		admitted = 100 * float64(s.Allowed) / float64(answered)
	}
	rate := 0.0
	if s.Elapsed > 0 {
		rate = float64(answered) / s.Elapsed.Seconds()
	}
	line := fmt.Sprintf("%8.0f decisions/s  admitted %5.1f%%  p99 %-8v", rate, admitted, s.P99.Round(10*time.Microsecond))
	if level {
		line += fmt.Sprintf("  level %-2d", shards)
	}
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
