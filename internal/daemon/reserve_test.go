package daemon

import (
	"context"
	"errors"
	"io"
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
// HTTP, more often than its limit allows: Redis runs at most one script
// per 10 decisions (INFO commandstats, before and after), and every window
// admits at most the limit. A lease of a whole window keeps the figure
// apart from how fast a busy machine serves HTTP.
func TestReserveDaemons(t *testing.T) {
	srv, err := redistest.Start(t.TempDir())
	if errors.Is(err, redistest.ErrNotInstalled) {
		t.Fatal("redis-server is not installed (make test installs it)")
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	const limit, period = 100, time.Second
	policies := filepath.Join(t.TempDir(), "policies.yaml")
	writeTestFile(t, policies, "policies:\n  hot:\n    algorithm: fixed_window\n    limit: "+strconv.Itoa(limit)+"\n    period: 1s\n    sync: reserve\n")
	// The key stays whole: the bound under test is the blocks', not a split's.
	args := []string{"--listen", "127.0.0.1:0", "--redis", "redis://" + srv.Addr, "--policies", policies, "--hot-threshold", "1e9", "--reload-interval", "0", "--reserve-lease", "1s"}
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
		return d1.engine.Instances() == 2 && d2.engine.Instances() == 2
	})

	admin := redis.NewClient(&redis.Options{Addr: srv.Addr})
	defer admin.Close()
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4}, Timeout: 10 * time.Second}
	defer client.CloseIdleConnections()
	calls0 := scriptCalls(t, admin)
	const clients, each = 4, 400
	var (
		mu        sync.Mutex
		perWindow = map[int64]int64{}
		admitted  atomic.Int64
		wg        sync.WaitGroup
	)
	for i := range clients {
		url := "http://" + []*Daemon{d1, d2}[i%2].Addr() + "/v1/allow"
		wg.Go(func() {
			for range each {
				resp, err := client.Post(url, "application/json", strings.NewReader(`{"policy":"hot","key":"k"}`))
				if err != nil {
					t.Error(err)
					return
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				switch resp.StatusCode {
				case http.StatusOK:
					admitted.Add(1)
					mu.Lock()
					perWindow[time.Now().UnixNano()/int64(period)]++
					mu.Unlock()
				case http.StatusTooManyRequests:
				default:
					t.Errorf("status %d", resp.StatusCode)
					return
				}
			}
		})
	}
	wg.Wait()
	calls := scriptCalls(t, admin) - calls0
	perDecision := float64(calls) / (clients * each)
	t.Logf("%d decisions, %d admitted, %d scripts run (%.4f per decision), admitted by window %v", clients*each, admitted.Load(), calls, perDecision, perWindow)
	if perDecision > 0.1 {
		t.Errorf("%.3f scripts per decision, want at most 0.1", perDecision)
	}
	// An admission is read on the clock after its answer: at a window's
	// end, each client's one request in flight may read the next window's.
	for w, n := range perWindow {
		if n > limit+clients {
			t.Errorf("window %d: %d admitted, over %d (+%d in flight)", w, n, limit, clients)
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
