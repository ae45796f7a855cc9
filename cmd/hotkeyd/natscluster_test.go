package main

import (
	"fmt"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/hotkeyd/hotkey/internal/natsserver"
	"github.com/hotkeyd/hotkey/internal/testkit"
)

// freeAddrOn returns an address on host whose port was free a moment ago.
func freeAddrOn(t *testing.T, host string) string {
	t.Helper()
	l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// TestEmbeddedNATSCluster: two daemons on different loopback addresses
// form one NATS cluster from their own embedded servers (routes with
// auth), with no nats-server of their own. A client without credentials
// is refused by either; a key hot on one is split on both; the password
// is in neither log.
func TestEmbeddedNATSCluster(t *testing.T) {
	t.Parallel()
	const password, clientPassword = "s3cret-route-pw", "gateway-pw"
	hosts := []string{"127.0.0.1", "127.0.0.2"}
	if l, err := net.Listen("tcp", "127.0.0.2:0"); err != nil {
		t.Skipf("no 127.0.0.2 on this host (%v): Linux routes all of 127/8 to loopback, others may not", err)
	} else {
		l.Close()
	}
	var clients, routes [2]string
	for i, h := range hosts {
		clients[i], routes[i] = freeAddrOn(t, h), freeAddrOn(t, h)
	}
	var d [2]*proc
	for i := range d {
		d[i] = startDaemon(t, daemonOpts{
			args: []string{
				"--nats-listen", clients[i], // wins over startDaemon's own
				"--nats-cluster-listen", routes[i],
				"--nats-routes", routes[1-i],
				"--nats-user", "hotkey",
				"--nats-client-user", "gateway",
				"--hot-threshold", "100",
			},
			env: []string{"HOTKEYD_NATS_PASSWORD=" + password, "HOTKEYD_NATS_CLIENT_PASSWORD=" + clientPassword},
		})
	}
	testkit.For(t, time.Minute, "each daemon to see the other as a peer", func() bool {
		return d[0].hotKeys(t).Peers == 1 && d[1].hotKeys(t).Peers == 1
	})

	for i, addr := range clients {
		if nc, err := nats.Connect("nats://"+addr, nats.MaxReconnects(0)); err == nil {
			nc.Close()
			t.Errorf("daemon %d's NATS server let in a client without credentials", i)
		} else if !strings.Contains(strings.ToLower(err.Error()), "authorization") {
			t.Errorf("daemon %d's NATS server refused a client without credentials with %v, want an authorization error", i, err)
		}
	}
	// An API client logs in as the client user: it gets decisions, from
	// either daemon, and may not publish or subscribe on the daemons'
	// coordination subjects.
	violations := make(chan error, 4)
	nc, err := nats.Connect("nats://"+clients[1], nats.UserInfo("gateway", clientPassword), nats.MaxReconnects(0),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { violations <- err }))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if m, err := nc.Request("hotkey.allow", []byte(`{"key":"over-nats"}`), 30*time.Second); err != nil || !strings.Contains(string(m.Data), `"allowed":true`) {
		t.Errorf("a decision over the clustered NATS: %v %v", m, err)
	}
	for _, try := range []struct {
		what string
		do   func() error
	}{
		{"publish a lease", func() error { return nc.Publish("hotkey.default.lease", []byte(`{}`)) }},
		{"subscribe to the leases", func() error { _, err := nc.Subscribe("hotkey.default.*", func(*nats.Msg) {}); return err }},
	} {
		if err := try.do(); err != nil {
			t.Fatal(err)
		}
		nc.Flush()
		select {
		case err := <-violations:
			if !strings.Contains(strings.ToLower(err.Error()), "permissions violation") {
				t.Errorf("the client user's try to %s: %v, want a permissions violation", try.what, err)
			}
		case <-time.After(30 * time.Second):
			t.Errorf("the client user's try to %s: no permissions violation", try.what)
		}
	}

	// Nor may it have the daemons answer on its behalf outside the clients'
	// inboxes: a request whose reply subject is elsewhere is dropped, where
	// one whose reply is an inbox is answered.
	daemonUser, err := nats.Connect("nats://"+clients[0], nats.UserInfo("hotkey", password), nats.MaxReconnects(0))
	if err != nil {
		t.Fatal(err)
	}
	defer daemonUser.Close()
	elsewhere, err := daemonUser.SubscribeSync("not.an.inbox")
	if err != nil {
		t.Fatal(err)
	}
	daemonUser.Flush()
	inbox := nc.NewInbox()
	answered, err := nc.SubscribeSync(inbox)
	if err != nil {
		t.Fatal(err)
	}
	for _, reply := range []string{"not.an.inbox", inbox} {
		if err := nc.PublishRequest("hotkey.allow", reply, []byte(`{"key":"reply-to"}`)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := answered.NextMsg(30 * time.Second); err != nil {
		t.Errorf("a request answered in the client's inbox: %v", err)
	}
	if m, err := elsewhere.NextMsg(500 * time.Millisecond); err == nil {
		t.Errorf("the daemon answered the client user on %s: %s", m.Subject, m.Data)
	}

	// A key hot on the first daemon is split on both.
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := doErr(t.Context(), "POST", d[0].base+"/v1/allow", `{"key":"hot"}`); err != nil {
				return
			}
		}
	}()
	level := func(p *proc) int {
		for _, k := range p.hotKeys(t).HotKeys {
			if k.Key == "hot" {
				return k.Level
			}
		}
		return 1
	}
	testkit.For(t, time.Minute, "the hot key split on both daemons", func() bool {
		return level(d[0]) >= 4 && level(d[1]) >= 4
	})
	close(stop)
	<-done

	for i, p := range d {
		if log := p.stderr.String(); strings.Contains(log, password) || strings.Contains(log, clientPassword) {
			t.Errorf("daemon %d logged a NATS password:\n%s", i, log)
		}
		if log := p.stderr.String(); !strings.Contains(log, fmt.Sprintf("cluster hotkey on %s", routes[i])) {
			t.Errorf("daemon %d's serving line does not name its cluster address %s:\n%s", i, routes[i], log)
		}
	}
}

// TestNATSURLPasswordNotLogged: a daemon that joins NATS with a password
// or a token in --nats does not log either.
func TestNATSURLPasswordNotLogged(t *testing.T) {
	t.Parallel()
	const password = "pw-in-the-url"
	a := startDaemon(t, daemonOpts{args: []string{"--nats-user", "hotkey", "--nats-password", password}})
	b := startDaemon(t, daemonOpts{join: "nats://hotkey:" + password + "@" + strings.TrimPrefix(a.natsURL, "nats://")})
	if log := b.stderr.String(); strings.Contains(log, password) || !strings.Contains(log, "nats://hotkey:xxxxx@") {
		t.Errorf("the log of a daemon joining with a password in the URL:\n%s", log)
	}
	const token = "token-in-the-url"
	c := startDaemon(t, daemonOpts{args: []string{"--nats-token", token}})
	e := startDaemon(t, daemonOpts{join: "nats://" + token + "@" + strings.TrimPrefix(c.natsURL, "nats://")})
	if log := e.stderr.String(); strings.Contains(log, token) || !strings.Contains(log, "nats://xxxxx@") {
		t.Errorf("the log of a daemon joining with a token in the URL:\n%s", log)
	}
}

// TestMemoryStoreSharedNATSWarns: daemons on memory counters that share
// NATS each admit a key's limit on their own; the one that joins says so
// at start, and /readyz warns on both once they see each other.
func TestMemoryStoreSharedNATSWarns(t *testing.T) {
	t.Parallel()
	a := startDaemon(t, daemonOpts{})
	if strings.Contains(a.stderr.String(), "counters are in memory") {
		t.Errorf("a lone daemon on loopback NATS warned of shared memory counters:\n%s", a.stderr)
	}
	b := startDaemon(t, daemonOpts{join: a.natsURL})
	if !strings.Contains(b.stderr.String(), "counters are in memory, yet other daemons may share this NATS") {
		t.Errorf("a daemon joining NATS on memory counters did not warn:\n%s", b.stderr)
	}
	for _, p := range []*proc{a, b} {
		testkit.For(t, time.Minute, "/readyz to warn of 2 daemons on memory counters", func() bool {
			r := do(t, "GET", p.base+"/readyz", "")
			return r.status == 200 && strings.Contains(string(r.body), `"warnings":["2 daemons share NATS but each keeps the counters of policy default in memory`)
		})
	}
}

// TestStartWithNATSDown: a daemon told to join a NATS that is not up yet
// starts, decides alone and reports degraded; once the server is up it
// connects, serves hotkey.allow, and coordinates with another daemon.
func TestStartWithNATSDown(t *testing.T) {
	t.Parallel()
	addr := freeAddr(t)
	d := startDaemon(t, daemonOpts{join: "nats://" + addr})
	if !strings.Contains(d.stderr.String(), "cannot reach NATS yet") {
		t.Errorf("no warning of NATS down at start:\n%s", d.stderr)
	}
	if r := do(t, "GET", d.base+"/readyz", ""); r.status != 200 || !strings.Contains(string(r.body), `"status":"degraded"`) || !strings.Contains(string(r.body), "NATS connection") {
		t.Errorf("/readyz with NATS down: %d %s, want 200 degraded naming NATS", r.status, r.body)
	}
	if r := do(t, "GET", d.base+"/readyz?strict=true", ""); r.status != 503 || !strings.Contains(string(r.body), "NATS connection") {
		t.Errorf("/readyz?strict=true with NATS down: %d %s, want 503 naming NATS", r.status, r.body)
	}
	if r := d.allow(t, `{"key":"alone"}`); r.status != 200 {
		t.Errorf("a decision with NATS down: %d %s", r.status, r.body)
	}

	host, port, _ := net.SplitHostPort(addr)
	p, _ := strconv.Atoi(port)
	ns, err := natsserver.Start(natsserver.Options{Configure: func(o *server.Options) { o.Host, o.Port = host, p }})
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Shutdown()
	testkit.For(t, time.Minute, "/readyz?strict=true 200 once NATS is up", func() bool {
		return do(t, "GET", d.base+"/readyz?strict=true", "").status == 200
	})
	nc, err := nats.Connect("nats://"+addr, nats.MaxReconnects(0))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if m, err := nc.Request("hotkey.allow", []byte(`{"key":"late"}`), 30*time.Second); err != nil || !strings.Contains(string(m.Data), `"allowed":true`) {
		t.Errorf("a decision over NATS once up: %v %v", m, err)
	}
	other := startDaemon(t, daemonOpts{join: "nats://" + addr})
	testkit.For(t, time.Minute, "the two daemons to see each other", func() bool {
		return d.hotKeys(t).Peers == 1 && other.hotKeys(t).Peers == 1
	})
}
