package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	ratelimit "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlpb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/redis/go-redis/v9"

	"github.com/hotkeyd/hotkey/bench/internal/scenario"
	"github.com/hotkeyd/hotkey/internal/daemon"
	"github.com/hotkeyd/hotkey/loadgen"
)

// The envoy scenario's limit, the same on both paths: a sliding window of
// envoyLimit an hour per key, far above what a run sends to one key, so
// that every decision is an admission that costs the store its work. A
// store failure fails closed (429 or 503, OVER_LIMIT), so that it cannot
// pass for an admission decided in memory.
const envoyLimit = 1_000_000

var (
	envoyPolicies = fmt.Sprintf(`policies:
  bench:
    algorithm: sliding_window
    limit: %d
    period: 1h
    on_store_failure: closed
`, envoyLimit)
	envoyRules = fmt.Sprintf(`domain: bench
descriptors:
  - key: tenant
    rate_limit:
      unit: hour
      requests_per_unit: %d
      algorithm: sliding_window
      on_store_failure: closed
`, envoyLimit)
)

// envoyMode is one way of asking the daemon for decisions: op makes one
// call, of perCall decisions, and counts them in t.
type envoyMode struct {
	name    string
	perCall int
	op      func(ctx context.Context, r *rand.Rand, t *tally) error
}

// tally counts the decisions of a measure.
type tally struct{ admitted, denied atomic.Int64 }

// envoyRound is what one measure of one mode found.
type envoyRound struct {
	decisions float64 // per second
	admitted  float64 // share of the decisions
	trips     float64 // store round trips (EVALSHA calls) per decision
}

// runEnvoy measures one daemon on the standalone redis-server asked in
// three ways by 64 closed-loop clients on the same keys and the same
// limit: Envoy's ShouldRateLimit over gRPC (one descriptor a request),
// POST /v1/allow with one request a call, and POST /v1/allow with batches
// of 100; and the store round trips each costs per decision.
func runEnvoy(ctx context.Context, s *setup) (*scenario.Section, error) {
	const clients, keys, batch = 64, 10_000, 100
	d := s.scale(4*time.Second, time.Second)
	warm := s.scale(time.Second, 250*time.Millisecond)
	k := s.rounds(3, 1)
	dir, err := os.MkdirTemp("", "hotkey-report-envoy-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	policies, rules := filepath.Join(dir, "policies.yaml"), filepath.Join(dir, "envoy.yaml")
	if err := os.WriteFile(policies, []byte(envoyPolicies), 0o644); err != nil {
		return nil, err
	}
	if err := os.WriteFile(rules, []byte(envoyRules), 0o644); err != nil {
		return nil, err
	}
	dm, err := daemon.StartArgs(ctx, "--listen", "127.0.0.1:0", "--nats-listen", "127.0.0.1:0", "--grpc-listen", "127.0.0.1:0",
		"--redis", "redis://"+s.env.Server.Addr, "--policies", policies, "--envoy-config", rules, "--log-level", "error")
	if err != nil {
		return nil, err
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		dm.Shutdown(sctx)
		cancel()
	}()
	rc := redis.NewClient(&redis.Options{Addr: s.env.Server.Addr})
	defer rc.Close()

	// Fresh names each run: nothing is flushed, and no counter of an
	// earlier run is met.
	prefix := fmt.Sprintf("envoy-%x:", time.Now().UnixNano())
	names := make([]string, keys)
	for i := range names {
		names[i] = prefix + strconv.Itoa(i)
	}

	tr := &http.Transport{MaxIdleConns: 2 * clients, MaxIdleConnsPerHost: 2 * clients, IdleConnTimeout: time.Minute}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr}
	url := "http://" + dm.Addr() + "/v1/allow"
	conn, err := loadgen.DialGRPC(ctx, dm.GRPCAddr(), nil)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	rls := rlpb.NewRateLimitServiceClient(conn)

	appendItem := func(b []byte, key string) []byte {
		b = append(b, `{"policy":"bench","key":"`...)
		b = append(b, key...)
		return append(b, `","cost":1}`...)
	}
	post := func(ctx context.Context, body []byte) (int, []byte, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
		if err != nil {
			return 0, nil, err
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := hc.Do(req)
		if err != nil {
			return 0, nil, err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return resp.StatusCode, b, err
	}
	modes := []envoyMode{
		{"gRPC ShouldRateLimit, 1 descriptor a request", 1, func(ctx context.Context, r *rand.Rand, t *tally) error {
			resp, err := rls.ShouldRateLimit(ctx, &rlpb.RateLimitRequest{Domain: "bench", Descriptors: []*ratelimit.RateLimitDescriptor{
				{Entries: []*ratelimit.RateLimitDescriptor_Entry{{Key: "tenant", Value: names[r.IntN(keys)]}}},
			}})
			if err != nil {
				return fmt.Errorf("ShouldRateLimit: %w", err)
			}
			if len(resp.Statuses) != 1 || resp.Statuses[0].CurrentLimit == nil || resp.Statuses[0].Code != resp.OverallCode {
				return fmt.Errorf("ShouldRateLimit: unexpected answer %v", resp)
			}
			switch resp.OverallCode {
			case rlpb.RateLimitResponse_OK:
				t.admitted.Add(1)
			case rlpb.RateLimitResponse_OVER_LIMIT:
				t.denied.Add(1)
			default:
				return fmt.Errorf("ShouldRateLimit: code %v", resp.OverallCode)
			}
			return nil
		}},
		{"HTTP POST /v1/allow, 1 request a call", 1, func(ctx context.Context, r *rand.Rand, t *tally) error {
			code, body, err := post(ctx, appendItem(make([]byte, 0, 64), names[r.IntN(keys)]))
			if err != nil {
				return fmt.Errorf("POST /v1/allow: %w", err)
			}
			switch code {
			case http.StatusOK:
				t.admitted.Add(1)
			case http.StatusTooManyRequests:
				t.denied.Add(1)
			default:
				return fmt.Errorf("POST /v1/allow: status %d: %.200s", code, body)
			}
			return nil
		}},
		{fmt.Sprintf("HTTP POST /v1/allow, batches of %d", batch), batch, func(ctx context.Context, r *rand.Rand, t *tally) error {
			b := append(make([]byte, 0, 64*batch), `{"requests":[`...)
			for i := range batch {
				if i > 0 {
					b = append(b, ',')
				}
				b = appendItem(b, names[r.IntN(keys)])
			}
			b = append(b, "]}"...)
			code, body, err := post(ctx, b)
			if err != nil {
				return fmt.Errorf("POST /v1/allow (batch): %w", err)
			}
			if code != http.StatusOK {
				return fmt.Errorf("POST /v1/allow (batch): status %d: %.200s", code, body)
			}
			var out struct {
				Responses []struct {
					Status int    `json:"status"`
					Error  string `json:"error"`
				} `json:"responses"`
			}
			if err := json.Unmarshal(body, &out); err != nil {
				return fmt.Errorf("POST /v1/allow (batch): %w", err)
			}
			if len(out.Responses) != batch {
				return fmt.Errorf("POST /v1/allow (batch): %d answers to %d requests", len(out.Responses), batch)
			}
			var admitted, denied int64
			for i, it := range out.Responses {
				switch it.Status {
				case http.StatusOK:
					admitted++
				case http.StatusTooManyRequests:
					denied++
				default:
					return fmt.Errorf("POST /v1/allow (batch): requests[%d]: status %d: %s", i, it.Status, it.Error)
				}
			}
			t.admitted.Add(admitted)
			t.denied.Add(denied)
			return nil
		}},
	}

	// measure runs m for dur and returns what it found.
	measure := func(m envoyMode, dur time.Duration) (envoyRound, error) {
		mctx, cancel := context.WithTimeout(ctx, dur+time.Minute)
		defer cancel()
		before, err := scenario.ScriptCalls(ctx, rc)
		if err != nil {
			return envoyRound{}, err
		}
		var t tally
		calls, err := scenario.Throughput(clients, dur, func(r *rand.Rand) error { return m.op(mctx, r, &t) })
		if err != nil {
			return envoyRound{}, fmt.Errorf("%s: %w", m.name, err)
		}
		after, err := scenario.ScriptCalls(ctx, rc)
		if err != nil {
			return envoyRound{}, err
		}
		n := float64(t.admitted.Load() + t.denied.Load())
		if n == 0 || after <= before {
			return envoyRound{}, fmt.Errorf("%s: %.0f decisions, %.0f EVALSHA calls: nothing reached the store", m.name, n, after-before)
		}
		return envoyRound{decisions: calls * float64(m.perCall), admitted: float64(t.admitted.Load()) / n, trips: (after - before) / n}, nil
	}
	for _, m := range modes { // connections, scripts and first counters
		if _, err := measure(m, warm); err != nil {
			return nil, err
		}
	}
	got := make([][]envoyRound, len(modes))
	var grpcRatio, batchRatio []float64
	var redone []string // measures that failed once (a store call over its timeout on a loaded machine), and were redone
	for range k {
		for i, m := range modes {
			r, err := measure(m, d)
			if err != nil {
				redone = append(redone, err.Error())
				r, err = measure(m, d)
			}
			if err != nil {
				return nil, err
			}
			if r.admitted < 0.99 {
				return nil, fmt.Errorf("%s: %.2f%% admitted under a limit set to admit all", m.name, 100*r.admitted)
			}
			got[i] = append(got[i], r)
		}
		last := func(i int) float64 { return got[i][len(got[i])-1].decisions }
		grpcRatio = append(grpcRatio, last(0)/last(1))
		batchRatio = append(batchRatio, last(2)/last(1))
	}
	field := func(rs []envoyRound, f func(envoyRound) float64) []float64 {
		out := make([]float64, len(rs))
		for i, r := range rs {
			out[i] = f(r)
		}
		return out
	}
	list := func(v []float64) string {
		s := make([]string, len(v))
		for i, x := range v {
			s[i] = fmt.Sprintf("%.2f", x)
		}
		return strings.Join(s, ", ")
	}

	sec := &scenario.Section{Setup: fmt.Sprintf("one hotkeyd in this process on the standalone redis-server; a sliding window of %d an hour per key on both paths (policy `bench` in a policies file for HTTP; rule `tenant` of domain `bench` in an envoyproxy/ratelimit file for gRPC), both failing closed; keys uniform over %d, fresh each run. %d closed-loop clients per mode, sharing one gRPC connection (loadgen.GRPCConn) or one HTTP client that keeps up to %d connections alive; the modes alternate, %v each per round after a %v warm-up, %d round(s), medians (ratios: median of the per-round ratios).",
		envoyLimit, keys, clients, 2*clients, d, warm, k)}
	sec.Printf("| mode | calls/s | decisions/s | admitted | store round trips per decision |\n|---|---|---|---|---|\n")
	for i, m := range modes {
		dec := median(field(got[i], func(r envoyRound) float64 { return r.decisions }))
		sec.Printf("| %s | %.0f | %.0f | %.2f%% | %.4f |\n", m.name, dec/float64(m.perCall), dec,
			100*median(field(got[i], func(r envoyRound) float64 { return r.admitted })),
			median(field(got[i], func(r envoyRound) float64 { return r.trips })))
	}
	sec.Printf("\ngRPC ÷ HTTP (one decision a call), decisions/s: %.2f (per round: %s).\n", median(grpcRatio), list(grpcRatio))
	sec.Printf("Batches of %d ÷ single requests over HTTP, decisions/s: %.2f (per round: %s).\n\n", batch, median(batchRatio), list(batchRatio))
	for _, e := range redone {
		sec.Printf("A measure was redone after it failed: %s.\n\n", e)
	}
	sec.Printf("Store round trips are the EVALSHA calls in the redis-server's `INFO commandstats`, read before and after each measure, over the decisions answered in it: on one redis-server the store sends one EVALSHA per round trip (one algorithm here), carrying all the decisions of that trip. A batch's decisions go in one; single calls share one only when they meet in the store's queue.\n")
	return sec, nil
}
