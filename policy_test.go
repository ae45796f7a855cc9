package hotkey

import (
	"context"
	"errors"
	"testing"

	"github.com/hotkeyd/hotkey/internal/testkit"
)

// TestPolicyUnavailable: only a denial decided by the fallback of a policy
// that fails closed means the service is unavailable.
func TestPolicyUnavailable(t *testing.T) {
	closed, local := &Policy{OnStoreFailure: FallbackClosed}, &Policy{OnStoreFailure: FallbackLocal}
	for _, c := range []struct {
		p    *Policy
		r    Result
		want bool
	}{
		{closed, Result{Degraded: true}, true},
		{closed, Result{Degraded: true, Allowed: true}, false}, // an allowlisted key
		{closed, Result{}, false},                              // over its limit, the store answering
		{local, Result{Degraded: true}, false},                 // the local fallback's own limit
	} {
		if got := c.p.Unavailable(c.r); got != c.want {
			t.Errorf("%v policy, %+v: Unavailable = %v, want %v", c.p.OnStoreFailure, c.r, got, c.want)
		}
	}
}

// TestPolicyCheckedAgain: a policy is validated once, but a policy whose
// limit or name changed between two decisions is judged as it is now.
func TestPolicyCheckedAgain(t *testing.T) {
	e, _ := newMemoryEngine(t, testkit.NewClock())
	ctx := context.Background()
	p := &Policy{Name: "p", Limit: PerSecond(10)}
	for _, tt := range []struct {
		change func()
		n      int64
		want   error
	}{
		{func() {}, 1, nil},
		{func() { p.Limit.Rate = 0 }, 1, ErrInvalidLimit},
		{func() { p.Limit = PerSecond(10) }, 1, nil},
		{func() { p.Limit.Burst = 2 }, 3, ErrCostExceedsBurst},
		{func() { p.Limit.Burst = 0 }, 3, nil},
		{func() { p.Name = "a|b" }, 1, ErrInvalidPolicyName},
		{func() { p.Name = "q" }, 1, nil},
	} {
		tt.change()
		if _, err := e.AllowN(ctx, "k", p, tt.n); !errors.Is(err, tt.want) && (err != nil || tt.want != nil) {
			t.Errorf("policy %q %+v, cost %d: %v, want %v", p.Name, p.Limit, tt.n, err, tt.want)
		}
	}
}
