package hotkey

import (
	"math"
	"net/http"
	"reflect"
	"strconv"
	"testing"
	"time"
)

// TestSetHeadersValues: SetHeaders writes the headers and values its
// contract gives, as Header.Set stores them, for allowed, denied, shadow
// and unnamed decisions; an Add after it keeps the values already set.
func TestSetHeadersValues(t *testing.T) {
	now := time.Unix(1_700_000_000, 250_000_000)
	named := &Policy{Name: `a "quoted" one`, Limit: PerMinute(600)}
	for _, tt := range []struct {
		name string
		p    *Policy
		r    Result
	}{
		{"allowed", named, Result{Allowed: true, Limit: 600, Remaining: 599, ResetAfter: 100 * time.Millisecond}},
		{"denied", named, Result{Limit: 600, Remaining: -3, ResetAfter: 61*time.Second + time.Nanosecond, RetryAfter: 1500 * time.Millisecond}},
		{"denied at once", &Policy{Limit: PerSecond(1)}, Result{Limit: 1}},
		{"shadow", &Policy{Name: "s", Limit: PerSecond(10), Shadow: true}, Result{Allowed: true, ShadowDenied: true, Limit: 10, ResetAfter: time.Second}},
		{"nil policy", nil, Result{Allowed: true, Limit: 1 << 62, Remaining: 1 << 62, ResetAfter: time.Hour}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got := http.Header{}
			SetHeaders(got, tt.p, tt.r, now)
			want := http.Header{}
			setHeadersBySet(want, tt.p, tt.r, now)
			if !reflect.DeepEqual(got, want) {
				t.Errorf("got  %v\nwant %v", got, want)
			}
			got.Add("X-RateLimit-Limit", "again")
			if v := got.Values("X-RateLimit-Limit"); len(v) != 2 || v[0] != want.Get("X-RateLimit-Limit") || got.Get("X-RateLimit-Remaining") != want.Get("X-RateLimit-Remaining") {
				t.Errorf("after an Add: %v", got)
			}
		})
	}
}

// setHeadersBySet is SetHeaders written header by header with Header.Set.
func setHeadersBySet(h http.Header, p *Policy, r Result, now time.Time) {
	name := p.name()
	resetAfter := r.ResetAfter.Truncate(time.Millisecond)
	reset := ceilSeconds(resetAfter)
	h.Set("X-RateLimit-Limit", strconv.FormatInt(r.Limit, 10))
	h.Set("X-RateLimit-Remaining", strconv.FormatInt(max(0, r.Remaining), 10))
	h.Set("X-RateLimit-Reset", strconv.FormatInt(now.Add(resetAfter).Add(time.Second-1).Unix(), 10))
	window := int64(1)
	if p != nil {
		window = max(1, ceilSeconds(p.Limit.Period))
	}
	h.Set("RateLimit-Policy", strconv.Quote(name)+";q="+strconv.FormatInt(r.Limit, 10)+";w="+strconv.FormatInt(window, 10))
	h.Set("RateLimit", strconv.Quote(name)+";r="+strconv.FormatInt(max(0, r.Remaining), 10)+";t="+strconv.FormatInt(reset, 10))
	if !r.Allowed {
		h.Set("Retry-After", strconv.FormatInt(max(1, ceilSeconds(r.RetryAfter)), 10))
	}
	if r.ShadowDenied {
		h.Set("X-RateLimit-Shadow", "denied")
	}
}

// TestSetHeadersAllocs: the headers of a decision cost two allocations,
// not two a header.
func TestSetHeadersAllocs(t *testing.T) {
	p := &Policy{Name: "api", Limit: PerSecond(100)}
	r := Result{Limit: 100, ResetAfter: time.Second, RetryAfter: 10 * time.Millisecond}
	h := http.Header{}
	now := time.Unix(1_700_000_000, 0)
	if n := testing.AllocsPerRun(100, func() { SetHeaders(h, p, r, now) }); n > 2 {
		t.Errorf("%.1f allocations, want at most 2", n)
	}
}

// ceilSeconds returns d in whole seconds, rounded up.
func ceilSeconds(d time.Duration) int64 {
	return int64(math.Ceil(d.Seconds()))
}
