package loadgen

import (
	"context"
	"sync/atomic"
	"testing"
	"time"
)

// TestIdeal: a perfect token bucket of the stated limit, full at the start,
// fed requests at their instants.
func TestIdeal(t *testing.T) {
	ms := time.Millisecond
	every := func(n int, step time.Duration) []time.Duration {
		at := make([]time.Duration, n)
		for i := range at {
			at[i] = time.Duration(i) * step
		}
		return at
	}
	for _, tc := range []struct {
		name string
		give Limit
		cost int64
		at   []time.Duration
		want int64
	}{
		{"a burst at once", Limit{5, time.Second}, 1, every(10, 0), 5},
		{"the burst and what refills", Limit{5, time.Second}, 1, every(10, 100*ms), 9}, // 5 + 0.8 s × 5/s, the last to the ns
		{"cost 2", Limit{5, time.Second}, 2, every(5, 0), 2},
		{"an hour's limit over a second", Limit{3, time.Hour}, 1, every(100, 10*ms), 3},
		{"at the limit's rate", Limit{10, time.Second}, 1, every(30, 100*ms), 30},
		{"at twice it", Limit{10, time.Second}, 1, every(40, 50*ms), 29}, // 10 + 1.95 s × 10/s
	} {
		b := newIdeal(tc.give)
		for _, at := range tc.at {
			b.take(at, tc.cost)
		}
		if b.admitted != tc.want {
			t.Errorf("%s: %d admitted, want %d", tc.name, b.admitted, tc.want)
		}
	}
}

// TestRunIdealAndQuota: a run counts the watched key's ideal under its
// stated limit beside what the target admitted, and tallies the quotas the
// target reported, keeping the one meant last.
func TestRunIdealAndQuota(t *testing.T) {
	var n atomic.Int64
	target := funcTarget(func(ctx context.Context, key string, cost int64) (Outcome, error) {
		i := n.Add(1)
		out := Outcome{Allowed: i <= 12}
		if i > 10 {
			out.Quota = Quota{Reported: true, Limit: 12, Remaining: max(0, 12-i)}
		}
		return out, nil
	})
	res, err := Run(context.Background(), Config{
		Target: target, Workload: Fixed("hot"), Rate: 1000, Duration: 100 * time.Millisecond,
		Watch: "hot", Limit: Limit{10, time.Hour},
	}, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d sent: %d admitted, ideal %d, admitted ÷ ideal %.2f; %d quotas, last %+v", res.Sent, res.WatchedAllowed(), res.Ideal, res.OfIdeal(), res.Quotas, res.Quota)
	if res.Sent != 100 || res.WatchedAllowed() != 12 || res.Ideal != 10 || res.OfIdeal() != 1.2 {
		t.Errorf("%d sent, %d admitted, ideal %d (%.2f); want 100, 12, 10 (1.2)", res.Sent, res.WatchedAllowed(), res.Ideal, res.OfIdeal())
	}
	// The request meant last is answered 37th or later: when a sender
	// took it, the 99 before it had been taken, and at most 63 other
	// senders held one not yet sent. It reports none left.
	if res.Quotas != 90 || res.Quota != (Quota{Reported: true, Limit: 12}) {
		t.Errorf("%d quotas, last %+v; want 90, the last of 12 with none remaining", res.Quotas, res.Quota)
	}
	if _, err := Run(context.Background(), Config{Target: target, Workload: Fixed("k"), Rate: 1, Duration: time.Second, Limit: Limit{Units: 5}}, nil, 0); err == nil {
		t.Error("a limit without a period: no error")
	}
}
