package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hotkeyd/hotkey/internal/testkit"
)

// TestStartWithRedisDown: a daemon started while its Redis is down serves
// at once, deciding by each policy's fallback (local admits and says
// degraded, closed answers 503 but to its allowlist), and /readyz answers
// 200 degraded (503 with ?strict=true); once redis-server answers, it is
// ready and its decisions go to Redis. With --require-store it refuses to start instead.
func TestStartWithRedisDown(t *testing.T) {
	t.Parallel()
	srv := startRedis(t)
	if err := srv.Kill(); err != nil {
		t.Fatal(err)
	}
	url := "redis://" + srv.Addr

	code, out := runBinary(t, "--redis", url, "--require-store", "--listen", freeAddr(t), "--nats-listen", freeAddr(t), "--grpc-listen", freeAddr(t), "--admin-listen", freeAddr(t))
	if code != 1 || !strings.Contains(out, "cannot reach Redis at "+url) {
		t.Errorf("--require-store with Redis down: exit %d, %s", code, out)
	}

	d := startDaemon(t, daemonOpts{args: []string{"--redis", url, "--policies", writeFile(t, "p.yaml", killPolicies)}})
	if !strings.Contains(d.stderr.String(), "starting degraded") {
		t.Errorf("no warning of the degraded start in the log:\n%s", d.stderr)
	}
	r := do(t, "GET", d.base+"/readyz", "")
	if r.status != 200 || !strings.Contains(string(r.body), `"status":"degraded"`) || !strings.Contains(string(r.body), "store not set up") {
		t.Errorf("/readyz with Redis down: %d %s, want 200 degraded naming the store", r.status, r.body)
	}
	r = do(t, "GET", d.base+"/readyz?strict=true", "")
	if r.status != 503 || !strings.Contains(string(r.body), "store not set up") {
		t.Errorf("/readyz?strict=true with Redis down: %d %s, want 503 naming the store", r.status, r.body)
	}
	r = d.allow(t, `{"policy":"cache","key":"c"}`)
	if r.status != 200 || !strings.Contains(string(r.body), `"degraded":true`) {
		t.Errorf("a local policy with Redis down: %d %s, want 200 degraded", r.status, r.body)
	}
	if r := d.allow(t, `{"policy":"login","key":"bob"}`); r.status != 503 {
		t.Errorf("a closed policy with Redis down: %d %s, want 503", r.status, r.body)
	}
	if r := d.allow(t, `{"policy":"login","key":"health_check"}`); r.status != 200 || !strings.Contains(string(r.body), `"degraded":true`) {
		t.Errorf("a closed policy's allowlisted key with Redis down: %d %s, want 200 degraded", r.status, r.body)
	}

	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	up := time.Now()
	testkit.For(t, time.Minute, "/readyz?strict=true 200 once Redis answers", func() bool {
		return do(t, "GET", d.base+"/readyz?strict=true", "").status == 200
	})
	if r := do(t, "GET", d.base+"/readyz", ""); r.status != 200 || !strings.Contains(string(r.body), `"status":"ready"`) {
		t.Errorf("/readyz once Redis answers: %d %s, want 200 ready", r.status, r.body)
	}
	t.Logf("ready %v after redis-server answered PING", time.Since(up).Round(time.Millisecond))

	r = d.allow(t, `{"policy":"login","key":"bob"}`)
	if r.status != 200 || !strings.Contains(string(r.body), `"degraded":false`) {
		t.Errorf("a closed policy once Redis is back: %d %s, want 200 from the store", r.status, r.body)
	}
	rc := redis.NewClient(&redis.Options{Addr: srv.Addr})
	defer rc.Close()
	if n, err := rc.Exists(context.Background(), "hk:login|bob").Result(); err != nil || n != 1 {
		t.Errorf("the decision's counter in Redis: %d, %v; want it there", n, err)
	}
	testkit.For(t, time.Minute, "the log line of the store getting ready", func() bool {
		return strings.Contains(d.stderr.String(), "store ready")
	})
}

// TestRedisAuthAndPrefix: --redis-password (requirepass) and --redis-user
// (an ACL user) log in to a redis-server that requires them, and
// --redis-prefix names the counters; without the password the daemon
// reports why it is degraded.
func TestRedisAuthAndPrefix(t *testing.T) {
	t.Parallel()
	srv := startRedis(t)
	ctx := context.Background()
	admin := redis.NewClient(&redis.Options{Addr: srv.Addr})
	defer admin.Close()
	if err := admin.Do(ctx, "ACL", "SETUSER", "gateway", "on", ">gw-pw", "~*", "+@all").Err(); err != nil {
		t.Fatal(err)
	}
	if err := admin.ConfigSet(ctx, "requirepass", "default-pw").Err(); err != nil {
		t.Fatal(err)
	}
	rc := redis.NewClient(&redis.Options{Addr: srv.Addr, Password: "default-pw"})
	defer rc.Close()
	url := "redis://" + srv.Addr

	withUser := startDaemon(t, daemonOpts{args: []string{"--redis", url, "--redis-user", "gateway", "--redis-prefix", "edge:"}, env: []string{"HOTKEYD_REDIS_PASSWORD=gw-pw"}})
	withPass := startDaemon(t, daemonOpts{args: []string{"--redis", url, "--redis-password", "default-pw"}})
	without := startDaemon(t, daemonOpts{args: []string{"--redis", url}})
	for _, p := range []*proc{withUser, withPass} {
		testkit.For(t, time.Minute, "/readyz?strict=true 200 with credentials", func() bool {
			return do(t, "GET", p.base+"/readyz?strict=true", "").status == 200
		})
	}
	if r := withUser.allow(t, `{"key":"k1"}`); r.status != 200 || !strings.Contains(string(r.body), `"degraded":false`) {
		t.Errorf("a decision as the ACL user: %d %s", r.status, r.body)
	}
	if r := withPass.allow(t, `{"key":"k2"}`); r.status != 200 || !strings.Contains(string(r.body), `"degraded":false`) {
		t.Errorf("a decision with requirepass's password: %d %s", r.status, r.body)
	}
	for key, want := range map[string]int64{"edge:default|k1": 1, "hk:default|k1": 0, "hk:default|k2": 1} {
		if n, err := rc.Exists(ctx, key).Result(); err != nil || n != want {
			t.Errorf("EXISTS %s: %d, %v; want %d", key, n, err, want)
		}
	}
	r := do(t, "GET", without.base+"/readyz", "")
	if r.status != 200 || !strings.Contains(string(r.body), `"status":"degraded"`) || !strings.Contains(string(r.body), "NOAUTH") {
		t.Errorf("/readyz without the password: %d %s, want 200 degraded naming NOAUTH", r.status, r.body)
	}
	if r := do(t, "GET", without.base+"/readyz?strict=true", ""); r.status != 503 || !strings.Contains(string(r.body), "NOAUTH") {
		t.Errorf("/readyz?strict=true without the password: %d %s, want 503 naming NOAUTH", r.status, r.body)
	}
	if strings.Contains(withUser.stderr.String(), "gw-pw") || strings.Contains(withPass.stderr.String(), "default-pw") {
		t.Error("a Redis password in the log")
	}
}
