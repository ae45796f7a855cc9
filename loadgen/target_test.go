package loadgen_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/hotkeyd/hotkey"
	"github.com/hotkeyd/hotkey/detector"
	"github.com/hotkeyd/hotkey/internal/daemon"
	"github.com/hotkeyd/hotkey/internal/testkit"
	"github.com/hotkeyd/hotkey/loadgen"
	"github.com/hotkeyd/hotkey/loadgen/embedded"
)

// startDaemon runs a hotkeyd in this process: memory store, embedded NATS,
// the default policy (100/s) and a hot threshold of 50/s.
func startDaemon(t *testing.T) *daemon.Daemon {
	t.Helper()
	d, err := daemon.StartArgs(context.Background(), "--listen", "127.0.0.1:0", "--nats-listen", "127.0.0.1:0", "--hot-threshold", "50")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute) // only catches a hang
		defer cancel()
		if err := d.Shutdown(ctx); err != nil {
			t.Errorf("shutdown: %v", err)
		}
	})
	return d
}

// untilSplit runs cfg again and again until the watched key is decided
// split, and returns that run. The detector runs on real time, so how many
// runs that takes is up to the machine: only a hang fails.
func untilSplit(t *testing.T, cfg loadgen.Config) *loadgen.Result {
	t.Helper()
	var res *loadgen.Result
	took := testkit.For(t, testkit.Patience, "the watched key split", func() bool {
		var err error
		if res, err = loadgen.Run(context.Background(), cfg, nil, 0); err != nil {
			t.Fatal(err)
		}
		if res.Errors > 0 {
			t.Fatalf("%d errors, first: %v", res.Errors, res.FirstError)
		}
		for _, b := range res.Watched {
			if b.Shards > 1 {
				return true
			}
		}
		return false
	})
	t.Logf("split within %v", took)
	return res
}

// TestDaemonTargets: a hot spot sent to a hotkeyd over HTTP and over NATS
// is decided (the daemon's default policy admits 100/s of the hot key) and
// split.
func TestDaemonTargets(t *testing.T) {
	d := startDaemon(t)
	nc, err := nats.Connect(d.NATSURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	for _, tc := range []struct {
		name   string
		target loadgen.Target
	}{
		{"http", loadgen.HTTP("http://"+d.Addr(), "", nil)},
		{"nats", loadgen.NATS(nc, "default")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hot := "hot-" + tc.name
			res := untilSplit(t, loadgen.Config{
				Target: tc.target, Workload: loadgen.Hotspot(hot, 400, loadgen.Uniform(tc.name+"-", 50, 1)),
				Rate: 800, Duration: time.Second, Concurrency: 16, Watch: hot, Period: 250 * time.Millisecond,
			})
			var allowed, denied int64
			for _, b := range res.Watched {
				allowed += b.Allowed
				denied += b.Denied
			}
			// 400 requests a second at a limit of 100/s (burst 100): no
			// more are admitted than the burst and the rate over the run
			// (plus a unit a subcounter for the split).
			if bound := 100 + 100*res.Elapsed.Seconds() + 16; float64(allowed) > bound {
				t.Errorf("hot key: %d allowed, %d denied in %v at 4× a limit of 100/s; want at most %.0f allowed", allowed, denied, res.Elapsed, bound)
			}
			t.Logf("%s: %.0f decisions/s, p50 %v, p99 %v", tc.name, res.Rate(), res.Latency.Quantile(0.5), res.Latency.Quantile(0.99))
		})
	}
	// A policy the daemon does not have is an error, over both.
	for _, target := range []loadgen.Target{loadgen.HTTP("http://"+d.Addr(), "nope", nil), loadgen.NATS(nc, "nope")} {
		if _, err := target.Decide(context.Background(), "k", 1); err == nil {
			t.Errorf("%T: unknown policy decided", target)
		}
	}
}

// TestCluster: three embedded engines over one in-process NATS server
// split a key hot on all of them, and each decides it on its subcounters.
func TestCluster(t *testing.T) {
	cfg := detector.DefaultConfig()
	cfg.Threshold = 100
	c, err := embedded.Start(embedded.Config{Instances: 3, Options: []hotkey.Option{hotkey.WithDetector(cfg)}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	target, err := c.Target(&hotkey.Policy{Name: "api", Limit: hotkey.PerSecond(1_000_000)})
	if err != nil {
		t.Fatal(err)
	}
	untilSplit(t, loadgen.Config{
		Target: target, Workload: loadgen.Hotspot("hot", 1500, loadgen.Uniform("k", 100, 1)),
		Rate: 3000, Duration: 500 * time.Millisecond, Watch: "hot", Period: 100 * time.Millisecond,
	})
	testkit.For(t, testkit.Patience, "every engine has the key split", func() bool {
		for _, e := range c.Engines {
			if !slices.ContainsFunc(e.HotKeys(), func(h hotkey.HotKey) bool { return h.Policy == "api" && h.Key == "hot" && h.Level >= 4 }) {
				return false
			}
		}
		return true
	})
}
