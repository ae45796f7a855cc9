package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hotkeyd/hotkey"
	"github.com/hotkeyd/hotkey/counter"
	"github.com/hotkeyd/hotkey/internal/envoyconf"
	"github.com/hotkeyd/hotkey/internal/testkit"
)

func writeTestFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

func onePolicy(name string, limit int) string {
	return fmt.Sprintf("policies:\n  %s:\n    algorithm: sliding_log\n    limit: %d\n    period: 24h\n", name, limit)
}

// replaceTestFile writes content to path as editors do: a new file
// renamed over the old, so that a reader never sees it half written.
func replaceTestFile(t *testing.T, path, content string) {
	t.Helper()
	writeTestFile(t, path+".new", content)
	if err := os.Rename(path+".new", path); err != nil {
		t.Fatal(err)
	}
}

// TestLoadPoliciesDir: a directory's *.yaml and *.yml files hold the
// policies together; hidden files and others are skipped; a name in two
// files, a bad file and an empty directory are refused, naming the file.
func TestLoadPoliciesDir(t *testing.T) {
	dir := t.TempDir()
	writeTestFile(t, filepath.Join(dir, "a.yaml"), onePolicy("a", 1))
	writeTestFile(t, filepath.Join(dir, "b.yml"), onePolicy("b", 2))
	writeTestFile(t, filepath.Join(dir, ".hidden.yaml"), "not: policies")
	writeTestFile(t, filepath.Join(dir, "notes.txt"), "not yaml at all: [")
	writeTestFile(t, filepath.Join(dir, "sub", "c.yaml"), "not: policies")
	ps, err := LoadPolicies(dir)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(ps.Names(), ","); got != "a,b,default" {
		t.Fatalf("policies %s, want a,b,default", got)
	}
	if ps["a"].Limit.Rate != 1 || ps["b"].Limit.Rate != 2 || ps[DefaultPolicy].Limit != BuiltinPolicy().Limit {
		t.Errorf("limits: a %+v, b %+v, default %+v", ps["a"].Limit, ps["b"].Limit, ps[DefaultPolicy].Limit)
	}

	dup := filepath.Join(dir, "c.yaml")
	writeTestFile(t, dup, onePolicy("a", 3))
	_, err = LoadPolicies(dir)
	pe, ok := err.(*PolicyError)
	if !ok || pe.File != dup || pe.Field != "policies.a" || !strings.Contains(pe.Msg, "a.yaml") {
		t.Errorf("a policy in two files: %v (%T), want a *PolicyError naming both", err, err)
	}
	writeTestFile(t, dup, "policies:\n  c:\n    limit: 3\n    period: 1 minute\n")
	_, err = LoadPolicies(dir)
	pe, ok = err.(*PolicyError)
	if !ok || pe.File != dup || pe.Line != 4 || pe.Field != "policies.c.period" || !strings.HasPrefix(err.Error(), dup+": line 4: policies.c.period: ") {
		t.Errorf("a bad file: %v (%T), want its file, line and field", err, err)
	}
	if _, err := LoadPolicies(t.TempDir()); err == nil || !strings.Contains(err.Error(), "no *.yaml or *.yml files") {
		t.Errorf("an empty directory: %v", err)
	}
	if _, err := LoadPolicies(filepath.Join(dir, "absent.yaml")); !os.IsNotExist(err) {
		t.Errorf("a missing file: %v", err)
	}
}

// reloadEnv is a daemon on the memory store whose log is kept.
type reloadEnv struct {
	t      *testing.T
	d      *Daemon
	log    *testkit.Buffer
	client *http.Client
}

func startReloadEnv(t *testing.T, args ...string) *reloadEnv {
	t.Helper()
	args = append([]string{"--nats-listen", "127.0.0.1:0", "--hot-threshold", "1e9"}, args...)
	var logs testkit.Buffer
	d, err := startLogged(t, &logs, nil, args...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { shutdown(t, d) })
	client := &http.Client{Transport: &http.Transport{}}
	t.Cleanup(client.CloseIdleConnections)
	return &reloadEnv{t: t, d: d, log: &logs, client: client}
}

// allow asks for one unit of key under policy: the status and the limit
// the answer gives.
func (e *reloadEnv) allow(policy, key string) (int, int64, error) {
	resp, err := e.client.Post("http://"+e.d.Addr()+"/v1/allow", "application/json",
		strings.NewReader(fmt.Sprintf(`{"policy":%q,"key":%q}`, policy, key)))
	if err != nil {
		return 0, 0, err
	}
	defer resp.Body.Close()
	var a AllowResponse
	if err := json.NewDecoder(resp.Body).Decode(&a); err != nil {
		return resp.StatusCode, 0, err
	}
	return resp.StatusCode, a.Limit, nil
}

// reloads is the reload count of result, as /metrics exposes it.
func (e *reloadEnv) reloads(result string) float64 {
	mfs, err := e.d.reg.Gather()
	if err != nil {
		e.t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "hotkeyd_policy_reloads_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			if m.GetLabel()[0].GetValue() == result {
				return m.GetCounter().GetValue()
			}
		}
	}
	return -1
}

// TestReloadWatchConfigMap: a policies directory laid out as Kubernetes
// mounts a ConfigMap (files linked through "..data", which an update
// swaps) and an Envoy rules file are reloaded when they change, without
// a signal.
func TestReloadWatchConfigMap(t *testing.T) {
	dir := t.TempDir()
	version := func(n int, content string) {
		t.Helper()
		v := fmt.Sprintf("..v%d", n)
		writeTestFile(t, filepath.Join(dir, v, "policies.yaml"), content)
		tmp := filepath.Join(dir, "..data_tmp")
		if err := os.Symlink(v, tmp); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, filepath.Join(dir, "..data")); err != nil {
			t.Fatal(err)
		}
	}
	version(1, onePolicy("cm", 3))
	if err := os.Symlink(filepath.Join("..data", "policies.yaml"), filepath.Join(dir, "policies.yaml")); err != nil {
		t.Fatal(err)
	}
	envoyFile := filepath.Join(t.TempDir(), "rules.yaml")
	writeTestFile(t, envoyFile, "domain: one\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 5}\n")

	e := startReloadEnv(t, "--policies", dir, "--envoy-config", envoyFile, "--reload-interval", "10ms")
	if _, limit, err := e.allow("cm", "a"); err != nil || limit != 3 {
		t.Fatalf("before the update: limit %d, %v; want 3", limit, err)
	}
	version(2, onePolicy("cm", 6))
	testkit.For(t, 30*time.Second, "the ConfigMap's update in force", func() bool {
		_, limit, err := e.allow("cm", "b")
		return err == nil && limit == 6
	})

	replaceTestFile(t, envoyFile, "domain: two\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 5}\n")
	testkit.For(t, 30*time.Second, "the Envoy rules' update in force", func() bool {
		return strings.Join(e.d.rules.Load().envoy.Domains(), ",") == "two"
	})
	if _, limit, err := e.allow("cm", "c"); err != nil || limit != 6 {
		t.Errorf("policies after the Envoy rules' reload: limit %d, %v; want 6", limit, err)
	}

	// A broken Envoy file keeps both the rules and the policies in force.
	refused := e.reloads("error")
	replaceTestFile(t, envoyFile, "domain: three\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 5}\n")
	testkit.For(t, 30*time.Second, "the refused reload counted", func() bool { return e.reloads("error") > refused })
	if got := strings.Join(e.d.rules.Load().envoy.Domains(), ","); got != "two" {
		t.Errorf("domains after a refused reload: %s, want two", got)
	}
	log := e.log.String()
	for _, want := range []string{"reload refused", "cause=\"file change\"", "file=" + envoyFile, "line=4", "field="} {
		if !strings.Contains(log, want) {
			t.Errorf("the log of the refused reload lacks %q:\n%s", want, log)
		}
	}
	if ok := e.reloads("ok"); ok < 2 {
		t.Errorf("%v reloads counted ok, want 2 or more", ok)
	}
}

// TestReloadAtomic: a batch is decided on one set of policies, never on
// half a reload. Two policies change their limits together, back and forth,
// while batches ask both; each batch's answers give the limits of one
// file. No request fails.
func TestReloadAtomic(t *testing.T) {
	path := filepath.Join(t.TempDir(), "policies.yaml")
	file := func(limit int) string {
		return fmt.Sprintf("policies:\n  p1:\n    limit: %d\n    period: 24h\n  p2:\n    limit: %d\n    period: 24h\n", limit, limit)
	}
	writeTestFile(t, path, file(1000))
	e := startReloadEnv(t, "--policies", path, "--reload-interval", "0")

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	var batches, torn, failed atomic.Int64
	var first atomic.Value
	// Many requests in a batch, so that a batch that read the policies
	// per request would likely straddle a reload.
	const n = 300
	items := make([]string, n)
	for i := range items {
		items[i] = fmt.Sprintf(`{"policy":"p%d","key":"k%d"}`, 1+i%2, i)
	}
	body := `{"requests":[` + strings.Join(items, ",") + `]}`
	for range 2 {
		wg.Go(func() {
			for ctx.Err() == nil {
				resp, err := e.client.Post("http://"+e.d.Addr()+"/v1/allow", "application/json", strings.NewReader(body))
				if err != nil {
					failed.Add(1)
					first.CompareAndSwap(nil, err.Error())
					continue
				}
				var br BatchResponse
				err = json.NewDecoder(resp.Body).Decode(&br)
				resp.Body.Close()
				if err != nil || resp.StatusCode != 200 || len(br.Responses) != n {
					failed.Add(1)
					first.CompareAndSwap(nil, fmt.Sprintf("%d %+v %v", resp.StatusCode, br, err))
					continue
				}
				for _, it := range br.Responses {
					if it.AllowResponse == nil {
						failed.Add(1)
						first.CompareAndSwap(nil, fmt.Sprintf("%+v", it))
						break
					}
					if it.Limit != br.Responses[0].Limit {
						torn.Add(1)
						break
					}
				}
				batches.Add(1)
			}
		})
	}
	reloads := 0
	for i := 0; reloads < 100 || batches.Load() < 60; i++ {
		writeTestFile(t, path, file(1000+1000*(i%2)))
		if err := e.d.Reload("test"); err != nil {
			t.Fatal(err)
		}
		reloads++
	}
	cancel()
	wg.Wait()
	if n := torn.Load(); n > 0 {
		t.Errorf("%d of %d batches answered with the limits of two policies files", n, batches.Load())
	}
	if n := failed.Load(); n > 0 {
		t.Errorf("%d requests failed; the first: %v", n, first.Load())
	}
	if got := e.reloads("ok"); got != float64(reloads) {
		t.Errorf("%v reloads counted ok, want %d", got, reloads)
	}
	t.Logf("%d batches across %d reloads", batches.Load(), reloads)
}

// TestReloadRefusesStateChange: a reload that changes the algorithm or the
// period of a policy, or of an Envoy rule, is refused, naming the file,
// line and field: its counters' state is written in them. Other changes of
// the same file's limits are not.
func TestReloadRefusesStateChange(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "policies.yaml")
	policies := func(alg, limit, period string) string {
		return "policies:\n  other:\n    limit: 1\n    period: 1s\n  api:\n    algorithm: " + alg + "\n    limit: " + limit + "\n    period: " + period + "\n"
	}
	writeTestFile(t, path, policies("token_bucket", "10", "1s"))
	envoyFile := filepath.Join(dir, "rules.yaml")
	rules := func(unit string, rpu int) string {
		return fmt.Sprintf("domain: edge\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: %s, requests_per_unit: %d}\n", unit, rpu)
	}
	writeTestFile(t, envoyFile, rules("minute", 5))
	e := startReloadEnv(t, "--policies", path, "--envoy-config", envoyFile, "--reload-interval", "0")

	for _, c := range []struct{ alg, period string }{{"sliding_window", "1s"}, {"token_bucket", "1m"}} {
		writeTestFile(t, path, policies(c.alg, "10", c.period))
		err := e.d.Reload("test")
		pe, ok := errors.AsType[*PolicyError](err)
		if !ok || pe.File != path || pe.Line != 5 || pe.Field != "policies.api" || !strings.Contains(pe.Msg, "a reload keeps the algorithm and period") {
			t.Errorf("%s per %s: %v, want a refusal naming the file, line 5 and policies.api", c.alg, c.period, err)
		}
		if l := e.d.rules.Load().policies["api"].Limit; l.Algorithm != counter.TokenBucket || l.Period != time.Second {
			t.Errorf("%s per %s: the policy in force is %+v, want the old one", c.alg, c.period, l)
		}
	}
	writeTestFile(t, path, policies("token_bucket", "20", "1s"))
	if err := e.d.Reload("test"); err != nil || e.d.rules.Load().policies["api"].Limit.Rate != 20 {
		t.Errorf("a new rate: %v", err)
	}

	writeTestFile(t, envoyFile, rules("hour", 5))
	err := e.d.Reload("test")
	ee, ok := errors.AsType[*envoyconf.Error](err)
	if !ok || ee.File != envoyFile || ee.Line != 3 || ee.Field != "edge.tenant" {
		t.Errorf("an Envoy rule's unit changed: %v, want a refusal naming the file, line 3 and the rule", err)
	}
	writeTestFile(t, envoyFile, rules("minute", 50))
	if err := e.d.Reload("test"); err != nil {
		t.Errorf("an Envoy rule's requests_per_unit changed: %v", err)
	}
	if ok, failed := e.reloads("ok"), e.reloads("error"); ok != 2 || failed != 3 {
		t.Errorf("reloads counted: %v ok, %v refused; want 2 and 3", ok, failed)
	}
}

// TestReloadRefusesSyncChange: a reload that changes the sync mode of a
// kept policy, or of a kept Envoy rule, is refused as a change of
// algorithm is; a new policy may take either mode.
func TestReloadRefusesSyncChange(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "policies.yaml")
	policies := func(mode, more string) string {
		return "policies:\n  other:\n    limit: 1\n    period: 1s\n  api:\n    algorithm: fixed_window\n    limit: 10\n    period: 1s\n    sync: " + mode + "\n" + more
	}
	writeTestFile(t, path, policies("store", ""))
	envoyFile := filepath.Join(dir, "rules.yaml")
	rules := func(mode string) string {
		return "domain: edge\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: minute, requests_per_unit: 5, sync: " + mode + "}\n"
	}
	writeTestFile(t, envoyFile, rules("store"))
	e := startReloadEnv(t, "--policies", path, "--envoy-config", envoyFile, "--reload-interval", "0")

	writeTestFile(t, path, policies("reserve", ""))
	err := e.d.Reload("test")
	pe, ok := errors.AsType[*PolicyError](err)
	if !ok || pe.File != path || pe.Line != 5 || pe.Field != "policies.api" || !strings.Contains(pe.Msg, "sync reserve, was store: a reload keeps the sync mode") {
		t.Errorf("sync store to reserve: %v, want a refusal naming the file, line 5 and policies.api", err)
	}
	if got := e.d.rules.Load().policies["api"].Sync; got != hotkey.SyncStore {
		t.Errorf("the policy in force has sync %v, want the old store", got)
	}
	writeTestFile(t, path, policies("gossip", ""))
	err = e.d.Reload("test")
	if pe, ok := errors.AsType[*PolicyError](err); !ok || pe.Field != "policies.api" || !strings.Contains(pe.Msg, "sync gossip, was store: a reload keeps the sync mode") {
		t.Errorf("sync store to gossip: %v, want a refusal naming policies.api", err)
	}
	writeTestFile(t, path, policies("store", "  fresh:\n    limit: 3\n    period: 1s\n    sync: reserve\n"))
	if err := e.d.Reload("test"); err != nil || e.d.rules.Load().policies["fresh"].Sync != hotkey.SyncReserve {
		t.Errorf("a new policy with sync reserve: %v", err)
	}

	for _, mode := range []string{"reserve", "gossip"} {
		writeTestFile(t, envoyFile, rules(mode))
		err = e.d.Reload("test")
		ee, ok := errors.AsType[*envoyconf.Error](err)
		if !ok || ee.File != envoyFile || ee.Line != 3 || ee.Field != "edge.tenant" || !strings.Contains(ee.Msg, "sync "+mode+", was store: a reload keeps the sync mode of a rule") {
			t.Errorf("an Envoy rule's sync changed to %s: %v, want a refusal naming the file, line 3 and the rule", mode, err)
		}
	}
	if ok, failed := e.reloads("ok"), e.reloads("error"); ok != 1 || failed != 4 {
		t.Errorf("reloads counted: %v ok, %v refused; want 1 and 4", ok, failed)
	}
}
