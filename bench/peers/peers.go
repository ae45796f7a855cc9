package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	guber "github.com/gubernator-io/gubernator/v2"
	"github.com/sirupsen/logrus"

	"github.com/hotkeyd/hotkey/bench/internal/scenario"
	"github.com/hotkeyd/hotkey/internal/daemon"
	"github.com/hotkeyd/hotkey/loadgen"
)

// The daemons' policies: "bulk" admits all the throughput runs send, and
// "strict" is the one key at 3× its limit.
const (
	bulkLimit   = 1_000_000
	strictLimit = 500
)

var peerPolicies = fmt.Sprintf(`policies:
  bulk:
    algorithm: token_bucket
    limit: %d
    period: 1s
    burst: %d
  strict:
    algorithm: token_bucket
    limit: %d
    period: 1s
    burst: %d
`, bulkLimit, bulkLimit, strictLimit, strictLimit)

// runPeers compares hotkeyd with gubernator, the rate-limiting daemon users
// would otherwise pick, both asked over HTTP by the same load: hotkeyd alone
// (memory store) and two hotkeyds on one Redis (NATS between them), against
// one gubernator and two gubernator peers with GLOBAL behaviour (each
// answers from its own copy and syncs with the key's owner).
func runPeers(ctx context.Context, redisAddr string, quick bool) (*scenario.Section, error) {
	const clients = 64
	d, strictRun := 10*time.Second, 10*time.Second
	if quick {
		d, strictRun = 3*time.Second, 3*time.Second
	}
	dir, err := os.MkdirTemp("", "hotkey-report-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	policies := filepath.Join(dir, "policies.yaml")
	if err := os.WriteFile(policies, []byte(peerPolicies), 0o644); err != nil {
		return nil, err
	}
	type system struct {
		name  string
		start func() (targets func(policy string) []loadgen.Target, stop func(), err error)
	}
	systems := []system{
		{"hotkeyd, 1 instance (memory store)", func() (func(string) []loadgen.Target, func(), error) {
			return startHotkeyd(ctx, 1, policies, "")
		}},
		{"hotkeyd, 2 instances on one Redis", func() (func(string) []loadgen.Target, func(), error) {
			return startHotkeyd(ctx, 2, policies, redisAddr)
		}},
		{"gubernator v2.13.0, 1 node", func() (func(string) []loadgen.Target, func(), error) {
			return startGubernator(ctx, 1, false)
		}},
		{"gubernator v2.13.0, 2 peers, GLOBAL", func() (func(string) []loadgen.Target, func(), error) {
			return startGubernator(ctx, 2, true)
		}},
	}
	sec := &scenario.Section{Setup: fmt.Sprintf("each system started alone in this process, then asked over HTTP: %d clients in a closed loop on 10,000 keys for %v (decisions/s, latency); then one key at 3× a limit of %d/s (token bucket, burst %d; gubernator's leaky bucket with that burst), open loop for %v (admitted ÷ ideal, the burst plus the limit over the run). Requests to two instances alternate between them. gubernator runs with its defaults, tracing off.",
		clients, d, strictLimit, strictLimit, strictRun)}
	sec.Printf("| system | decisions/s | p50 | p99 | one key at 3×: admitted ÷ ideal |\n|---|---|---|---|---|\n")
	rows := make([]struct {
		rate     float64
		p50, p99 time.Duration
		ratio    float64
	}, len(systems))
	for i, sys := range systems {
		targets, stop, err := sys.start()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", sys.name, err)
		}
		bulk := alternate(targets("bulk"))
		names := make([]string, 10_000)
		for j := range names {
			names[j] = "peer:" + strconv.Itoa(j)
		}
		var hist loadgen.Histogram
		var mu sync.Mutex
		rate, err := scenario.Throughput(clients, d, func(r *rand.Rand) error {
			start := time.Now()
			_, err := bulk.Decide(ctx, names[r.IntN(len(names))], 1)
			el := time.Since(start)
			mu.Lock()
			hist.Record(el)
			mu.Unlock()
			return err
		})
		if err == nil {
			key := fmt.Sprintf("strict:%d", time.Now().UnixNano())
			var res *loadgen.Result
			res, err = loadgen.Run(ctx, loadgen.Config{
				Target: alternate(targets("strict")), Workload: loadgen.Fixed(key),
				Rate: 3 * strictLimit, Duration: strictRun, Concurrency: clients,
			}, nil, 0)
			if err == nil && res.Errors > 0 {
				err = fmt.Errorf("%d errors at 3×, first %v", res.Errors, res.FirstError)
			}
			if err == nil {
				rows[i].ratio = float64(res.Allowed) / (strictLimit + strictLimit*res.Elapsed.Seconds())
			}
		}
		stop()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", sys.name, err)
		}
		rows[i].rate, rows[i].p50, rows[i].p99 = rate, hist.Quantile(0.5), hist.Quantile(0.99)
		sec.Printf("| %s | %.0f | %v | %v | %.3f |\n", sys.name, rate, rows[i].p50.Round(10*time.Microsecond), rows[i].p99.Round(10*time.Microsecond), rows[i].ratio)
	}
	sec.Printf("\nhotkeyd ÷ gubernator, decisions/s: %.2f (one instance each), %.2f (two each).\n", rows[0].rate/rows[2].rate, rows[1].rate/rows[3].rate)
	return sec, nil
}

// alternate decides on targets in turn.
func alternate(ts []loadgen.Target) loadgen.Target {
	if len(ts) == 1 {
		return ts[0]
	}
	return &turns{ts: ts}
}

type turns struct {
	ts   []loadgen.Target
	next atomic.Uint64
}

func (t *turns) Decide(ctx context.Context, key string, cost int64) (loadgen.Outcome, error) {
	return t.ts[(t.next.Add(1)-1)%uint64(len(t.ts))].Decide(ctx, key, cost)
}

// startHotkeyd starts n daemons in this process: on the memory store if
// redisAddr is empty, else on that Redis; the first embeds NATS and the
// others join it.
func startHotkeyd(ctx context.Context, n int, policies, redisAddr string) (func(string) []loadgen.Target, func(), error) {
	var ds []*daemon.Daemon
	stop := func() {
		for _, d := range ds {
			sctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			d.Shutdown(sctx)
			cancel()
		}
	}
	for i := range n {
		args := []string{"--listen", "127.0.0.1:0", "--policies", policies, "--log-level", "error"}
		if i == 0 {
			args = append(args, "--nats-listen", "127.0.0.1:0")
		} else {
			args = append(args, "--nats", ds[0].NATSURL())
		}
		if redisAddr != "" {
			args = append(args, "--redis", "redis://"+redisAddr)
		}
		d, err := daemon.StartArgs(ctx, args...)
		if err != nil {
			stop()
			return nil, nil, err
		}
		ds = append(ds, d)
	}
	return func(policy string) []loadgen.Target {
		var ts []loadgen.Target
		for _, d := range ds {
			ts = append(ts, loadgen.HTTP("http://"+d.Addr(), policy, nil))
		}
		return ts
	}, stop, nil
}

// startGubernator starts n gubernator daemons in this process, each told of
// the others (a static peer list: on one host its member list does not
// find them), and returns targets on their HTTP API.
func startGubernator(ctx context.Context, n int, global bool) (func(string) []loadgen.Target, func(), error) {
	logger := logrus.New()
	logger.SetOutput(io.Discard)
	var ds []*guber.Daemon
	var peers []guber.PeerInfo
	// gubernator v2.13.0's Close can wait forever in GLOBAL mode (its
	// global manager waits on a broadcast that no longer comes): give each
	// a few seconds, and leave the rest to the process's exit.
	stop := func() {
		for _, d := range ds {
			done := make(chan struct{})
			go func() { d.Close(); close(done) }()
			select {
			case <-done:
			case <-time.After(5 * time.Second):
				fmt.Fprintln(os.Stderr, "peers: a gubernator daemon did not close within 5 s; left running")
			}
		}
	}
	for range n {
		grpcAddr, err := freePort()
		if err != nil {
			stop()
			return nil, nil, err
		}
		httpAddr, err := freePort()
		if err != nil {
			stop()
			return nil, nil, err
		}
		sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		d, err := guber.SpawnDaemon(sctx, guber.DaemonConfig{
			Logger:            logrus.NewEntry(logger),
			InstanceID:        grpcAddr,
			GRPCListenAddress: grpcAddr,
			HTTPListenAddress: httpAddr,
			AdvertiseAddress:  grpcAddr,
		})
		cancel()
		if err != nil {
			stop()
			return nil, nil, err
		}
		ds = append(ds, d)
		peers = append(peers, guber.PeerInfo{GRPCAddress: grpcAddr, HTTPAddress: httpAddr})
	}
	for _, d := range ds {
		d.SetPeers(peers)
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConns, tr.MaxIdleConnsPerHost = 1024, 1024
	client := &http.Client{Transport: tr}
	return func(policy string) []loadgen.Target {
		limit := int64(bulkLimit)
		if policy == "strict" {
			limit = strictLimit
		}
		var ts []loadgen.Target
		for _, p := range peers {
			ts = append(ts, &guberTarget{url: "http://" + p.HTTPAddress + "/v1/GetRateLimits", name: policy, limit: limit, global: global, client: client})
		}
		return ts
	}, stop, nil
}

// guberTarget asks gubernator's HTTP API, as its clients do: a leaky bucket
// (algorithm 1, the match for a token bucket) with a burst of the limit.
type guberTarget struct {
	url, name string
	limit     int64
	global    bool
	client    *http.Client
}

type guberReq struct {
	Name      string `json:"name"`
	UniqueKey string `json:"unique_key"`
	Hits      int64  `json:"hits"`
	Limit     int64  `json:"limit"`
	Duration  int64  `json:"duration"`
	Algorithm int    `json:"algorithm"`
	Behavior  int    `json:"behavior"`
	Burst     int64  `json:"burst"`
}

func (g *guberTarget) Decide(ctx context.Context, key string, cost int64) (loadgen.Outcome, error) {
	r := guberReq{Name: g.name, UniqueKey: key, Hits: cost, Limit: g.limit, Duration: 1000, Algorithm: 1, Burst: g.limit}
	if g.global {
		r.Behavior = 2 // GLOBAL
	}
	body, _ := json.Marshal(map[string][]guberReq{"requests": {r}})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, g.url, bytes.NewReader(body))
	if err != nil {
		return loadgen.Outcome{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := g.client.Do(req)
	if err != nil {
		return loadgen.Outcome{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return loadgen.Outcome{}, err
	}
	if resp.StatusCode != http.StatusOK {
		return loadgen.Outcome{}, fmt.Errorf("gubernator: %s: %s", resp.Status, bytes.TrimSpace(b))
	}
	var out struct {
		Responses []struct {
			Status string `json:"status"`
			Error  string `json:"error"`
		} `json:"responses"`
	}
	if err := json.Unmarshal(b, &out); err != nil || len(out.Responses) != 1 {
		return loadgen.Outcome{}, fmt.Errorf("gubernator: %s: %v", b, err)
	}
	if e := out.Responses[0].Error; e != "" {
		return loadgen.Outcome{}, fmt.Errorf("gubernator: %s", e)
	}
	return loadgen.Outcome{Allowed: out.Responses[0].Status != "OVER_LIMIT", Shards: 1}, nil
}

// freePort returns a loopback address with a port free just now.
func freePort() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}
