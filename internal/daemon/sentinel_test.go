package daemon

import (
	"context"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hotkeyd/hotkey/internal/redistest"
	"github.com/hotkeyd/hotkey/internal/testkit"
)

// sentinelPolicies: 20 a day, and no decision without the store.
const sentinelPolicies = `policies:
  daily:
    limit: 20
    period: 24h
    on_store_failure: closed
`

// TestRedisSentinel: a daemon with --redis-sentinel and --redis-master
// keeps its counters in the master the Sentinel names, and after a
// failover (SENTINEL FAILOVER) in the new master, with the count carried
// by replication: a key with a limit of 20, 10 admitted before, is
// admitted 10 more times after, never more.
func TestRedisSentinel(t *testing.T) {
	const name = "counters"
	dir := t.TempDir()
	master, err := redistest.Start(dir)
	if errors.Is(err, redistest.ErrNotInstalled) {
		t.Fatal("redis-server is not installed (make test installs it)")
	}
	if err != nil {
		t.Fatal(err)
	}
	defer master.Close()
	replica, err := redistest.StartReplica(dir, master.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer replica.Close()
	ctx := context.Background()
	rc := redisClient(t, replica.Addr)
	testkit.For(t, testkit.Patience, "replica in sync", func() bool {
		info, err := rc.Info(ctx, "replication").Result()
		return err == nil && strings.Contains(info, "master_link_status:up")
	})
	sentinel, err := redistest.StartSentinel(dir, name, master.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer sentinel.Close()

	policies := filepath.Join(t.TempDir(), "policies.yaml")
	if err := os.WriteFile(policies, []byte(sentinelPolicies), 0o600); err != nil {
		t.Fatal(err)
	}
	var logs testkit.Buffer
	d, err := startLogged(t, &logs, nil, "--grpc-listen", "", "--nats", "none", "--policies", policies, "--breaker-probe", "100ms",
		"--redis-sentinel", sentinel.Addr, "--redis-master", name, "--require-store")
	if err != nil {
		t.Fatal(err)
	}
	defer shutdown(t, d)
	if want := "store=\"redis master counters of sentinels " + sentinel.Addr + "\""; !strings.Contains(logs.String(), want) {
		t.Errorf("serving log: %s; want %s", logs.String(), want)
	}

	const body = `{"policy":"daily","key":"user_1"}`
	admitted := 0
	for range 10 {
		if allow(t, d, body) == http.StatusOK {
			admitted++
		}
	}
	if admitted != 10 {
		t.Fatalf("before the failover: admitted %d of 10, want 10", admitted)
	}
	mc := redisClient(t, master.Addr)
	if keys, err := mc.Keys(ctx, "*user_1*").Result(); err != nil || len(keys) == 0 {
		t.Fatalf("counters in the master: %v, %v; want the key's", keys, err)
	}
	// The failover is forced, with the replica in sync: the count carried
	// is all of it. (An unforced one may lose the writes not yet copied.)
	if n, err := mc.Do(ctx, "WAIT", 1, 0).Int(); err != nil || n != 1 {
		t.Fatalf("WAIT: %d, %v", n, err)
	}

	if info, err := rc.Info(ctx, "commandstats").Result(); err != nil || strings.Contains(info, "cmdstat_evalsha") {
		t.Fatalf("the replica's commands before the failover: %v %s; want no script run", err, info)
	}

	sc := redisClient(t, sentinel.Addr)
	testkit.For(t, testkit.Patience, "SENTINEL FAILOVER accepted", func() bool {
		return sc.Do(ctx, "SENTINEL", "FAILOVER", name).Err() == nil // NOGOODSLAVE until the Sentinel knows the replica
	})
	testkit.For(t, testkit.Patience, "the Sentinel names the replica master", func() bool {
		addr, err := sc.Do(ctx, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", name).StringSlice()
		return err == nil && len(addr) == 2 && addr[0]+":"+addr[1] == replica.Addr
	})

	// No decision is asked until the old master is a replica: one it
	// took between the promotion and then would be lost with its copy.
	testkit.For(t, testkit.Patience, "the old master a replica", func() bool {
		info, err := mc.Info(ctx, "replication").Result()
		return err == nil && strings.Contains(info, "role:slave")
	})

	// Answers 503 (on_store_failure: closed) until the daemon follows the
	// failover; then 10 admitted, and denied after.
	decided, closed := 0, 0
	deadline := time.Now().Add(testkit.Patience)
	for decided < 20 && time.Now().Before(deadline) {
		switch allow(t, d, body) {
		case http.StatusOK:
			admitted++
			decided++
		case http.StatusTooManyRequests:
			decided++
		default:
			closed++
		}
	}
	t.Logf("after the failover: admitted %d of 20 in all, %d decisions, %d answered by the fallback", admitted, decided, closed)
	if decided < 20 || admitted != 20 {
		t.Errorf("after the failover: %d decisions, %d admitted in all; want 20 decisions and 20 admitted (10 before, 10 after)", decided, admitted)
	}
	// The replica ran no script before: the master's were copied as
	// their effects. So scripts run on it are the daemon's decisions.
	info, err := rc.Info(ctx, "commandstats").Result()
	if err != nil || !strings.Contains(info, "cmdstat_evalsha:calls=") {
		t.Errorf("the new master ran no decision: %v %s", err, info)
	}
}
