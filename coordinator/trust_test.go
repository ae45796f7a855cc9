package coordinator

import (
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/hotkeyd/hotkey/internal/natsserver"
	"github.com/hotkeyd/hotkey/internal/testkit"
	"github.com/hotkeyd/hotkey/shard"
)

// rawConn connects a plain client, as a forger would, closed at cleanup.
func rawConn(t *testing.T, s *natsserver.Server) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(s.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// publishAll publishes each message of msgs on subject and flushes.
func publishAll(t *testing.T, nc *nats.Conn, subject string, msgs ...[]byte) {
	t.Helper()
	for _, m := range msgs {
		if err := nc.Publish(subject, m); err != nil {
			t.Fatal(err)
		}
	}
	if err := nc.FlushTimeout(patience); err != nil {
		t.Fatal(err)
	}
}

// instancesTold returns every instance count r was told, in order.
func instancesTold(r *recorder) []int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.insts)
}

// TestForgedPeers: one connection publishing heartbeats of thousands of
// origins. Origins heard once never count; origins heard twice count up to
// MaxPeers, but the instance count handed to the Handler stays at most
// MaxInstances; once the forger stops, they lapse and the real peer is
// still counted.
func TestForgedPeers(t *testing.T) {
	s := startServer(t, natsserver.Options{})
	clk := testkit.NewClock()
	cfg := onClock(clk, "victim", s.URL())
	c, r := startCoord(t, cfg)
	_, rb := startCoord(t, onClock(clk, "real", s.URL()))
	waitMesh(t, 2, r, rb)
	nc := rawConn(t, s)
	const hb, forged = "hotkey.default.hb", 2000

	// A lease of the forger's after its heartbeats: once it is in force, the
	// heartbeats before it were handled (one publisher, one subscription: in
	// order), and the dispatcher took the live count with it.
	sentinel := func(i int) {
		t.Helper()
		k := "sentinel-" + strconv.Itoa(i)
		publishAll(t, nc, "hotkey.default.lease", encodeLease("forger", k, 4, time.Minute))
		testkit.For(t, patience, "the forger's heartbeats handled", func() bool { return r.level(k) == 4 })
	}

	// Each origin once.
	start := time.Now()
	var once [][]byte
	for i := range forged {
		once = append(once, encodeControl("once-"+strconv.Itoa(i), typeHB))
	}
	publishAll(t, nc, hb, once...)
	sentinel(1)
	st := c.Stats()
	t.Logf("%d origins heard once, handled in %v: instances told %d (max %d), peers %d, heard once %d, rejected %d",
		forged, time.Since(start), r.instances(), slices.Max(instancesTold(r)), st.Peers, st.PendingPeers, st.PeersRejected)
	if r.instances() != 2 || slices.Max(instancesTold(r)) != 2 || st.Peers != 1 {
		t.Errorf("origins heard once counted: instances %d (max %d), peers %d; want 2 and 1",
			r.instances(), slices.Max(instancesTold(r)), st.Peers)
	}
	if st.PendingPeers > DefaultMaxPeers {
		t.Errorf("%d origins heard once kept, cap %d", st.PendingPeers, DefaultMaxPeers)
	}

	// Each origin twice: they count as peers, up to MaxPeers, but the
	// Handler is told at most MaxInstances.
	start = time.Now()
	var twice [][]byte
	for i := range forged {
		m := encodeControl("twice-"+strconv.Itoa(i), typeHB)
		twice = append(twice, m, m)
	}
	publishAll(t, nc, hb, twice...)
	sentinel(2)
	st = c.Stats()
	maxTold := slices.Max(instancesTold(r))
	t.Logf("%d origins heard twice, handled in %v: instances told %d (max %d), peers %d, rejected %d",
		forged, time.Since(start), r.instances(), maxTold, st.Peers, st.PeersRejected)
	if r.instances() != DefaultMaxInstances || maxTold != DefaultMaxInstances || st.Peers != DefaultMaxPeers {
		t.Errorf("instances told %d (max %d), peers %d; want %d, %d, %d",
			r.instances(), maxTold, st.Peers, DefaultMaxInstances, DefaultMaxInstances, DefaultMaxPeers)
	}

	// The forger stops: its origins lapse after the peer timeout, the real
	// peer, heard at every new instant, stays.
	timeout := peerTimeout * cfg.Heartbeat
	moves := 0
	testkit.For(t, patience, "back to 2 instances", func() bool {
		if r.instances() == 2 {
			return true
		}
		clk.Advance(timeout - 1)
		moves++
		now := clk.Now()
		testkit.For(t, patience, "the real peer heard after the clock moved", func() bool { return heardAt(c, "real").Equal(now) })
		return false
	})
	if told := instancesTold(r); slices.Min(told[1:]) < 2 {
		t.Errorf("the real peer stopped counting: instances told %v", told)
	}
	t.Logf("forged peers gone after %d moves of the clock; stats %+v", moves, c.Stats())
}

var (
	testSecret  = []byte("0123456789abcdef-shared-secret!!")
	otherSecret = []byte("another secret, 32 bytes long...")
)

// signedConfig returns clk's config with secret.
func signedConfig(clk *testkit.Clock, id string, secret []byte, urls ...string) spec {
	cfg := onClock(clk, id, urls...)
	cfg.Secret = secret
	return cfg
}

// waitInvalid waits until c counted n invalid messages in all.
func waitInvalid(t *testing.T, c *NATS, n uint64) {
	t.Helper()
	testkit.For(t, patience, strconv.FormatUint(n, 10)+" invalid messages counted", func() bool { return c.Stats().Invalid >= n })
}

// TestSignedForgery: with a secret, forged leases and heartbeats, unsigned
// or signed with another key, are dropped and counted, and change nothing;
// a message signed with the secret is applied.
func TestSignedForgery(t *testing.T) {
	s := startServer(t, natsserver.Options{})
	clk := testkit.NewClock()
	c, r := startCoord(t, signedConfig(clk, "victim", testSecret, s.URL()))
	nc := rawConn(t, s)
	const lease, hb = "hotkey.default.lease", "hotkey.default.hb"
	wrong := &signer{secret: otherSecret, scope: "hotkey.default"}
	right := &signer{secret: testSecret, scope: "hotkey.default"}

	forgedLease := encodeLease("forger", "victim-key", 64, time.Minute)
	publishAll(t, nc, lease,
		forgedLease, // unsigned
		wrong.seal(lease, forgedLease, clk.Now()),               // another key
		right.seal("hotkey.default.hb", forgedLease, clk.Now()), // signed for another subject
		[]byte(`not json`),
	)
	var hbs [][]byte
	for i := range 2000 {
		hbs = append(hbs, encodeControl("forged-"+strconv.Itoa(i), typeHB))
		if i%2 == 0 {
			hbs = append(hbs, hbs[len(hbs)-1]) // twice
		}
	}
	publishAll(t, nc, hb, hbs...)
	const sent = 4 + 3000
	waitInvalid(t, c, sent)
	st := c.Stats()
	want := map[string]uint64{"unsigned": 2 + 3000, "signature": 2}
	if st.Invalid != sent || st.InvalidBy["unsigned"] != want["unsigned"] || st.InvalidBy["signature"] != want["signature"] {
		t.Errorf("invalid %d by reason %v, want %d: %v", st.Invalid, st.InvalidBy, sent, want)
	}
	if r.level("victim-key") != 1 || r.instances() != 1 || st.Peers != 0 || st.PendingPeers != 0 || st.Keys != 0 {
		t.Errorf("forged messages applied: level %d, instances %d, stats %+v", r.level("victim-key"), r.instances(), st)
	}
	t.Logf("forged: level of victim-key %d, instances %d; invalid by reason %v", r.level("victim-key"), r.instances(), st.InvalidBy)

	// Signed with the secret: applied.
	publishAll(t, nc, lease, right.seal(lease, forgedLease, clk.Now()))
	d := testkit.For(t, patience, "a lease signed with the secret applied", func() bool { return r.level("victim-key") == 64 })
	t.Logf("a lease signed with the secret applied in %v", d)
}

// TestSignedReplay: a signed message published again is refused, within
// the clock window as a replay, past it as stale, and on another subject or
// namespace for its signature. A replayed heartbeat of a gone peer does not
// bring it back.
func TestSignedReplay(t *testing.T) {
	s := startServer(t, natsserver.Options{})
	clk := testkit.NewClock()
	// A recorder of a's messages, as anyone allowed to subscribe sees them.
	spy := rawConn(t, s)
	var mu sync.Mutex
	caught := map[string][]byte{} // by type: the last message of a
	if _, err := spy.Subscribe("hotkey.default.*", func(m *nats.Msg) {
		if msg, r := decode(m.Data, testLimits); r == reasonNone && msg.Origin == "a" {
			mu.Lock()
			caught[msg.T] = m.Data
			mu.Unlock()
		}
	}); err != nil {
		t.Fatal(err)
	}
	if err := spy.FlushTimeout(patience); err != nil {
		t.Fatal(err)
	}
	get := func(typ string) []byte {
		mu.Lock()
		defer mu.Unlock()
		return caught[typ]
	}

	cfgB := signedConfig(clk, "b", testSecret, s.URL())
	b, rb := startCoord(t, cfgB)
	a, ra := startCoord(t, signedConfig(clk, "a", testSecret, s.URL()))
	other := signedConfig(clk, "o", testSecret, s.URL())
	other.Namespace = "other"
	o, _ := startCoord(t, other)
	waitMesh(t, 2, ra, rb)
	a.Announce("hot", shard.NameHash("hot"), 64)
	testkit.For(t, patience, "b has a's lease", func() bool { return rb.level("hot") == 64 })
	testkit.For(t, patience, "the spy caught a's lease and heartbeat", func() bool { return get(typeLease) != nil && get(typeHB) != nil })
	leaseMsg, hbMsg := get(typeLease), get(typeHB)
	t.Logf("a signed lease: %s", leaseMsg)

	// a goes; its lease lapses, its peer entry too. First every message a
	// sent is handled by b: the server has seen a's connection close (so it
	// has routed all a sent), and b then counts a marker published after
	// that, on the one subscription that takes a's messages in order. Only
	// then does the clock move past the lease's ttl and the peer timeout,
	// well within MaxClockSkew, so no heartbeat of a handled late can leave
	// a heard once.
	clients := s.Server().NumClients()
	closeCoord(t, a, ra)
	a.nc.Close()
	testkit.For(t, patience, "the server sees a go", func() bool { return s.Server().NumClients() < clients })
	marker := rawConn(t, s)
	inv := b.Stats().Invalid
	publishAll(t, marker, "hotkey.default.hb", []byte("marker"))
	waitInvalid(t, b, inv+1)
	clk.Advance(10 * time.Second)
	testkit.For(t, patience, "b drops a", func() bool {
		st := b.Stats()
		return rb.instances() == 1 && rb.level("hot") == 1 && st.Peers == 0 && st.PendingPeers == 0
	})

	nc := rawConn(t, s)
	base := b.Stats().Invalid
	// Within the window: replays.
	publishAll(t, nc, "hotkey.default.lease", leaseMsg)
	publishAll(t, nc, "hotkey.default.hb", hbMsg, hbMsg)
	// On another subject, or namespace: a bad signature.
	publishAll(t, nc, "hotkey.default.hb", leaseMsg)
	publishAll(t, nc, "hotkey.other.lease", leaseMsg)
	waitInvalid(t, b, base+4)
	waitInvalid(t, o, 1)
	// Past the window: stale.
	clk.Advance(DefaultMaxClockSkew)
	publishAll(t, nc, "hotkey.default.lease", leaseMsg)
	publishAll(t, nc, "hotkey.default.hb", hbMsg)
	waitInvalid(t, b, base+6)

	st := b.Stats()
	t.Logf("b: invalid by reason %v", st.InvalidBy)
	if st.InvalidBy["replay"] != 3 || st.InvalidBy["signature"] != 1 || st.InvalidBy["stale"] != 2 {
		t.Errorf("b: invalid by reason %v, want replay 3, signature 1, stale 2", st.InvalidBy)
	}
	if os := o.Stats(); os.InvalidBy["signature"] != 1 {
		t.Errorf("o (namespace other): invalid by reason %v, want signature 1", os.InvalidBy)
	}
	if rb.level("hot") != 1 || rb.instances() != 1 || st.Peers != 0 || st.PendingPeers != 0 {
		t.Errorf("replays applied: level %d, instances %d, stats %+v", rb.level("hot"), rb.instances(), st)
	}
}

// TestSignedReplayAfterRestart: an instance that starts within the clock
// window of a gone peer's messages refuses them as stale when they are
// replayed, though no replay guard of its own saw them (they are stamped
// before its Start). A peer started after it is heard; a peer whose clock
// is behind its own has its heartbeats and leases refused as stale while
// they are stamped before that Start, but its sync reply, signed for this
// Start's inbox, is applied.
func TestSignedReplayAfterRestart(t *testing.T) {
	s := startServer(t, natsserver.Options{})
	clk := testkit.NewClock()
	spy := rawConn(t, s)
	var mu sync.Mutex
	caught := map[string][]byte{} // by type: the last message of a
	if _, err := spy.Subscribe("hotkey.default.*", func(m *nats.Msg) {
		if msg, r := decode(m.Data, testLimits); r == reasonNone && msg.Origin == "a" {
			mu.Lock()
			caught[msg.T] = m.Data
			mu.Unlock()
		}
	}); err != nil {
		t.Fatal(err)
	}
	if err := spy.FlushTimeout(patience); err != nil {
		t.Fatal(err)
	}
	get := func(typ string) []byte {
		mu.Lock()
		defer mu.Unlock()
		return caught[typ]
	}
	a, ra := startCoord(t, signedConfig(clk, "a", testSecret, s.URL()))
	a.Announce("hot", shard.NameHash("hot"), 64)
	testkit.For(t, patience, "the spy caught a's lease and heartbeat", func() bool { return get(typeLease) != nil && get(typeHB) != nil })
	leaseMsg, hbMsg := get(typeLease), get(typeHB)
	closeCoord(t, a, ra)

	// c's clock is 5 s behind b's, once b starts: well within MaxClockSkew.
	clkC := testkit.NewClock()
	clkC.Set(clk.Now().Add(-4 * time.Second))
	c, rc := startCoord(t, signedConfig(clkC, "c", testSecret, s.URL()))
	c.Announce("warm", shard.NameHash("warm"), 16)
	testkit.For(t, patience, "c applies its own lease", func() bool { return rc.level("warm") == 16 })

	// b starts 1 s after a's messages were stamped: they are fresh.
	clk.Advance(time.Second)
	b, rb := startCoord(t, signedConfig(clk, "b", testSecret, s.URL()))
	testkit.For(t, patience, "b has c's lease by sync", func() bool { return rb.level("warm") == 16 })
	_, rd := startCoord(t, signedConfig(clk, "d", testSecret, s.URL()))
	testkit.For(t, patience, "b hears d", func() bool { return !heardAt(b, "d").IsZero() && rd.instances() >= 2 })

	nc := rawConn(t, s)
	publishAll(t, nc, "hotkey.default.lease", leaseMsg)
	publishAll(t, nc, "hotkey.default.hb", hbMsg, []byte("marker")) // handled after the replays
	testkit.For(t, patience, "b counts the marker", func() bool { return b.Stats().InvalidBy["unsigned"] == 1 })

	st := b.Stats()
	b.mu.Lock()
	_, aPending := b.once["a"]
	_, aLive := b.peers["a"]
	b.mu.Unlock()
	t.Logf("b: level of hot %d, a heard %v/%v, invalid by reason %v, sync replies %d", rb.level("hot"), aPending, aLive, st.InvalidBy, st.SyncReplies)
	if rb.level("hot") != 1 || aPending || aLive {
		t.Errorf("b applied a's replayed messages: level of hot %d, a heard once %v, live %v", rb.level("hot"), aPending, aLive)
	}
	if st.InvalidBy["stale"] < 2 || st.InvalidBy["replay"] != 0 {
		t.Errorf("b: invalid by reason %v, want a's lease and heartbeat (and c's) stale", st.InvalidBy)
	}
	if st.SyncReplies == 0 || !heardAt(b, "c").IsZero() {
		t.Errorf("b: %d sync replies applied, c heard at %v: want c's sync reply applied and its heartbeats, stamped before b's Start, not", st.SyncReplies, heardAt(b, "c"))
	}
}

// TestSignedPeers: instances with the same secret converge, join sync
// included, with sync replies split to fit a small MaxMessage; one with
// another secret is ignored and ignores them; one without a secret accepts
// their messages (it ignores the fields it does not know) while they drop
// its.
func TestSignedPeers(t *testing.T) {
	s := startServer(t, natsserver.Options{})
	clk := testkit.NewClock()
	cfg := func(id string, secret []byte) spec {
		c := signedConfig(clk, id, secret, s.URL())
		c.MaxKeyLen = 64
		c.MaxMessage = minMessage(c.MaxKeyLen, true)
		return c
	}
	a, ra := startCoord(t, cfg("a", testSecret))
	want := announceKeys(t, a, ra, "signed-", 100)
	b, rb := startCoord(t, cfg("b", testSecret))
	c, rc := startCoord(t, cfg("c", otherSecret))
	d, rd := startCoord(t, cfg("d", nil))

	start := time.Now()
	testkit.For(t, patience, "b has a's keys", func() bool { return rb.has(want) })
	waitMesh(t, 2, ra, rb)
	t.Logf("a and b (same secret) converged in %v: b got %d sync replies", time.Since(start), b.Stats().SyncReplies)
	testkit.For(t, patience, "d has a's keys", func() bool { return rd.has(want) })
	waitMesh(t, 4, rd)
	c.Announce("from-c", shard.NameHash("from-c"), 64)
	d.Announce("from-d", shard.NameHash("from-d"), 64)
	// c's messages reach a and b, and theirs c, all refused.
	testkit.For(t, patience, "c's heartbeats refused by a and b", func() bool {
		return a.Stats().InvalidBy["signature"] >= 2 && b.Stats().InvalidBy["signature"] >= 2 && c.Stats().InvalidBy["signature"] >= 2
	})
	testkit.For(t, patience, "d's heartbeats refused by a and b", func() bool {
		return a.Stats().InvalidBy["unsigned"] >= 2 && b.Stats().InvalidBy["unsigned"] >= 2
	})
	testkit.For(t, patience, "d has c's key", func() bool { return rd.level("from-c") == 64 })
	for _, x := range []struct {
		name         string
		r            *recorder
		st           Stats
		fromC, fromD shard.Level // levels wanted
	}{{"a", ra, a.Stats(), 1, 1}, {"b", rb, b.Stats(), 1, 1}, {"c", rc, c.Stats(), 64, 1}} {
		t.Logf("%s: instances %d, invalid by reason %v", x.name, x.r.instances(), x.st.InvalidBy)
		if x.r.level("from-c") != x.fromC || x.r.level("from-d") != x.fromD {
			t.Errorf("%s: from-c at %d, from-d at %d; want %d, %d", x.name, x.r.level("from-c"), x.r.level("from-d"), x.fromC, x.fromD)
		}
	}
	if ra.instances() != 2 || rb.instances() != 2 || rc.instances() != 1 {
		t.Errorf("instances: a %d, b %d, c %d; want 2, 2, 1", ra.instances(), rb.instances(), rc.instances())
	}
	if rc.has(map[string]shard.Level{"signed-1": 16}) {
		t.Error("c applied a's lease")
	}
	if st := b.Stats(); st.SyncReplies < 2 || st.InvalidBy["stale"]+st.InvalidBy["replay"] != 0 {
		t.Errorf("b: %d sync replies (want them split), stats %+v", st.SyncReplies, st)
	}
}

// TestPermissionsExample runs the NATS permissions of docs/operations.md:
// instances logged in as "hotkey" coordinate, join sync included, and a
// client logged in as "gateway" can neither publish nor subscribe on the
// coordination subjects.
func TestPermissionsExample(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join("..", "docs", "operations.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, conf, ok := strings.Cut(string(doc), "```\nauthorization {")
	conf, _, ok2 := strings.Cut(conf, "```")
	if !ok || !ok2 {
		t.Fatal("docs/operations.md has no authorization block")
	}
	file := filepath.Join(t.TempDir(), "nats.conf")
	if err := os.WriteFile(file, []byte("authorization {"+conf), 0o600); err != nil {
		t.Fatal(err)
	}
	parsed, err := server.ProcessConfigFile(file)
	if err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	s := startServer(t, natsserver.Options{Configure: func(o *server.Options) {
		o.Users = parsed.Users
	}})
	clk := testkit.NewClock()
	instance := func(id string) spec {
		cfg := onClock(clk, id, s.URL())
		cfg.dialOpts = []nats.Option{nats.UserInfo("hotkey", "instances-password")}
		return cfg
	}
	a, ra := startCoord(t, instance("a"))
	a.Announce("allowed", shard.NameHash("allowed"), 16)
	testkit.For(t, patience, "a applies its own", func() bool { return ra.level("allowed") == 16 })
	b, rb := startCoord(t, instance("b"))
	waitMesh(t, 2, ra, rb)
	testkit.For(t, patience, "b has a's key", func() bool { return rb.level("allowed") == 16 })
	if st := b.Stats(); st.SyncReplies == 0 {
		t.Errorf("b got no sync reply through the permissions: %+v", st)
	}

	errs := make(chan error, 10)
	gw, err := nats.Connect(s.URL(), nats.UserInfo("gateway", "clients-password"),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { errs <- err }))
	if err != nil {
		t.Fatal(err)
	}
	defer gw.Close()
	forged := [][2]string{
		{"hotkey.default.hb", string(encodeControl("forged", typeHB))},
		{"hotkey.default.lease", string(encodeLease("forged", "forced", 64, time.Minute))},
	}
	for _, f := range forged {
		if err := gw.Publish(f[0], []byte(f[1])); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := gw.SubscribeSync("hotkey.default.*"); err != nil {
		t.Fatal(err)
	}
	if err := gw.FlushTimeout(patience); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		select {
		case err := <-errs:
			if !strings.Contains(strings.ToLower(err.Error()), "permissions violation") {
				t.Errorf("gateway: %v", err)
			}
			t.Logf("gateway: %v", err)
		case <-time.After(patience):
			t.Fatal("the server did not refuse the gateway's publishes and subscription")
		}
	}
	if st := a.Stats(); st.Invalid != 0 || ra.level("forced") != 1 || ra.instances() != 2 {
		t.Errorf("a: forced at %d, instances %d, stats %+v", ra.level("forced"), ra.instances(), st)
	}
}
