package daemon

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	rlpb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/nats-io/nats.go"
)

// shadowPolicies are two policies of 2 a day, "shadow" in shadow mode as
// shadow says, "live" not.
func shadowPolicies(shadow bool) string {
	return fmt.Sprintf("policies:\n  shadow:\n    algorithm: sliding_log\n    limit: 2\n    period: 24h\n    shadow: %v\n  live:\n    algorithm: sliding_log\n    limit: 2\n    period: 24h\n", shadow)
}

// shadowAnswer is one answer of POST /v1/allow: its status, its
// X-RateLimit-Shadow and Retry-After headers, and its body's fields.
type shadowAnswer struct {
	status             int
	shadowHdr, retry   string
	body               map[string]any
	allowed, shadowDen bool
}

func (e *reloadEnv) shadowAllow(body string) shadowAnswer {
	e.t.Helper()
	resp, err := e.client.Post("http://"+e.d.Addr()+"/v1/allow", "application/json", strings.NewReader(body))
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	a := shadowAnswer{status: resp.StatusCode, shadowHdr: resp.Header.Get("X-RateLimit-Shadow"), retry: resp.Header.Get("Retry-After")}
	if err := json.NewDecoder(resp.Body).Decode(&a.body); err != nil {
		e.t.Fatal(err)
	}
	a.allowed, _ = a.body["allowed"].(bool)
	a.shadowDen, _ = a.body["shadow_denied"].(bool)
	return a
}

// decisions is hotkey_decisions_total of policy and result on d.
func decisions(t *testing.T, d *Daemon, policy, result string) float64 {
	t.Helper()
	return counterValue(t, d, "hotkey_decisions_total", map[string]string{"policy": policy, "result": result})
}

// counterValue is the counter name of labels (those given; others any) on
// d's registry, summed.
func counterValue(t *testing.T, d *Daemon, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := d.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metrics:
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if v, ok := labels[l.GetName()]; ok && v != l.GetValue() {
					continue metrics
				}
			}
			sum += m.GetCounter().GetValue()
		}
	}
	return sum
}

// TestShadowPolicyFile: a policy with shadow: true answers every request
// 200, those over its limit with "shadow_denied":true, X-RateLimit-Shadow:
// denied and no Retry-After, over HTTP, in a batch and over NATS, counted
// as shadow_denied; the policy beside it denies. A reload turns shadow off
// (the key stays spent: 429) and on again.
func TestShadowPolicyFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "policies.yaml")
	writeTestFile(t, path, shadowPolicies(true))
	e := startReloadEnv(t, "--policies", path, "--reload-interval", "0")

	shadowed, liveDenied := 0, 0
	for i := range 5 {
		a := e.shadowAllow(`{"policy":"shadow","key":"k"}`)
		if a.status != http.StatusOK || !a.allowed || a.retry != "" {
			t.Errorf("shadow request %d: %d %v, Retry-After %q; want 200, allowed, none", i, a.status, a.body, a.retry)
		}
		if a.shadowDen != (i >= 2) || (a.shadowHdr == "denied") != (i >= 2) {
			t.Errorf("shadow request %d: shadow_denied %v, X-RateLimit-Shadow %q; want %v", i, a.shadowDen, a.shadowHdr, i >= 2)
		}
		if _, ok := a.body["shadow_denied"]; ok != (i >= 2) {
			t.Errorf("shadow request %d: body %v: want shadow_denied only when true", i, a.body)
		}
		if a.shadowDen {
			shadowed++
		}
		if a := e.shadowAllow(`{"policy":"live","key":"k"}`); a.status == http.StatusTooManyRequests {
			liveDenied++
		} else if a.shadowDen || a.shadowHdr != "" {
			t.Errorf("live request %d: %v, X-RateLimit-Shadow %q", i, a.body, a.shadowHdr)
		}
	}
	t.Logf("shadow: %d of 5 shadow denied; live: %d denied", shadowed, liveDenied)
	if shadowed != 3 || liveDenied != 3 {
		t.Errorf("shadow denied %d, live denied %d, want 3 and 3", shadowed, liveDenied)
	}

	// A batch, and NATS.
	resp, err := e.client.Post("http://"+e.d.Addr()+"/v1/allow", "application/json",
		strings.NewReader(`{"requests":[{"policy":"shadow","key":"k"},{"policy":"live","key":"k"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var br BatchResponse
	if err := json.Unmarshal(body, &br); err != nil || len(br.Responses) != 2 {
		t.Fatalf("batch: %v %s", err, body)
	}
	if it := br.Responses[0]; it.Status != http.StatusOK || !it.Allowed || !it.ShadowDenied {
		t.Errorf("batch, shadow: %s, want 200 allowed shadow_denied", body)
	}
	if it := br.Responses[1]; it.Status != http.StatusTooManyRequests || it.ShadowDenied {
		t.Errorf("batch, live: %s, want 429", body)
	}
	nc, err := nats.Connect(e.d.NATSURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	m, err := nc.Request(natsSubject, []byte(`{"policy":"shadow","key":"k"}`), time.Minute)
	if err != nil || !strings.Contains(string(m.Data), `"allowed":true`) || !strings.Contains(string(m.Data), `"shadow_denied":true`) {
		t.Errorf("NATS: %v %s, want allowed and shadow_denied", err, m.Data)
	}
	if n := decisions(t, e.d, "shadow", "shadow_denied"); n != 5 {
		t.Errorf("shadow_denied counted %v, want 5 (3, the batch's and NATS's)", n)
	}
	if n := decisions(t, e.d, "shadow", "denied") + decisions(t, e.d, "live", "shadow_denied"); n != 0 {
		t.Errorf("denied under shadow, or shadow denied under live: %v", n)
	}

	// Reload: shadow off, then on; the counter stays spent.
	writeTestFile(t, path, shadowPolicies(false))
	if err := e.d.Reload("test"); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(e.log.String(), "changed=shadow") {
		t.Errorf("the reload's log does not name the policy changed:\n%s", e.log.String())
	}
	if a := e.shadowAllow(`{"policy":"shadow","key":"k"}`); a.status != http.StatusTooManyRequests || a.shadowDen || a.retry == "" {
		t.Errorf("shadow off: %d %v, Retry-After %q; want 429 with Retry-After", a.status, a.body, a.retry)
	}
	writeTestFile(t, path, shadowPolicies(true))
	if err := e.d.Reload("test"); err != nil {
		t.Fatal(err)
	}
	if a := e.shadowAllow(`{"policy":"shadow","key":"k"}`); a.status != http.StatusOK || !a.shadowDen {
		t.Errorf("shadow on again: %d %v; want 200 shadow_denied", a.status, a.body)
	}
	if a := e.shadowAllow(`{"policy":"shadow","key":"fresh"}`); a.status != http.StatusOK || a.shadowDen {
		t.Errorf("a fresh key in shadow: %d %v; want 200, not shadow denied", a.status, a.body)
	}
}

// TestShadowPolicyFileRefused: shadow takes true or false only.
func TestShadowPolicyFileRefused(t *testing.T) {
	for _, v := range []string{`"true"`, "yes", "1", "[true]"} {
		_, err := ParsePolicies([]byte("policies:\n  a:\n    limit: 1\n    period: 1s\n    shadow: " + v + "\n"))
		pe, ok := err.(*PolicyError)
		if !ok || pe.Field != "policies.a.shadow" || !strings.Contains(pe.Msg, "want true or false") {
			t.Errorf("shadow: %s: %v, want a refusal of policies.a.shadow", v, err)
		}
	}
	ps, err := ParsePolicies([]byte("policies:\n  a:\n    limit: 1\n    period: 1s\n    shadow: true\n  b:\n    limit: 1\n    period: 1s\n"))
	if err != nil || !ps["a"].Shadow || ps["b"].Shadow || ps[DefaultPolicy].Shadow {
		t.Errorf("shadow: true on a: %v %+v", err, ps)
	}
}

// shadowRules limit each user to 1 a year.
const shadowRules = `domain: edge
descriptors:
  - key: user
    rate_limit: {unit: year, requests_per_unit: 1}
`

// TestShadowFlag: with --shadow every policy, the built-in default and
// the Envoy rules' included, admits every request: over HTTP with
// shadow_denied, over gRPC OK, counted as over the limit and in shadow
// mode, and as shadow_denied by the engine.
func TestShadowFlag(t *testing.T) {
	path := filepath.Join(t.TempDir(), "policies.yaml")
	writeTestFile(t, path, onePolicy("api", 2))
	e := startRLS(t, "memory", shadowRules, "--shadow", "--policies", path)
	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()
	env := &reloadEnv{t: t, d: e.d, client: client}
	shadowed := 0
	for i := range 5 {
		a := env.shadowAllow(`{"policy":"api","key":"k"}`)
		if a.status != http.StatusOK {
			t.Errorf("request %d: %d %v, want 200", i, a.status, a.body)
		}
		if a.shadowDen {
			shadowed++
		}
	}
	if shadowed != 3 {
		t.Errorf("HTTP: %d of 5 shadow denied, want 3", shadowed)
	}
	for _, p := range e.d.rules.Load().dump(e.d.cfg).Policies {
		if !p.Shadow {
			t.Errorf("policy %s not in shadow under --shadow (GET /v1/config)", p.Name)
		}
	}
	over := 0
	for i := range 3 {
		resp, err := e.raw(wireRequest("edge", []string{"user", "bob"}))
		if err != nil {
			t.Fatal(err)
		}
		if resp.OverallCode != rlpb.RateLimitResponse_OK || resp.Statuses[0].Code != rlpb.RateLimitResponse_OK {
			t.Errorf("gRPC request %d: %v, want OK", i, resp)
		}
		for _, h := range resp.ResponseHeadersToAdd {
			if h.Key == "retry-after" || h.Key == "x-ratelimit-shadow" {
				t.Errorf("gRPC request %d: header %s: %s", i, h.Key, h.Value)
			}
		}
	}
	labels := map[string]string{"domain": "edge", "descriptor": "edge.user"}
	over = int(counterValue(t, e.d, "hotkeyd_descriptor_over_limit_total", labels))
	sh := counterValue(t, e.d, "hotkeyd_descriptor_shadow_mode_total", labels)
	if over != 2 || sh != 2 {
		t.Errorf("gRPC: over the limit %d, shadow mode %v; want 2 and 2", over, sh)
	}
	if n := counterValue(t, e.d, "hotkey_decisions_total", map[string]string{"result": "shadow_denied"}); n != 5 {
		t.Errorf("shadow_denied counted %v, want 5 (3 over HTTP, 2 over gRPC)", n)
	}
}
