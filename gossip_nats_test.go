package hotkey

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/hotkeyd/hotkey/coordinator"
	"github.com/hotkeyd/hotkey/internal/natsserver"
	"github.com/hotkeyd/hotkey/internal/testkit"
)

// gossipSecret signs the coordinators' messages in the gossip tests, as a
// deployment's would.
var gossipSecret = []byte("gossip-test-secret-0123456789abcdef")

// gossipNATSConfig is natsConfig with a Secret.
func gossipNATSConfig() coordinator.Config {
	cfg := natsConfig()
	cfg.Secret = gossipSecret
	return cfg
}

// gossipWindow is the limit of the gossip tests over NATS: a fixed window
// of an hour on engines whose clock stands still, so that what a key
// admitted only grows, and counts compare without a window rolling over.
func gossipWindow(limit int64) *Policy {
	return &Policy{Name: "g", Limit: Limit{Algorithm: FixedWindow, Rate: limit, Period: time.Hour}, Sync: SyncGossip}
}

// gossipUsed is how many units of key's counter under p engine e's view
// holds: its own admissions and the peers' it was charged; the limit once
// it denies.
func gossipUsed(t *testing.T, e *Engine, key string, p *Policy) int64 {
	t.Helper()
	r, err := e.Peek(context.Background(), key, p)
	if err != nil {
		t.Fatal(err)
	}
	if !r.Allowed {
		return p.Limit.Rate
	}
	return p.Limit.Rate - r.Remaining - 1
}

// gossipDrive sends each engine requests requests of key under p, one at a
// time round the engines with a pause between two, and returns what the
// engines of each side (side[i] is engine i's) admitted. Before each
// request it measures what the deciding engine's view lacks of its side's
// admissions so far (sent but not yet charged there): the units
// undelivered. An engine admits only below the limit in its view, so a
// side admits at most the limit plus the most undelivered at one of its
// admissions, returned as undelivered.
func gossipDrive(t *testing.T, engines []*Engine, side []int, key string, p *Policy, requests int, pause time.Duration) (admitted, undelivered []int64) {
	t.Helper()
	sides := 0
	for _, s := range side {
		sides = max(sides, s+1)
	}
	admitted, undelivered = make([]int64, sides), make([]int64, sides)
	for i := range requests * len(engines) {
		e, s := engines[i%len(engines)], side[i%len(engines)]
		und := admitted[s] - gossipUsed(t, e, key, p)
		r, err := e.Allow(context.Background(), key, p)
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		if r.Allowed {
			admitted[s]++
			undelivered[s] = max(undelivered[s], und)
		}
		time.Sleep(pause)
	}
	return admitted, undelivered
}

// gossipEngines adds n engines to f, engine i on node i%3, each deciding
// on clock and exporting its metrics to a registry of its own.
func gossipEngines(t *testing.T, f *fleet, n int, clock func() time.Time, opts ...Option) []*prometheus.Registry {
	t.Helper()
	regs := make([]*prometheus.Registry, n)
	for i := range n {
		regs[i] = prometheus.NewRegistry()
		f.add(t, i%f.cluster.Len(), memoryStores(), append([]Option{withClock(clock), WithMetrics(regs[i])}, opts...)...)
	}
	testkit.For(t, patience, "membership", func() bool {
		for _, e := range f.engines {
			if e.liveInstances() != len(f.engines) {
				return false
			}
		}
		return true
	})
	return regs
}

// TestGossipNATS: three engines on a 3-node NATS cluster, with signed
// messages, take one key at three times its limit, a request at a time
// round them. With sync: gossip they admit the limit plus at most the
// units a deciding engine had not been charged yet (measured, and logged
// against the design's bound); with sync: store on their own memory
// stores, three times the limit.
func TestGossipNATS(t *testing.T) {
	checkLeaks(t)
	const limit, instances = 300, 3
	const interval, pause = 100 * time.Millisecond, time.Millisecond
	f := startFleetConfig(t, gossipNATSConfig(), 0, memoryStores)
	clock := testkit.NewClock()
	gossipEngines(t, f, instances, clock.Now, WithGossipInterval(interval))
	// A heartbeat stamped just before a peer's Start, and delivered after
	// it, is refused as stale there (the peer's replay guard starts at its
	// Start); on a loaded machine one may be. Such a message comes before
	// the heartbeats that completed the membership, so count from here.
	invalid0 := make([]uint64, instances)
	for i, c := range f.coords {
		invalid0[i] = c.Stats().Invalid
	}
	p := gossipWindow(limit)
	side := make([]int, instances)
	start := time.Now()
	admitted, undelivered := gossipDrive(t, f.engines, side, "k", p, limit, pause)
	took := time.Since(start)
	got, und := admitted[0], undelivered[0]

	store := &Policy{Name: "s", Limit: p.Limit}
	var alone int64
	for range limit {
		for _, e := range f.engines {
			if r, err := e.Allow(context.Background(), "k", store); err != nil {
				t.Fatal(err)
			} else if r.Allowed {
				alone++
			}
		}
	}
	// The design's bound, with the rate each engine was driven at and the
	// delivery the undelivered units stand for.
	rate := float64(limit) / took.Seconds()
	t.Logf("sync: gossip admitted %d of %d requests (limit %d): %d over, at most %d undelivered at an admission; each engine at %.0f/s, so %d undelivered is %v of interval and delivery (interval %v); sync: store admitted %d",
		got, instances*limit, limit, got-limit, und, rate, und, time.Duration(float64(und)/float64(instances-1)/rate*float64(time.Second)).Round(time.Millisecond), interval, alone)
	if got > limit+und || got < limit {
		t.Errorf("sync: gossip admitted %d, want %d to %d (the limit plus the most undelivered at an admission)", got, limit, limit+und)
	}
	if alone != instances*limit {
		t.Errorf("sync: store on each engine's memory store admitted %d, want %d", alone, instances*limit)
	}
	for i, c := range f.coords {
		if st := c.Stats(); st.GossipReceived == 0 || st.Invalid != invalid0[i] {
			t.Errorf("coordinator %d: %d gossip messages received, %d invalid since the membership was complete (%v in all): want some, none invalid", i, st.GossipReceived, st.Invalid-invalid0[i], st.InvalidBy)
		}
	}
}

// TestGossipNATSJoin: an engine started after the others used most of a
// key's limit admits only what is left: its join sync charged it the
// peers' counts, the largest of their views rather than their sum.
func TestGossipNATSJoin(t *testing.T) {
	checkLeaks(t)
	const limit, used = 100, 80
	cfg := gossipNATSConfig()
	cfg.SyncWait = patience
	f := startFleetConfig(t, cfg, 0, memoryStores)
	clock := testkit.NewClock()
	gossipEngines(t, f, 2, clock.Now, WithGossipInterval(10*time.Millisecond))
	p := gossipWindow(limit)
	for i := range used {
		if r, err := f.engines[i%2].Allow(context.Background(), "k", p); err != nil || !r.Allowed {
			t.Fatalf("request %d: %+v, %v: want admitted", i, r, err)
		}
	}
	testkit.For(t, patience, "both engines charged each other's units", func() bool {
		return gossipUsed(t, f.engines[0], "k", p) == used && gossipUsed(t, f.engines[1], "k", p) == used
	})
	late := f.add(t, 2, memoryStores(), withClock(clock.Now), WithGossipInterval(10*time.Millisecond))
	testkit.For(t, patience, "the late engine's join sync answered", func() bool {
		return f.coords[2].Stats().GossipSyncApplied >= 1
	})
	var admitted int64
	for range limit {
		if r, err := late.Allow(context.Background(), "k", p); err != nil {
			t.Fatal(err)
		} else if r.Allowed {
			admitted++
		}
	}
	st := f.coords[2].Stats()
	t.Logf("an engine joining after %d of %d units were used admitted %d of %d requests; %d snapshot messages applied, %d late", used, limit, admitted, limit, st.GossipSyncApplied, st.LateReplies)
	if admitted != limit-used {
		t.Errorf("the late engine admitted %d, want what was left, %d", admitted, limit-used)
	}
}

// TestGossipNATSPeerKilled: a peer's NATS connection closes under it (no
// Close) right after it admitted units its round has not sent yet. What it
// admitted and sent before stays charged on the survivors after they count
// it gone, nothing is refunded, and the survivors go on deciding: the key
// admits at most the limit plus that lost round.
func TestGossipNATSPeerKilled(t *testing.T) {
	checkLeaks(t)
	const limit, sent, unsent = 200, 60, 40
	f := startFleetConfig(t, gossipNATSConfig(), 0, memoryStores)
	clock := testkit.NewClock()
	gossipEngines(t, f, 2, clock.Now, WithGossipInterval(10*time.Millisecond))
	p := gossipWindow(limit)

	// The victim dials its own connection, for the test to close.
	nc, err := nats.Connect(f.cluster.URL(2), nats.NoReconnect())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	co, err := coordinator.NewNATS(nc, f.cfg)
	if err != nil {
		t.Fatal(err)
	}
	victim, err := New(memoryStores(), WithoutDetector(), WithCoordinator(co), withClock(clock.Now), WithGossipInterval(200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer victim.Close()
	survivors := f.engines
	testkit.For(t, patience, "membership", func() bool {
		return survivors[0].liveInstances() == 3 && survivors[1].liveInstances() == 3 && victim.liveInstances() == 3
	})
	take := func(e *Engine, n int) int64 {
		var admitted int64
		for range n {
			if r, err := e.Allow(context.Background(), "k", p); err != nil {
				t.Fatal(err)
			} else if r.Allowed {
				admitted++
			}
		}
		return admitted
	}
	if got := take(victim, sent); got != sent {
		t.Fatalf("victim admitted %d of %d", got, sent)
	}
	testkit.For(t, patience, "the victim's first units charged on the survivors", func() bool {
		return gossipUsed(t, survivors[0], "k", p) == sent && gossipUsed(t, survivors[1], "k", p) == sent
	})
	if got := take(victim, unsent); got != unsent {
		t.Fatalf("victim admitted %d of %d more", got, unsent)
	}
	nc.Close() // killed mid-round
	testkit.For(t, patience, "the survivors count the victim gone", func() bool {
		return survivors[0].liveInstances() == 2 && survivors[1].liveInstances() == 2
	})
	charged := []int64{gossipUsed(t, survivors[0], "k", p), gossipUsed(t, survivors[1], "k", p)}
	if charged[0] != charged[1] || charged[0] < sent || charged[0] > sent+unsent {
		t.Fatalf("the survivors were charged %v of the victim's %d units, want the same, at least the %d it sent", charged, sent+unsent, sent)
	}

	// The survivors decide on: the first until it denies, then the second
	// once charged the first's units.
	first := take(survivors[0], limit)
	testkit.For(t, patience, "the second survivor charged the first's units", func() bool {
		return gossipUsed(t, survivors[1], "k", p) == charged[1]+first
	})
	second := take(survivors[1], limit)
	total := sent + unsent + first + second
	lost := sent + unsent - charged[0]
	t.Logf("victim admitted %d (%d in the round it did not send), survivors were charged %d of them (%d lost) and admitted %d and %d: %d in all, limit %d",
		sent+unsent, unsent, charged[0], lost, first, second, total, limit)
	if total > limit+unsent || total != limit+lost {
		t.Errorf("admitted %d in all, want the limit %d plus the units lost with the victim's last round, %d (at most %d)", total, limit, lost, unsent)
	}
	if first != limit-charged[0] {
		t.Errorf("the first survivor admitted %d after the victim died, want %d: the victim's charged units refunded or lost", first, limit-charged[0])
	}
	victim.Close()
	if err := co.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestGossipNATSDown: with the whole NATS cluster down, gossip engines go
// on deciding on their own counts, hotkey_gossip_alone is 1 and their
// coordinators count the disconnection and the rounds not sent; with NATS
// back, alone is 0 again and rounds reach the peers.
func TestGossipNATSDown(t *testing.T) {
	checkLeaks(t)
	const limit = 50
	f := startFleetConfig(t, gossipNATSConfig(), 0, memoryStores)
	clock := testkit.NewClock()
	regs := gossipEngines(t, f, 3, clock.Now, WithGossipInterval(20*time.Millisecond))
	p := gossipWindow(limit)
	ctx := context.Background()
	alone := func(want float64) func() bool {
		return func() bool {
			for _, reg := range regs {
				if gather(t, reg)["hotkey_gossip_alone"] != want {
					return false
				}
			}
			return true
		}
	}
	for _, e := range f.engines {
		if _, err := e.Allow(ctx, "before", p); err != nil {
			t.Fatal(err)
		}
	}
	testkit.For(t, patience, "hotkey_gossip_alone 0 on every engine", alone(0))

	for i := range f.cluster.Len() {
		f.cluster.Shutdown(i)
	}
	took := testkit.For(t, patience, "hotkey_gossip_alone 1 on every engine", alone(1))
	for i, e := range f.engines {
		var admitted int64
		for range 2 * limit {
			r, err := e.Allow(ctx, "down", p)
			if err != nil {
				t.Fatalf("engine %d with NATS down: %v", i, err)
			}
			if r.Allowed {
				admitted++
			}
		}
		if admitted != limit {
			t.Errorf("engine %d with NATS down admitted %d of %d, want its own limit, %d", i, admitted, 2*limit, limit)
		}
	}
	// Units of a key only engine 0 takes while alone: its peers learn
	// them only from its join snapshot, if they ask after it reconnected.
	for range 20 {
		f.engines[0].Allow(ctx, "solo", p)
	}
	testkit.For(t, patience, "the rounds of the outage refused by the coordinators", func() bool {
		for _, e := range f.engines {
			if st := e.Stats().Coordinator; st.Disconnects == 0 || st.GossipPublishErrors == 0 {
				return false
			}
		}
		return true
	})
	t.Logf("alone %v after the cluster went down", took)

	for i := range f.cluster.Len() {
		if err := f.cluster.Restart(i); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.cluster.WaitMeshed(); err != nil {
		t.Fatal(err)
	}
	took = testkit.For(t, patience, "hotkey_gossip_alone 0 on every engine", alone(0))
	if got := func() int64 {
		var n int64
		for range 10 {
			if r, _ := f.engines[0].Allow(ctx, "after", p); r.Allowed {
				n++
			}
		}
		return n
	}(); got != 10 {
		t.Fatalf("engine 0 admitted %d of 10 after NATS came back", got)
	}
	// Interest crosses the new routes asynchronously: a round sent before
	// it did is lost, which is the gossip's AP, so the wait is for the
	// peers to be charged the units sooner or later, sent again if need be.
	flowed := testkit.For(t, patience, "engine 0's units charged on its peers", func() bool {
		if gossipUsed(t, f.engines[1], "after", p) >= 10 && gossipUsed(t, f.engines[2], "after", p) >= 10 {
			return true
		}
		f.engines[0].Allow(ctx, "after", p)
		return false
	})
	solo := []int64{gossipUsed(t, f.engines[1], "solo", p), gossipUsed(t, f.engines[2], "solo", p)}
	t.Logf("alone 0 %v after the cluster was meshed again; rounds charged on the peers %v later; the 20 units engine 0 admitted alone charged %v on its peers", took, flowed, solo)
	if solo[0] > 20 || solo[1] > 20 {
		t.Errorf("engine 0's 20 units admitted alone charged %v on its peers, want at most 20", solo)
	}
}

// TestGossipNATSPartition: two sides, each two engines on a NATS server of
// its own (as a cluster whose routes are cut), take one key at three times
// its limit. Each side goes on deciding on what it hears: each admits at
// least the limit and at most the limit plus the most its deciding engine
// had not been charged yet, so the key admits at most sides × (limit +
// that bound) where one counter admits the limit.
func TestGossipNATSPartition(t *testing.T) {
	checkLeaks(t)
	const limit, perSide = 200, 2
	const interval, pause = 100 * time.Millisecond, time.Millisecond
	clock := testkit.NewClock()
	var engines []*Engine
	var side []int
	for s := range 2 {
		srv, err := natsserver.Start(natsserver.Options{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(srv.Shutdown)
		for range perSide {
			co, err := coordinator.NewNATS(natsConn(t, []string{srv.URL()}), gossipNATSConfig())
			if err != nil {
				t.Fatal(err)
			}
			e, err := New(memoryStores(), WithoutDetector(), WithCoordinator(co), withClock(clock.Now), WithGossipInterval(interval))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { e.Close() })
			engines, side = append(engines, e), append(side, s)
		}
	}
	testkit.For(t, patience, "each side's membership", func() bool {
		for _, e := range engines {
			if e.liveInstances() != perSide {
				return false
			}
		}
		return true
	})
	p := gossipWindow(limit)
	// 3× the limit over the whole: 1.5× on each side.
	admitted, undelivered := gossipDrive(t, engines, side, fmt.Sprintf("part:%x", rand.Uint64()), p, 3*limit/(2*perSide), pause)
	total := admitted[0] + admitted[1]
	t.Logf("partitioned into 2 sides of %d engines at 3× a limit of %d: sides admitted %v (most undelivered at an admission %v): %d in all, %.2f× the limit, %d over it",
		perSide, limit, admitted, undelivered, total, float64(total)/limit, total-limit)
	for s := range admitted {
		if admitted[s] < limit || admitted[s] > limit+undelivered[s] {
			t.Errorf("side %d admitted %d, want %d to %d (the limit plus its most undelivered)", s, admitted[s], limit, limit+undelivered[s])
		}
	}
}

// TestGossipNATSClockStep: with a Secret, a coordinator refuses messages
// stamped more than MaxClockSkew from its clock. An instance whose clock
// steps within it goes on gossiping; one stepped beyond it is, for gossip,
// partitioned away: its rounds are refused as stale, counted, and the
// units in them are never charged, even once its clock is back within the
// skew. A gossip store's messages carry its start and round numbers, not
// the time: a step changes nothing in them.
func TestGossipNATSClockStep(t *testing.T) {
	checkLeaks(t)
	const limit = 1000
	const skew = 10 * time.Second
	srv, err := natsserver.Start(natsserver.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	clock := testkit.NewClock()
	var step atomic.Int64 // b's clocks are ahead by this much
	p := gossipWindow(limit)
	newEngine := func(now func() time.Time, clock func() time.Time) (*Engine, *coordinator.NATS) {
		cfg := gossipNATSConfig()
		cfg.MaxClockSkew = skew
		cfg.Heartbeat = time.Minute // no heartbeat among the messages refused
		cfg.Now = now
		co, err := coordinator.NewNATS(natsConn(t, []string{srv.URL()}), cfg)
		if err != nil {
			t.Fatal(err)
		}
		// Rounds go out when the test flushes them, not every interval.
		e, err := New(memoryStores(), WithoutDetector(), WithCoordinator(co), withClock(clock), WithGossipInterval(time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { e.Close() })
		return e, co
	}
	a, ca := newEngine(time.Now, clock.Now)
	bNow := func() time.Time { return clock.Now().Add(time.Duration(step.Load())) }
	b, cb := newEngine(func() time.Time { return time.Now().Add(time.Duration(step.Load())) }, bNow)
	ctx := context.Background()
	var admitted int64
	// round admits 10 units on b, sends its round through b's coordinator
	// and waits until a handled every gossip message b sent.
	round := func() {
		t.Helper()
		for range 10 {
			if r, err := b.Allow(ctx, "k", p); err != nil || !r.Allowed {
				t.Fatalf("b: %+v, %v: want admitted", r, err)
			}
			admitted++
		}
		for _, m := range b.gossipFlush(bNow()) {
			if err := cb.PublishGossip(m); err != nil {
				t.Fatal(err)
			}
		}
		testkit.For(t, patience, "a handled all b sent", func() bool {
			st := ca.Stats()
			return st.GossipReceived+st.Invalid >= cb.Stats().GossipPublished
		})
	}
	stale := func() uint64 { return ca.Stats().InvalidBy["stale"] }

	round()
	if got := gossipUsed(t, a, "k", p); got != admitted || stale() != 0 {
		t.Fatalf("no step: a charged %d of b's %d, %d stale: want all, none", got, admitted, stale())
	}
	step.Store(int64(skew / 2)) // within the skew: nothing changes
	round()
	if got := gossipUsed(t, a, "k", p); got != admitted || stale() != 0 {
		t.Errorf("b stepped %v (skew %v): a charged %d of b's %d, %d stale: want all, none", skew/2, skew, got, admitted, stale())
	}
	step.Store(int64(6 * skew)) // beyond it: b's rounds are refused
	charged := admitted
	round()
	round()
	if got, n := gossipUsed(t, a, "k", p), stale(); got != charged || n == 0 {
		t.Errorf("b stepped %v (skew %v): a charged %d of b's %d, %d stale: want %d, some stale", 6*skew, skew, got, admitted, n, charged)
	}
	lost := admitted - charged
	step.Store(int64(skew / 2)) // back within it: b's rounds reach a again
	round()
	step.Store(0) // a step back within it changes nothing either
	round()
	got := gossipUsed(t, a, "k", p)
	t.Logf("b admitted %d; a was charged %d: %d refused while b's clock was %v ahead (%d stale messages), none refused %v ahead or stepped back to a's (skew %v)",
		admitted, got, lost, 6*skew, stale(), skew/2, skew)
	if got != admitted-lost || stale() != 2 || ca.Stats().Invalid != 2 {
		t.Errorf("b back within the skew: a charged %d of b's %d, %d messages refused (%v): want all but the %d refused, the 2 rounds sent beyond it",
			got, admitted, ca.Stats().Invalid, ca.Stats().InvalidBy, lost)
	}
}

// TestGossipNATSJoinBusy: an engine joining a peer that holds 130,000 keys
// (under the snapshot's cap of 131,072) while the peer decides under load
// gets at least 99% of them from the peer's snapshot, with the default
// SyncWait. The peer's rounds of those keys went out before the joiner
// started: only its snapshot carries them.
func TestGossipNATSJoinBusy(t *testing.T) {
	checkLeaks(t)
	const keys, busyKeys = 130_000, 64
	ctx := context.Background()
	cfg := gossipNATSConfig()
	cfg.SyncWait = coordinator.DefaultSyncWait
	f := startFleetConfig(t, cfg, 0, memoryStores)
	clock := testkit.NewClock()
	gossipEngines(t, f, 1, clock.Now, WithGossipInterval(10*time.Millisecond))
	peer := f.engines[0]
	p := gossipWindow(1000)
	names := make([]string, keys)
	for i := range names {
		names[i] = fmt.Sprintf("user:%06d", i)
		if r, err := peer.Allow(ctx, names[i], p); err != nil || !r.Allowed {
			t.Fatalf("key %d: %+v, %v", i, r, err)
		}
	}
	testkit.For(t, patience, "the peer's rounds of its keys sent", func() bool {
		st, _ := peer.gossipStats()
		return st.EntriesSent >= keys
	})

	// Busy: the peer decides on other keys, as fast as one goroutine can,
	// while it answers the join.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var busy atomic.Int64
	wg.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			peer.Allow(ctx, fmt.Sprintf("busy:%d", i%busyKeys), p)
			busy.Add(1)
		}
	})
	reg := prometheus.NewRegistry()
	joiner := f.add(t, 0, memoryStores(), withClock(clock.Now), WithGossipInterval(10*time.Millisecond), WithMetrics(reg))
	jc, pc := f.coords[1], f.coords[0]
	testkit.For(t, patience, "every snapshot message the peer sent received", func() bool {
		ps, js := pc.Stats(), jc.Stats()
		return ps.SyncAnswered >= 1 && ps.GossipSyncSent > 0 && js.GossipSyncApplied+js.LateReplies >= ps.GossipSyncSent
	})
	close(stop)
	wg.Wait()
	held := 0
	for _, k := range names {
		if gossipUsed(t, joiner, k, p) > 0 {
			held++
		}
	}
	ps, js := pc.Stats(), jc.Stats()
	t.Logf("the joiner holds %d of the peer's %d keys: %d snapshot messages sent, %d applied, %d late; %d busy decisions meanwhile",
		held, keys, ps.GossipSyncSent, js.GossipSyncApplied, js.LateReplies, busy.Load())
	if held < keys*99/100 {
		t.Errorf("the joiner holds %d of %d keys, want at least 99%%", held, keys)
	}
	got := gather(t, reg)
	if late, applied := got[`hotkey_coordinator_messages_total{kind="late_replies"}`], got[`hotkey_coordinator_messages_total{kind="sync_replies"}`]; late != float64(js.LateReplies) || applied < float64(js.GossipSyncApplied) {
		t.Errorf("metrics: %v late replies, %v applied; want %d, at least %d", late, applied, js.LateReplies, js.GossipSyncApplied)
	}
}
