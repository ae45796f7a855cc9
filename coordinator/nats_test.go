package coordinator

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/hotkeyd/hotkey/internal/natsserver"
	"github.com/hotkeyd/hotkey/internal/testkit"
	"github.com/hotkeyd/hotkey/shard"
)

var levels = []shard.Level{4, 16, 64}

// waitMesh waits until every recorder counts n instances: each has heard
// the others' heartbeats, so their subscriptions (one per coordinator, for
// leases, heartbeats and sync alike) have spread to every server.
func waitMesh(t *testing.T, n int, rs ...*recorder) time.Duration {
	t.Helper()
	return testkit.For(t, patience, fmt.Sprintf("%d instances seen", n), func() bool {
		for _, r := range rs {
			if r.instances() != n {
				return false
			}
		}
		return true
	})
}

// TestConvergence: 200 hot keys announced from random instances of a
// 3-node cluster reach every instance, at the highest level announced.
func TestConvergence(t *testing.T) {
	cl := startCluster(t, 3)
	cs := make([]*NATS, 3)
	rs := make([]*recorder, 3)
	for i := range cs {
		cfg := testConfig("i"+strconv.Itoa(i), cl.URL(i))
		cfg.TTL = 3 * time.Second // renewal (1 s) is not what delivers; the clock stands still, so nothing lapses
		cs[i], rs[i] = startCoord(t, cfg)
	}
	t.Logf("interest spread in %v", waitMesh(t, 3, rs...))

	rng := rand.New(rand.NewPCG(1, 2))
	want := make(map[string]shard.Level)
	start := time.Now()
	for k := range 200 {
		key := "conv-" + strconv.Itoa(k)
		// Some keys from two instances: the highest level wins.
		for _, i := range rng.Perm(3)[:1+rng.IntN(2)] {
			l := levels[rng.IntN(3)]
			cs[i].Announce(key, shard.NameHash(key), l)
			want[key] = max(want[key], l)
		}
	}
	for i, r := range rs {
		d := testkit.For(t, patience, r.name+" has all 200 keys", func() bool { return r.has(want) })
		t.Logf("instance %d has all 200 keys %v after the last Announce (%v after the first)", i, d, time.Since(start))
	}
	for _, c := range cs {
		if s := c.Stats(); s.Keys != 200 || s.Invalid != 0 || s.Rejected != 0 {
			t.Errorf("%s: stats %+v", c.ID(), s)
		}
	}
}

// leaseOf returns key's lease in c's table at the instant c's clock reads
// (level 1 if it is not split there).
func leaseOf(c *NATS, key string) Lease {
	for _, l := range c.Leases() {
		if l.Key == key {
			return l
		}
	}
	return Lease{Key: key, Level: 1}
}

// inForce reports whether key is at level in every table of cs, at the
// instant their clock reads.
func inForce(key string, level shard.Level, cs ...*NATS) bool {
	for _, c := range cs {
		if leaseOf(c, key).Level != level {
			return false
		}
	}
	return true
}

// told reports whether every recorder of rs was told key is at level.
func told(key string, level shard.Level, rs ...*recorder) bool {
	for _, r := range rs {
		if r.level(key) != level {
			return false
		}
	}
	return true
}

// freshLease reports whether one of cs holds a lease of one of keys
// received at the instant their clock reads: a renewal sent before a
// drop (or before NATS went down) but handled after the clock moved past
// it, which lasts ttl from then.
func freshLease(ttl time.Duration, keys []string, cs ...*NATS) bool {
	for _, c := range cs {
		for _, k := range keys {
			if l := leaseOf(c, k); l.Level > 1 && l.ExpiresIn == ttl && l.Origin != c.ID() {
				return true
			}
		}
	}
	return false
}

// peerLease reports whether c holds a peer's unexpired lease of key at
// level, whether or not that level is in force.
func peerLease(c *NATS, key string, level shard.Level) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	e := c.table.keys[key]
	return e != nil && e.exp[slot(level)] > c.table.at(c.now())
}

// setLevelCalls returns the SetLevel calls each recorder has had.
func setLevelCalls(rs ...*recorder) []int {
	n := make([]int, len(rs))
	for i, r := range rs {
		n[i] = r.setLevels()
	}
	return n
}

// TestLeaseLapse: a renewed lease outlives its ttl, a dropped one lapses on
// every instance a ttl after its last renewal and not before, and the
// highest level over origins is in force. The instances share a clock the
// test moves: a message is judged by the instant it is received at, however
// long it took to come.
func TestLeaseLapse(t *testing.T) {
	s := startServer(t, natsserver.Options{})
	clk := testkit.NewClock()
	const ttl = 300 * time.Millisecond
	// b renews every ttl/3; a and c every few minutes of real time, that
	// is never in this test, so what their leases say is exact.
	cfg := func(id string, ttl time.Duration) spec {
		cfg := onClock(clk, id, s.URL())
		cfg.MaxTTL, cfg.TTL = 10*time.Minute, ttl
		return cfg
	}
	cfgA, cfgC := cfg("a", 10*time.Minute), cfg("c", 5*time.Minute)
	a, ra := startCoord(t, cfgA)
	b, rb := startCoord(t, cfg("b", ttl))
	c, rc := startCoord(t, cfgC)
	waitMesh(t, 3, ra, rb, rc)
	all, rs := []*NATS{a, b, c}, []*recorder{ra, rb, rc}

	// Renewal keeps b's lease past its ttl: the clock moves ttl/2 at a
	// time, and after each move the test waits for a renewal received at
	// the new instant (b sends one every ttl/3 of real time), which then
	// lasts a whole ttl from it. Had a lease lapsed in between, a Handler
	// would have been told.
	const k1 = "renewed"
	b.Announce(k1, 0, 16)
	testkit.For(t, patience, "all at 16", func() bool { return told(k1, 16, rs...) })
	calls := setLevelCalls(rs...)
	for range 4 {
		clk.Advance(ttl / 2)
		testkit.For(t, patience, "b's lease renewed after the clock moved", func() bool {
			for _, x := range all {
				if l := leaseOf(x, k1); l.Level != 16 || l.ExpiresIn != ttl {
					return false
				}
			}
			return true
		})
	}
	if got := setLevelCalls(rs...); !slices.Equal(got, calls) || !told(k1, 16, rs...) {
		t.Fatalf("renewed lease lapsed over 2 ttls: SetLevel calls %v, then %v", calls, got)
	}

	// b drops it: in force everywhere until a ttl after b's last renewal,
	// received at the current instant, and then gone. A renewal b sent
	// just before the drop may be handled after the clock moved, and
	// lasts a ttl from then: the clock moves on again for it.
	b.Announce(k1, 0, 1)
	clk.Advance(ttl - 1)
	for _, x := range all {
		if l := leaseOf(x, k1); l.Level != 16 {
			t.Errorf("%s: dropped lease lapsed before its ttl was up: %+v", x.ID(), l)
		}
	}
	clk.Advance(1)
	late := 0
	d := testkit.For(t, patience, "all at 1 once b's dropped lease lapsed", func() bool {
		if told(k1, 1, rs...) {
			return true
		}
		if freshLease(ttl, []string{k1}, a, c) {
			clk.Advance(ttl)
			late++
		}
		return false
	})
	t.Logf("b's dropped lease lapsed everywhere; Handlers told %v after the clock passed its expiry (renewals handled late: %d)", d, late)

	// Max over origins: c's 64 over a's 16, then a's 16 again once c's 64
	// lapses, at that instant on every instance and not before. Each lease
	// went out at the instant the clock read when it was announced.
	const k2 = "max"
	aAt := clk.Now()
	a.Announce(k2, 0, 16)
	testkit.For(t, patience, "all at a's 16", func() bool { return told(k2, 16, rs...) })
	clk.Advance(time.Second)
	cAt := clk.Now()
	c.Announce(k2, 0, 64)
	testkit.For(t, patience, "all at c's 64", func() bool { return told(k2, 64, rs...) })
	c.Announce(k2, 0, 1)
	clk.Advance(cAt.Add(cfgC.TTL - 1).Sub(clk.Now()))
	if !inForce(k2, 64, all...) {
		t.Errorf("c's dropped 64 lapsed before its ttl was up: %+v, %+v, %+v", leaseOf(a, k2), leaseOf(b, k2), leaseOf(c, k2))
	}
	clk.Advance(1)
	for _, x := range all {
		if l := leaseOf(x, k2); l.Level != 16 || l.Origin != "a" {
			t.Errorf("%s: once c's 64 lapsed, lease %+v, want a's at 16", x.ID(), l)
		}
	}
	testkit.For(t, patience, "all told a's 16 once c's 64 lapsed", func() bool { return told(k2, 16, rs...) })

	// Last lease dropped: level 1 everywhere at its expiry, and nothing
	// left in the tables.
	a.Announce(k2, 0, 1)
	clk.Advance(aAt.Add(cfgA.TTL - 1).Sub(clk.Now()))
	if !inForce(k2, 16, all...) {
		t.Errorf("a's dropped 16 lapsed before its ttl was up: %+v, %+v, %+v", leaseOf(a, k2), leaseOf(b, k2), leaseOf(c, k2))
	}
	clk.Advance(1)
	if !inForce(k2, 1, all...) {
		t.Errorf("a's dropped 16 held past its ttl: %+v, %+v, %+v", leaseOf(a, k2), leaseOf(b, k2), leaseOf(c, k2))
	}
	testkit.For(t, patience, "all told 1 once a's 16 lapsed", func() bool { return told(k2, 1, rs...) })
	for _, x := range all {
		if s := x.Stats(); s.Keys != 0 || s.OwnKeys != 0 {
			t.Errorf("%s: %d keys (%d own) left", x.ID(), s.Keys, s.OwnKeys)
		}
	}
}

// heardAt returns when c last heard a heartbeat of peer, on c's clock
// (zero if peer is not live there).
func heardAt(c *NATS, peer string) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.peers[peer]
}

// TestMembership: the live count goes 1→3 as peers join, and back down to
// 2 when one leaves, once 3 heartbeat intervals have passed on the clock
// without its heartbeat, and not before.
func TestMembership(t *testing.T) {
	s := startServer(t, natsserver.Options{})
	clk := testkit.NewClock()
	a, ra := startCoord(t, onClock(clk, "a", s.URL()))
	if ra.instances() != 1 {
		t.Fatalf("after Start: instances %v, want [1]", ra.insts)
	}
	b, rb := startCoord(t, onClock(clk, "b", s.URL()))
	cfg := onClock(clk, "c", s.URL())
	c := newCoord(t, cfg)
	rc := newRecorder("c")
	if err := c.Start(rc); err != nil {
		t.Fatal(err)
	}
	t.Logf("3 instances seen by all in %v", waitMesh(t, 3, ra, rb, rc))
	closeCoord(t, c, rc)

	// While the clock stands still, a and b still count c after 10 more
	// heartbeats of b, sent 50 ms apart: more real time than c's timeout,
	// and many expiry checks, which would have dropped c had they gone by
	// the real clock.
	timeout := peerTimeout * cfg.Heartbeat
	st := a.Stats()
	fromB := st.Received - st.Own
	testkit.For(t, patience, "10 more heartbeats of b", func() bool { st := a.Stats(); return st.Received-st.Own >= fromB+10 })
	if ra.instances() != 3 || rb.instances() != 3 {
		t.Errorf("c dropped while the clock stood still: a counts %d, b %d instances", ra.instances(), rb.instances())
	}
	// Past c's timeout, a and b drop c, and only c. The clock moves short
	// of a timeout at a time, and a and b hear each other at each new
	// instant before it moves again, until c is gone: twice, or more if a
	// heartbeat c sent before closing was handled after the clock moved.
	moves := 0
	d := testkit.For(t, patience, "back to 2", func() bool {
		if ra.instances() == 2 && rb.instances() == 2 {
			return true
		}
		clk.Advance(timeout - 1)
		moves++
		now := clk.Now()
		testkit.For(t, patience, "a and b heard each other after the clock moved", func() bool {
			return heardAt(a, "b").Equal(now) && heardAt(b, "a").Equal(now)
		})
		return false
	})
	t.Logf("a and b count 2 instances %v after the clock began to move (%d moves of %v)", d, moves, timeout-1)
	for _, r := range []*recorder{ra, rb} {
		r.mu.Lock()
		insts := slices.Clone(r.insts)
		r.mu.Unlock()
		// From 3 straight to 2: a and b never lost each other.
		if insts[0] != 1 || len(insts) < 3 || !slices.Equal(insts[len(insts)-2:], []int{3, 2}) || slices.Max(insts) != 3 {
			t.Errorf("%s's instance counts %v", r.name, insts)
		}
	}
	if s := a.Stats(); s.Peers != 1 {
		t.Errorf("a: %d peers", s.Peers)
	}
}

// TestJoinSync: a coordinator started after leases exist gets them from
// the join sync, long before any renewal, and leases of an instance that
// has gone are relayed by the ones that know them. The clock stands still,
// so every reply comes within SyncWait.
func TestJoinSync(t *testing.T) {
	s := startServer(t, natsserver.Options{})
	long := func(id string) spec {
		cfg := testConfig(id, s.URL())
		// Renewal every 100 s of real time, after any wait of this test
		// gives up: only sync can deliver.
		cfg.MaxTTL, cfg.TTL = 10*time.Minute, 5*time.Minute
		return cfg
	}
	// a's first publication of its leases is asynchronous, and nats.go
	// buffers it: a subscriber of the test's sees it through the server
	// before b subscribes, so that b can only learn them by sync.
	probe, err := nats.Connect(s.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer probe.Close()
	var leases atomic.Int32
	if _, err := probe.Subscribe("hotkey.default.lease", func(*nats.Msg) { leases.Add(1) }); err != nil {
		t.Fatal(err)
	}
	if err := probe.FlushTimeout(patience); err != nil {
		t.Fatal(err)
	}
	a, ra := startCoord(t, long("a"))
	want := announceKeys(t, a, ra, "join-", 50)
	testkit.For(t, patience, "a's leases went through the server", func() bool { return leases.Load() >= 50 })

	start := time.Now()
	b, rb := startCoord(t, long("b"))
	d := testkit.For(t, patience, "b synced", func() bool { return rb.has(want) })
	t.Logf("b got 50 leases by sync %v after Start began (%v after it returned)", time.Since(start), d)
	if st := b.Stats(); st.SyncReplies == 0 || st.SyncRequests != 1 {
		t.Errorf("b stats %+v", st)
	}

	// a goes; c learns a's leases from b.
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	ra.closed.Store(true)
	start = time.Now()
	c, rc := startCoord(t, long("c"))
	d = testkit.For(t, patience, "c synced from b", func() bool { return rc.has(want) })
	t.Logf("c got a's 50 leases relayed by b %v after Start began (%v after it returned)", time.Since(start), d)
	if st := c.Stats(); st.SyncReplies == 0 {
		t.Errorf("c stats %+v", st)
	}
}

// TestFaults: failover to another node, NATS fully down, NATS back. The
// instances share a clock the test moves.
func TestFaults(t *testing.T) {
	cl := startCluster(t, 3)
	clk := testkit.NewClock()
	const ttl = 600 * time.Millisecond // renewal every 200 ms
	cfgX := onClock(clk, "x", cl.URLs()...)
	cfgX.TTL = ttl
	x, rx := startCoord(t, cfgX)
	j := slices.Index(cl.URLs(), x.nc.ConnectedUrl())
	if j < 0 {
		t.Fatalf("x connected to %s, not one of %v", x.nc.ConnectedUrl(), cl.URLs())
	}
	cfgY := onClock(clk, "y", cl.URL((j+1)%3))
	cfgY.TTL = ttl
	y, ry := startCoord(t, cfgY)
	cfgZ := onClock(clk, "z", cl.URL((j+2)%3))
	cfgZ.TTL = ttl
	z, rz := startCoord(t, cfgZ)
	waitMesh(t, 3, rx, ry, rz)

	want := make(map[string]shard.Level)
	announce := func(k string, l shard.Level) {
		want[k] = l
		x.Announce(k, shard.NameHash(k), l)
	}
	for i := range 20 {
		announce("fault-"+strconv.Itoa(i), 16)
	}
	peersHave := func() bool { return ry.has(want) && rz.has(want) }
	testkit.For(t, patience, "peers have x's keys", peersHave)

	// x's node goes away: x reconnects to another and re-announces.
	cl.Shutdown(j)
	d := testkit.For(t, patience, "x reconnected", func() bool { return x.Stats().Reconnects >= 1 })
	t.Logf("x reconnected to %s %v after its node %d stopped", x.nc.ConnectedUrl(), d, j)
	announce("after-failover", 64)
	d = testkit.For(t, patience, "peers see a key announced after failover", peersHave)
	t.Logf("key announced after failover seen by peers in %v", d)
	// Two ttls later on the clock, the keys are still held, renewed through
	// the new node: the clock moves ttl/2 at a time, each time followed by
	// renewals received at the new instant, lasting a whole ttl from it.
	calls := setLevelCalls(ry, rz)
	for range 4 {
		clk.Advance(ttl / 2)
		testkit.For(t, patience, "x's leases renewed after the clock moved", func() bool {
			for _, p := range []*NATS{y, z} {
				for k, l := range want {
					if got := leaseOf(p, k); got.Level != l || got.ExpiresIn != ttl {
						return false
					}
				}
			}
			return true
		})
	}
	if got := setLevelCalls(ry, rz); !slices.Equal(got, calls) || !peersHave() {
		t.Fatalf("peers lost x's keys after failover: SetLevel calls %v, then %v", calls, got)
	}

	// NATS fully down: Announce still applies locally, and the peers let
	// x's leases lapse once their ttl is up.
	for i := range 3 {
		cl.Shutdown(i)
	}
	announce("while-down", 64)
	d = testkit.For(t, patience, "x applies a key announced while NATS is down", func() bool { return rx.level("while-down") == 64 })
	t.Logf("while NATS is down, x applied its own key in %v", d)
	x.Announce("while-down-dropped", 0, 4) // announced and dropped while down
	x.Announce("while-down-dropped", 0, 1)
	// The last renewals were received at the current instant; one sent
	// just before NATS went down may be handled after the clock moved, and
	// lasts a ttl from then: the clock moves on again for it.
	clk.Advance(ttl)
	keys := slices.Collect(maps.Keys(want))
	late := 0
	testkit.For(t, patience, "peers let x's leases lapse", func() bool {
		if ry.level("fault-0") == 1 && rz.level("after-failover") == 1 {
			return true
		}
		if freshLease(ttl, keys, y, z) {
			clk.Advance(ttl)
			late++
		}
		return false
	})
	t.Logf("peers let x's leases lapse (renewals handled late: %d)", late)
	if rx.level("fault-0") != 16 {
		t.Fatal("x lost its own key while NATS was down")
	}
	before := x.Stats()

	// NATS back: everything reconverges within about a renewal period.
	restart := time.Now()
	for i := range 3 {
		if err := cl.Restart(i); err != nil {
			t.Fatal(err)
		}
	}
	restarted := time.Since(restart)
	testkit.For(t, patience, "x reconnected again", func() bool { return x.Stats().Reconnects > before.Reconnects })
	reconnected := time.Since(restart)
	testkit.For(t, patience, "peers reconverged", peersHave)
	t.Logf("NATS back: 3 nodes restarted and meshed in %v; x reconnected %v and peers had all %d keys %v after the first restart began (renewal period %v)",
		restarted, reconnected, len(want), time.Since(restart), ttl/3)
	if ry.level("while-down-dropped") != 1 {
		t.Error("a key dropped while NATS was down reached a peer")
	}
	after := x.Stats()
	t.Logf("x stats: published %d, publish errors %d, reconnects %d, disconnects %d",
		after.Published, after.PublishErrors, after.Reconnects, after.Disconnects)
	if after.Disconnects < 2 {
		t.Errorf("x saw %d disconnects, want ≥ 2", after.Disconnects)
	}
}

// TestBorrowedConn: a coordinator on a caller's connection leaves it open,
// ignores its own echoed messages, and notices reconnects by polling. It
// runs on the real clock (Config.Now nil): a lease that lapses while the
// machine is too busy to renew it is back with the next renewal.
func TestBorrowedConn(t *testing.T) {
	s := startServer(t, natsserver.Options{DontListen: true})
	nc1, err := s.Connect()
	if err != nil {
		t.Fatal(err)
	}
	defer nc1.Close()
	nc2, err := s.Connect()
	if err != nil {
		t.Fatal(err)
	}
	defer nc2.Close()
	a, ra := startCoord(t, spec{Config: Config{ID: "a", TTL: 300 * time.Millisecond, Heartbeat: 50 * time.Millisecond}, conn: nc1})
	_, rb := startCoord(t, spec{Config: Config{ID: "b", TTL: 300 * time.Millisecond, Heartbeat: 50 * time.Millisecond}, conn: nc2})
	waitMesh(t, 2, ra, rb)
	a.Announce("borrowed", 0, 4)
	testkit.For(t, patience, "b sees a's key", func() bool { return rb.level("borrowed") == 4 })
	closeCoord(t, a, ra)
	if nc1.IsClosed() {
		t.Fatal("Close closed a borrowed connection")
	}
	if st := a.Stats(); st.Own == 0 {
		t.Errorf("no own echoes counted on a connection without NoEcho: %+v", st)
	}
	if err := a.Close(); err != nil {
		t.Fatal("second Close:", err)
	}
}

// TestLifecycle: calls out of order do nothing harmful.
func TestLifecycle(t *testing.T) {
	s := startServer(t, natsserver.Options{})
	c := newCoord(t, testConfig("", s.URL()))
	if len(c.ID()) != 16 {
		t.Errorf("default ID %q", c.ID())
	}
	c.Announce("early", 0, 4) // before Start: ignored
	if err := c.Start(nil); err == nil {
		t.Error("Start(nil) accepted")
	}
	r := newRecorder("lc")
	if err := c.Start(r); err != nil {
		t.Fatal(err)
	}
	if err := c.Start(r); err == nil {
		t.Error("second Start accepted")
	}
	c.Announce("k", 0, 3) // invalid level: ignored
	c.Announce("k", 0, 1) // nothing to drop
	c.Announce("bad-\xff", 0, 16)
	c.Announce(string(make([]byte, 600)), 0, 16) // longer than MaxKeyLen
	testkit.For(t, patience, "unpublishable keys applied locally", func() bool {
		return r.level("bad-\xff") == 16 && r.level(string(make([]byte, 600))) == 16
	})
	if st := c.Stats(); st.Unpublished != 2 || st.Keys != 2 {
		t.Errorf("stats %+v", st)
	}
	if r.level("early") != 1 {
		t.Error("Announce before Start applied")
	}
	closeCoord(t, c, r)
	c.Announce("late", 0, 4) // after Close: ignored, no Handler call
	if err := c.Close(); err != nil {
		t.Error(err)
	}
	if err := c.Start(r); err == nil {
		t.Error("Start after Close accepted")
	}

	c2 := newCoord(t, testConfig("", s.URL()))
	if err := c2.Close(); err != nil { // never started
		t.Error(err)
	}
}

// TestOwnKeyEvictsPeerKey: with the table full of peers' keys, an own hot
// key still gets in, evicting a peer's.
func TestOwnKeyEvictsPeerKey(t *testing.T) {
	s := startServer(t, natsserver.Options{})
	cfg := testConfig("own", s.URL())
	cfg.MaxHotKeys = 10
	c, r := startCoord(t, cfg)
	nc, err := s.Connect()
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	for i := range 20 {
		_ = nc.Publish("hotkey.default.lease", encodeLease("peer", "peer-"+strconv.Itoa(i), 4, time.Minute))
	}
	// Counted as received before handled: wait for all 20 to be handled.
	testkit.For(t, patience, "peer leases handled", func() bool { st := c.Stats(); return uint64(st.Keys)+st.Rejected >= 20 })
	if st := c.Stats(); st.Keys != 10 || st.Rejected != 10 {
		t.Fatalf("stats %+v", st)
	}
	c.Announce("mine", 0, 64)
	testkit.For(t, patience, "own key in force", func() bool { return r.level("mine") == 64 })
	if st := c.Stats(); st.Keys != 10 {
		t.Errorf("%d keys, cap 10", st.Keys)
	}
}

// TestLowerTogether: when an instance lowers a key, it and its peers leave
// the old level at the same instant, when the old lease lapses:
// instances on different levels would decide on different subcounters, each
// set enforcing the whole limit. The instances share a clock the test moves;
// their leases last 5 minutes, renewed every 100 s of real time, that is
// never in this test, so the lowered lease went out when it was announced.
func TestLowerTogether(t *testing.T) {
	cl := startCluster(t, 3)
	clk := testkit.NewClock()
	const ttl = 5 * time.Minute
	cs := make([]*NATS, 3)
	rs := make([]*recorder, 3)
	for i := range cs {
		cfg := onClock(clk, "i"+strconv.Itoa(i), cl.URL(i))
		cfg.MaxTTL, cfg.TTL = 2*ttl, ttl
		cs[i], rs[i] = startCoord(t, cfg)
	}
	waitMesh(t, 3, rs...)
	levelsOf := func(k string) []shard.Level {
		var l []shard.Level
		for _, c := range cs {
			l = append(l, leaseOf(c, k).Level)
		}
		return l
	}
	for round, change := range [][2]shard.Level{{16, 4}, {4, 1}, {64, 16}} {
		k := "lower-" + strconv.Itoa(round)
		h := shard.NameHash(k)
		cs[0].Announce(k, h, change[0])
		testkit.For(t, patience, "all at the first level", func() bool { return told(k, change[0], rs...) })
		clk.Advance(time.Second) // the lease ages, so a lapse at ttl from now would be wrong
		cs[0].Announce(k, h, change[1])
		if change[1] > 1 {
			// The lower lease goes out at once, ttl before the old one
			// lapses: let it arrive.
			testkit.For(t, patience, "peers hold the lower lease", func() bool {
				return peerLease(cs[1], k, change[1]) && peerLease(cs[2], k, change[1])
			})
		}
		clk.Advance(ttl - time.Second - 1)
		if !inForce(k, change[0], cs...) {
			t.Errorf("%d→%d: a nanosecond before the old lease lapses, levels %v", change[0], change[1], levelsOf(k))
		}
		clk.Advance(1)
		if !inForce(k, change[1], cs...) {
			t.Errorf("%d→%d: the instant the old lease lapses, levels %v", change[0], change[1], levelsOf(k))
		}
		at := make([]time.Duration, 3)
		start := time.Now()
		testkit.For(t, patience, "all told the lower level", func() bool {
			done := true
			for i, r := range rs {
				if at[i] == 0 && r.level(k) == change[1] {
					at[i] = time.Since(start)
				}
				done = done && at[i] != 0
			}
			return done
		})
		t.Logf("%d→%d: Handlers told %v after the clock reached the lapse", change[0], change[1], at)
	}
}

// TestConnWatch: disconnects and reconnects are counted from polls of a
// connection's reconnect count and state, short outages between polls
// included.
func TestConnWatch(t *testing.T) {
	type poll struct {
		reconnects      uint64
		connected       bool
		wantDisconnects uint64
		wantReconnected bool
	}
	tests := []struct {
		name  string
		start connWatch
		polls []poll
	}{
		{"up", connWatch{}, []poll{{0, true, 0, false}, {0, true, 0, false}}},
		{"down, then back", connWatch{}, []poll{{0, false, 1, false}, {0, false, 0, false}, {1, true, 0, true}, {1, true, 0, false}}},
		{"outage between polls", connWatch{}, []poll{{1, true, 1, true}, {3, true, 2, true}}},
		{"back and down again between polls", connWatch{}, []poll{{0, false, 1, false}, {1, false, 1, true}, {2, true, 0, true}}},
		{"first connection of a retrying one", connWatch{down: true}, []poll{{0, false, 0, false}, {1, true, 0, true}}},
		{"closed by its owner", connWatch{}, []poll{{0, false, 1, false}, {0, false, 0, false}}},
	}
	for _, tt := range tests {
		w := tt.start
		for i, p := range tt.polls {
			d, r := w.poll(p.reconnects, p.connected)
			if d != p.wantDisconnects || r != p.wantReconnected {
				t.Errorf("%s, poll %d: %d disconnects, reconnected %v; want %d, %v", tt.name, i, d, r, p.wantDisconnects, p.wantReconnected)
			}
		}
	}
}
