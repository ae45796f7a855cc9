package main

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/hotkeyd/hotkey/bench/internal/scenario"
	"github.com/hotkeyd/hotkey/internal/daemon"
	"github.com/hotkeyd/hotkey/internal/redistest"
	"github.com/hotkeyd/hotkey/loadgen"
)

// rlsVersion is the envoyproxy/ratelimit the scenario builds: it has no
// tagged Go versions, so a pseudo-version of its main branch.
const (
	rlsModule  = "github.com/envoyproxy/ratelimit"
	rlsVersion = "v1.4.1-0.20260122083618-3fb702589d36"
)

// The rules both systems are given, as one file: each value of descriptor
// key "user" of domain "bench" may make rlsLimit requests a second.
const (
	rlsDomain = "bench"
	rlsLimit  = 100
)

var rlsRules = rulesOf(rlsLimit)

// rulesOf returns the rules file that gives each value of descriptor key
// "user" of domain rlsDomain limit requests a second.
func rulesOf(limit int) string {
	return fmt.Sprintf(`domain: %s
descriptors:
  - key: user
    rate_limit:
      unit: second
      requests_per_unit: %d
`, rlsDomain, limit)
}

// rlsSystem is one rate-limit service under test, reached over gRPC.
type rlsSystem struct {
	name   string
	target loadgen.Target
}

// rlsRun is what one loadgen run against one system measured.
type rlsRun struct {
	rate, p50, p99 float64 // decisions/s, ms, ms
	denied, errors int64
	firstErr       error
	ofIdeal        float64
	admitted       int64
	ideal          int64
}

// runRatelimit measures hotkeyd's Envoy rate-limit service against
// envoyproxy/ratelimit given the same rules file, each on a redis-server
// of its own, with the same loadgen runs (Envoy target, open loop),
// alternated: decisions/s and latency on many keys at three rising rates,
// and one key at 3× its limit, admitted ÷ ideal.
func runRatelimit(ctx context.Context, s *setup) (*scenario.Section, error) {
	const keys = 10_000
	rates := []float64{1000, 4000, 8000}
	d := s.scale(5*time.Second, 2*time.Second)
	hotD := s.scale(10*time.Second, 3*time.Second)
	hotRate := float64(3 * rlsLimit)
	warm := s.scale(time.Second, 500*time.Millisecond)
	k := s.rounds(3, 1)
	dir, err := os.MkdirTemp("", "hotkey-report-ratelimit-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)

	built := time.Now()
	bin, err := buildRatelimit(ctx, dir)
	if err != nil {
		return nil, err
	}
	buildTook := time.Since(built)

	// The rules: one file, where each system wants it.
	rules, err := writeRules(dir, rlsRules)
	if err != nil {
		return nil, err
	}

	hkRedis, err := redistest.Start(s.env.Dir)
	if err != nil {
		return nil, err
	}
	defer hkRedis.Close()
	rlRedis, err := redistest.Start(s.env.Dir)
	if err != nil {
		return nil, err
	}
	defer rlRedis.Close()

	dm, err := daemon.StartArgs(ctx, "--listen", "127.0.0.1:0", "--nats", "none",
		"--redis", "redis://"+hkRedis.Addr, "--envoy-config", rules, "--log-level", "error")
	if err != nil {
		return nil, err
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		dm.Shutdown(sctx)
		cancel()
	}()
	rl, err := startRatelimit(ctx, bin, filepath.Join(dir, "runtime"), "rls", rlRedis.Addr)
	if err != nil {
		return nil, err
	}
	defer rl.stop()

	descs := [][]loadgen.Entry{{{Key: "user", Value: loadgen.KeyPlaceholder}}}
	var systems []*rlsSystem
	for _, sys := range []struct{ name, addr string }{{"hotkeyd", dm.GRPCAddr()}, {"envoyproxy/ratelimit", rl.grpcAddr}} {
		conn, err := loadgen.DialGRPC(ctx, sys.addr, nil)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", sys.name, err)
		}
		defer conn.Close()
		systems = append(systems, &rlsSystem{name: sys.name, target: loadgen.Envoy(conn, rlsDomain, descs)})
	}

	// Fresh keys each run: nothing is flushed, and no counter of an
	// earlier run is met.
	prefix := fmt.Sprintf("rls-%x-", time.Now().UnixNano())
	run := func(sys *rlsSystem, cfg loadgen.Config) (rlsRun, error) {
		cfg.Target = sys.target
		res, err := loadgen.Run(ctx, cfg, nil, 0)
		if err != nil {
			return rlsRun{}, fmt.Errorf("%s: %w", sys.name, err)
		}
		if res.Allowed+res.Denied == 0 {
			return rlsRun{}, fmt.Errorf("%s: no request answered: %v", sys.name, res.FirstError)
		}
		ms := func(q float64) float64 { return float64(res.Latency.Quantile(q)) / float64(time.Millisecond) }
		return rlsRun{rate: res.Rate(), p50: ms(0.5), p99: ms(0.99), denied: res.Denied, errors: res.Errors, firstErr: res.FirstError,
			ofIdeal: res.OfIdeal(), admitted: res.WatchedAllowed(), ideal: res.Ideal}, nil
	}
	for i, sys := range systems { // connections, scripts, first counters
		if _, err := run(sys, loadgen.Config{Workload: loadgen.Uniform(prefix+"warm-", keys, uint64(i)), Rate: 500, Duration: warm}); err != nil {
			return nil, err
		}
	}

	// thr[step][system] and hot[system] hold each round's run.
	thr := make([][][]rlsRun, len(rates))
	for i := range thr {
		thr[i] = make([][]rlsRun, len(systems))
	}
	hot := make([][]rlsRun, len(systems))
	var firstErrs []string
	var denied int64 // in (1), where every request is under its key's limit
	for round := range k {
		order := []int{0, 1}
		if round%2 == 1 {
			order = []int{1, 0}
		}
		for step, rate := range rates {
			for _, i := range order {
				r, err := run(systems[i], loadgen.Config{
					Workload: loadgen.Uniform(fmt.Sprintf("%sr%d-s%d-%d-", prefix, round, step, i), keys, uint64(round*len(rates)+step)),
					Rate:     rate, Duration: d,
				})
				if err != nil {
					return nil, err
				}
				if r.firstErr != nil {
					firstErrs = append(firstErrs, fmt.Sprintf("%s at %.0f/s: %d errors, the first: %v", systems[i].name, rate, r.errors, r.firstErr))
				}
				denied += r.denied
				thr[step][i] = append(thr[step][i], r)
			}
		}
		for _, i := range order {
			key := fmt.Sprintf("%sr%d-hot-%d", prefix, round, i)
			r, err := run(systems[i], loadgen.Config{
				Workload: loadgen.Fixed(key), Rate: hotRate, Duration: hotD,
				Watch: key, Limit: loadgen.Limit{Units: rlsLimit, Period: time.Second},
			})
			if err != nil {
				return nil, err
			}
			if r.firstErr != nil {
				firstErrs = append(firstErrs, fmt.Sprintf("%s, one key: %d errors, the first: %v", systems[i].name, r.errors, r.firstErr))
			}
			hot[i] = append(hot[i], r)
		}
	}

	med := func(rs []rlsRun, f func(rlsRun) float64) float64 {
		v := make([]float64, len(rs))
		for i, r := range rs {
			v[i] = f(r)
		}
		slices.Sort(v)
		return v[len(v)/2]
	}
	// ratio is the median over the rounds of hotkeyd's figure ÷ envoyproxy/ratelimit's.
	ratio := func(rs [][]rlsRun, f func(rlsRun) float64) float64 {
		v := make([]float64, len(rs[0]))
		for i := range v {
			v[i] = f(rs[0][i]) / f(rs[1][i])
		}
		slices.Sort(v)
		return v[len(v)/2]
	}
	decs := func(r rlsRun) float64 { return r.rate }
	p50 := func(r rlsRun) float64 { return r.p50 }
	p99 := func(r rlsRun) float64 { return r.p99 }
	errs := func(r rlsRun) float64 { return float64(r.errors) }
	ofIdeal := func(r rlsRun) float64 { return r.ofIdeal }

	sec := &scenario.Section{Setup: fmt.Sprintf("hotkeyd (this tree, in this process, `--nats none`, `--envoy-config`) against envoyproxy/ratelimit %s@%s (`go install %s/src/service_cmd`, built for the run in %.0f s; a process of its own, BACKEND_TYPE=redis, REDIS_TYPE=SINGLE, its defaults otherwise: fixed windows, REDIS_POOL_SIZE 10, LOCAL_CACHE_SIZE_IN_BYTES 0 (no over-limit cache), REDIS_PIPELINE_WINDOW 0), each on a redis-server of its own, both answering Envoy's ShouldRateLimit over gRPC on loopback. Both read the same rules file: domain `%s`, descriptor key `user`, %d requests per second per value (no algorithm named, so hotkeyd enforces its default sliding window where envoyproxy/ratelimit counts fixed 1 s windows). The load is the same loadgen run for each, its Envoy target (descriptor `user={key}`), open loop, up to 64 requests in flight on one gRPC connection per system: (1) %d keys uniform (each far under its limit: all should be admitted) at %s requests/s, %v per rate; (2) one key at %.0f/s, 3× its limit, for %v, against loadgen's ideal (a token bucket of %d a second holding %d, fed the same instants). The systems alternate (the first one swapped each round), keys fresh each run, after a warm-up of 500/s for %v; %d round(s), medians; ratios are hotkeyd ÷ envoyproxy/ratelimit, the median of the per-round ratios.",
		rlsModule, rlsVersion, rlsModule, buildTook.Seconds(), rlsDomain, rlsLimit, keys, joinRates(rates), d, hotRate, hotD, rlsLimit, rlsLimit, warm, k)}
	sec.Printf("| load | figure | hotkeyd | envoyproxy/ratelimit | hotkeyd ÷ envoyproxy/ratelimit |\n|---|---|---|---|---|\n")
	for step, rate := range rates {
		rs := thr[step]
		load := fmt.Sprintf("%d keys at %.0f/s", keys, rate)
		sec.Printf("| %s | decisions/s | %.0f | %.0f | %.2f |\n", load, med(rs[0], decs), med(rs[1], decs), ratio(rs, decs))
		sec.Printf("| %s | p50 latency (ms) | %.2f | %.2f | %.2f |\n", load, med(rs[0], p50), med(rs[1], p50), ratio(rs, p50))
		sec.Printf("| %s | p99 latency (ms) | %.2f | %.2f | %.2f |\n", load, med(rs[0], p99), med(rs[1], p99), ratio(rs, p99))
		sec.Printf("| %s | errors | %.0f | %.0f | |\n", load, med(rs[0], errs), med(rs[1], errs))
	}
	hl := fmt.Sprintf("1 key at %.0f/s (3× its limit)", hotRate)
	sec.Printf("| %s | admitted ÷ ideal | %.3f | %.3f | %.2f |\n", hl, med(hot[0], ofIdeal), med(hot[1], ofIdeal), ratio(hot, ofIdeal))
	sec.Printf("| %s | admitted (ideal) | %s | %s | |\n", hl, admittedList(hot[0]), admittedList(hot[1]))
	sec.Printf("| %s | errors | %.0f | %.0f | |\n\n", hl, med(hot[0], errs), med(hot[1], errs))
	if denied > 0 {
		sec.Printf("(1) was meant to be admitted whole, and %d decisions of it were denied.\n\n", denied)
	} else {
		sec.Printf("Every decision of (1) was an admission, on both systems.\n\n")
	}
	for _, e := range firstErrs {
		sec.Printf("Errors: %s.\n\n", e)
	}
	sec.Printf("Latency is counted from the instant each request was meant to be sent (loadgen's open loop), so a stall shows in every request it delayed. The ideal is a token bucket that starts full: over a run of T s it admits the limit and T s' worth more. A fixed window admits up to its limit in each window the run touches (T of them, or T+1 cut at the ends), a sliding window about T s' worth, so both read under 1, the more so the shorter the run.\n")
	return sec, nil
}

// joinRates lists rates as "1000 and 4000".
func joinRates(rates []float64) string {
	s := make([]string, len(rates))
	for i, r := range rates {
		s[i] = strconv.FormatFloat(r, 'f', 0, 64)
	}
	if len(s) < 2 {
		return strings.Join(s, "")
	}
	return strings.Join(s[:len(s)-1], ", ") + " and " + s[len(s)-1]
}

// admittedList lists each round's admitted (ideal) of the one key.
func admittedList(rs []rlsRun) string {
	s := make([]string, len(rs))
	for i, r := range rs {
		s[i] = fmt.Sprintf("%d (%d)", r.admitted, r.ideal)
	}
	return strings.Join(s, ", ")
}

// buildRatelimit builds envoyproxy/ratelimit's service into dir and returns
// the binary's path. It fails with go's own output if the build does.
func buildRatelimit(ctx context.Context, dir string) (string, error) {
	bin := filepath.Join(dir, "bin")
	pkg := rlsModule + "/src/service_cmd@" + rlsVersion
	cmd := exec.CommandContext(ctx, "go", "install", pkg)
	cmd.Dir = dir // outside any module
	cmd.Env = append(os.Environ(), "GOBIN="+bin, "GOWORK=off")
	out, err := cmd.CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("envoyproxy/ratelimit: go install %s: %w: %s", pkg, err, tailOf(out, 2000))
	}
	return filepath.Join(bin, "service_cmd"), nil
}

// rlsProcess is a running envoyproxy/ratelimit.
type rlsProcess struct {
	cmd      *exec.Cmd
	done     chan struct{} // closed once cmd has been waited for
	out      *bytes.Buffer // its output; read only after done
	grpcAddr string
}

// startRatelimit starts bin on loopback ports of its own, with the rules
// in root/sub/config and its counters on the redis-server at redisAddr, and
// returns once it answers a ShouldRateLimit of the rules' domain. env adds
// to its settings. The caller must call stop.
func startRatelimit(ctx context.Context, bin, root, sub, redisAddr string, env ...string) (*rlsProcess, error) {
	ports, err := freeLoopbackPorts()
	if err != nil {
		return nil, err
	}
	p := &rlsProcess{done: make(chan struct{}), out: new(bytes.Buffer), grpcAddr: net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[1]))}
	p.cmd = exec.Command(bin)
	p.cmd.Env = []string{ // only these: nothing of this process's environment leaks into its settings
		"BACKEND_TYPE=redis", "REDIS_SOCKET_TYPE=tcp", "REDIS_TYPE=SINGLE", "REDIS_URL=" + redisAddr,
		"RUNTIME_ROOT=" + root, "RUNTIME_SUBDIRECTORY=" + sub, "RUNTIME_WATCH_ROOT=false", "RUNTIME_IGNOREDOTFILES=true",
		"USE_STATSD=false", "LOG_LEVEL=warn",
		"HOST=127.0.0.1", "PORT=" + strconv.Itoa(ports[0]),
		"GRPC_HOST=127.0.0.1", "GRPC_PORT=" + strconv.Itoa(ports[1]),
		"DEBUG_HOST=127.0.0.1", "DEBUG_PORT=" + strconv.Itoa(ports[2]),
	}
	p.cmd.Env = append(p.cmd.Env, env...)
	if err := p.start(ctx, "envoyproxy/ratelimit"); err != nil {
		return nil, err
	}
	return p, nil
}

// start starts p's command, the service name, and returns once it answers
// (ready); if it does not, start stops it and says why, with its output.
func (p *rlsProcess) start(ctx context.Context, name string) error {
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	if err := p.cmd.Start(); err != nil {
		return fmt.Errorf("%s: start: %w", name, err)
	}
	go func() {
		p.cmd.Wait()
		close(p.done)
	}()
	if err := p.ready(ctx); err != nil {
		p.stop()
		return fmt.Errorf("%s: %w; its output: %s", name, err, tailOf(p.out.Bytes(), 2000))
	}
	return nil
}

// ready waits until p answers a request of the rules' domain with OK.
func (p *rlsProcess) ready(ctx context.Context) error {
	// A connection a probe: the process may not listen yet, and GRPCConn
	// does not redial.
	probe := func(ctx context.Context) (loadgen.Outcome, error) {
		conn, err := loadgen.DialGRPC(ctx, p.grpcAddr, nil)
		if err != nil {
			return loadgen.Outcome{}, err
		}
		defer conn.Close()
		return loadgen.Envoy(conn, rlsDomain, [][]loadgen.Entry{{{Key: "user", Value: "ready-probe"}}}).Decide(ctx, "", 1)
	}
	deadline := time.Now().Add(30 * time.Second)
	var last error
	for time.Now().Before(deadline) {
		select {
		case <-p.done:
			return fmt.Errorf("exited: %v", p.cmd.ProcessState)
		default:
		}
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		out, err := probe(cctx)
		cancel()
		if err == nil && out.Allowed && out.Quota.Reported {
			return nil
		}
		if err == nil {
			err = fmt.Errorf("probe answered %+v: the rules were not loaded", out)
		}
		last = err
		select { // polling a process's start: no clock of ours to inject
		case <-time.After(100 * time.Millisecond):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return fmt.Errorf("not ready within 30 s: %w", last)
}

// stop ends p by its PID (SIGTERM, then SIGKILL after 10 s) and waits.
func (p *rlsProcess) stop() {
	select {
	case <-p.done:
		return
	default:
	}
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		p.cmd.Process.Kill()
		<-p.done
	}
}

// freeLoopbackPorts returns three loopback TCP ports, each free a moment
// ago: a service's HTTP, gRPC and debug or admin ports.
func freeLoopbackPorts() ([3]int, error) {
	var ports [3]int
	for i := range ports {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return ports, err
		}
		defer l.Close() // held until all are picked, so that none repeats
		ports[i] = l.Addr().(*net.TCPAddr).Port
	}
	return ports, nil
}

// writeRules writes rules where both services read it:
// dir/runtime/rls/config/bench.yaml (envoyproxy/ratelimit reads the
// config directory under RUNTIME_ROOT/RUNTIME_SUBDIRECTORY), and returns
// its path.
func writeRules(dir, rules string) (string, error) {
	rulesDir := filepath.Join(dir, "runtime", "rls", "config")
	if err := os.MkdirAll(rulesDir, 0o755); err != nil {
		return "", err
	}
	file := filepath.Join(rulesDir, "bench.yaml")
	return file, os.WriteFile(file, []byte(rules), 0o644)
}

// median returns the median of v (the upper one of an even count),
// leaving v as it is.
func median(v []float64) float64 {
	c := slices.Clone(v)
	slices.Sort(c)
	return c[len(c)/2]
}

// tailOf returns the last n bytes of b, trimmed.
func tailOf(b []byte, n int) string {
	if len(b) > n {
		b = b[len(b)-n:]
	}
	s := strings.TrimSpace(string(b))
	if s == "" {
		return "(no output)"
	}
	return s
}

// dialRLS returns a client connection to the rate-limit service at addr,
// and what closes it: loadgen's own (loadgen.DialGRPC), or with grpcGo
// grpc-go's.
func dialRLS(ctx context.Context, addr string, grpcGo bool) (grpc.ClientConnInterface, func(), error) {
	if !grpcGo {
		conn, err := loadgen.DialGRPC(ctx, addr, nil)
		if err != nil {
			return nil, nil, err
		}
		return conn, func() { conn.Close() }, nil
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, nil, err
	}
	return conn, func() { conn.Close() }, nil
}
