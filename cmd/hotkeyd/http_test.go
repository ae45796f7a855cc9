package main

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"
)

const testPolicies = `policies:
  login:
    algorithm: sliding_log
    limit: 5
    period: 1m
    on_store_failure: closed
    allowlist: [health_check]
  bulk:
    algorithm: token_bucket
    limit: 10
    period: 1s
    burst: 50
`

// dailyPolicy refills one unit every 864 s: a test spends its burst of 100
// and sees its 429 however slowly it runs.
const dailyPolicy = `  daily:
    limit: 100
    period: 24h
    burst: 100
`

// TestHTTPAllow: the default policy and cost, the body and headers of 200
// and 429, and Retry-After once the burst is spent.
func TestHTTPAllow(t *testing.T) {
	t.Parallel()
	d := startDaemon(t, daemonOpts{args: []string{"--policies", writeFile(t, "p.yaml", testPolicies+dailyPolicy)}})

	before := time.Now().Unix()
	r := d.allow(t, `{"key":"user_123"}`)
	if r.status != 200 {
		t.Fatalf("first request: %d %s", r.status, r.body)
	}
	var a allowResp
	r.json(t, &a)
	if a.Allowed == nil || !*a.Allowed || *a.Limit != 100 || *a.Remaining != 99 || *a.RetryAfterMs != 0 || *a.Shards != 1 || a.ResetAfterMs == nil || *a.ResetAfterMs < 1 || *a.ResetAfterMs > 10 {
		t.Errorf("default policy (token bucket 100/s, burst 100), cost 1: got %s", r.body)
	}
	if got := r.header.Get("Content-Type"); got != "application/json" {
		t.Errorf("Content-Type %q", got)
	}
	checkHeaders(t, r, "default", 100, 99, before, time.Second)
	if got := r.header.Get("RateLimit-Policy"); got != `"default";q=100;w=1` {
		t.Errorf("RateLimit-Policy %q", got)
	}
	if got := r.header.Get("RateLimit"); got != `"default";r=99;t=1` {
		t.Errorf("RateLimit %q", got)
	}

	// An explicit policy and cost.
	r = d.allow(t, `{"policy":"default","key":"costly","cost":10}`)
	r.json(t, &a)
	if r.status != 200 || *a.Remaining != 90 {
		t.Errorf("cost 10: %d %s", r.status, r.body)
	}
	r = d.allow(t, `{"policy":"bulk","key":"b","cost":50}`)
	r.json(t, &a)
	if r.status != 200 || *a.Limit != 50 || *a.Remaining != 0 {
		t.Errorf("bulk, cost = burst: %d %s", r.status, r.body)
	}
	if got := r.header.Get("RateLimit-Policy"); got != `"bulk";q=50;w=1` {
		t.Errorf("bulk RateLimit-Policy %q", got)
	}

	// Spend the burst: the 101st request is the first 429, but for one
	// unit back per 864 s the requests took.
	var denied reply
	spendStart := time.Now()
	for i := 0; i < 200; i++ {
		r := d.allow(t, `{"policy":"daily","key":"burst"}`)
		if r.status == 429 {
			denied = r
			took := time.Since(spendStart)
			t.Logf("first 429 after %d requests in %v", i, took)
			if refilled := int(took / (864 * time.Second)); i < 100 || i > 100+refilled {
				t.Errorf("first 429 after %d requests in %v, want after the burst of 100 and %d units refilled", i, took, refilled)
			}
			break
		}
		if r.status != 200 {
			t.Fatalf("request %d: %d %s", i, r.status, r.body)
		}
	}
	if denied.status != 429 {
		t.Fatal("no 429 in 200 requests with a burst of 100")
	}
	denied.json(t, &a)
	if *a.Allowed || *a.RetryAfterMs <= 0 || *a.Limit != 100 || *a.Remaining != 0 {
		t.Errorf("429 body %s", denied.body)
	}
	ra, err := strconv.Atoi(denied.header.Get("Retry-After"))
	if err != nil || ra < 1 || int64(ra) < (*a.RetryAfterMs+999)/1000 {
		t.Errorf("Retry-After %q for retry_after_ms %d: want whole seconds rounded up, at least 1", denied.header.Get("Retry-After"), *a.RetryAfterMs)
	}
	checkHeaders(t, denied, "daily", 100, 0, before, 24*time.Hour)

	// The login policy: RateLimit-Policy in whole seconds.
	r = d.allow(t, `{"policy":"login","key":"alice"}`)
	if r.status != 200 || r.header.Get("RateLimit-Policy") != `"login";q=5;w=60` {
		t.Errorf("login: %d %s %q", r.status, r.body, r.header.Get("RateLimit-Policy"))
	}
}

// checkHeaders checks the X-RateLimit-* and RateLimit headers; full is the
// policy's time to refill from empty.
func checkHeaders(t *testing.T, r reply, policy string, limit, remaining int64, before int64, full time.Duration) {
	t.Helper()
	if got := r.header.Get("X-RateLimit-Limit"); got != fmt.Sprint(limit) {
		t.Errorf("X-RateLimit-Limit %q, want %d", got, limit)
	}
	if got := r.header.Get("X-RateLimit-Remaining"); got != fmt.Sprint(remaining) {
		t.Errorf("X-RateLimit-Remaining %q, want %d", got, remaining)
	}
	reset, err := strconv.ParseInt(r.header.Get("X-RateLimit-Reset"), 10, 64)
	if latest := time.Now().Add(full).Unix() + 2; err != nil || reset < before || reset > latest {
		t.Errorf("X-RateLimit-Reset %q: want Unix seconds from %d to %d", r.header.Get("X-RateLimit-Reset"), before, latest)
	}
	if got := r.header.Get("RateLimit-Policy"); !strings.HasPrefix(got, `"`+policy+`";q=`) {
		t.Errorf("RateLimit-Policy %q", got)
	}
	if got := r.header.Get("RateLimit"); !strings.HasPrefix(got, fmt.Sprintf(`"%s";r=%d;t=`, policy, remaining)) {
		t.Errorf("RateLimit %q", got)
	}
}

// TestHTTPErrors: every error status with its message.
func TestHTTPErrors(t *testing.T) {
	t.Parallel()
	d := startDaemon(t, daemonOpts{args: []string{"--policies", writeFile(t, "p.yaml", testPolicies)}})
	cases := []struct {
		name, method, path, body string
		status                   int
		msg                      string
	}{
		{"malformed JSON", "POST", "/v1/allow", `{"key":`, 400, "malformed JSON body"},
		{"not an object", "POST", "/v1/allow", `["k"]`, 400, "malformed JSON body"},
		{"wrong type", "POST", "/v1/allow", `{"key":42}`, 400, `field "key" must be a string`},
		{"unknown field", "POST", "/v1/allow", `{"key":"k","cots":2}`, 400, `unknown field "cots"`},
		{"empty body", "POST", "/v1/allow", ``, 400, "empty body"},
		{"empty key", "POST", "/v1/allow", `{"key":""}`, 400, "empty key"},
		{"missing key", "POST", "/v1/allow", `{"policy":"default"}`, 400, "empty key"},
		{"key too long", "POST", "/v1/allow", `{"key":"` + strings.Repeat("k", 513) + `"}`, 400, "key is 513 bytes, longer than the 512 allowed"},
		{"cost negative", "POST", "/v1/allow", `{"key":"k","cost":-5}`, 400, "cost must not be negative, got -5"},
		{"cost over burst", "POST", "/v1/allow", `{"key":"k","cost":101}`, 400, `cost 101 is over policy "default"'s burst of 100`},
		{"cost over limit", "POST", "/v1/allow", `{"policy":"login","key":"k","cost":6}`, 400, `cost 6 is over policy "login"'s limit of 5`},
		{"cost not whole", "POST", "/v1/allow", `{"key":"k","cost":1.5}`, 400, `field "cost" must be a whole number`},
		{"unknown policy", "POST", "/v1/allow", `{"policy":"nope","key":"k"}`, 404, `unknown policy "nope": this daemon has "bulk", "default", "login"`},
		{"GET allow", "GET", "/v1/allow", ``, 405, "method GET not allowed on /v1/allow: use POST"},
		{"PUT allow", "PUT", "/v1/allow", `{"key":"k"}`, 405, "method PUT not allowed"},
		{"hotkeys on the API", "GET", "/v1/hotkeys", ``, 404, "moved to the admin listener, --admin-listen"},
		{"metrics on the API", "GET", "/metrics", ``, 404, "moved to the admin listener, --admin-listen"},
		{"DELETE readyz", "DELETE", "/readyz", ``, 405, "use GET"},
		{"too large", "POST", "/v1/allow", `{"key":"` + strings.Repeat("k", 1<<20) + `"}`, 413, "request body over the 1048576 bytes allowed"},
		{"no such endpoint", "GET", "/v2/allow", ``, 404, "no such endpoint /v2/allow"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := do(t, c.method, d.base+c.path, c.body)
			if r.status != c.status {
				t.Fatalf("status %d, want %d: %s", r.status, c.status, r.body)
			}
			if got := r.header.Get("Content-Type"); got != "application/json" {
				t.Errorf("Content-Type %q", got)
			}
			if msg := r.errorMsg(t); !strings.Contains(msg, c.msg) {
				t.Errorf("error %q, want it to contain %q", msg, c.msg)
			}
			if c.status == 405 {
				want := "GET, HEAD"
				if c.path == "/v1/allow" {
					want = "POST"
				}
				if got := r.header.Get("Allow"); got != want {
					t.Errorf("Allow %q, want %q", got, want)
				}
			}
		})
	}
	// A body just at the cap is read (and decided).
	key := strings.Repeat("k", 1<<20-len(`{"key":""}`))
	if r := d.allow(t, `{"key":"`+key+`"}`); r.status != 400 || !strings.Contains(r.errorMsg(t), "longer than the 512 allowed") {
		t.Errorf("body of exactly 1 MiB: %d %s", r.status, r.body)
	}
}

// TestHTTPStatus: /healthz, /readyz, /v1/hotkeys on an idle daemon; the
// flags win over the environment, and the environment alone works too.
func TestHTTPStatus(t *testing.T) {
	t.Parallel()
	// HOTKEYD_LISTEN points nowhere useful: the --listen flag must win.
	d := startDaemon(t, daemonOpts{env: []string{"HOTKEYD_LISTEN=127.0.0.1:1", "HOTKEYD_NATS_LISTEN=127.0.0.1:1"}, args: []string{"--log-level", "debug"}})
	for _, p := range []string{"/healthz", "/readyz"} {
		if r := do(t, "GET", d.base+p, ""); r.status != 200 {
			t.Errorf("%s: %d %s", p, r.status, r.body)
		}
		if r := do(t, "HEAD", d.base+p, ""); r.status != 200 {
			t.Errorf("HEAD %s: %d", p, r.status)
		}
	}
	for _, p := range []string{"/readyz", "/readyz?strict=true", "/readyz?strict=false"} {
		if r := do(t, "GET", d.base+p, ""); r.status != 200 || string(r.body) != "{\"status\":\"ready\"}\n" {
			t.Errorf("%s: %d %q", p, r.status, r.body)
		}
	}
	if r := do(t, "GET", d.base+"/readyz?strict=maybe", ""); r.status != 400 || !strings.Contains(r.errorMsg(t), "want true or false") {
		t.Errorf("/readyz?strict=maybe: %d %s, want 400", r.status, r.body)
	}
	h := d.hotKeys(t)
	if h.Peers != 0 || h.HotKeys == nil || len(h.HotKeys) != 0 {
		t.Errorf("/v1/hotkeys on an idle lone daemon: %+v", h)
	}
	if r := do(t, "POST", d.admin+"/v1/hotkeys", `{}`); r.status != 405 || r.header.Get("Allow") != "GET, HEAD" {
		t.Errorf("POST /v1/hotkeys on the admin listener: %d %s, want 405", r.status, r.body)
	}
	// Addresses from the environment only.
	e := startDaemon(t, daemonOpts{viaEnv: true})
	if r := do(t, "GET", e.base+"/healthz", ""); r.status != 200 {
		t.Errorf("HOTKEYD_LISTEN: %d", r.status)
	}
	if r := do(t, "GET", e.admin+"/metrics", ""); r.status != 200 {
		t.Errorf("HOTKEYD_ADMIN_LISTEN: %d", r.status)
	}
}
