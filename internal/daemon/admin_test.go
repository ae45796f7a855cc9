package daemon

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hotkeyd/hotkey/internal/testkit"
)

// TestAdminListenFlag: --admin-listen defaults to loopback, is read from
// its environment variable, may be empty (off), and may not take the port
// of --listen or --grpc-listen.
func TestAdminListenFlag(t *testing.T) {
	for _, c := range []struct {
		give    []string
		env     map[string]string
		want    string
		wantErr string
	}{
		{want: DefaultAdminListen},
		{give: []string{"--admin-listen", "0.0.0.0:9090"}, want: "0.0.0.0:9090"},
		{env: map[string]string{"HOTKEYD_ADMIN_LISTEN": "10.0.0.5:8082"}, want: "10.0.0.5:8082"},
		{give: []string{"--admin-listen", ""}, want: ""},
		{give: []string{"--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"}, want: "127.0.0.1:0"},
		{give: []string{"--admin-listen", "8082"}, wantErr: "--admin-listen (HOTKEYD_ADMIN_LISTEN) \"8082\": want host:port"},
		{give: []string{"--admin-listen", "127.0.0.1:8080"}, wantErr: "--admin-listen (HOTKEYD_ADMIN_LISTEN) \"127.0.0.1:8080\" is the address of --listen (HOTKEYD_LISTEN)"},
		{give: []string{"--listen", ":9000", "--admin-listen", "127.0.0.1:9000"}, wantErr: "is the address of --listen (HOTKEYD_LISTEN)"},
		{give: []string{"--admin-listen", "0.0.0.0:8081"}, wantErr: "is the address of --grpc-listen (HOTKEYD_GRPC_LISTEN)"},
		{give: []string{"--grpc-listen", "", "--admin-listen", "127.0.0.1:8081"}, want: "127.0.0.1:8081"},
	} {
		cfg, err := ParseArgs(c.give, env(c.env), nil)
		switch {
		case c.wantErr != "":
			if err == nil || !strings.Contains(err.Error(), c.wantErr) {
				t.Errorf("%q %v: err %v, want it to say %q", c.give, c.env, err, c.wantErr)
			}
		case err != nil:
			t.Errorf("%q %v: %v", c.give, c.env, err)
		case cfg.AdminListen != c.want:
			t.Errorf("%q %v: admin listen %q, want %q", c.give, c.env, cfg.AdminListen, c.want)
		}
	}
}

// TestAdminListener: the admin listener serves /metrics, /v1/hotkeys,
// /v1/config, the health checks and pprof; the API listener serves
// decisions and health only, and its 404 for the others points at the
// admin listener.
func TestAdminListener(t *testing.T) {
	e := startReloadEnv(t)
	get := func(addr, path string) (int, string) {
		t.Helper()
		resp, err := e.client.Get("http://" + addr + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	if e.d.AdminAddr() == "" || e.d.AdminAddr() == e.d.Addr() {
		t.Fatalf("admin address %q, API %q", e.d.AdminAddr(), e.d.Addr())
	}
	for _, c := range []struct{ path, want string }{
		{"/metrics", "hotkeyd_build_info"},
		{"/v1/hotkeys", `"hotkeys":[]`},
		{"/v1/config", `"generation":1`},
		{"/healthz", `"status":"ok"`},
		{"/readyz", `"status":"ready"`},
		{"/debug/pprof/", "goroutine"},
		{"/debug/pprof/cmdline", ""},
	} {
		if code, body := get(e.d.AdminAddr(), c.path); code != http.StatusOK || !strings.Contains(body, c.want) {
			t.Errorf("admin %s: %d %.200s, want 200 with %q", c.path, code, body, c.want)
		}
	}
	for _, path := range []string{"/metrics", "/v1/hotkeys", "/v1/config", "/debug/pprof/", "/debug/pprof/cmdline"} {
		if code, body := get(e.d.Addr(), path); code != http.StatusNotFound || !strings.Contains(body, "admin listener, --admin-listen") {
			t.Errorf("API %s: %d %.200s, want 404 pointing at the admin listener", path, code, body)
		}
	}
	for _, path := range []string{"/healthz", "/readyz"} {
		if code, _ := get(e.d.Addr(), path); code != http.StatusOK {
			t.Errorf("API %s: %d, want 200", path, code)
		}
	}
	if code, _, err := e.allow(DefaultPolicy, "k"); err != nil || code != http.StatusOK {
		t.Errorf("API /v1/allow: %d %v", code, err)
	}
	if code, body := get(e.d.AdminAddr(), "/v1/allow"); code != http.StatusNotFound {
		t.Errorf("admin /v1/allow: %d %s, want 404", code, body)
	}
}

// TestAdminConfig: GET /v1/config dumps the rules in force, where they
// were read from and their generation, follows a reload, and holds none of
// the flags' values.
func TestAdminConfig(t *testing.T) {
	const password = "pw-f00d-2a7c-never-dumped"
	dir := t.TempDir()
	policies := filepath.Join(dir, "policies.yaml")
	writeTestFile(t, policies, onePolicy("api", 3))
	envoyFile := filepath.Join(dir, "rules.yaml")
	writeTestFile(t, envoyFile, "domain: edge\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 5, sync: reserve}\n")
	e := startReloadEnv(t, "--policies", policies, "--envoy-config", envoyFile, "--reload-interval", "0",
		"--nats-user", "hotkeyd", "--nats-password", password)
	dump := func() (ConfigDump, string) {
		t.Helper()
		resp, err := e.client.Get("http://" + e.d.AdminAddr() + "/v1/config")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		var c ConfigDump
		if resp.StatusCode != http.StatusOK || json.Unmarshal(body, &c) != nil {
			t.Fatalf("/v1/config: %d %s", resp.StatusCode, body)
		}
		if strings.Contains(string(body), password) {
			t.Errorf("/v1/config holds --nats-password: %s", body)
		}
		return c, string(body)
	}
	rate := func(c ConfigDump, name string) int64 {
		for _, p := range c.Policies {
			if p.Name == name {
				return p.Rate
			}
		}
		return -1
	}

	c, body := dump()
	if c.Generation != 1 || c.PoliciesFrom != policies || c.EnvoyConfigFrom != envoyFile || c.LoadedAt.IsZero() || rate(c, "api") != 3 || rate(c, DefaultPolicy) != BuiltinPolicy().Limit.Rate {
		t.Errorf("at start: %s", body)
	}
	if len(c.EnvoyRules) != 1 || c.EnvoyRules[0].Domain != "edge" || c.EnvoyRules[0].RequestsPerUnit != 5 || c.EnvoyRules[0].Unit != "minute" || c.EnvoyRules[0].File != envoyFile || c.EnvoyRules[0].Sync != "reserve" {
		t.Errorf("Envoy rules at start: %+v", c.EnvoyRules)
	}
	if p := c.Policies[0]; p.Name != "api" || p.Algorithm != "sliding_log" || p.Period != "24h0m0s" || p.File != policies || p.Line != 2 || p.Sync != "store" {
		t.Errorf("policy api: %+v", p)
	}

	replaceTestFile(t, policies, onePolicy("api", 7))
	if err := e.d.Reload("test"); err != nil {
		t.Fatal(err)
	}
	after, body := dump()
	if after.Generation != 2 || rate(after, "api") != 7 || after.LoadedAt.Before(c.LoadedAt) {
		t.Errorf("after a reload: %s", body)
	}

	// A refused reload keeps the rules in force, and their generation.
	replaceTestFile(t, policies, "policies: [")
	if err := e.d.Reload("test"); err == nil {
		t.Fatal("a broken file reloaded")
	}
	if refused, body := dump(); refused.Generation != 2 || rate(refused, "api") != 7 {
		t.Errorf("after a refused reload: %s", body)
	}
}

// TestAdminStopsLast: while a shutdown waits for a decision in flight on
// the API, the admin listener still serves /metrics (and /readyz says
// draining); once the shutdown returns, it is closed.
func TestAdminStopsLast(t *testing.T) {
	d, err := StartArgs(context.Background(), "--listen", "127.0.0.1:0", "--nats", "none")
	if err != nil {
		t.Fatal(err)
	}
	admin := "http://" + d.AdminAddr()
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: time.Minute}

	// A decision in flight: its body half sent, its handler reading.
	body := `{"key":"in-flight"}`
	conn, err := net.Dial("tcp", d.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "POST /v1/allow HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body[:5])
	// Until the server has read it, the request is not in flight: a
	// shutdown would close the listener with the connection not accepted.
	testkit.For(t, time.Minute, "the decision to be read", func() bool { return d.conns.count(http.StateActive) == 1 })

	stopped := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute) // only catches a hang
		defer cancel()
		stopped <- d.Shutdown(ctx)
	}()
	testkit.For(t, time.Minute, "/readyz on the admin listener to say draining", func() bool {
		resp, err := client.Get(admin + "/readyz")
		if err != nil {
			t.Fatalf("admin /readyz while draining: %v", err)
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusServiceUnavailable
	})
	resp, err := client.Get(admin + "/metrics")
	if err != nil {
		t.Fatalf("admin /metrics while the API drains: %v", err)
	}
	scrape, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(scrape), "hotkeyd_build_info") {
		t.Errorf("admin /metrics while the API drains: %d", resp.StatusCode)
	}
	select {
	case err := <-stopped:
		t.Fatalf("shutdown returned with a decision in flight: %v", err)
	default:
	}

	fmt.Fprint(conn, body[5:])
	answer, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	answer.Body.Close()
	if answer.StatusCode != http.StatusOK {
		t.Errorf("the decision in flight: %d", answer.StatusCode)
	}
	if err := <-stopped; err != nil {
		t.Errorf("shutdown: %v", err)
	}
	if _, err := client.Get(admin + "/metrics"); err == nil {
		t.Error("the admin listener still answers after the shutdown")
	}
}

// count returns how many connections are in state s.
func (t *connTracker) count(s http.ConnState) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := 0
	for _, cs := range t.conns {
		if cs == s {
			n++
		}
	}
	return n
}
