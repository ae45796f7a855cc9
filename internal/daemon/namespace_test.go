package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/hotkeyd/hotkey/coordinator"
	"github.com/hotkeyd/hotkey/internal/namespace"
	"github.com/hotkeyd/hotkey/internal/natsserver"
	"github.com/hotkeyd/hotkey/internal/testkit"
)

// TestNamespaceNames: the default namespace keeps the subjects and names of
// a daemon without --namespace; another has its own.
func TestNamespaceNames(t *testing.T) {
	for _, c := range []struct {
		give                          string
		subject, service, inbox, gwIn string
	}{
		{"default", "hotkey.allow", "hotkey", "", "_HOTKEYD_INBOX"},
		{"staging", "hotkey.staging.api.allow", "hotkey-staging", "_HOTKEYD_INBOX.staging", "_HOTKEYD_INBOX.staging"},
	} {
		if s, n, in, gw := namespace.AllowSubject(c.give), serviceName(c.give), inboxPrefix(c.give, false), inboxPrefix(c.give, true); s != c.subject || n != c.service || in != c.inbox || gw != c.gwIn {
			t.Errorf("%s: subject %q, service %q, inbox %q (%q with a client user); want %q, %q, %q (%q)", c.give, s, n, in, gw, c.subject, c.service, c.inbox, c.gwIn)
		}
		if p := clientPermissions(c.give).Publish.Allow; !slices.Equal(p, []string{c.subject}) {
			t.Errorf("%s: the client user may publish on %q, want only %q", c.give, p, c.subject)
		}
	}
}

// namespaceArgs are the flags that put a daemon in namespace ns.
func namespaceArgs(ns string) []string { return []string{"--namespace", ns} }

// fleetSubject is the subject d decides on.
func fleetSubject(d *Daemon) string { return namespace.AllowSubject(d.cfg.Namespace) }

// coordNamespace is the coordinator's namespace of d.
func coordNamespace(d *Daemon) string { return d.cfg.Namespace }

// TestNamespacesApart: two fleets of two daemons, namespaces a and b, on
// one NATS server. Each daemon counts only its fleet's other daemon as a
// peer, a key hot in one fleet is split in that fleet only, and a decision
// asked on a fleet's subject is answered by that fleet's daemons only, under
// its policies: b_only, a policy of fleet b, is unknown on a's subject.
func TestNamespacesApart(t *testing.T) {
	ns, err := natsserver.Start(natsserver.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Shutdown()
	dir := t.TempDir()
	const policyA = "policies:\n  default:\n    algorithm: token_bucket\n    limit: 100\n    period: 1s\n"
	const policyB = policyA + "  b_only:\n    algorithm: token_bucket\n    limit: 100\n    period: 1s\n"
	watch, err := ns.Connect()
	if err != nil {
		t.Fatal(err)
	}
	defer watch.Close()
	var mu sync.Mutex
	beats := make(map[string]int) // guarded by mu: heartbeats by origin
	if _, err := watch.Subscribe("hotkey.*.hb", func(m *nats.Msg) {
		var hb struct{ Origin string }
		if json.Unmarshal(m.Data, &hb) == nil {
			mu.Lock()
			beats[hb.Origin]++
			mu.Unlock()
		}
	}); err != nil {
		t.Fatal(err)
	}
	if err := watch.Flush(); err != nil {
		t.Fatal(err)
	}
	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()
	hotKeys := func(d *Daemon) HotKeys {
		t.Helper()
		resp, err := client.Get("http://" + d.AdminAddr() + "/v1/hotkeys")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var hk HotKeys
		if err := json.NewDecoder(resp.Body).Decode(&hk); err != nil {
			t.Fatal(err)
		}
		return hk
	}
	fleet := func(name, policies string) [2]*Daemon {
		file := filepath.Join(dir, name+".yaml")
		if err := os.WriteFile(file, []byte(policies), 0o600); err != nil {
			t.Fatal(err)
		}
		var f [2]*Daemon
		for i := range f {
			args := append([]string{"--listen", "127.0.0.1:0", "--nats", ns.URL(), "--policies", file, "--hot-threshold", "50", "--reload-interval", "0"}, namespaceArgs(name)...)
			if f[i], err = StartArgs(context.Background(), args...); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { shutdown(t, f[i]) })
		}
		testkit.For(t, testkit.Patience, "fleet "+name+"'s daemons to see each other", func() bool {
			return hotKeys(f[0]).Peers >= 1 && hotKeys(f[1]).Peers >= 1
		})
		return f
	}
	b := fleet("b", policyB)
	a := fleet("a", policyA)

	// a counts a new origin once two of its heartbeats came within three
	// intervals: three more of each of b's, heard here, leave it no excuse.
	mu.Lock()
	seen := [2]int{beats[b[0].ID()], beats[b[1].ID()]}
	mu.Unlock()
	testkit.For(t, testkit.Patience, "three more heartbeats of each of b's daemons", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return beats[b[0].ID()] >= seen[0]+3 && beats[b[1].ID()] >= seen[1]+3
	})
	for _, d := range []*Daemon{a[0], a[1], b[0], b[1]} {
		if p := hotKeys(d).Peers; p != 1 {
			t.Errorf("daemon %s counts %d peers, want 1 (its fleet's other daemon)", d.ID(), p)
		}
	}

	// A hot key announced in a fleet's namespace is split by its daemons
	// only. The announcers count as instances: peers were checked above.
	announce := func(f [2]*Daemon, key string) {
		wc, err := ns.Connect()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(wc.Close)
		c, err := coordinator.NewNATS(wc, coordinator.Config{ID: "announcer-" + key, Namespace: coordNamespace(f[0])})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		if err := c.Start(nopHandler{}); err != nil {
			t.Fatal(err)
		}
		c.Announce("default|"+key, 0, 4) // the counter name, policy|key
		testkit.For(t, testkit.Patience, key+" split on both daemons of its fleet", func() bool {
			has := func(d *Daemon) bool {
				return slices.ContainsFunc(hotKeys(d).HotKeys, func(h HotKey) bool { return h.Key == key })
			}
			return has(f[0]) && has(f[1])
		})
	}
	announce(b, "hot-in-b")
	announce(a, "hot-in-a") // after b's lease, on the same server: a has it if it ever will
	for _, c := range []struct {
		d    *Daemon
		want string
	}{{a[0], "hot-in-a"}, {a[1], "hot-in-a"}, {b[0], "hot-in-b"}, {b[1], "hot-in-b"}} {
		var keys []string
		for _, h := range hotKeys(c.d).HotKeys {
			keys = append(keys, h.Key)
		}
		if !slices.Equal(keys, []string{c.want}) {
			t.Errorf("daemon %s splits %q, want only %q", c.d.ID(), keys, c.want)
		}
	}

	// Decisions: b_only is unknown on a's subject, known on b's.
	nc, err := ns.Connect()
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	ask := func(subject string) (unknown, allowed int) {
		for range 10 {
			m, err := nc.Request(subject, []byte(`{"policy":"b_only","key":"k"}`), time.Minute)
			switch {
			case err != nil:
				t.Fatalf("%s: %v", subject, err)
			case m.Header.Get(micro.ErrorCodeHeader) == "404":
				unknown++
			case strings.Contains(string(m.Data), `"allowed":true`):
				allowed++
			}
		}
		return unknown, allowed
	}
	if u, ok := ask(fleetSubject(a[0])); u != 10 || ok != 0 {
		t.Errorf("b_only on a's subject: %d of 10 unknown, %d allowed; want 10 unknown (only a answers)", u, ok)
	}
	if u, ok := ask(fleetSubject(b[0])); u != 0 || ok != 10 {
		t.Errorf("b_only on b's subject: %d of 10 unknown, %d allowed; want 10 allowed", u, ok)
	}
	if _, err := nc.Request(namespace.AllowSubject("default"), []byte(`{"key":"k"}`), time.Minute); !errors.Is(err, nats.ErrNoResponders) {
		t.Errorf("a request on the default namespace's subject: %v, want no responders", err)
	}
	m, err := nc.Request("$SRV.INFO.hotkey-a", nil, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	var info micro.Info
	if err := json.Unmarshal(m.Data, &info); err != nil || info.Name != "hotkey-a" || info.Metadata["namespace"] != "a" ||
		len(info.Endpoints) != 1 || info.Endpoints[0].Subject != "hotkey.a.api.allow" {
		t.Errorf("$SRV.INFO.hotkey-a: %s %v", m.Data, err)
	}
}

// TestNamespaceClientUser: the embedded server's client user may ask for
// decisions on its daemons' namespace's subject only.
func TestNamespaceClientUser(t *testing.T) {
	d, err := StartArgs(context.Background(), "--listen", "127.0.0.1:0", "--nats-listen", "127.0.0.1:0", "--namespace", "tenant-1",
		"--nats-user", "hotkey", "--nats-password", "daemons-password", "--nats-client-user", "gateway", "--nats-client-password", "clients-password")
	if err != nil {
		t.Fatal(err)
	}
	defer shutdown(t, d)
	violations := make(chan error, 4)
	nc, err := nats.Connect(d.NATSURL(), nats.UserInfo("gateway", "clients-password"), nats.MaxReconnects(0),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { violations <- err }))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if m, err := nc.Request("hotkey.tenant-1.api.allow", []byte(`{"key":"k"}`), time.Minute); err != nil || !strings.Contains(string(m.Data), `"allowed":true`) {
		t.Fatalf("a request on the namespace's subject: %v %v", m, err)
	}
	for _, subject := range []string{"hotkey.allow", "hotkey.other.api.allow"} {
		if err := nc.Publish(subject, []byte(`{"key":"k"}`)); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-violations:
			if !strings.Contains(err.Error(), "Permissions Violation for Publish to \""+subject+"\"") {
				t.Errorf("publish on %s: %v, want a permissions violation", subject, err)
			}
		case <-time.After(testkit.Patience):
			t.Errorf("publish on %s: no permissions violation", subject)
		}
	}
}
