package daemon

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hotkeyd/hotkey/internal/testkit"
)

// gossipSent returns the messages d's engine flushed for its peers
// (hotkey_gossip_sent_messages_total), read off its registry, so also
// after Shutdown; -1 before its first sync: gossip decision.
func gossipSent(t *testing.T, d *Daemon) float64 {
	t.Helper()
	mfs, err := d.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "hotkey_gossip_sent_messages_total" {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	return -1
}

// TestGossipIntervalFlag: --gossip-interval reaches the engine. At 1m, a
// daemon on NATS sends no round of a sync: gossip decision for a second
// (ten rounds at the default 100 ms), and sends it, whole, at Shutdown.
// The round's timer is the engine's own, not a clock a test can advance,
// so the second is waited for.
func TestGossipIntervalFlag(t *testing.T) {
	policies := filepath.Join(t.TempDir(), "p.yaml")
	writeTestFile(t, policies, "policies:\n  g:\n    limit: 5\n    period: 1m\n    sync: gossip\n")
	d, err := StartArgs(context.Background(), "--listen", "127.0.0.1:0", "--nats-listen", "127.0.0.1:0", "--policies", policies, "--reload-interval", "0",
		"--gossip-interval", "1m")
	if err != nil {
		t.Fatal(err)
	}
	if code := allow(t, d, `{"policy":"g","key":"k"}`); code != 200 {
		shutdown(t, d)
		t.Fatalf("allow: HTTP %d, want 200", code)
	}
	const wait = time.Second
	time.Sleep(wait)
	if n := gossipSent(t, d); n != 0 {
		t.Errorf("--gossip-interval 1m: %v messages sent within %v of a decision, want 0 until the minute is up", n, wait)
	}
	shutdown(t, d)
	if n := gossipSent(t, d); n != 1 {
		t.Errorf("at Shutdown: %v messages sent, want 1, the round of the decision", n)
	}
}

// TestGossipUnsignedWarn: a daemon deciding sync: gossip policies over NATS
// without --nats-secret-file warns at start, naming the risk and the flag;
// with a secret, with no gossip policy or with --nats none it does not.
func TestGossipUnsignedWarn(t *testing.T) {
	const warning = "anyone who can publish on NATS"
	dir := t.TempDir()
	gossipPolicies := filepath.Join(dir, "gossip.yaml")
	writeTestFile(t, gossipPolicies, "policies:\n  g:\n    limit: 5\n    period: 1m\n    sync: gossip\n")
	storePolicies := filepath.Join(dir, "store.yaml")
	writeTestFile(t, storePolicies, "policies:\n  s:\n    limit: 5\n    period: 1m\n")
	secret := filepath.Join(dir, "secret")
	if err := os.WriteFile(secret, []byte("0123456789abcdef0123456789abcdef\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		give []string
		want bool // warned
	}{
		{"gossip unsigned", []string{"--nats-listen", "127.0.0.1:0", "--policies", gossipPolicies}, true},
		{"gossip signed", []string{"--nats-listen", "127.0.0.1:0", "--policies", gossipPolicies, "--nats-secret-file", secret}, false},
		{"no gossip", []string{"--nats-listen", "127.0.0.1:0", "--policies", storePolicies}, false},
		{"no NATS", []string{"--nats", "none", "--policies", gossipPolicies}, false},
	} {
		var logs testkit.Buffer
		d, err := startLogged(t, &logs, nil, append([]string{"--reload-interval", "0"}, c.give...)...)
		if err != nil {
			t.Fatal(err)
		}
		shutdown(t, d)
		out := logs.String()
		if got := strings.Contains(out, warning); got != c.want {
			t.Errorf("%s: warned %v, want %v; log:\n%s", c.name, got, c.want, out)
		} else if got && (!strings.Contains(out, "level=WARN") || !strings.Contains(out, "--nats-secret-file (HOTKEYD_NATS_SECRET_FILE)") || !strings.Contains(out, "policies=g")) {
			t.Errorf("%s: the warning must be a WARN naming the flag and the policies; log:\n%s", c.name, out)
		}
	}
}
