package hotkey

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

// shadowLimit is the limit of the shadow tests: 3 an hour, so nothing
// refills while a test runs on its fixed clock.
var shadowLimit = Limit{Rate: 3, Period: time.Hour, Burst: 3}

// TestShadowPolicy: a Shadow policy at limit L admits all N > L requests,
// N−L of them ShadowDenied (those after the first L, the deny cache
// answering some), counted as shadow_denied; a policy beside it without
// Shadow admits L and denies the rest. Both charge alike: once a unit
// refills, each admits one more, and the shadow one is not ShadowDenied.
func TestShadowPolicy(t *testing.T) {
	checkLeaks(t)
	clock, _, reg, e := newMetricsEngine(t)
	ctx := context.Background()
	shadow := &Policy{Name: "shadow", Limit: shadowLimit, Shadow: true}
	live := &Policy{Name: "live", Limit: shadowLimit}
	const n = 10
	admitted, shadowDenied, liveAdmitted := 0, 0, 0
	for i := range n {
		r, err := e.Allow(ctx, "k", shadow)
		if err != nil {
			t.Fatal(err)
		}
		if r.Allowed {
			admitted++
		}
		if r.ShadowDenied {
			shadowDenied++
			if i < 3 {
				t.Errorf("request %d: ShadowDenied within the limit", i)
			}
			if r.RetryAfter <= 0 {
				t.Errorf("request %d: ShadowDenied with RetryAfter %v, want when it would pass", i, r.RetryAfter)
			}
		}
		if r, _ := e.Allow(ctx, "k", live); r.Allowed {
			liveAdmitted++
		} else if r.ShadowDenied {
			t.Errorf("request %d: ShadowDenied under a policy without Shadow", i)
		}
	}
	t.Logf("shadow: admitted %d of %d, %d shadow denied; live: admitted %d", admitted, n, shadowDenied, liveAdmitted)
	if admitted != n || shadowDenied != n-3 {
		t.Errorf("shadow policy: admitted %d of %d with %d ShadowDenied, want %d with %d", admitted, n, shadowDenied, n, n-3)
	}
	if liveAdmitted != 3 {
		t.Errorf("live policy: admitted %d of %d, want 3", liveAdmitted, n)
	}
	got := gather(t, reg)
	want := map[string]float64{
		`hotkey_decisions_total{policy="shadow",result="allowed",sync="store"}`:       3,
		`hotkey_decisions_total{policy="shadow",result="shadow_denied",sync="store"}`: n - 3,
		`hotkey_decisions_total{policy="shadow",result="denied",sync="store"}`:        0,
		`hotkey_decisions_total{policy="live",result="allowed",sync="store"}`:         3,
		`hotkey_decisions_total{policy="live",result="denied",sync="store"}`:          n - 3,
		`hotkey_decisions_total{policy="live",result="shadow_denied",sync="store"}`:   0,
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %v, want %v", k, got[k], v)
		}
	}
	if got["hotkey_deny_cache_hits_total"] == 0 {
		t.Error("the deny cache answered nothing: the test misses its path")
	}

	clock.Advance(shadowLimit.Period / 3) // one unit back, for each
	for _, p := range []*Policy{shadow, live} {
		r, _ := e.Allow(ctx, "k", p)
		if !r.Allowed || r.ShadowDenied {
			t.Errorf("%s after a unit refilled: %+v, want allowed, not shadow denied", p.Name, r)
		}
		if r, _ := e.Allow(ctx, "k", p); r.Allowed != p.Shadow || r.ShadowDenied != p.Shadow {
			t.Errorf("%s, the unit after: %+v, want denied (shadow denied in shadow)", p.Name, r)
		}
	}
}

// TestShadowFallback: a Shadow policy that fails closed admits while the
// store is down, ShadowDenied and Degraded, counted as
// fallback_shadow_denied, and is not Unavailable.
func TestShadowFallback(t *testing.T) {
	checkLeaks(t)
	_, bs, reg, e := newMetricsEngine(t)
	bs.mu.Lock()
	bs.down = true
	bs.mu.Unlock()
	p := &Policy{Name: "closed", Limit: shadowLimit, OnStoreFailure: FallbackClosed, Shadow: true}
	r, err := e.Allow(context.Background(), "k", p)
	if err != nil {
		t.Fatal(err)
	}
	if !r.Allowed || !r.ShadowDenied || !r.Degraded || p.Unavailable(r) {
		t.Errorf("store down, closed shadow policy: %+v (unavailable %v), want allowed, shadow denied, degraded", r, p.Unavailable(r))
	}
	if n := gather(t, reg)[`hotkey_decisions_total{policy="closed",result="fallback_shadow_denied",sync="store"}`]; n != 1 {
		t.Errorf("fallback_shadow_denied = %v, want 1", n)
	}
}

// TestShadowBatch: AllowBatch honours Shadow per request: in one batch, a
// Shadow policy's requests are all admitted, those over the limit
// ShadowDenied, and another policy's over the limit denied; a second batch
// (its denials from the deny cache) alike.
func TestShadowBatch(t *testing.T) {
	checkLeaks(t)
	_, bs, reg, e := newMetricsEngine(t)
	shadow := &Policy{Name: "shadow", Limit: shadowLimit, Shadow: true}
	live := &Policy{Name: "live", Limit: shadowLimit}
	var reqs []Request
	for range 5 {
		reqs = append(reqs, Request{Key: "k", Policy: shadow, Cost: 1}, Request{Key: "k", Policy: live, Cost: 1})
	}
	out := make([]Decision, len(reqs))
	admitted := map[string]int{}
	shadowDenied := map[string]int{}
	for range 2 {
		e.AllowBatch(context.Background(), reqs, out)
		for i, d := range out {
			if d.Err != nil {
				t.Fatal(d.Err)
			}
			name := reqs[i].Policy.Name
			if d.Result.Allowed {
				admitted[name]++
			}
			if d.Result.ShadowDenied {
				shadowDenied[name]++
			}
		}
	}
	t.Logf("admitted %v, shadow denied %v, batches %v", admitted, shadowDenied, bs.batches)
	if admitted["shadow"] != 10 || shadowDenied["shadow"] != 7 {
		t.Errorf("shadow policy: admitted %d of 10 with %d ShadowDenied, want 10 with 7", admitted["shadow"], shadowDenied["shadow"])
	}
	if admitted["live"] != 3 || shadowDenied["live"] != 0 {
		t.Errorf("live policy: admitted %d of 10 with %d ShadowDenied, want 3 with 0", admitted["live"], shadowDenied["live"])
	}
	if len(bs.batches) == 0 {
		t.Error("no TakeBatch: the test misses the batched path")
	}
	if n := gather(t, reg)[`hotkey_decisions_total{policy="shadow",result="shadow_denied",sync="store"}`]; n != 7 {
		t.Errorf("shadow_denied = %v, want 7", n)
	}
}

// TestShadowMiddleware: under a Shadow policy the middleware serves every
// request, those over the limit with X-RateLimit-Shadow: denied and no
// Retry-After; without Shadow they get 429.
func TestShadowMiddleware(t *testing.T) {
	checkLeaks(t)
	_, _, _, e := newMetricsEngine(t)
	served := 0
	ok := http.HandlerFunc(func(http.ResponseWriter, *http.Request) { served++ })
	key := func(*http.Request) string { return "alice" }
	shadow := e.Middleware(MiddlewareConfig{Policy: &Policy{Name: "shadow", Limit: shadowLimit, Shadow: true}, Key: key})(ok)
	live := e.Middleware(MiddlewareConfig{Policy: &Policy{Name: "live", Limit: shadowLimit}, Key: key})(ok)
	do := func(h http.Handler) *httptest.ResponseRecorder {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("GET", "/", nil))
		return rec
	}
	for i := range 5 {
		rec := do(shadow)
		wantShadow := ""
		if i >= 3 {
			wantShadow = "denied"
		}
		if rec.Code != http.StatusOK || rec.Header().Get("X-RateLimit-Shadow") != wantShadow || rec.Header().Get("Retry-After") != "" {
			t.Errorf("shadow request %d: %d, X-RateLimit-Shadow %q, Retry-After %q; want 200, %q, none",
				i, rec.Code, rec.Header().Get("X-RateLimit-Shadow"), rec.Header().Get("Retry-After"), wantShadow)
		}
	}
	if served != 5 {
		t.Errorf("shadow: served %d of 5", served)
	}
	codes := []int{}
	for range 5 {
		rec := do(live)
		codes = append(codes, rec.Code)
		if rec.Header().Get("X-RateLimit-Shadow") != "" {
			t.Errorf("live: X-RateLimit-Shadow %q", rec.Header().Get("X-RateLimit-Shadow"))
		}
	}
	if served != 8 || codes[4] != http.StatusTooManyRequests {
		t.Errorf("live: served %d in all, codes %v; want 8 served, the last two 429", served, codes)
	}
}
