package coordinator

import (
	"bytes"
	"errors"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/hotkeyd/hotkey/internal/natsserver"
	"github.com/hotkeyd/hotkey/internal/testkit"
	"github.com/hotkeyd/hotkey/shard"
)

// gossipRecorder is a GossipHandler: a recorder that also keeps the
// payloads handed to Gossip and GossipSync, answers GossipSnapshot with
// snapshot, and checks that the gossip calls are never concurrent nor after
// Close. If gate is set, Gossip waits for it to be closed.
type gossipRecorder struct {
	*recorder
	gate     chan struct{}
	snapshot [][]byte
	between  func(i int) // if set, called before sending snapshot[i], i > 0
	onSync   func()      // if set, called by GossipSync before it returns

	inGossip atomic.Int32
	gmu      sync.Mutex
	gossip   [][]byte // payloads handed to Gossip, in order
	synced   [][]byte // payloads handed to GossipSync, in order
	asked    []int    // maxBytes of each GossipSnapshot call
}

func (g *gossipRecorder) enterGossip() {
	if g.inGossip.Add(1) != 1 {
		g.fail("concurrent gossip calls")
	}
	if g.closed.Load() {
		g.fail("gossip call after Close returned")
	}
}

func (g *gossipRecorder) Gossip(payload []byte) {
	g.enterGossip()
	defer g.inGossip.Add(-1)
	if g.gate != nil {
		<-g.gate
	}
	g.gmu.Lock()
	defer g.gmu.Unlock()
	g.gossip = append(g.gossip, bytes.Clone(payload))
}

func (g *gossipRecorder) GossipSync(payload []byte) {
	g.enterGossip()
	defer g.inGossip.Add(-1)
	g.gmu.Lock()
	g.synced = append(g.synced, bytes.Clone(payload))
	g.gmu.Unlock()
	if g.onSync != nil {
		g.onSync()
	}
}

func (g *gossipRecorder) GossipSnapshot(maxBytes int, send func([]byte)) {
	g.gmu.Lock()
	g.asked = append(g.asked, maxBytes)
	g.gmu.Unlock()
	for i, p := range g.snapshot {
		if i > 0 && g.between != nil {
			g.between(i)
		}
		send(p)
	}
}

// got returns copies of the payloads handed to Gossip and GossipSync.
func (g *gossipRecorder) got() (gossip, synced [][]byte) {
	g.gmu.Lock()
	defer g.gmu.Unlock()
	return slices.Clone(g.gossip), slices.Clone(g.synced)
}

// startGossip starts a coordinator with cfg reporting to a new
// gossipRecorder (with snapshot); cleanup closes it and checks the recorder.
func startGossip(t *testing.T, cfg spec, snapshot ...[]byte) (*NATS, *gossipRecorder) {
	t.Helper()
	c := newCoord(t, cfg)
	g := &gossipRecorder{recorder: newRecorder(cfg.ID), snapshot: snapshot}
	if err := c.Start(g); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closeCoord(t, c, g.recorder) })
	return c, g
}

// waitGossip waits until g was handed n payloads by Gossip.
func waitGossip(t *testing.T, g *gossipRecorder, n int) {
	t.Helper()
	testkit.For(t, patience, g.name+" handed "+strconv.Itoa(n)+" gossip payloads", func() bool {
		got, _ := g.got()
		return len(got) >= n
	})
}

// TestGossipDelivery: a payload published by one instance reaches each
// other instance once, never its sender, and never the control path; on a
// borrowed connection that echoes, the sender's own comes back and is
// ignored. A Handler that is no GossipHandler ignores gossip, counted.
// Payloads empty or over MaxGossip, and publishing before Start and after
// Close, are refused with errors, counted.
func TestGossipDelivery(t *testing.T) {
	s := startServer(t, natsserver.Options{})
	a, ga := startGossip(t, testConfig("a", s.URL()))
	b, gb := startGossip(t, testConfig("b", s.URL()))
	echo, err := s.Connect() // echoes its own messages back
	if err != nil {
		t.Fatal(err)
	}
	defer echo.Close()
	specD := testConfig("d")
	specD.conn = echo
	d, gd := startGossip(t, specD)
	plain, rp := startCoord(t, testConfig("plain", s.URL()))
	waitMesh(t, 4, ga.recorder, gb.recorder, gd.recorder, rp)

	if got := a.MaxGossip(); got != DefaultMaxMessage-GossipOverhead {
		t.Errorf("MaxGossip %d, want %d", got, DefaultMaxMessage-GossipOverhead)
	}
	largest := bytes.Repeat([]byte{'x'}, a.MaxGossip())
	for _, p := range [][]byte{[]byte("from a"), largest} {
		if err := a.PublishGossip(p); err != nil {
			t.Fatal(err)
		}
	}
	if err := d.PublishGossip([]byte("from d")); err != nil {
		t.Fatal(err)
	}
	waitGossip(t, gb, 3)
	waitGossip(t, gd, 2)
	testkit.For(t, patience, "a has d's", func() bool { return a.Stats().GossipReceived == 1 })
	testkit.For(t, patience, "d's own back", func() bool { return d.Stats().Own > 0 && plain.Stats().GossipIgnored == 3 })
	// A marker from each sender, after which nothing more of theirs is due.
	for _, c := range []*NATS{a, d} {
		if err := c.PublishGossip([]byte("marker " + c.ID())); err != nil {
			t.Fatal(err)
		}
	}
	waitGossip(t, gb, 5)
	waitGossip(t, gd, 3)
	testkit.For(t, patience, "a has d's marker", func() bool { return a.Stats().GossipReceived == 2 })
	testkit.For(t, patience, "plain has all 5", func() bool { return plain.Stats().GossipIgnored == 5 })

	gotA, _ := ga.got()
	gotB, _ := gb.got()
	gotD, _ := gd.got()
	want := func(name string, got [][]byte, want ...[]byte) {
		t.Helper()
		slices.SortFunc(got, bytes.Compare)
		slices.SortFunc(want, bytes.Compare)
		if !slices.EqualFunc(got, want, bytes.Equal) {
			t.Errorf("%s was handed %d payloads (%.20q), want %d (%.20q)", name, len(got), got, len(want), want)
		}
	}
	want("a", gotA, []byte("from d"), []byte("marker d"))
	want("b", gotB, []byte("from a"), largest, []byte("from d"), []byte("marker a"), []byte("marker d"))
	want("d", gotD, []byte("from a"), largest, []byte("marker a"))
	for _, c := range []*NATS{a, b, d, plain} {
		st := c.Stats()
		t.Logf("%s: received %d, own %d, invalid %v, gossip received %d, ignored %d, published %d (%d bytes)",
			c.ID(), st.Received, st.Own, st.InvalidBy, st.GossipReceived, st.GossipIgnored, st.GossipPublished, st.GossipBytesPublished)
		if st.Invalid != 0 {
			t.Errorf("%s: invalid messages %v: gossip reached the control path", c.ID(), st.InvalidBy)
		}
	}
	if st := d.Stats(); st.Own < 2 || st.GossipReceived != 3 {
		t.Errorf("d: own %d, gossip received %d; want its 2 gossip messages among its own, 3 received", st.Own, st.GossipReceived)
	}
	if st := a.Stats(); st.GossipPublished != 3 || st.GossipBytesPublished < uint64(2*len("from a")+len(largest)) {
		t.Errorf("a: gossip published %d (%d bytes)", st.GossipPublished, st.GossipBytesPublished)
	}

	// Refused: too large, empty, before Start, after Close.
	for _, p := range [][]byte{append(largest, 'x'), nil} {
		if err := a.PublishGossip(p); !errors.Is(err, ErrGossipSize) {
			t.Errorf("a payload of %d bytes (MaxGossip %d): %v, want ErrGossipSize", len(p), a.MaxGossip(), err)
		}
	}
	idle := newCoord(t, testConfig("idle", s.URL()))
	if err := idle.PublishGossip([]byte("p")); !errors.Is(err, ErrClosed) {
		t.Errorf("before Start: %v, want ErrClosed", err)
	}
	closeCoord(t, a, ga.recorder)
	if err := a.PublishGossip([]byte("p")); !errors.Is(err, ErrClosed) {
		t.Errorf("after Close: %v, want ErrClosed", err)
	}
	if st := a.Stats(); st.GossipPublishErrors != 3 || st.GossipPublished != 3 {
		t.Errorf("a: gossip publish errors %d, published %d; want 3, 3", st.GossipPublishErrors, st.GossipPublished)
	}
}

// TestGossipSigned: with a Secret, a tampered message, one signed with
// another secret or for another subject, a replayed one, stale ones (the
// receiver's clock moved past the window), an unsigned one and malformed
// ones are refused, counted by reason, and never handed to the Handler;
// one signed with the secret is.
func TestGossipSigned(t *testing.T) {
	s := startServer(t, natsserver.Options{})
	clk := testkit.NewClock()
	const subj = "hotkey.default.gossip"
	spy := rawConn(t, s)
	caught := make(chan []byte, 1)
	if _, err := spy.Subscribe(subj, func(m *nats.Msg) {
		select {
		case caught <- m.Data: // the first only
		default:
		}
	}); err != nil {
		t.Fatal(err)
	}
	if err := spy.FlushTimeout(patience); err != nil {
		t.Fatal(err)
	}
	a, ga := startGossip(t, signedConfig(clk, "a", testSecret, s.URL()))
	b, gb := startGossip(t, signedConfig(clk, "b", testSecret, s.URL()))
	waitMesh(t, 2, ga.recorder, gb.recorder)
	if err := a.PublishGossip([]byte("signed")); err != nil {
		t.Fatal(err)
	}
	waitGossip(t, gb, 1)
	var raw []byte
	select {
	case raw = <-caught:
	case <-time.After(patience):
		t.Fatal("the spy caught nothing")
	}

	right := &signer{secret: testSecret, scope: "hotkey.default"}
	wrong := &signer{secret: otherSecret, scope: "hotkey.default"}
	now := clk.Now().UnixMicro()
	tampered := bytes.Clone(raw)
	tampered[len(raw)-macSize-1] ^= 1 // the payload's last byte
	nc := rawConn(t, s)
	publishAll(t, nc, subj,
		tampered, // signature
		sealedEnvelope(wrong, subj, "forger", now, []byte("p")),                   // signature
		sealedEnvelope(right, "hotkey.default.lease", "forger", now, []byte("p")), // signature
		raw, // replay
		appendEnvelope(nil, "forger", false, 0, []byte("p")),                                         // unsigned
		sealedEnvelope(right, subj, "old", now-DefaultMaxClockSkew.Microseconds()-1, []byte("p")),    // stale
		sealedEnvelope(right, subj, "future", now+DefaultMaxClockSkew.Microseconds()+1, []byte("p")), // stale
		[]byte{1, 1, 1, 'x'}, // envelope: signed, cut
		[]byte("{}"),         // envelope
	)
	const sent = 9
	waitInvalid(t, b, sent)
	// Past the window on b's clock, a's message is stale too. First a goes
	// and b handles all a sent (the server saw a's connection close, and b
	// counts a marker published after that), so that none of a's
	// heartbeats is judged on the moved clock.
	clients := s.Server().NumClients()
	closeCoord(t, a, ga.recorder)
	a.nc.Close()
	testkit.For(t, patience, "the server sees a go", func() bool { return s.Server().NumClients() < clients })
	publishAll(t, nc, "hotkey.default.hb", []byte(`{"v":1,"t":"hb","origin":"marker"}`))
	waitInvalid(t, b, sent+1)
	clk.Advance(DefaultMaxClockSkew + time.Second)
	publishAll(t, nc, subj, raw)
	waitInvalid(t, b, sent+2)

	st := b.Stats()
	t.Logf("b: invalid by reason %v", st.InvalidBy)
	want := map[string]uint64{"signature": 3, "replay": 1, "unsigned": 2, "stale": 3, "envelope": 2}
	for r, n := range want {
		if st.InvalidBy[r] != n {
			t.Errorf("b: %d invalid for %s, want %d (all: %v)", st.InvalidBy[r], r, n, st.InvalidBy)
		}
	}
	if got, _ := gb.got(); len(got) != 1 || st.GossipReceived != 1 {
		t.Errorf("b was handed %d payloads (%q), want 1", len(got), got)
	}

	// Signed with the secret, fresh on the clock moved: handed on.
	publishAll(t, nc, subj, sealedEnvelope(right, subj, "forger", clk.Now().UnixMicro(), []byte("fresh")))
	waitGossip(t, gb, 2)
	if got, _ := gb.got(); string(got[1]) != "fresh" {
		t.Errorf("b was handed %q", got)
	}
}

// TestGossipJoinSync: an instance started after a peer whose Handler has
// a snapshot gets each payload of it through GossipSync, signed for its
// inbox; one that comes after SyncWait is counted late and not handed on.
func TestGossipJoinSync(t *testing.T) {
	s := startServer(t, natsserver.Options{})
	clk := testkit.NewClock()
	cfg := signedConfig(clk, "a", testSecret, s.URL())
	max := DefaultMaxMessage - GossipOverhead
	snapshot := [][]byte{[]byte("one"), []byte("two"), bytes.Repeat([]byte{'3'}, max)}
	a, ga := startGossip(t, cfg, snapshot...)
	b, gb := startGossip(t, signedConfig(clk, "b", testSecret, s.URL()))
	testkit.For(t, patience, "b synced", func() bool {
		_, synced := gb.got()
		return len(synced) >= len(snapshot)
	})
	_, synced := gb.got()
	if !slices.EqualFunc(synced, snapshot, bytes.Equal) {
		t.Errorf("b synced %d payloads %.20q, want %.20q", len(synced), synced, snapshot)
	}
	ga.gmu.Lock()
	asked := slices.Clone(ga.asked)
	ga.gmu.Unlock()
	if len(asked) == 0 || asked[0] != max {
		t.Errorf("GossipSnapshot asked for %v bytes, want %d", asked, max)
	}
	testkit.For(t, patience, "a counted its snapshot sent", func() bool { return a.Stats().GossipSyncSent >= 3 })
	if sa, sb := a.Stats(), b.Stats(); sa.GossipSyncSent != 3 || sb.GossipSyncApplied != 3 || sb.Invalid != 0 {
		t.Errorf("a sent %d snapshot payloads, b applied %d (invalid %v); want 3", sa.GossipSyncSent, sb.GossipSyncApplied, sb.InvalidBy)
	}

	// After SyncWait on b's clock: late.
	clk.Advance(DefaultSyncWait + time.Millisecond)
	late := b.Stats().LateReplies
	right := &signer{secret: testSecret, scope: "hotkey.default"}
	publishAll(t, rawConn(t, s), b.inbox, sealedEnvelope(right, b.inbox, "late", clk.Now().UnixMicro(), []byte("late")))
	testkit.For(t, patience, "a late snapshot counted", func() bool { return b.Stats().LateReplies == late+1 })
	if _, synced := gb.got(); len(synced) != 3 {
		t.Errorf("b synced %d payloads, want 3", len(synced))
	}
}

// TestGossipJoinSyncProgress: a joiner applies a snapshot whose parts come
// over more than SyncWait as long as each comes within SyncWait of the
// one before: parts 0.6 SyncWait apart on its clock, 2.4 SyncWait in all,
// are all applied.
func TestGossipJoinSyncProgress(t *testing.T) {
	s := startServer(t, natsserver.Options{})
	clk := testkit.NewClock()
	snapshot := [][]byte{[]byte("p0"), []byte("p1"), []byte("p2"), []byte("p3"), []byte("p4")}
	a := newCoord(t, signedConfig(clk, "a", testSecret, s.URL()))
	ga := &gossipRecorder{recorder: newRecorder("a"), snapshot: snapshot}
	var joiner atomic.Pointer[NATS]
	ga.between = func(i int) { // on a's publisher: no t.Fatal here
		for deadline := time.Now().Add(patience); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
			if st := joiner.Load().Stats(); st.GossipSyncApplied+st.LateReplies >= uint64(i) {
				break
			}
		}
		clk.Advance(DefaultSyncWait * 6 / 10)
	}
	if err := a.Start(ga); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closeCoord(t, a, ga.recorder) })
	b := newCoord(t, signedConfig(clk, "b", testSecret, s.URL()))
	joiner.Store(b)
	gb := &gossipRecorder{recorder: newRecorder("b")}
	if err := b.Start(gb); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closeCoord(t, b, gb.recorder) })
	testkit.For(t, patience, "a answered b's sync", func() bool { return a.Stats().SyncAnswered >= 1 })
	testkit.For(t, patience, "b received every part", func() bool {
		st := b.Stats()
		return st.GossipSyncApplied+st.LateReplies >= uint64(len(snapshot))
	})
	_, synced := gb.got()
	if st := b.Stats(); !slices.EqualFunc(synced, snapshot, bytes.Equal) || st.LateReplies != 0 {
		t.Errorf("b synced %q, %d late; want %q, none late", synced, st.LateReplies, snapshot)
	}
}

// TestGossipJoinSyncQueued: replies queued while the joiner applies one
// are in time, however long the joiner then takes to reach them: after the
// first part is applied, the joiner's clock jumps 2 SyncWait before it
// reads the next, queued behind it, and every part is applied.
func TestGossipJoinSyncQueued(t *testing.T) {
	s := startServer(t, natsserver.Options{})
	clk := testkit.NewClock()
	snapshot := [][]byte{[]byte("p0"), []byte("p1"), []byte("p2")}
	startGossip(t, signedConfig(clk, "a", testSecret, s.URL()), snapshot...)
	cfg := signedConfig(clk, "b", testSecret, s.URL())
	var jump atomic.Bool // the next read of b's clock returns, then moves it
	cfg.Now = func() time.Time {
		now := clk.Now()
		if jump.Swap(false) {
			clk.Advance(2 * DefaultSyncWait)
		}
		return now
	}
	b := newCoord(t, cfg)
	gb := &gossipRecorder{recorder: newRecorder("b")}
	var first atomic.Bool
	gb.onSync = func() { // on b's inbox subscription: no t.Fatal here
		if first.Swap(true) {
			return
		}
		for deadline := time.Now().Add(patience); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
			if n, _, _ := b.inboxSub.Pending(); n >= len(snapshot) { // this one and the others
				break
			}
		}
		jump.Store(true) // read next when the part is counted applied
	}
	if err := b.Start(gb); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closeCoord(t, b, gb.recorder) })
	testkit.For(t, patience, "b received every part", func() bool {
		st := b.Stats()
		return st.GossipSyncApplied+st.LateReplies >= uint64(len(snapshot))
	})
	_, synced := gb.got()
	if st := b.Stats(); !slices.EqualFunc(synced, snapshot, bytes.Equal) || st.LateReplies != 0 {
		t.Errorf("b synced %q, %d late; want %q, none late", synced, st.LateReplies, snapshot)
	}
}

// TestGossipFlood: while 10,000 gossip messages wait for a Handler that
// takes none, leases published after them are applied; then every gossip
// message is handed on, none dropped.
func TestGossipFlood(t *testing.T) {
	s := startServer(t, natsserver.Options{})
	a, ga := startGossip(t, testConfig("a", s.URL()))
	cfgB := testConfig("b", s.URL())
	b := newCoord(t, cfgB)
	gb := &gossipRecorder{recorder: newRecorder("b"), gate: make(chan struct{})}
	if err := b.Start(gb); err != nil {
		t.Fatal(err)
	}
	opened := false
	open := func() {
		if !opened {
			opened = true
			close(gb.gate)
		}
	}
	t.Cleanup(func() {
		open()
		closeCoord(t, b, gb.recorder)
	})
	waitMesh(t, 2, ga.recorder, gb.recorder)

	const flood, keys = 10000, 20
	for i := range flood {
		if err := a.PublishGossip([]byte("gossip " + strconv.Itoa(i))); err != nil {
			t.Fatal(err)
		}
	}
	want := make(map[string]shard.Level, keys)
	for i := range keys {
		k := "flood-" + strconv.Itoa(i)
		want[k] = 64
		a.Announce(k, shard.NameHash(k), 64)
	}
	applied := func() int {
		n := 0
		for k, l := range want {
			if gb.level(k) == l {
				n++
			}
		}
		return n
	}
	defer func() {
		if t.Failed() {
			t.Logf("b applied %d of %d leases, %d gossip messages handed on", applied(), keys, b.Stats().GossipReceived)
		}
	}()
	testkit.For(t, patience, "b has a's leases", func() bool { return applied() == keys })
	st := b.Stats()
	t.Logf("b applied %d leases with %d of %d gossip messages handed on", keys, st.GossipReceived, flood)
	if st.GossipReceived > 1 {
		t.Errorf("%d gossip messages handed on through a closed gate", st.GossipReceived)
	}
	open()
	waitGossip(t, gb, flood)
	st = b.Stats()
	if got, _ := gb.got(); len(got) != flood || st.Dropped != 0 || st.GossipReceived != flood {
		t.Errorf("b was handed %d gossip payloads of %d, dropped %d", len(got), flood, st.Dropped)
	}
}

// TestGossipConnected: Connected is false before Start, true once
// connected, false once the server is gone (and publishing is then
// refused), and false after Close.
func TestGossipConnected(t *testing.T) {
	s := startServer(t, natsserver.Options{})
	c := newCoord(t, testConfig("a", s.URL()))
	if c.Connected() {
		t.Error("connected before Start")
	}
	r := &gossipRecorder{recorder: newRecorder("a")}
	if err := c.Start(r); err != nil {
		t.Fatal(err)
	}
	defer closeCoord(t, c, r.recorder)
	if !c.Connected() {
		t.Error("not connected after Start")
	}
	s.Shutdown()
	d := testkit.For(t, patience, "disconnected", func() bool { return !c.Connected() })
	t.Logf("Connected false %v after the server was shut down", d)
	if err := c.PublishGossip([]byte("p")); !errors.Is(err, ErrNotConnected) {
		t.Errorf("publishing while disconnected: %v, want ErrNotConnected", err)
	}
	closeCoord(t, c, r.recorder)
	if c.Connected() {
		t.Error("connected after Close")
	}
}
