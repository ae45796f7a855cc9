package hotkey

import (
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/hotkeyd/hotkey/internal/testkit"
)

func TestMiddleware(t *testing.T) {
	checkLeaks(t)
	clock := testkit.NewClock()
	e, store := newMemoryEngine(t, clock)
	served := 0
	ok := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { served++ })
	byHeader := func(r *http.Request) string { return r.Header.Get("X-Api-Key") }
	do := func(h http.Handler, key string) *httptest.ResponseRecorder {
		req := httptest.NewRequest("GET", "/", nil)
		req.Header.Set("X-Api-Key", key)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec
	}
	p := &Policy{Name: "api", Limit: Limit{Rate: 3, Period: 2 * time.Second, Burst: 3}}
	h := e.Middleware(MiddlewareConfig{Policy: p, Key: byHeader})(ok)
	for i := range 3 {
		rec := do(h, "alice")
		if rec.Code != 200 {
			t.Fatalf("request %d: %d", i, rec.Code)
		}
		if got := rec.Header().Get("X-RateLimit-Remaining"); got != strconv.Itoa(2-i) {
			t.Errorf("request %d: X-RateLimit-Remaining %q, want %d", i, got, 2-i)
		}
	}
	rec := do(h, "alice")
	if rec.Code != http.StatusTooManyRequests || served != 3 {
		t.Fatalf("after the burst: %d (served %d), want 429 and 3 served", rec.Code, served)
	}
	hd := rec.Header()
	// 2 s per 3 units: the next unit in 667 ms, so 1 s rounded up; full in 2 s.
	want := map[string]string{
		"Retry-After":           "1",
		"X-RateLimit-Limit":     "3",
		"X-RateLimit-Remaining": "0",
		"X-RateLimit-Reset":     strconv.FormatInt(clock.Now().Add(2*time.Second).Unix(), 10),
		"RateLimit-Policy":      `"api";q=3;w=2`,
		"RateLimit":             `"api";r=0;t=2`,
	}
	for k, v := range want {
		if hd.Get(k) != v {
			t.Errorf("%s = %q, want %q", k, hd.Get(k), v)
		}
	}
	if rec := do(h, ""); rec.Code != 200 || rec.Header().Get("X-RateLimit-Limit") != "" {
		t.Errorf("no key: %d with headers %v, want 200 unlimited", rec.Code, rec.Header())
	}

	// The store down: a closed policy answers 503 but to its allowlist; a
	// FallbackError policy goes to OnError.
	store.Down.Store(true)
	closed := &Policy{Name: "login", Limit: PerSecond(100), OnStoreFailure: FallbackClosed, Allowlist: []string{"health"}}
	hc := e.Middleware(MiddlewareConfig{Policy: closed, Key: byHeader})(ok)
	if rec := do(hc, "bob"); rec.Code != http.StatusServiceUnavailable {
		t.Errorf("closed policy, store down: %d, want 503", rec.Code)
	}
	if rec := do(hc, "health"); rec.Code != 200 {
		t.Errorf("closed policy, store down, allowlisted key: %d, want 200", rec.Code)
	}
	fail := &Policy{Limit: PerSecond(100), OnStoreFailure: FallbackError}
	var gotErr error
	hf := e.Middleware(MiddlewareConfig{Policy: fail, Key: byHeader, OnError: func(w http.ResponseWriter, _ *http.Request, err error) {
		gotErr = err
		w.WriteHeader(http.StatusTeapot)
	}})(ok)
	if rec := do(hf, "carol"); rec.Code != http.StatusTeapot || gotErr == nil {
		t.Errorf("error policy, store down: %d, %v; want OnError's answer", rec.Code, gotErr)
	}
	hd2 := e.Middleware(MiddlewareConfig{Policy: fail, Key: byHeader})(ok)
	if rec := do(hd2, "carol"); rec.Code != http.StatusServiceUnavailable {
		t.Errorf("default OnError on a store error: %d, want 503", rec.Code)
	}
}
