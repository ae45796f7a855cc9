package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/hotkeyd/hotkey/internal/redistest"
	"github.com/hotkeyd/hotkey/internal/testkit"
)

// startRedis starts a redis-server for one test.
func startRedis(t *testing.T) *redistest.Server { return redistest.ForTest(t) }

const killPolicies = `policies:
  cache:
    limit: 5
    period: 1s
    on_store_failure: local
  login:
    algorithm: sliding_log
    limit: 5
    period: 1m
    on_store_failure: closed
    allowlist: [health_check]
`

// outcome is one answer under load, with the phase its request was sent
// and answered in.
type outcome struct {
	phase    int32  // -1 if the phase changed while the request was in flight
	target   string // cache, login, allowlisted
	status   int
	degraded bool // the answer says "degraded":true
}

// TestRedisKilled: a daemon on real Redis keeps its promise while
// redis-server is SIGKILLed under load: a "local" policy still answers 200
// or 429 only, degraded, a "closed" one answers 503 except to its
// allowlisted keys, and no request fails to connect. The shipped
// Deployment's readiness probe stays 200, saying degraded and why, so the
// fallbacks are reached; /readyz?strict=true answers 503 meanwhile, and
// 200 again once Redis is back.
func TestRedisKilled(t *testing.T) {
	t.Parallel()
	probe := shippedReadinessPath(t)
	srv := startRedis(t)
	d := startDaemon(t, daemonOpts{args: []string{
		"--redis", "redis://" + srv.Addr, "--policies", writeFile(t, "p.yaml", killPolicies), "--breaker-probe", "300ms",
	}})
	testkit.For(t, time.Minute, probe+" 200 before the kill", func() bool {
		return do(t, "GET", d.base+probe, "").status == 200
	})

	const (
		up = iota
		down
		restarting // answers not checked: the breaker may or may not have probed yet
		back
	)
	var phase atomic.Int32
	var mu sync.Mutex
	var outcomes []outcome
	var connErrs atomic.Int64
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	// Login keys are fresh each time: a key the store denied is known
	// denied (the engine's deny cache) until its retry-after, and gets
	// 429 during the outage too. The allowlisted key is asked only once
	// Redis is down, so it has not used up its limit before.
	targets := []struct{ name, body string }{
		{"cache", `{"policy":"cache","key":"c%d"}`},
		{"login", `{"policy":"login","key":"user_%d"}`},
		{"allowlisted", `{"policy":"login","key":"health_check"}`},
	}
	for g := 0; g < 6; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ctx.Err() == nil; i++ {
				tg := targets[(g+i)%len(targets)]
				p := phase.Load()
				body := tg.body
				switch tg.name {
				case "cache":
					body = fmt.Sprintf(body, rand.IntN(2)) // each well over its limit
				case "login":
					body = fmt.Sprintf(body, rand.Uint64())
				case "allowlisted":
					if p == up {
						continue
					}
				}
				r, err := doErr(ctx, "POST", d.base+"/v1/allow", body)
				if err != nil {
					if ctx.Err() == nil {
						connErrs.Add(1)
						t.Errorf("request: %v", err)
					}
					return
				}
				if phase.Load() != p {
					p = -1
				}
				mu.Lock()
				outcomes = append(outcomes, outcome{p, tg.name, r.status, strings.Contains(string(r.body), `"degraded":true`)})
				mu.Unlock()
			}
		}()
	}
	// answered reports whether, since outcome from, phase p has answers for
	// every target it asks, and both admissions and denials for cache.
	answered := func(from int, p int32) bool {
		mu.Lock()
		defer mu.Unlock()
		seen := map[string]map[int]bool{}
		for _, o := range outcomes[from:] {
			if o.phase == p {
				if seen[o.target] == nil {
					seen[o.target] = map[int]bool{}
				}
				seen[o.target][o.status] = true
			}
		}
		return seen["cache"][200] && seen["cache"][429] && len(seen["login"]) > 0 && (p == up || len(seen["allowlisted"]) > 0)
	}
	since := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(outcomes)
	}
	testkit.For(t, time.Minute, "answers of every kind with Redis up", func() bool { return answered(0, up) })

	phase.Store(restarting)
	if err := srv.Kill(); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	phase.Store(down)
	var reason string
	tookDown := testkit.For(t, time.Minute, probe+" to name Redis after the kill", func() bool {
		var body struct{ Reason string }
		do(t, "GET", d.base+probe, "").json(t, &body)
		reason = body.Reason
		return strings.Contains(reason, "Redis")
	})
	t.Logf("%s names Redis %v after the kill: %s", probe, tookDown, reason)
	// The breaker opens, and decisions go on without the store.
	testkit.For(t, time.Minute, "the breaker open", func() bool {
		return metric(string(do(t, "GET", d.admin+"/metrics", "").body), `hotkey_breaker_changes_total{state="open"}`) >= 1
	})
	opened := since()
	// The probe keeps the daemon in the load balancer: it answers, by the
	// fallbacks; the strict form takes it out.
	const probes = 20
	ready, strict := map[string]int{}, map[string]int{}
	for range probes {
		for _, c := range []struct {
			path string
			seen map[string]int
		}{{probe, ready}, {"/readyz?strict=true", strict}} {
			r := do(t, "GET", d.base+c.path, "")
			var body struct{ Status, Reason string }
			r.json(t, &body)
			c.seen[fmt.Sprintf("%d %s", r.status, body.Status)]++
			if !strings.Contains(body.Reason, "Redis") {
				t.Errorf("%s with Redis down: reason %q does not mention Redis", c.path, body.Reason)
			}
		}
	}
	t.Logf("with Redis down, %d probes: %s %v, /readyz?strict=true %v", probes, probe, ready, strict)
	if ready["200 degraded"] != probes {
		t.Errorf("%s with Redis down: %v of %d probes, want 200 degraded for all", probe, ready, probes)
	}
	if strict["503 degraded"] != probes {
		t.Errorf("/readyz?strict=true with Redis down: %v of %d probes, want 503 degraded for all", strict, probes)
	}
	testkit.For(t, time.Minute, "answers of every kind with the breaker open", func() bool { return answered(opened, down) })

	phase.Store(restarting)
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	restarted := time.Now()
	tookUp := testkit.For(t, time.Minute, "/readyz?strict=true 200 after Redis returns", func() bool {
		return do(t, "GET", d.base+"/readyz?strict=true", "").status == 200
	})
	phase.Store(back)
	t.Logf("/readyz?strict=true 200 %v after Redis restarted (down %v in all)", tookUp, time.Since(killed)-time.Since(restarted))
	testkit.For(t, time.Minute, probe+" ready with Redis back", func() bool {
		var body struct{ Status string }
		r := do(t, "GET", d.base+probe, "")
		r.json(t, &body)
		return r.status == 200 && body.Status == "ready"
	})
	testkit.For(t, time.Minute, "answers of every kind with Redis back", func() bool { return answered(0, back) })
	cancel()
	wg.Wait()
	if n := connErrs.Load(); n > 0 {
		t.Errorf("%d requests failed to connect", n)
	}

	// count[phase][target][status]
	count := map[int32]map[string]map[int]int{}
	for _, o := range outcomes {
		if count[o.phase] == nil {
			count[o.phase] = map[string]map[int]int{}
		}
		if count[o.phase][o.target] == nil {
			count[o.phase][o.target] = map[int]int{}
		}
		count[o.phase][o.target][o.status]++
	}
	t.Logf("answers by phase (0 up, 1 Redis killed, 2 killing or restarting, 3 back, -1 sent and answered in different phases), target and status: %v", count)
	allowed := map[string]map[int]bool{
		"cache":       {200: true, 429: true},
		"login":       {200: true, 429: true},
		"allowlisted": {200: true, 429: true},
	}
	for p := int32(up); p <= back; p++ {
		if p == restarting {
			continue
		}
		want := allowed
		if p == down {
			want = map[string]map[int]bool{
				"cache":       {200: true, 429: true}, // local: limited in memory
				"login":       {503: true},            // closed
				"allowlisted": {200: true},            // closed, but on the allowlist
			}
		}
		for target, ok := range want {
			seen := count[p][target]
			if len(seen) == 0 && (p != up || target != "allowlisted") {
				t.Errorf("phase %d: no answers for %s", p, target)
			}
			for status, n := range seen {
				if !ok[status] {
					t.Errorf("phase %d, %s: %d answers with status %d", p, target, n, status)
				}
			}
			if target == "cache" && (seen[200] == 0 || seen[429] == 0) {
				t.Errorf("phase %d, cache: %v: want both admissions and denials (2 keys over a limit of 5/s)", p, seen)
			}
		}
	}
	// With Redis down, the local fallback admits and says so.
	var admitted, degraded int
	for _, o := range outcomes {
		if o.phase == down && o.target == "cache" && o.status == 200 {
			admitted++
			if o.degraded {
				degraded++
			}
		}
	}
	if degraded != admitted {
		t.Errorf("with Redis down, %d of %d admissions of the local policy say degraded, want all", degraded, admitted)
	}
}

// shippedReadinessPath is the path of the readiness probe of the
// Deployment in deploy/kubernetes.
func shippedReadinessPath(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "deploy", "kubernetes", "deployment.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var dep struct {
		Spec struct {
			Template struct {
				Spec struct {
					Containers []struct {
						ReadinessProbe struct {
							HTTPGet struct{ Path string } `yaml:"httpGet"`
						} `yaml:"readinessProbe"`
					}
				}
			}
		}
	}
	if err := yaml.Unmarshal(b, &dep); err != nil {
		t.Fatal(err)
	}
	if cs := dep.Spec.Template.Spec.Containers; len(cs) == 0 || cs[0].ReadinessProbe.HTTPGet.Path == "" {
		t.Fatal("deployment.yaml: no readiness probe with an httpGet path")
	}
	return dep.Spec.Template.Spec.Containers[0].ReadinessProbe.HTTPGet.Path
}

// TestTwoDaemons: two daemons on one redis-server, the second joined to
// the first's embedded NATS server. A key driven over the hot threshold
// through the first is listed as hot by both, and a key driven through
// both is admitted no more than its limit allows (+2%).
func TestTwoDaemons(t *testing.T) {
	t.Parallel()
	srv := startRedis(t)
	pol := writeFile(t, "p.yaml", "policies:\n  shared:\n    limit: 200\n    period: 1s\n    burst: 200\n")
	args := []string{"--redis", "redis://" + srv.Addr, "--policies", pol, "--hot-threshold", "50", "--cool-down", "10s"}
	d1 := startDaemon(t, daemonOpts{args: args})
	d2 := startDaemon(t, daemonOpts{args: args, join: d1.natsURL})
	if d1.id == "" || d2.id == "" || d1.id == d2.id {
		t.Fatalf("instance IDs %q and %q", d1.id, d2.id)
	}
	testkit.For(t, time.Minute, "each daemon sees the other", func() bool {
		return d1.hotKeys(t).Peers == 1 && d2.hotKeys(t).Peers == 1
	})

	// A key hot through d1 only is listed by both, with d1 as origin.
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for g := 0; g < 2; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				doErr(ctx, "POST", d1.base+"/v1/allow", `{"key":"hot-one"}`)
				time.Sleep(2 * time.Millisecond)
			}
		}()
	}
	for _, d := range []*proc{d1, d2} {
		took := testkit.For(t, time.Minute, "hot-one listed", func() bool {
			for _, h := range d.hotKeys(t).HotKeys {
				if h.Policy == "default" && h.Key == "hot-one" && h.Level >= 4 && h.Origin == d1.id && h.ExpiresInMs > 0 {
					return true
				}
			}
			return false
		})
		t.Logf("hot-one in /v1/hotkeys of %s after %v: %+v", d.id, took, d.hotKeys(t).HotKeys)
	}
	cancel()
	wg.Wait()

	// A key driven through both: admitted ≤ (burst + rate × elapsed) × 1.02.
	const rate, burst = 200, 200
	ctx, cancel = context.WithCancel(context.Background())
	defer cancel()
	var admitted, denied, failed atomic.Int64
	var maxShards atomic.Int64
	start := time.Now()
	var last atomic.Int64 // ns after start of the last answer
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			d := []*proc{d1, d2}[g%2]
			for ctx.Err() == nil {
				r, err := doErr(ctx, "POST", d.base+"/v1/allow", `{"policy":"shared","key":"shared-hot"}`)
				if err != nil {
					return
				}
				last.Store(int64(time.Since(start)))
				switch r.status {
				case 200:
					admitted.Add(1)
				case 429:
					denied.Add(1)
				default:
					failed.Add(1)
				}
				var a allowResp
				if json.Unmarshal(r.body, &a) == nil && a.Shards != nil && int64(*a.Shards) > maxShards.Load() {
					maxShards.Store(int64(*a.Shards))
				}
			}
		}()
	}
	// At least 3 s, and until the key was seen split.
	time.Sleep(3 * time.Second)
	testkit.For(t, time.Minute, "shared-hot split into 4 or more", func() bool { return maxShards.Load() >= 4 })
	cancel()
	wg.Wait()
	elapsed := time.Duration(last.Load())
	bound := (burst + rate*elapsed.Seconds()) * 1.02
	t.Logf("shared-hot through both daemons for %v: %d admitted, %d denied (%.0f req/s), at most %d subcounters; limit allows %.0f (+2%%: %.0f)",
		elapsed.Round(time.Millisecond), admitted.Load(), denied.Load(), float64(admitted.Load()+denied.Load())/elapsed.Seconds(),
		maxShards.Load(), burst+rate*elapsed.Seconds(), bound)
	if failed.Load() > 0 {
		t.Errorf("%d answers other than 200 and 429", failed.Load())
	}
	if float64(admitted.Load()) > bound {
		t.Errorf("admitted %d > %.0f: (burst %d + %d/s × %v) + 2%%", admitted.Load(), bound, burst, rate, elapsed)
	}
	// Not too strict: at least half of what the limit allows, or of what
	// was asked if a slow machine asked less.
	if asked, allows := float64(admitted.Load()+denied.Load()), burst+rate*elapsed.Seconds(); float64(admitted.Load()) < min(asked, allows)/2 {
		t.Errorf("admitted only %d of %.0f asked in %v, the limit allowing %.0f: the limit is enforced too strictly", admitted.Load(), asked, elapsed, allows)
	}

	// The first daemon, and with it the NATS server, goes away: the second
	// is degraded (it cannot agree on hot keys) but goes on deciding, and
	// stays ready.
	d1.stop()
	var reason string
	testkit.For(t, time.Minute, "the second daemon degraded without NATS", func() bool {
		r := do(t, "GET", d2.base+"/readyz", "")
		var body struct{ Status, Reason string }
		r.json(t, &body)
		reason = body.Reason
		return r.status == 200 && body.Status == "degraded"
	})
	if r := do(t, "GET", d2.base+"/readyz?strict=true", ""); r.status != 503 {
		t.Errorf("/readyz?strict=true of the second daemon without NATS: %d %s, want 503", r.status, r.body)
	}
	t.Logf("/readyz of the second daemon without NATS: %s", reason)
	if !strings.Contains(reason, "NATS") {
		t.Errorf("reason %q does not mention NATS", reason)
	}
	if r := d2.allow(t, `{"policy":"shared","key":"after-nats"}`); r.status != 200 {
		t.Errorf("decision without NATS: %d %s", r.status, r.body)
	}
}

// TestMetrics: /metrics shows decisions counted and a hot key by level.
func TestMetrics(t *testing.T) {
	t.Parallel()
	d := startDaemon(t, daemonOpts{args: []string{"--hot-threshold", "50"}})
	scrape := func() string {
		r := do(t, "GET", d.admin+"/metrics", "")
		if r.status != 200 {
			t.Fatalf("/metrics: %d", r.status)
		}
		return string(r.body)
	}
	first := scrape()
	for _, name := range []string{"go_goroutines", "process_cpu_seconds_total", `hotkeyd_build_info{instance_id="` + d.id + `",version="v0.0.0-test"}`} {
		if metric(first, name) < 0 {
			t.Errorf("/metrics lacks %s", name)
		}
	}
	allowed := `hotkey_decisions_total{policy="default",result="allowed",sync="store"}`
	before := max(0, metric(first, allowed))
	hot := func(s string) float64 {
		n := 0.0
		for _, l := range []string{"4", "16", "64"} {
			n += max(0, metric(s, `hotkey_hot_keys{level="`+l+`"}`))
		}
		return n
	}
	var last string
	testkit.For(t, time.Minute, "a hot key counted in /metrics", func() bool {
		for i := 0; i < 300; i++ {
			d.allow(t, `{"key":"metrics-hot"}`)
		}
		last = scrape()
		return hot(last) >= 1
	})
	if after := metric(last, allowed); after <= before {
		t.Errorf("%s did not move: %v then %v", allowed, before, after)
	}
	// The hot key was denied, unless the machine was so slow that its
	// bucket refilled as fast as it was used: then a key that asks for its
	// whole burst (the default policy's 100) twice within a second is.
	denied := `hotkey_decisions_total{policy="default",result="denied",sync="store"}`
	for try := 0; metric(last, denied) < 1 && try < 10; try++ {
		key := fmt.Sprintf("metrics-deny-%d", try)
		d.allow(t, `{"key":"`+key+`","cost":100}`)
		d.allow(t, `{"key":"`+key+`","cost":100}`)
		last = scrape()
	}
	if metric(last, denied) < 1 {
		t.Errorf("no denials counted")
	}
	t.Logf("%s %v; hot keys by level 4/16/64: %v/%v/%v", allowed, metric(last, allowed),
		metric(last, `hotkey_hot_keys{level="4"}`), metric(last, `hotkey_hot_keys{level="16"}`), metric(last, `hotkey_hot_keys{level="64"}`))
}

// TestRedisCluster: --redis-cluster keeps the counters in a Redis Cluster.
func TestRedisCluster(t *testing.T) {
	t.Parallel()
	c, err := redistest.StartCluster(t.TempDir(), 3)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	// One unit back every 4.8 h: however slow the test, the sixth is denied.
	pol := writeFile(t, "p.yaml", "policies:\n  five:\n    limit: 5\n    period: 24h\n")
	d := startDaemon(t, daemonOpts{args: []string{"--redis-cluster", strings.Join(c.Addrs, ","), "--policies", pol}})
	testkit.For(t, time.Minute, "/readyz 200", func() bool {
		return do(t, "GET", d.base+"/readyz", "").status == 200
	})
	for i := 0; i < 5; i++ {
		if r := d.allow(t, `{"policy":"five","key":"k"}`); r.status != 200 {
			t.Fatalf("request %d: %d %s", i, r.status, r.body)
		}
	}
	if r := d.allow(t, `{"policy":"five","key":"k"}`); r.status != 429 {
		t.Fatalf("6th request in a day: %d %s", r.status, r.body)
	}
	// The counter is in the cluster: a second daemon on it sees it spent.
	e := startDaemon(t, daemonOpts{args: []string{"--redis-cluster", c.Addrs[1], "--policies", pol}})
	if r := e.allow(t, `{"policy":"five","key":"k"}`); r.status != 429 {
		t.Errorf("another daemon on the cluster: %d %s", r.status, r.body)
	}
}
