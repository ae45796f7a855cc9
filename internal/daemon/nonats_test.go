package daemon

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/hotkeyd/hotkey/internal/testkit"
)

// TestParseArgsNoNATS: --nats none (or HOTKEYD_NATS=none) runs without
// NATS, and refuses every other NATS flag rather than ignore it.
func TestParseArgsNoNATS(t *testing.T) {
	const refused = "applies to NATS, which --nats (HOTKEYD_NATS) none turns off"
	for _, c := range []struct {
		give []string
		env  map[string]string
		want string // "" for accepted, else part of the error
	}{
		{give: []string{"--nats", "none"}},
		{env: map[string]string{"HOTKEYD_NATS": "none"}},
		{give: []string{"--nats", "none", "--hot-threshold", "10", "--redis", "redis://127.0.0.1:6379"}},
		{give: []string{"--nats", "none", "--nats-listen", "127.0.0.1:4223"}, want: "--nats-listen (HOTKEYD_NATS_LISTEN) " + refused},
		{give: []string{"--nats", "none", "--nats-routes", "h:6222"}, want: "--nats-routes (HOTKEYD_NATS_ROUTES) " + refused},
		{give: []string{"--nats", "none", "--nats-client-user", "gw", "--nats-client-password", "p"}, want: "--nats-client-user (HOTKEYD_NATS_CLIENT_USER) " + refused},
		{give: []string{"--nats", "none", "--nats-secret-file", "/run/secrets/hotkey"}, want: "--nats-secret-file (HOTKEYD_NATS_SECRET_FILE) " + refused},
		{give: []string{"--nats", "none", "--nats-concurrency", "8"}, want: "--nats-concurrency (HOTKEYD_NATS_CONCURRENCY) " + refused},
		{give: []string{"--nats", "none"}, env: map[string]string{"HOTKEYD_NATS_TOKEN": "t"}, want: "--nats-token (HOTKEYD_NATS_TOKEN) " + refused},
		{give: []string{"--nats", "off"}, want: `--nats (HOTKEYD_NATS) "off": want none to run with no NATS`},
	} {
		cfg, err := ParseArgs(c.give, env(c.env), nil)
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%v %v: %v, want it accepted", c.give, c.env, err)
		case c.want == "" && cfg.NATS != "none":
			t.Errorf("%v %v: NATS %q, want %q", c.give, c.env, cfg.NATS, "none")
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%v %v: err %v, want it to say %q", c.give, c.env, err, c.want)
		}
	}
}

// TestNoNATS: with --nats none a daemon starts with no NATS server or
// connection (the default NATS port may be another's), says so when it
// serves, is ready with no NATS reason, decides, splits a hot key alone and
// shuts down cleanly.
func TestNoNATS(t *testing.T) {
	// A developer's own nats-server on the default port: hold it if free.
	if l, err := net.Listen("tcp", DefaultNATSListen); err == nil {
		defer l.Close()
	} else {
		t.Logf("%s is taken already: %v", DefaultNATSListen, err)
	}
	var logs testkit.Buffer
	d, err := startLogged(t, &logs, nil, "--nats", "none", "--hot-threshold", "50")
	if err != nil {
		t.Fatal(err)
	}
	stopped := false
	defer func() {
		if !stopped {
			shutdown(t, d)
		}
	}()
	if !strings.Contains(logs.String(), "msg=serving") || !strings.Contains(logs.String(), " nats=off ") {
		t.Errorf("the serving line must say nats=off; log:\n%s", logs.String())
	}
	if strings.Contains(logs.String(), "level=WARN") {
		t.Errorf("a daemon alone on memory counters has nothing to warn of; log:\n%s", logs.String())
	}
	if d.nc != nil || d.ns != nil || d.NATSURL() != "" {
		t.Errorf("NATS connection %v, embedded server %v, URL %q: want none", d.nc != nil, d.ns != nil, d.NATSURL())
	}

	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()
	get := func(path string) (int, string) {
		t.Helper()
		addr := d.Addr()
		if path != "/readyz" {
			addr = d.AdminAddr()
		}
		resp, err := client.Get("http://" + addr + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	allow := func(key string) (int, string) {
		t.Helper()
		resp, err := client.Post("http://"+d.Addr()+"/v1/allow", "application/json", strings.NewReader(`{"key":"`+key+`"}`))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}

	if code, body := get("/readyz"); code != http.StatusOK || strings.TrimSpace(body) != `{"status":"ready"}` {
		t.Errorf("/readyz: %d %s, want 200 ready with no reason", code, body)
	}
	if code, body := allow("k"); code != http.StatusOK || !strings.Contains(body, `"allowed":true,"limit":100,"remaining":99`) {
		t.Errorf("allow: %d %s", code, body)
	}

	// A key driven hot is split by this daemon alone: its origin, no lease.
	testkit.For(t, time.Minute, "/v1/hotkeys to list the hot key", func() bool {
		for range 20 {
			allow("hot")
		}
		_, body := get("/v1/hotkeys")
		var hk HotKeys
		if err := json.Unmarshal([]byte(body), &hk); err != nil {
			t.Fatalf("/v1/hotkeys: %v: %s", err, body)
		}
		return len(hk.HotKeys) == 1 && hk.HotKeys[0].Key == "hot" && hk.HotKeys[0].Level >= 4 && hk.HotKeys[0].Origin == d.ID() && hk.HotKeys[0].ExpiresInMs == 0 && hk.Peers == 0
	})

	_, metrics := get("/metrics")
	if !strings.Contains(metrics, "\nhotkey_peers 0\n") || strings.Contains(metrics, `api="nats"`) {
		t.Errorf("/metrics: want hotkey_peers 0 and no series of api nats")
	}

	stopped = true
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute) // only catches a hang
	defer cancel()
	if err := d.Shutdown(ctx); err != nil {
		t.Errorf("shutdown: %v", err)
	}
}
