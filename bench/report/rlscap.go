package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/hotkeyd/hotkey/bench/internal/scenario"
	"github.com/hotkeyd/hotkey/internal/redistest"
	"github.com/hotkeyd/hotkey/loadgen"
)

// rlsCacheBytes is the over-limit cache envoyproxy/ratelimit is given when
// its cache is on (LOCAL_CACHE_SIZE_IN_BYTES).
const rlsCacheBytes = 64 << 20

// rlsCapSystem is one rate-limit service of the capacity runs: a process of
// its own, on a redis-server of its own, and the loadgen target that asks
// it.
type rlsCapSystem struct {
	name    string
	proc    *rlsProcess
	redis   *redistest.Server
	targets [2]loadgen.Target // over loadgen's client, and over grpc-go's
	closers []func()          // the targets' connections
}

// stop closes s's connections, then stops its service, then its
// redis-server.
func (s *rlsCapSystem) stop() {
	for _, c := range s.closers {
		c()
	}
	s.proc.stop()
	s.redis.Close()
}

// capRun is one capacity run: calls/s, and the CPU µs a call of the
// service, its redis-server and the client.
type capRun struct {
	rate float64
	cpu  [3]float64
}

// cpu returns the CPU time used so far by s's service, its redis-server
// and this process.
func (s *rlsCapSystem) cpu() ([3]time.Duration, error) {
	var t [3]time.Duration
	var err error
	if t[0], err = procCPU(s.proc.cmd.Process.Pid); err != nil {
		return t, fmt.Errorf("%s: %w", s.name, err)
	}
	if t[1], err = procCPU(s.redis.Pid()); err != nil {
		return t, fmt.Errorf("%s's redis-server: %w", s.name, err)
	}
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return t, err
	}
	t[2] = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	return t, nil
}

// procCPU returns the user and system time process pid has used, all its
// threads, from /proc/pid/stat (Linux; its clock ticks are USER_HZ, 100 a
// second on every Linux ABI).
func procCPU(pid int) (time.Duration, error) {
	if pid <= 0 {
		return 0, errors.New("not running")
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name, field 2, is in parentheses and may hold spaces:
	// the fields after its last ')' start at field 3 (state).
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc/%d/stat: no command name", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f)+2)
	}
	utime, err1 := strconv.ParseUint(f[11], 10, 64) // field 14
	stime, err2 := strconv.ParseUint(f[12], 10, 64) // field 15
	if err := errors.Join(err1, err2); err != nil {
		return 0, fmt.Errorf("/proc/%d/stat: %w", pid, err)
	}
	return time.Duration(utime+stime) * (time.Second / 100), nil
}

// runRatelimitCapacity measures how many ShouldRateLimit calls a second
// hotkeyd and envoyproxy/ratelimit answer from one client that keeps 64 in
// flight, each service a process of its own on a redis-server of its own,
// given the same rules file: on one hot value far over its limit, and on
// 10,000 values under theirs. hotkeyd runs twice: on its own gRPC server and on
// grpc-go's. envoyproxy/ratelimit runs twice: with its
// defaults, and with its local over-limit cache on.
func runRatelimitCapacity(ctx context.Context, s *setup) (*scenario.Section, error) {
	const keys = 10_000
	d := s.scale(5*time.Second, 2*time.Second)
	k := s.rounds(3, 1)
	dir, err := os.MkdirTemp("", "hotkey-report-rlscap-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)

	rlBin, err := buildRatelimit(ctx, dir)
	if err != nil {
		return nil, err
	}
	hkBin := filepath.Join(dir, "hotkeyd")
	if out, err := exec.CommandContext(ctx, "go", "build", "-o", hkBin, "github.com/hotkeyd/hotkey/cmd/hotkeyd").CombinedOutput(); err != nil {
		return nil, fmt.Errorf("go build hotkeyd: %w: %s", err, tailOf(out, 2000))
	}
	rules, err := writeRules(dir, rlsRules)
	if err != nil {
		return nil, err
	}

	var systems []*rlsCapSystem
	defer func() {
		for _, sys := range systems {
			sys.stop()
		}
	}()
	for _, sys := range []struct {
		name  string
		start func(redisAddr string) (*rlsProcess, error)
	}{
		{"hotkeyd", func(addr string) (*rlsProcess, error) {
			return startHotkeyd(ctx, hkBin, rules, addr)
		}},
		{"hotkeyd on grpc-go's server (--grpc-server grpc-go)", func(addr string) (*rlsProcess, error) {
			return startHotkeyd(ctx, hkBin, rules, addr, "--grpc-server", "grpc-go")
		}},
		{"envoyproxy/ratelimit", func(addr string) (*rlsProcess, error) {
			return startRatelimit(ctx, rlBin, filepath.Join(dir, "runtime"), "rls", addr)
		}},
		{"envoyproxy/ratelimit, local cache on", func(addr string) (*rlsProcess, error) {
			return startRatelimit(ctx, rlBin, filepath.Join(dir, "runtime"), "rls", addr, "LOCAL_CACHE_SIZE_IN_BYTES="+strconv.Itoa(rlsCacheBytes))
		}},
	} {
		rd, err := redistest.Start(s.env.Dir)
		if err != nil {
			return nil, err
		}
		p, err := sys.start(rd.Addr)
		if err != nil {
			rd.Close()
			return nil, fmt.Errorf("%s: %w", sys.name, err)
		}
		cs := &rlsCapSystem{name: sys.name, proc: p, redis: rd}
		systems = append(systems, cs)
		for c := range cs.targets {
			conn, closeConn, err := dialRLS(ctx, p.grpcAddr, c == 1)
			if err != nil {
				return nil, err
			}
			cs.targets[c] = loadgen.Envoy(conn, rlsDomain, [][]loadgen.Entry{{{Key: "user", Value: loadgen.KeyPlaceholder}}})
			cs.closers = append(cs.closers, closeConn)
		}
	}

	prefix := fmt.Sprintf("cap-%x-", time.Now().UnixNano())
	run := func(sys *rlsCapSystem, client int, w loadgen.Workload, d time.Duration) (capRun, error) {
		before, err := sys.cpu()
		if err != nil {
			return capRun{}, err
		}
		// A closed loop: 64 calls always in flight.
		res, err := loadgen.Run(ctx, loadgen.Config{Target: sys.targets[client], Workload: w, Duration: d, Concurrency: 64}, nil, 0)
		if err != nil {
			return capRun{}, fmt.Errorf("%s: %w", sys.name, err)
		}
		if res.Errors > 0 {
			return capRun{}, fmt.Errorf("%s: %d errors, the first: %v", sys.name, res.Errors, res.FirstError)
		}
		after, err := sys.cpu()
		if err != nil {
			return capRun{}, err
		}
		r := capRun{rate: res.Rate()}
		if n := float64(res.Sent); n > 0 {
			for i := range r.cpu {
				r.cpu[i] = float64(after[i]-before[i]) / float64(time.Microsecond) / n
			}
		}
		return r, nil
	}
	for i, sys := range systems { // connections, scripts, first counters
		for c := range sys.targets {
			if _, err := run(sys, c, loadgen.Uniform(fmt.Sprintf("%swarm-%d-%d-", prefix, i, c), keys, uint64(i)), s.scale(time.Second, 500*time.Millisecond)); err != nil {
				return nil, err
			}
		}
	}
	clients := [2]string{"loadgen's own", "grpc-go's"}
	workloads := []struct {
		name string
		w    func(client, round, sys int) loadgen.Workload
	}{
		{"one hot value (100/s allowed)", func(client, round, sys int) loadgen.Workload {
			return loadgen.Fixed(fmt.Sprintf("%shot-c%d-r%d-%d", prefix, client, round, sys))
		}},
		{"10,000 values, each under its limit", func(client, round, sys int) loadgen.Workload {
			return loadgen.Uniform(fmt.Sprintf("%sc%d-r%d-%d-", prefix, client, round, sys), keys, uint64(round*len(systems)+sys))
		}},
	}
	// calls[client][workload][system] holds each round's run.
	var calls [2][][][]capRun
	for c := range calls {
		calls[c] = make([][][]capRun, len(workloads))
		for wi, wl := range workloads {
			calls[c][wi] = make([][]capRun, len(systems))
			for round := range k {
				for j := range systems { // each round starts with another system
					i := (round + j) % len(systems)
					r, err := run(systems[i], c, wl.w(c, round, i), d)
					if err != nil {
						return nil, err
					}
					calls[c][wi][i] = append(calls[c][wi][i], r)
				}
			}
		}
	}

	sec := &scenario.Section{Setup: fmt.Sprintf("hotkeyd (this tree, built for the run, `--nats none`, `--envoy-config`, sync: store; on its own gRPC server, the default, and again on grpc-go's with `--grpc-server grpc-go`) and envoyproxy/ratelimit %s@%s, each a process of its own on a redis-server of its own, given the same rules file (domain `%s`, descriptor key `user`, %d requests per second per value); envoyproxy/ratelimit with its defaults (REDIS_POOL_SIZE 10, no local cache, no pipelining) and again with LOCAL_CACHE_SIZE_IN_BYTES %d. One client, this process: loadgen's Envoy target (descriptor `user={key}`) on one connection per service, over loadgen's own gRPC client (`loadgen.DialGRPC`, the connection that hotkeyd loadgen's default client, `loadgen.DialGRPCClient`, redials) and again over grpc-go's (`--grpc-client grpc-go`), in a closed loop of 64 senders (each sends its next call when its last is answered), so that each service answers as fast as it can; %v per run, the services in turn (each round starting with the next), %d round(s), medians; ratios are the median of the per-round ratios. The client shares the machine's %d cores with the services and their redis-servers.",
		rlsModule, rlsVersion, rlsDomain, rlsLimit, rlsCacheBytes, d, k, runtime.NumCPU())}
	sec.Printf("| client | workload | service | calls/s | hotkeyd ÷ it | CPU µs a call: service | its redis-server | client |\n|---|---|---|---|---|---|---|---|\n")
	for c, client := range clients {
		for wi, wl := range workloads {
			for i, sys := range systems {
				runs := calls[c][wi][i]
				ratios := make([]float64, k)
				rates := make([]float64, k)
				var cpu [3][]float64
				for r := range k {
					ratios[r] = calls[c][wi][0][r].rate / runs[r].rate
					rates[r] = runs[r].rate
					for j := range cpu {
						cpu[j] = append(cpu[j], runs[r].cpu[j])
					}
				}
				sec.Printf("| %s | %s | %s | %.0f | %.2f | %.1f | %.1f | %.1f |\n", client, wl.name, sys.name, median(rates), median(ratios), median(cpu[0]), median(cpu[1]), median(cpu[2]))
			}
		}
	}
	sec.Printf("\nThe targets are hotkeyd at 2.5× envoyproxy/ratelimit's calls/s with its defaults and 2× with its local cache on, on both workloads. The client's own cost divides every figure: the less CPU it takes from the services, the closer a ratio comes to theirs. CPU µs a call is each process's user and system time over the run (from /proc) divided by the calls it answered, medians over the rounds; the client's is this process's own.\n")
	return sec, nil
}

// startHotkeyd starts the hotkeyd binary bin on loopback ports of its own,
// deciding by the Envoy rules file rules on the redis-server at redisAddr,
// and returns once it answers a ShouldRateLimit of the rules' domain. The
// caller must call stop.
func startHotkeyd(ctx context.Context, bin, rules, redisAddr string, args ...string) (*rlsProcess, error) {
	ports, err := freeLoopbackPorts()
	if err != nil {
		return nil, err
	}
	addr := func(port int) string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(port)) }
	p := &rlsProcess{done: make(chan struct{}), out: new(bytes.Buffer), grpcAddr: addr(ports[1])}
	p.cmd = exec.Command(bin, append([]string{"--listen", addr(ports[0]), "--grpc-listen", p.grpcAddr, "--admin-listen", addr(ports[2]),
		"--nats", "none", "--redis", "redis://" + redisAddr, "--envoy-config", rules, "--log-level", "error"}, args...)...)
	p.cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
	if err := p.start(ctx, "hotkeyd"); err != nil {
		return nil, err
	}
	return p, nil
}
