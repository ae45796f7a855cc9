package hotkey

import "testing"

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
