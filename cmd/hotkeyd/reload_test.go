package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/hotkeyd/hotkey/internal/testkit"
)

// reloadPolicies is a policies file: "quota" (an exact log, so that its
// counts do not depend on when the test runs) admits quota per hour, and
// "bulk", which the load uses, admits bulk per second.
func reloadPolicies(quota, bulk int) string {
	return fmt.Sprintf(`policies:
  quota:
    algorithm: sliding_log
    limit: %d
    period: 1h
  bulk:
    algorithm: token_bucket
    limit: %d
    period: 1s
`, quota, bulk)
}

// replaceFile writes content to path as editors and ConfigMaps do: a new
// file renamed over the old.
func replaceFile(t *testing.T, path, content string) {
	t.Helper()
	tmp := path + ".new"
	if err := os.WriteFile(tmp, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// TestSIGHUPReload: under load over HTTP, SIGHUP reloads the policies file.
// The next decisions use the new limits, with the usage counted under the
// old one carried (5 of 5 taken, then 3 more under a limit of 8); no
// request fails. A broken file keeps the limits in force, and the log
// names its file, line and field. Reloads are counted by result.
func TestSIGHUPReload(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "policies.yaml")
	replaceFile(t, path, reloadPolicies(5, 1000000))
	// No watch of the file: the reloads here are SIGHUP's.
	d := startDaemon(t, daemonOpts{args: []string{"--policies", path, "--reload-interval", "0"}})

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	var served, failed atomic.Int64
	var firstFailure atomic.Value
	for i := range 4 {
		wg.Go(func() {
			body := fmt.Sprintf(`{"policy":"bulk","key":"load-%d"}`, i)
			for ctx.Err() == nil {
				r, err := doErr(ctx, "POST", d.base+"/v1/allow", body)
				switch {
				case ctx.Err() != nil:
				case err != nil:
					failed.Add(1)
					firstFailure.CompareAndSwap(nil, err.Error())
				case r.status != 200 && r.status != 429:
					failed.Add(1)
					firstFailure.CompareAndSwap(nil, fmt.Sprintf("status %d: %s", r.status, r.body))
				default:
					served.Add(1)
				}
			}
		})
	}

	// quota answers as the policy says: limit is its limit, and it admits
	// want of n requests.
	quota := func(n, want int, limit int64) {
		t.Helper()
		admitted := 0
		for range n {
			r := d.allow(t, `{"policy":"quota","key":"tenant"}`)
			var a allowResp
			r.json(t, &a)
			if a.Limit == nil || *a.Limit != limit {
				t.Fatalf("quota answered %d %s, want its limit %d", r.status, r.body, limit)
			}
			if r.status == 200 {
				admitted++
			}
		}
		if admitted != want {
			t.Fatalf("quota admitted %d of %d requests, want %d", admitted, n, want)
		}
	}
	bulkLimit := func() int64 {
		var a allowResp
		d.allow(t, `{"policy":"bulk","key":"probe"}`).json(t, &a)
		return *a.Limit
	}
	reloads := func(result string) float64 {
		return metric(string(do(t, "GET", d.admin+"/metrics", "").body), `hotkeyd_policy_reloads_total{result="`+result+`"}`)
	}
	hup := func(result string, want float64) {
		t.Helper()
		if err := d.cmd.Process.Signal(syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
		testkit.For(t, 30*time.Second, "the reload counted as "+result, func() bool { return reloads(result) == want })
	}

	quota(7, 5, 5)
	testkit.For(t, 30*time.Second, "load served", func() bool { return served.Load() > 100 })

	replaceFile(t, path, reloadPolicies(8, 2000000))
	hup("ok", 1)
	quota(5, 3, 8)
	if got := bulkLimit(); got != 2000000 {
		t.Errorf("bulk's limit after the reload: %d, want 2000000", got)
	}
	mid := served.Load()

	// Broken: the limit of quota is not a number (line 4).
	replaceFile(t, path, strings.Replace(reloadPolicies(20, 3000000), "limit: 20", "limit: twenty", 1))
	hup("error", 1)
	quota(2, 0, 8)
	if got := bulkLimit(); got != 2000000 {
		t.Errorf("bulk's limit after a refused reload: %d, want 2000000 still", got)
	}
	// The log line reaches the test through a pipe: wait for it.
	testkit.For(t, 30*time.Second, "the refused reload's log line", func() bool {
		return strings.Contains(d.stderr.String(), "reload refused")
	})
	log := d.stderr.String()
	for _, want := range []string{"reload refused", "file=" + path, "line=4", "field=policies.quota.limit", "cause=SIGHUP"} {
		if !strings.Contains(log, want) {
			t.Errorf("the log of the refused reload lacks %q:\n%s", want, log)
		}
	}
	if v := metric(string(do(t, "GET", d.admin+"/metrics", "").body), "hotkeyd_policy_last_reload_successful"); v != 0 {
		t.Errorf("hotkeyd_policy_last_reload_successful = %v after a refused reload, want 0", v)
	}

	// Mended, it loads.
	replaceFile(t, path, reloadPolicies(9, 3000000))
	hup("ok", 2)
	quota(2, 1, 9)
	testkit.For(t, 30*time.Second, "load served after the reloads", func() bool { return served.Load() > mid+100 })

	cancel()
	wg.Wait()
	if n := failed.Load(); n > 0 {
		t.Errorf("%d of %d requests failed across the reloads; the first: %v", n, n+served.Load(), firstFailure.Load())
	}
	select {
	case <-d.done:
		t.Fatalf("hotkeyd exited (%d) on SIGHUP", d.exitCode)
	default:
	}
	d.stop()
	if d.exitCode != 0 {
		t.Errorf("exit code %d after SIGTERM, want 0", d.exitCode)
	}
	t.Logf("%d requests served across 3 reloads", served.Load())
}
