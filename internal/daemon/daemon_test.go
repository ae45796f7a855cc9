package daemon

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/goleak"

	"github.com/hotkeyd/hotkey/internal/testkit"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// TestInProcess runs a daemon in this process (memory store, embedded
// NATS on kernel-chosen ports), asks it over HTTP and NATS, shuts it down,
// and checks (goleak, in TestMain) that nothing it started is left running.
func TestInProcess(t *testing.T) {
	var logs testkit.Buffer
	d, err := startLogged(t, &logs, nil, "--nats-listen", "127.0.0.1:0", "--hot-threshold", "50")
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute) // only catches a hang
		defer cancel()
		if err := d.Shutdown(ctx); err != nil {
			t.Errorf("shutdown: %v", err)
		}
	}()
	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()

	resp, err := client.Post("http://"+d.Addr()+"/v1/allow", "application/json", strings.NewReader(`{"key":"k"}`))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(body), `"allowed":true,"limit":100,"remaining":99`) {
		t.Fatalf("allow: %d %s", resp.StatusCode, body)
	}

	nc, err := nats.Connect(d.NATSURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	msg, err := nc.Request("hotkey.allow", []byte(`{"key":"k","cost":2}`), 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var ar AllowResponse
	if err := json.Unmarshal(msg.Data, &ar); err != nil || !ar.Allowed || ar.Remaining < 97 || ar.Remaining > 98 {
		t.Fatalf("NATS allow: %s %v", msg.Data, err)
	}
	msg, err = nc.Request("hotkey.allow", []byte(`{"key":"k","policy":"nope"}`), 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if code := msg.Header.Get("Nats-Service-Error-Code"); code != "404" {
		t.Fatalf("unknown policy over NATS: code %q, %s", code, msg.Data)
	}

	// A key driven hot is listed by /v1/hotkeys, with this daemon as origin.
	deadline := time.Now().Add(time.Minute)
	for {
		for i := 0; i < 100; i++ {
			if _, err := nc.Request("hotkey.allow", []byte(`{"key":"hot"}`), 30*time.Second); err != nil {
				t.Fatal(err)
			}
		}
		resp, err := client.Get("http://" + d.AdminAddr() + "/v1/hotkeys")
		if err != nil {
			t.Fatal(err)
		}
		var hk HotKeys
		err = json.NewDecoder(resp.Body).Decode(&hk)
		resp.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		if len(hk.HotKeys) == 1 && hk.HotKeys[0].Policy == "default" && hk.HotKeys[0].Key == "hot" && hk.HotKeys[0].Origin == d.ID() && hk.HotKeys[0].Level >= 4 && hk.Peers == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/v1/hotkeys: %+v", hk)
		}
	}
}

// TestClusterListenWarn: a route port on loopback without credentials is
// let through with a warning that names the flags to add; with them, there
// is no warning.
func TestClusterListenWarn(t *testing.T) {
	const warning = "accepts routes without authentication"
	for _, c := range []struct {
		give []string
		want bool // warned
	}{
		{[]string{"--nats-cluster-listen", "127.0.0.1:0"}, true},
		{[]string{"--nats-cluster-listen", "127.0.0.1:0", "--nats-token", "s3cret-token"}, false},
	} {
		var logs testkit.Buffer
		d, err := startLogged(t, &logs, nil, append([]string{"--nats-listen", "127.0.0.1:0"}, c.give...)...)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute) // only catches a hang
		if err := d.Shutdown(ctx); err != nil {
			t.Errorf("shutdown: %v", err)
		}
		cancel()
		out := logs.String()
		if got := strings.Contains(out, warning); got != c.want {
			t.Errorf("%v: warned %v, want %v; log:\n%s", c.give, got, c.want, out)
		} else if got && (!strings.Contains(out, "level=WARN") || !strings.Contains(out, "--nats-token (HOTKEYD_NATS_TOKEN)") || !strings.Contains(out, "cluster=127.0.0.1:")) {
			t.Errorf("%v: the warning must be a WARN naming the flags to add and the route address; log:\n%s", c.give, out)
		}
		if strings.Contains(out, "s3cret-token") {
			t.Errorf("%v: the token is in the log", c.give)
		}
	}
}

// TestSecretFile: --nats-secret-file must name a readable file of at least
// 16 bytes; with it, the daemon's coordinator drops unsigned messages.
func TestSecretFile(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	start := func(file string) (*Daemon, error) {
		return startLogged(t, nil, nil, "--nats-listen", "127.0.0.1:0", "--nats-secret-file", file)
	}
	for _, bad := range []struct{ file, msg string }{
		{filepath.Join(dir, "missing"), "no such file"},
		{write("short", "  too-short \n"), "9 bytes, want at least 16"},
	} {
		if _, err := start(bad.file); err == nil || !strings.Contains(err.Error(), "--nats-secret-file (HOTKEYD_NATS_SECRET_FILE)") || !strings.Contains(err.Error(), bad.msg) {
			t.Errorf("%s: %v", bad.file, err)
		}
	}

	d, err := start(write("secret", "0123456789abcdef0123456789abcdef\n"))
	if err != nil {
		t.Fatal(err)
	}
	defer shutdown(t, d)
	nc, err := nats.Connect(d.NATSURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if err := nc.Publish("hotkey.default.hb", []byte(`{"v":1,"t":"hb","origin":"forged"}`)); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for d.coord.Stats().InvalidBy["unsigned"] == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("unsigned heartbeat not refused: %+v", d.coord.Stats())
		}
		time.Sleep(5 * time.Millisecond)
	}
}
