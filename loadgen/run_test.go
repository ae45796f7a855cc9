package loadgen

import (
	"context"
	"errors"
	"math"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// funcTarget decides with f.
type funcTarget func(ctx context.Context, key string, cost int64) (Outcome, error)

func (f funcTarget) Decide(ctx context.Context, key string, cost int64) (Outcome, error) {
	return f(ctx, key, cost)
}

// TestNoCoordinatedOmission: one sender, 1,000 requests a second, and a
// target that stalls 200 ms on request 100. The 100 requests meant for the
// first 100 ms of the stall are answered after it, so each is recorded with
// at least 100 ms of latency; a closed loop would record one. Every bound
// here is a lower bound that a slow machine can only raise.
func TestNoCoordinatedOmission(t *testing.T) {
	var n atomic.Int64
	target := funcTarget(func(ctx context.Context, key string, cost int64) (Outcome, error) {
		if n.Add(1) == 100 {
			time.Sleep(200 * time.Millisecond)
		}
		return Outcome{Allowed: true}, nil
	})
	res, err := Run(context.Background(), Config{
		Target: target, Workload: Uniform("k", 10, 1),
		Rate: 1000, Duration: 500 * time.Millisecond, Concurrency: 1,
	}, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	if res.Sent != 500 || res.Allowed != 500 || res.Latency.Count() != 500 {
		t.Fatalf("sent %d, allowed %d, recorded %d; want 500", res.Sent, res.Allowed, res.Latency.Count())
	}
	if res.Latency.Max() < 200*time.Millisecond {
		t.Errorf("max latency %v, want ≥ the 200 ms stall", res.Latency.Max())
	}
	// At least 101 of 500 (the stalled one and the 100 after it) are ≥ 100
	// ms: the quantile at rank 400 (q = 0.8) is at least 100 ms.
	if q := res.Latency.Quantile(0.8); q < 100*time.Millisecond {
		t.Errorf("p80 %v: the requests queued behind the stall were not counted from their send time", q)
	}
	t.Logf("p50 %v p80 %v p99 %v max %v, elapsed %v", res.Latency.Quantile(0.5), res.Latency.Quantile(0.8), res.Latency.Quantile(0.99), res.Latency.Max(), res.Elapsed)
}

// TestRunCounts: every request sent is answered and counted once, by
// outcome; the watched key's decisions land in its periods; errors are
// counted and the first is kept.
func TestRunCounts(t *testing.T) {
	boom := errors.New("boom")
	var mu sync.Mutex
	seen := map[string]int{}
	target := funcTarget(func(ctx context.Context, key string, cost int64) (Outcome, error) {
		if cost != 3 {
			t.Errorf("cost %d, want 3", cost)
		}
		mu.Lock()
		seen[key]++
		c := seen[key]
		mu.Unlock()
		switch {
		case key == "hot":
			return Outcome{Allowed: c%2 == 0, Shards: 4}, nil
		case key == "k0" && c == 1:
			return Outcome{}, boom
		}
		return Outcome{Allowed: true, Shards: 1}, nil
	})
	var last atomic.Pointer[Snapshot]
	res, err := Run(context.Background(), Config{
		Target: target, Workload: Hotspot("hot", 100, Uniform("k", 5, 1)),
		Rate: 2000, Duration: 400 * time.Millisecond, Cost: 3,
		Watch: "hot", Period: 100 * time.Millisecond,
	}, func(s Snapshot) { last.Store(&s) }, 50*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if res.Sent != 800 || res.Allowed+res.Denied+res.Errors != 800 {
		t.Fatalf("sent %d, answered %d+%d+%d; want 800", res.Sent, res.Allowed, res.Denied, res.Errors)
	}
	if res.Errors != 1 || !errors.Is(res.FirstError, boom) {
		t.Errorf("errors %d, first %v; want 1, boom", res.Errors, res.FirstError)
	}
	if int(res.Latency.Count()) != 799 {
		t.Errorf("%d latencies, want 799 (errors have none)", res.Latency.Count())
	}
	// Hotspot at 100/s over 0.4 s: the key is due floor(100·t) times by t,
	// so 40 in all, 10 a period.
	if len(res.Watched) != 4 {
		t.Fatalf("%d periods, want 4", len(res.Watched))
	}
	hot := int64(0)
	for i, b := range res.Watched {
		if n := b.Allowed + b.Denied; n < 9 || n > 11 || b.Shards != 4 {
			t.Errorf("period %d: %+v, want about 10 decisions at 4 shards", i, b)
		}
		hot += b.Allowed + b.Denied
	}
	if hot != int64(seen["hot"]) || hot < 39 || hot > 40 {
		t.Errorf("hot key: %d watched, %d decided; want 40", hot, seen["hot"])
	}
	// The last snapshot is the run's end: its counts are the result's.
	if s := last.Load(); s == nil || s.Sent != res.Sent || s.Allowed != res.Allowed || s.Denied != res.Denied || s.Errors != res.Errors || s.Shards != 4 {
		t.Errorf("last snapshot %+v, want the result's counts and the watched key's 4 shards", s)
	}
}

// TestRunStops: a cancelled run returns what it measured and ctx's error.
func TestRunStops(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	var n atomic.Int64
	target := funcTarget(func(ctx context.Context, key string, cost int64) (Outcome, error) {
		if n.Add(1) == 10 {
			cancel()
		}
		return Outcome{Allowed: true}, nil
	})
	res, err := Run(ctx, Config{Target: target, Workload: Uniform("k", 1, 1), Rate: 1000, Duration: time.Hour}, nil, 0)
	if !errors.Is(err, context.Canceled) || res == nil || res.Sent < 10 {
		t.Fatalf("Run = %+v, %v; want what it measured and context.Canceled", res, err)
	}
}

func TestRunRefusesBadConfig(t *testing.T) {
	ok := funcTarget(func(context.Context, string, int64) (Outcome, error) { return Outcome{}, nil })
	for _, cfg := range []Config{
		{Workload: Uniform("k", 1, 1), Rate: 1, Duration: time.Second},
		{Target: ok, Rate: 1, Duration: time.Second},
		{Target: ok, Workload: Uniform("k", 1, 1), Rate: -1, Duration: time.Second},
		{Target: ok, Workload: Uniform("k", 1, 1), Rate: math.NaN(), Duration: time.Second},
		{Target: ok, Workload: Uniform("k", 1, 1), Rate: math.Inf(1), Duration: time.Second},
		{Target: ok, Workload: Uniform("k", 1, 1), Rate: 1},
	} {
		if _, err := Run(context.Background(), cfg, nil, 0); err == nil {
			t.Errorf("%+v: no error", cfg)
		}
	}
}

// TestClosedLoop: with Rate 0 each of Concurrency senders sends its next
// request once its last is answered: as many are in flight as there are
// senders, never more, every request sent is answered and timed, and the
// run ends once Duration has passed.
func TestClosedLoop(t *testing.T) {
	const senders = 3
	var inFlight, most atomic.Int64
	arrived := make(chan struct{})
	var once sync.Once
	target := funcTarget(func(ctx context.Context, key string, cost int64) (Outcome, error) {
		n := inFlight.Add(1)
		defer inFlight.Add(-1)
		for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
		}
		if n == senders {
			once.Do(func() { close(arrived) })
		}
		select { // the first calls wait until all senders are in
		case <-arrived:
		case <-ctx.Done():
			return Outcome{}, ctx.Err()
		}
		return Outcome{Allowed: true}, nil
	})
	res, err := Run(context.Background(), Config{
		Target: target, Workload: Uniform("k", 10, 1), Duration: 200 * time.Millisecond, Concurrency: senders,
	}, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	if m := most.Load(); m != senders {
		t.Errorf("at most %d in flight, want %d", m, senders)
	}
	if res.Sent < senders || res.Allowed != res.Sent || res.Errors != 0 || res.Latency.Count() != uint64(res.Sent) {
		t.Fatalf("sent %d, allowed %d, errors %d, timed %d: want every one sent answered and timed", res.Sent, res.Allowed, res.Errors, res.Latency.Count())
	}
	if res.Elapsed < 200*time.Millisecond {
		t.Errorf("elapsed %v, want at least the run's 200 ms", res.Elapsed)
	}
}
