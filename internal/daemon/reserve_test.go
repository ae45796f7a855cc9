package daemon

import (
	"context"
	"encoding/json"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hotkeyd/hotkey/internal/redistest"
	"github.com/hotkeyd/hotkey/internal/testkit"
)

// TestReserveDaemons: two daemons on one redis-server, agreeing over
// NATS, decide one hot key of a sync: reserve fixed-window policy over
// HTTP at the default lease, in batches so that the key sees hundreds of
// decisions per lease on a busy machine: Redis runs at most one script per
// 10 decisions (INFO commandstats, before and after), and every window
// admits at most the limit. The limit is above the traffic, so that every
// decision is an admission from a block: denials past the limit would be
// answered by the deny cache, at no store call, and flatter the figure.
func TestReserveDaemons(t *testing.T) {
	srv := redistest.ForTest(t)
	const limit, period = 20_000, time.Second
	policies := filepath.Join(t.TempDir(), "policies.yaml")
	writeTestFile(t, policies, "policies:\n  hot:\n    algorithm: fixed_window\n    limit: "+strconv.Itoa(limit)+"\n    period: 1s\n    sync: reserve\n")
	// The key stays whole: the bound under test is the blocks', not a split's.
	args := []string{"--listen", "127.0.0.1:0", "--redis", "redis://" + srv.Addr, "--policies", policies, "--hot-threshold", "1e9", "--reload-interval", "0"}
	d1, err := StartArgs(context.Background(), append(args, "--nats-listen", "127.0.0.1:0")...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { shutdown(t, d1) })
	d2, err := StartArgs(context.Background(), append(args, "--nats", d1.NATSURL())...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { shutdown(t, d2) })
	testkit.For(t, time.Minute, "each daemon sees the other", func() bool {
		return d1.engine.Stats().Instances == 2 && d2.engine.Stats().Instances == 2
	})

	admin := redis.NewClient(&redis.Options{Addr: srv.Addr})
	defer admin.Close()
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4}, Timeout: 10 * time.Second}
	defer client.CloseIdleConnections()
	const batch = 100
	var body strings.Builder
	body.WriteString(`{"requests":[`)
	for i := range batch {
		if i > 0 {
			body.WriteString(",")
		}
		body.WriteString(`{"policy":"hot","key":"k"}`)
	}
	body.WriteString(`]}`)
	calls0 := scriptCalls(t, admin)
	const clients, batches = 4, 40
	var (
		mu        sync.Mutex
		perWindow = map[int64]int64{}
		admitted  atomic.Int64
		wg        sync.WaitGroup
	)
	start := time.Now()
	for i := range clients {
		url := "http://" + []*Daemon{d1, d2}[i%2].Addr() + "/v1/allow"
		wg.Go(func() {
			for range batches {
				resp, err := client.Post(url, "application/json", strings.NewReader(body.String()))
				if err != nil {
					t.Error(err)
					return
				}
				var br BatchResponse
				err = json.NewDecoder(resp.Body).Decode(&br)
				resp.Body.Close()
				if err != nil || resp.StatusCode != http.StatusOK || len(br.Responses) != batch {
					t.Errorf("status %d, %d answers, %v", resp.StatusCode, len(br.Responses), err)
					return
				}
				var n int64
				for _, it := range br.Responses {
					switch it.Status {
					case http.StatusOK:
						n++
					case http.StatusTooManyRequests:
					default:
						t.Errorf("status %d: %s", it.Status, it.Error)
						return
					}
				}
				admitted.Add(n)
				mu.Lock()
				perWindow[time.Now().UnixNano()/int64(period)] += n
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	calls := scriptCalls(t, admin) - calls0
	const decisions = clients * batches * batch
	perDecision := float64(calls) / decisions
	// Decisions per lease per daemon: a block is about one lease of the
	// key's local rate, so the figure is about 1 ÷ this, plus the first
	// decisions of each daemon, taken on the store.
	perLease := decisions / 2 / elapsed.Seconds() * DefaultReserveLease.Seconds()
	t.Logf("%d decisions in %v (%.0f per lease per daemon), %d admitted, %d scripts run (%.4f per decision), admitted by window %v", decisions, elapsed, perLease, admitted.Load(), calls, perDecision, perWindow)
	switch {
	case perLease < 20:
		t.Logf("too few decisions per lease for the figure to mean anything: not held to 0.1")
	case perDecision > 0.1:
		t.Errorf("%.3f scripts per decision, want at most 0.1", perDecision)
	}
	if admitted.Load() != decisions {
		t.Errorf("%d of %d admitted under a limit above the traffic", admitted.Load(), decisions)
		for i, d := range []*Daemon{d1, d2} {
			for l := range strings.Lines(scrapeMetrics(t, d)) {
				if strings.HasPrefix(l, "hotkey_reserve_") || strings.HasPrefix(l, "hotkey_decisions_total") || strings.HasPrefix(l, "hotkey_peers") {
					t.Logf("daemon %d: %s", i+1, strings.TrimSpace(l))
				}
			}
		}
	}
	// An admission is read on the clock after its batch's answer: at a
	// window's end, each client's batch in flight may read the next
	// window's.
	for w, n := range perWindow {
		if n > limit+clients*batch {
			t.Errorf("window %d: %d admitted, over %d (+%d in flight)", w, n, limit, clients*batch)
		}
	}
}

// scriptCalls is the number of scripts the Redis server of c has run
// (redistest.ScriptCalls).
func scriptCalls(t *testing.T, c *redis.Client) int64 {
	t.Helper()
	n, err := redistest.ScriptCalls(context.Background(), c)
	if err != nil {
		t.Fatal(err)
	}
	return n
}
