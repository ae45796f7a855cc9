package coordinator

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/hotkeyd/hotkey/internal/natsserver"
)

var levels = []int{4, 16, 64}

// waitMesh waits until every recorder counts n instances: each has heard
// the others' heartbeats, so their subscriptions (one per coordinator, for
// leases, heartbeats and sync alike) have spread to every server.
func waitMesh(t *testing.T, n int, rs ...*recorder) time.Duration {
	t.Helper()
	return waitFor(t, 10*time.Second, fmt.Sprintf("%d instances seen", n), func() bool {
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
		cfg.TTL = 3 * time.Second // renewal (1 s) is not what delivers
		cs[i], rs[i] = startCoord(t, cfg)
	}
	t.Logf("interest spread in %v", waitMesh(t, 3, rs...))

	rng := rand.New(rand.NewPCG(1, 2))
	want := make(map[string]int)
	start := time.Now()
	for k := range 200 {
		key := "conv-" + strconv.Itoa(k)
		// Some keys from two instances: the highest level wins.
		for _, i := range rng.Perm(3)[:1+rng.IntN(2)] {
			l := levels[rng.IntN(3)]
			cs[i].Announce(key, xxhash.Sum64String(key), l)
			want[key] = max(want[key], l)
		}
	}
	for i, r := range rs {
		d := waitFor(t, 10*time.Second, r.name+" has all 200 keys", func() bool { return r.has(want) })
		t.Logf("instance %d has all 200 keys %v after the last Announce (%v after the first)", i, d, time.Since(start))
	}
	for _, c := range cs {
		if s := c.Stats(); s.Keys != 200 || s.Invalid != 0 || s.Rejected != 0 {
			t.Errorf("%s: stats %+v", c.ID(), s)
		}
	}
}

// TestLeaseLapse: a dropped lease lapses on peers within about a TTL, a
// renewed one lives past it, and the highest level over origins is in
// force.
func TestLeaseLapse(t *testing.T) {
	s := startServer(t, natsserver.Options{})
	a, ra := startCoord(t, testConfig("a", s.URL()))
	b, rb := startCoord(t, testConfig("b", s.URL()))
	_, rc := startCoord(t, testConfig("c", s.URL()))
	waitMesh(t, 3, ra, rb, rc)
	const ttl = 300 * time.Millisecond
	const k = "lapse"
	h := xxhash.Sum64String(k)

	a.Announce(k, h, 16)
	if ra.level(k) != 16 {
		// Announce is in force here at once, but the Handler runs on the
		// dispatcher: allow it a moment.
		waitFor(t, time.Second, "own level applied", func() bool { return ra.level(k) == 16 })
	}
	waitFor(t, 2*time.Second, "peers at 16", func() bool { return rb.level(k) == 16 && rc.level(k) == 16 })

	// Renewal keeps the lease past its TTL.
	renewed := time.Now()
	for time.Since(renewed) < 4*ttl {
		if rb.level(k) != 16 || rc.level(k) != 16 {
			t.Fatalf("lease lapsed while renewed, after %v", time.Since(renewed))
		}
		time.Sleep(10 * time.Millisecond)
	}

	// Max over origins.
	b.Announce(k, h, 64)
	waitFor(t, 2*time.Second, "all at 64", func() bool { return ra.level(k) == 64 && rb.level(k) == 64 && rc.level(k) == 64 })
	b.Announce(k, h, 1) // a's 16 remains
	waitFor(t, time.Second, "b back to a's 16 once its 64 lapses", func() bool { return rb.level(k) == 16 })
	d := waitFor(t, 3*time.Second, "a and c back to 16", func() bool { return ra.level(k) == 16 && rc.level(k) == 16 })
	t.Logf("b's 64 lapsed on peers %v after its drop (TTL %v)", d, ttl)

	// Last lease dropped: level 1 everywhere.
	a.Announce(k, h, 1)
	waitFor(t, time.Second, "a at 1 once its 16 lapses", func() bool { return ra.level(k) == 1 })
	d = waitFor(t, 3*time.Second, "peers at 1", func() bool { return rb.level(k) == 1 && rc.level(k) == 1 })
	t.Logf("a's 16 lapsed on peers %v after its drop (TTL %v)", d, ttl)
	if d > 10*ttl {
		t.Errorf("lapse took %v, TTL is %v", d, ttl)
	}
	for _, c := range []*NATS{a, b} {
		if s := c.Stats(); s.Keys != 0 || s.OwnKeys != 0 {
			t.Errorf("%s: %d keys (%d own) left", c.ID(), s.Keys, s.OwnKeys)
		}
	}
}

// TestMembership: the live count goes 1→3 as peers join and back down when
// one leaves.
func TestMembership(t *testing.T) {
	s := startServer(t, natsserver.Options{})
	a, ra := startCoord(t, testConfig("a", s.URL()))
	if ra.instances() != 1 {
		t.Fatalf("after Start: instances %v, want [1]", ra.insts)
	}
	_, rb := startCoord(t, testConfig("b", s.URL()))
	cfg := testConfig("c", s.URL())
	c, err := NewNATS(cfg)
	if err != nil {
		t.Fatal(err)
	}
	rc := newRecorder("c")
	if err := c.Start(rc); err != nil {
		t.Fatal(err)
	}
	t.Logf("3 instances seen by all in %v", waitMesh(t, 3, ra, rb, rc))
	closeCoord(t, c, rc)
	d := waitFor(t, 5*time.Second, "back to 2", func() bool { return ra.instances() == 2 && rb.instances() == 2 })
	t.Logf("a and b count 2 instances %v after c closed (heartbeat 50 ms, timeout 3 beats)", d)
	if d < 50*time.Millisecond {
		t.Errorf("c dropped %v after closing, before 3 heartbeats could pass", d)
	}
	ra.mu.Lock()
	insts := slices.Clone(ra.insts)
	ra.mu.Unlock()
	if insts[0] != 1 || !slices.Contains(insts, 3) || insts[len(insts)-1] != 2 || slices.Max(insts) != 3 {
		t.Errorf("a's instance counts %v", insts)
	}
	if s := a.Stats(); s.Peers != 1 {
		t.Errorf("a: %d peers", s.Peers)
	}
}

// TestJoinSync: a coordinator started after leases exist gets them from
// the join sync, long before any renewal, and leases of an instance that
// has gone are relayed by the ones that know them.
func TestJoinSync(t *testing.T) {
	s := startServer(t, natsserver.Options{})
	long := func(id string) Config {
		cfg := testConfig(id, s.URL())
		cfg.TTL = 30 * time.Second // renewal every 10 s: only sync can be fast
		return cfg
	}
	a, ra := startCoord(t, long("a"))
	want := make(map[string]int)
	for i := range 50 {
		k := "join-" + strconv.Itoa(i)
		want[k] = levels[i%3]
		a.Announce(k, xxhash.Sum64String(k), want[k])
	}
	waitFor(t, time.Second, "a applies its own", func() bool { return ra.has(want) })
	// a's first publication of its leases is asynchronous: let it go out
	// (a heartbeat, a sync request, 50 leases) before b subscribes, so
	// that b can only learn them by sync.
	waitFor(t, 5*time.Second, "a published its leases", func() bool { return a.Stats().Published >= 52 })

	start := time.Now()
	b, rb := startCoord(t, long("b"))
	d := waitFor(t, 5*time.Second, "b synced", func() bool { return rb.has(want) })
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
	d = waitFor(t, 5*time.Second, "c synced from b", func() bool { return rc.has(want) })
	t.Logf("c got a's 50 leases relayed by b %v after Start began (%v after it returned)", time.Since(start), d)
	if st := c.Stats(); st.SyncReplies == 0 {
		t.Errorf("c stats %+v", st)
	}
}

// TestFaults: failover to another node, NATS fully down, NATS back.
func TestFaults(t *testing.T) {
	cl := startCluster(t, 3)
	cfgX := testConfig("x", cl.URLs()...)
	cfgX.TTL = 600 * time.Millisecond // renewal every 200 ms
	x, rx := startCoord(t, cfgX)
	j := slices.Index(cl.URLs(), x.nc.ConnectedUrl())
	if j < 0 {
		t.Fatalf("x connected to %s, not one of %v", x.nc.ConnectedUrl(), cl.URLs())
	}
	cfgY := testConfig("y", cl.URL((j+1)%3))
	cfgY.TTL = cfgX.TTL
	_, ry := startCoord(t, cfgY)
	cfgZ := testConfig("z", cl.URL((j+2)%3))
	cfgZ.TTL = cfgX.TTL
	_, rz := startCoord(t, cfgZ)
	waitMesh(t, 3, rx, ry, rz)

	want := make(map[string]int)
	announce := func(k string, l int) {
		want[k] = l
		x.Announce(k, xxhash.Sum64String(k), l)
	}
	for i := range 20 {
		announce("fault-"+strconv.Itoa(i), 16)
	}
	peersHave := func() bool { return ry.has(want) && rz.has(want) }
	waitFor(t, 5*time.Second, "peers have x's keys", peersHave)

	// x's node goes away: x reconnects to another and re-announces.
	down := time.Now()
	cl.Shutdown(j)
	d := waitFor(t, 10*time.Second, "x reconnected", func() bool { return x.Stats().Reconnects >= 1 })
	t.Logf("x reconnected to %s %v after its node %d stopped", x.nc.ConnectedUrl(), d, j)
	announce("after-failover", 64)
	d = waitFor(t, 5*time.Second, "peers see a key announced after failover", peersHave)
	t.Logf("key announced after failover seen by peers in %v", d)
	// Well past a TTL, the keys are still held (renewed through the new node).
	time.Sleep(2 * cfgX.TTL)
	if !peersHave() {
		t.Fatal("peers lost x's keys after failover")
	}
	t.Logf("failover: keys still held %v after the node stopped (2 TTLs after reconnecting)", time.Since(down))

	// NATS fully down: Announce still applies locally.
	for i := range 3 {
		cl.Shutdown(i)
	}
	announce("while-down", 64)
	d = waitFor(t, time.Second, "x applies a key announced while NATS is down", func() bool { return rx.level("while-down") == 64 })
	t.Logf("while NATS is down, x applied its own key in %v", d)
	x.Announce("while-down-dropped", 0, 4) // announced and dropped while down
	x.Announce("while-down-dropped", 0, 1)
	waitFor(t, 5*time.Second, "peers let x's leases lapse", func() bool {
		return ry.level("fault-0") == 1 && rz.level("after-failover") == 1
	})
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
	waitFor(t, 10*time.Second, "x reconnected again", func() bool { return x.Stats().Reconnects > before.Reconnects })
	reconnected := time.Since(restart)
	waitFor(t, 10*time.Second, "peers reconverged", peersHave)
	t.Logf("NATS back: 3 nodes restarted and meshed in %v; x reconnected %v and peers had all %d keys %v after the first restart began (renewal period %v)",
		restarted, reconnected, len(want), time.Since(restart), cfgX.TTL/3)
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
// ignores its own echoed messages, and notices reconnects by polling.
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
	a, ra := startCoord(t, Config{Conn: nc1, ID: "a", TTL: 300 * time.Millisecond, Heartbeat: 50 * time.Millisecond})
	_, rb := startCoord(t, Config{Conn: nc2, ID: "b", TTL: 300 * time.Millisecond, Heartbeat: 50 * time.Millisecond})
	waitMesh(t, 2, ra, rb)
	a.Announce("borrowed", 0, 4)
	waitFor(t, 2*time.Second, "b sees a's key", func() bool { return rb.level("borrowed") == 4 })
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
	c, err := NewNATS(testConfig("", s.URL()))
	if err != nil {
		t.Fatal(err)
	}
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
	waitFor(t, time.Second, "unpublishable keys applied locally", func() bool {
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

	c2, err := NewNATS(testConfig("", s.URL()))
	if err != nil {
		t.Fatal(err)
	}
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
	waitFor(t, 5*time.Second, "peer leases handled", func() bool { st := c.Stats(); return uint64(st.Keys)+st.Rejected >= 20 })
	if st := c.Stats(); st.Keys != 10 || st.Rejected != 10 {
		t.Fatalf("stats %+v", st)
	}
	c.Announce("mine", 0, 64)
	waitFor(t, time.Second, "own key in force", func() bool { return r.level("mine") == 64 })
	if st := c.Stats(); st.Keys != 10 {
		t.Errorf("%d keys, cap 10", st.Keys)
	}
}

// TestLowerTogether: when an instance lowers a key, it and its peers leave
// the old level at about the same instant, when the old lease lapses:
// instances on different levels would decide on different subcounters, each
// set enforcing the whole limit.
func TestLowerTogether(t *testing.T) {
	cl := startCluster(t, 3)
	cs := make([]*NATS, 3)
	rs := make([]*recorder, 3)
	for i := range cs {
		cs[i], rs[i] = startCoord(t, testConfig("i"+strconv.Itoa(i), cl.URL(i)))
	}
	waitMesh(t, 3, rs...)
	ttl := testConfig("x").TTL
	for round, change := range [][2]int{{16, 4}, {4, 1}, {64, 16}} {
		k := "lower-" + strconv.Itoa(round)
		h := xxhash.Sum64String(k)
		cs[0].Announce(k, h, change[0])
		waitFor(t, 2*time.Second, "all at the first level", func() bool {
			return rs[0].level(k) == change[0] && rs[1].level(k) == change[0] && rs[2].level(k) == change[0]
		})
		time.Sleep(ttl / 2) // some renewals
		start := time.Now()
		cs[0].Announce(k, h, change[1])
		at := make([]time.Duration, 3)
		waitFor(t, 5*ttl, "all at the lower level", func() bool {
			done := true
			for i, r := range rs {
				if at[i] == 0 && r.level(k) == change[1] {
					at[i] = time.Since(start)
				}
				done = done && at[i] != 0
			}
			return done
		})
		spread := slices.Max(at) - slices.Min(at)
		t.Logf("%d→%d: instances changed %v after the Announce (spread %v; ttl %v)", change[0], change[1], at, spread, ttl)
		if spread > ttl/2 {
			t.Errorf("%d→%d: instances changed %v apart, want well under the ttl %v", change[0], change[1], spread, ttl)
		}
	}
}
