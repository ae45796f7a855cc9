package hotkey

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	"github.com/hotkeyd/hotkey/coordinator"
	"github.com/hotkeyd/hotkey/counter"
	"github.com/hotkeyd/hotkey/gossip"
	"github.com/hotkeyd/hotkey/internal/testkit"
	"github.com/hotkeyd/hotkey/shard"
)

// gossipRun drives instances engines on one clock, each deciding one
// request of key a step (1 ms) for d, under p: with deliver, every interval
// each engine's round goes to the others at once. It returns the units
// admitted.
func gossipRun(t *testing.T, instances int, p *Policy, d, interval time.Duration, deliver bool) int64 {
	t.Helper()
	clock := testkit.NewClock()
	engines := make([]*Engine, instances)
	for i := range engines {
		e, _ := newMemoryEngine(t, clock, withGossipRounds())
		engines[i] = e
	}
	const step = time.Millisecond
	var admitted int64
	for at := step; at <= d; at += step {
		clock.Advance(step)
		for _, e := range engines {
			r, err := e.Allow(context.Background(), "k", p)
			if err != nil {
				t.Fatal(err)
			}
			if r.Allowed {
				admitted++
			}
		}
		if at%interval == 0 && deliver {
			for i, from := range engines {
				for _, m := range from.gossipFlush(clock.Now()) {
					for j, to := range engines {
						if j != i {
							if err := to.gossipApply(m); err != nil {
								t.Fatal(err)
							}
						}
					}
				}
			}
		}
	}
	return admitted
}

// TestGossipEngines: three engines on one key at three times its limit,
// their rounds delivered by the test every simulated 100 ms, admit at most
// the limit plus (instances − 1) × rate × (interval + one step of
// delivery), and at least 98% of the limit; not delivered, about three
// times the limit.
func TestGossipEngines(t *testing.T) {
	const instances, interval, d = 3, 100 * time.Millisecond, 10 * time.Second
	const step = time.Millisecond
	for _, c := range []struct {
		name string
		lim  Limit
		// ideal is what one counter admits of the load in d.
		ideal int64
	}{
		{"token-bucket", Limit{Rate: 1000, Period: time.Second, Burst: 100}, 100 + 1000*10},
		{"fixed-window", Limit{Algorithm: FixedWindow, Rate: 1000, Period: time.Second}, 1000 * 10},
		{"sliding-window", Limit{Algorithm: SlidingWindow, Rate: 1000, Period: time.Second}, 1000 * 10},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := &Policy{Name: "g", Limit: c.lim, Sync: SyncGossip}
			over := int64(instances-1) * c.lim.Rate * int64(interval+step) / int64(c.lim.Period)
			periods := int64(d / c.lim.Period)
			bound := c.ideal + over*periods
			if c.lim.Algorithm == TokenBucket {
				bound = c.ideal + over
			}
			got := gossipRun(t, instances, p, d, interval, true)
			alone := gossipRun(t, instances, p, d, interval, false)
			t.Logf("admitted %d delivered, %d not delivered; ideal %d, bound %d", got, alone, c.ideal, bound)
			if got > bound || got < c.ideal*98/100 {
				t.Errorf("delivered: admitted %d, want %d to %d", got, c.ideal*98/100, bound)
			}
			if alone < int64(instances)*c.ideal*95/100 {
				t.Errorf("not delivered: admitted %d, want about %d", alone, int64(instances)*c.ideal)
			}
		})
	}
}

// TestGossipNeverSplits: a SyncGossip key the detector finds hot, or one
// split statically, is decided whole: level 1 results, its limit exact on
// this instance. The detector still sees it, and HotKeys lists it.
func TestGossipNeverSplits(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	e := hotEngine(t, time.Minute, WithSplitKeys(4, &Policy{Name: "g"}, "static"))
	defer e.Close()
	p := &Policy{Name: "g", Limit: PerSecond(1_000_000), Sync: SyncGossip}
	deadline := time.Now().Add(20 * time.Second)
	for e.levelOf(nameOf("g", "hot")) == shard.Level1 {
		if time.Now().After(deadline) {
			t.Fatal("the detector did not find the key hot before the deadline")
		}
		r, err := e.Allow(context.Background(), "hot", p)
		if err != nil || !r.Allowed || r.Shards != 1 {
			t.Fatalf("hot key: %+v, %v: want admitted on 1 counter", r, err)
		}
	}
	if r, err := e.Allow(context.Background(), "hot", p); err != nil || r.Shards != 1 {
		t.Errorf("hot key at level %d: %+v, %v: want decided on 1 counter", e.levelOf(nameOf("g", "hot")), r, err)
	}
	listed := map[string]bool{}
	for _, h := range e.HotKeys() {
		listed[h.Key] = true
	}
	if !listed["hot"] || !listed["static"] {
		t.Errorf("HotKeys = %+v, want hot and static listed", e.HotKeys())
	}
	window := &Policy{Name: "g", Limit: Limit{Algorithm: FixedWindow, Rate: 10, Period: time.Hour}, Sync: SyncGossip}
	admitted := 0
	for range 40 {
		r, err := e.Allow(context.Background(), "static", window)
		if err != nil || r.Shards != 1 {
			t.Fatalf("static key: %+v, %v: want decided on 1 counter", r, err)
		}
		if r.Allowed {
			admitted++
		}
	}
	if admitted != 10 {
		t.Errorf("static key split 4 ways admitted %d of 40, want its limit, 10", admitted)
	}
}

// TestGossipAlone: with no coordinator carrying gossip, a SyncGossip
// policy decides exactly as SyncStore on a memory store: the same results
// for a seeded run of takes, batches and peeks, no round kept, no
// goroutine, and hotkey_gossip_alone says so.
func TestGossipAlone(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	clock := testkit.NewClock()
	reg := prometheus.NewRegistry()
	var gossiped, plain *Engine
	for _, e := range []**Engine{&gossiped, &plain} {
		opts := []Option{withClock(clock.Now), WithoutDetector()}
		if e == &gossiped {
			opts = append(opts, WithMetrics(reg))
		}
		var err error
		if *e, err = New(counter.NewMemoryStore(counter.MemoryConfig{Clock: clock.Now}), opts...); err != nil {
			t.Fatal(err)
		}
		defer (*e).Close()
	}
	rng := rand.New(rand.NewPCG(27, 1))
	lims := []Limit{
		{Rate: 50, Period: time.Second, Burst: 20},
		{Algorithm: FixedWindow, Rate: 30, Period: time.Second},
		{Algorithm: SlidingWindow, Rate: 30, Period: time.Second},
		{Algorithm: SlidingLog, Rate: 10, Period: time.Second},
	}
	ctx := context.Background()
	for i := range 5000 {
		clock.Advance(time.Duration(rng.Int64N(int64(20 * time.Millisecond))))
		lim := lims[rng.IntN(len(lims))]
		key, n := fmt.Sprintf("k%d", rng.IntN(5)), 1+rng.Int64N(3)
		g := &Policy{Name: "p" + lim.Algorithm.String(), Limit: lim, Sync: SyncGossip}
		s := &Policy{Name: g.Name, Limit: lim}
		var a, b Result
		var errA, errB error
		switch rng.IntN(3) {
		case 0:
			a, errA = gossiped.AllowN(ctx, key, g, n)
			b, errB = plain.AllowN(ctx, key, s, n)
		case 1:
			var da, db [2]Decision
			gossiped.AllowBatch(ctx, []Request{{key, g, n}, {key, g, 1}}, da[:])
			plain.AllowBatch(ctx, []Request{{key, s, n}, {key, s, 1}}, db[:])
			a, errA, b, errB = da[1].Result, da[1].Err, db[1].Result, db[1].Err
			if da[0] != db[0] {
				t.Fatalf("step %d: batch %+v, want %+v", i, da[0], db[0])
			}
		default:
			a, errA = gossiped.Peek(ctx, key, g)
			b, errB = plain.Peek(ctx, key, s)
		}
		if a != b || errA != nil || errB != nil {
			t.Fatalf("step %d: SyncGossip alone %+v, %v; SyncStore on memory %+v, %v", i, a, errA, b, errB)
		}
	}
	if msgs := gossiped.gossipFlush(clock.Now()); len(msgs) != 0 {
		t.Errorf("alone: a round of %d messages kept", len(msgs))
	}
	got := gather(t, reg)
	if got["hotkey_gossip_alone"] != 1 || got["hotkey_gossip_sent_messages_total"] != 0 {
		t.Errorf("metrics %v: want hotkey_gossip_alone 1, nothing sent", got)
	}
}

// gossiper is a coordinator.Gossiper that keeps what it is asked to
// publish, for a test to deliver.
type gossiper struct {
	coordinator.Local
	mu        sync.Mutex // guards published
	published [][]byte
	sent      chan struct{} // a value per publish, if not full
	connected bool
	refuse    atomic.Bool // PublishGossip fails
}

func newGossiper(connected bool) *gossiper {
	return &gossiper{sent: make(chan struct{}, 1), connected: connected}
}

func (g *gossiper) PublishGossip(p []byte) error {
	if g.refuse.Load() {
		return errors.New("not connected")
	}
	g.mu.Lock()
	g.published = append(g.published, p)
	g.mu.Unlock()
	select {
	case g.sent <- struct{}{}:
	default:
	}
	return nil
}

func (g *gossiper) MaxGossip() int  { return 32 << 10 }
func (g *gossiper) Connected() bool { return g.connected }

func (g *gossiper) take() [][]byte {
	g.mu.Lock()
	defer g.mu.Unlock()
	p := g.published
	g.published = nil
	return p
}

var _ coordinator.Gossiper = (*gossiper)(nil)

// snapshotOf returns the payloads of e's handler's GossipSnapshot.
func snapshotOf(e *Engine, maxBytes int) [][]byte {
	var msgs [][]byte
	handler{e}.GossipSnapshot(maxBytes, func(p []byte) { msgs = append(msgs, p) })
	return msgs
}

// TestGossipCoordinator: on a coordinator that carries gossip, the engine
// publishes its rounds every interval and a last one at Close, charges its
// peers' (the handler's Gossip), answers a join with its view
// (GossipSnapshot) and takes a peer's (GossipSync); its metrics count it.
func TestGossipCoordinator(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	lim := Limit{Algorithm: FixedWindow, Rate: 100, Period: time.Hour}
	p := &Policy{Name: "g", Limit: lim, Sync: SyncGossip}
	ctx := context.Background()
	clock := testkit.NewClock()

	// Every interval: a round goes out while the engine runs.
	ga := newGossiper(true)
	regA := prometheus.NewRegistry()
	a, err := New(counter.NewMemoryStore(counter.MemoryConfig{}), WithoutDetector(), withClock(clock.Now), WithCoordinator(ga), WithGossipInterval(time.Millisecond), WithMetrics(regA))
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if snap := snapshotOf(a, ga.MaxGossip()); snap != nil {
		t.Errorf("snapshot before any gossip decision: %d messages, want none", len(snap))
	}
	a.AllowN(ctx, "k", p, 30)
	select {
	case <-ga.sent:
	case <-time.After(10 * time.Second):
		t.Fatal("no round published within 10 s at an interval of 1 ms")
	}
	round := ga.take()

	// A peer: charged a's round, joined from a's snapshot.
	gb := newGossiper(false)
	regB := prometheus.NewRegistry()
	b, err := New(counter.NewMemoryStore(counter.MemoryConfig{}), WithoutDetector(), withClock(clock.Now), WithCoordinator(gb), WithGossipInterval(time.Minute), WithMetrics(regB))
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range round {
		handler{b}.Gossip(m)
	}
	for _, m := range snapshotOf(a, gb.MaxGossip()) {
		handler{b}.GossipSync(m) // a's 30 again: b has seen them
	}
	if r, _ := b.Peek(ctx, "k", p); r.Remaining != 69 {
		t.Errorf("peer after a's round and snapshot: %d left after one more, want 69", r.Remaining)
	}
	b.AllowN(ctx, "k", p, 5)
	if err := b.Close(); err != nil { // its last round goes out
		t.Fatal(err)
	}
	last := gb.take()
	for _, m := range last {
		handler{a}.Gossip(m)
	}
	if r, _ := a.Peek(ctx, "k", p); len(last) != 1 || r.Remaining != 64 {
		t.Errorf("b's last round: %d messages, a has %d left after one more: want 1, 64", len(last), r.Remaining)
	}
	gotA, gotB := gather(t, regA), gather(t, regB)
	if gotA["hotkey_gossip_sent_messages_total"] < 1 || gotA["hotkey_gossip_sent_bytes_total"] < 1 ||
		gotA[`hotkey_gossip_entries_total{event="applied"}`] != 1 || gotA["hotkey_gossip_alone"] != 0 {
		t.Errorf("a's metrics %v: want a message sent, an entry applied, not alone", gotA)
	}
	if gotB["hotkey_gossip_alone"] != 1 || gotB[`hotkey_gossip_entries_total{event="applied"}`] != 1 {
		t.Errorf("b's metrics %v: want alone (not connected), one entry applied", gotB)
	}
	ga.refuse.Store(true)
	a.AllowN(ctx, "k", p, 1)
	a.Close()
	if got := a.gossipErrors.Load(); got != 1 {
		t.Errorf("%d send errors, want 1: the last round refused", got)
	}
}

func TestWithGossipInterval(t *testing.T) {
	for _, c := range []struct {
		give time.Duration
		ok   bool
	}{
		{0, false}, {-time.Second, false}, {time.Microsecond, false},
		{time.Millisecond, true}, {DefaultGossipInterval, true}, {time.Minute, true},
		{time.Minute + 1, false},
	} {
		var o options
		if err := WithGossipInterval(c.give)(&o); (err == nil) != c.ok {
			t.Errorf("WithGossipInterval(%v): %v, want ok %v", c.give, err, c.ok)
		}
	}
}

// TestGossipOutageLogged: rounds the coordinator refuses are logged once
// per outage, a warning at the first with its error, and the next round
// sent whole once, with how many failed; every refused message is still
// counted. Empty rounds between change nothing.
func TestGossipOutageLogged(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	p := &Policy{Name: "g", Limit: Limit{Algorithm: FixedWindow, Rate: 1000, Period: time.Hour}, Sync: SyncGossip}
	ctx := context.Background()
	var logs testkit.Buffer
	g := newGossiper(true)
	g.refuse.Store(true)
	e, err := New(counter.NewMemoryStore(counter.MemoryConfig{}), WithoutDetector(), WithCoordinator(g), WithGossipInterval(time.Millisecond),
		WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	// refused sends a round of one key and waits until it is refused.
	refused := func() {
		n := e.gossipErrors.Load()
		e.Allow(ctx, "k", p)
		testkit.For(t, 10*time.Second, fmt.Sprintf("a round refused after %d", n), func() bool { return e.gossipErrors.Load() > n })
	}
	const failed = 5
	for range failed {
		refused()
	}
	g.refuse.Store(false)
	e.Allow(ctx, "k", p)
	select {
	case <-g.sent:
	case <-time.After(10 * time.Second):
		t.Fatal("no round published within 10 s at an interval of 1 ms")
	}
	g.refuse.Store(true)
	refused() // a second outage, warned again
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	var warns, infos int
	for _, l := range strings.Split(logs.String(), "\n") {
		switch {
		case strings.Contains(l, "level=WARN") && strings.Contains(l, "gossip round") && strings.Contains(l, "not connected"):
			warns++
		case strings.Contains(l, "level=INFO") && strings.Contains(l, "gossip round sent whole again") && strings.Contains(l, fmt.Sprintf("failed_rounds=%d", failed)):
			infos++
		}
	}
	if warns != 2 || infos != 1 || e.gossipErrors.Load() != failed+1 {
		t.Errorf("%d rounds refused, one sent, one refused: %d warnings, %d infos, %d send errors; want 2, 1 (failed_rounds=%d), %d\n%s",
			failed, warns, infos, e.gossipErrors.Load(), failed, failed+1, logs.String())
	}
}

// TestGossipAloneFromStart: hotkey_gossip_alone is scraped before any
// SyncGossip decision on an engine whose coordinator carries gossip, at
// whether it reaches its peers; with one that carries none (the default
// coordinator.Local) it appears, at 1, with the first such decision.
func TestGossipAloneFromStart(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	for _, c := range []struct {
		name        string
		give        coordinator.Coordinator
		want, after float64 // before any decision (-1: absent), after one
	}{
		{"connected", newGossiper(true), 0, 0},
		{"not connected", newGossiper(false), 1, 1},
		{"local", nil, -1, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			reg := prometheus.NewRegistry()
			opts := []Option{WithoutDetector(), WithMetrics(reg)}
			if c.give != nil {
				opts = append(opts, WithCoordinator(c.give))
			}
			e, err := New(counter.NewMemoryStore(counter.MemoryConfig{}), opts...)
			if err != nil {
				t.Fatal(err)
			}
			defer e.Close()
			scrape := func() float64 {
				if v, ok := gather(t, reg)["hotkey_gossip_alone"]; ok {
					return v
				}
				return -1
			}
			if got := scrape(); got != c.want {
				t.Errorf("before any decision: hotkey_gossip_alone %v, want %v (-1: absent)", got, c.want)
			}
			e.Allow(context.Background(), "k", &Policy{Name: "g", Limit: Limit{Rate: 10, Period: time.Second}, Sync: SyncGossip})
			if got := scrape(); got != c.after {
				t.Errorf("after a decision: hotkey_gossip_alone %v, want %v", got, c.after)
			}
		})
	}
}

// TestGossipCapsPeerEntry: a peer's entry of 2^63-1 units on a 10/s token
// bucket denies the key for what the bucket admits in a round's span, not
// for decades; the capped entry is counted.
func TestGossipCapsPeerEntry(t *testing.T) {
	p := &Policy{Name: "g", Limit: PerSecond(10), Sync: SyncGossip}
	ctx := context.Background()
	clock := testkit.NewClock()
	reg := prometheus.NewRegistry()
	a, _ := newMemoryEngine(t, clock, withGossipRounds())
	b, err := New(counter.NewMemoryStore(counter.MemoryConfig{}), WithoutDetector(), withClock(clock.Now), withGossipRounds(), WithMetrics(reg))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	a.Allow(ctx, "k", p)
	codec := gossip.NewCodec(gossip.Config{})
	for _, raw := range a.gossipFlush(clock.Now()) {
		m, err := codec.Decode(raw)
		if err != nil {
			t.Fatal(err)
		}
		for i := range m.Entries {
			m.Entries[i].Units = math.MaxInt64
		}
		forged, err := codec.Encode(m.Header, m.Entries)
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range forged {
			if err := b.gossipApply(f); err != nil {
				t.Fatal(err)
			}
		}
	}
	if r, _ := b.Allow(ctx, "k", p); r.Allowed {
		t.Fatal("the peer's entry charged nothing")
	}
	clock.Advance(5 * time.Second) // a round's span at 10/s is 11 units
	if r, _ := b.Allow(ctx, "k", p); !r.Allowed {
		t.Errorf("still denied 5 s after one peer entry: retry after %v", r.RetryAfter)
	}
	if got := gather(t, reg)[`hotkey_gossip_entries_total{event="capped"}`]; got != 1 {
		t.Errorf("capped entries metric %v, want 1", got)
	}
}

// lateGossiper delivers the rounds published on it to a peer's handler
// out of order: each round at a seeded delay of up to maxLate rounds, some
// twice, as a Gossiper may (the interface promises no order).
type lateGossiper struct {
	rng     *rand.Rand
	maxLate int
	queue   []lateDelivery
	round   int // rounds published
}

type lateDelivery struct {
	due int
	msg []byte
}

// publish queues a round's messages.
func (g *lateGossiper) publish(msgs [][]byte) (copies int) {
	g.round++
	for _, m := range msgs {
		for c := range 1 + g.rng.IntN(4)/3 { // a quarter go twice
			g.queue = append(g.queue, lateDelivery{due: g.round + g.rng.IntN(g.maxLate+1), msg: m})
			copies += c
		}
	}
	return copies
}

// deliver hands h the messages due by round, in a shuffled order; all of
// them if all.
func (g *lateGossiper) deliver(h coordinator.GossipHandler, round int, all bool) {
	g.rng.Shuffle(len(g.queue), func(i, j int) { g.queue[i], g.queue[j] = g.queue[j], g.queue[i] })
	rest := g.queue[:0]
	for _, d := range g.queue {
		if d.due <= round || all {
			h.Gossip(d.msg)
		} else {
			rest = append(rest, d)
		}
	}
	g.queue = rest
}

// TestGossipLateRounds: rounds delivered up to 40 rounds late, shuffled and
// some twice, are each applied once: the peer's view holds every unit the
// sender admitted, and the copies are refused as duplicates. A round
// delivered later than the dedup remembers is refused and counted as late,
// its entries as dropped, never applied twice.
func TestGossipLateRounds(t *testing.T) {
	p := &Policy{Name: "g", Limit: Limit{Algorithm: FixedWindow, Rate: 1 << 30, Period: time.Hour}, Sync: SyncGossip}
	ctx := context.Background()
	clock := testkit.NewClock()
	a, _ := newMemoryEngine(t, clock, withGossipRounds())
	reg := prometheus.NewRegistry()
	b, err := New(counter.NewMemoryStore(counter.MemoryConfig{}), WithoutDetector(), withClock(clock.Now), withGossipRounds(), WithMetrics(reg))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	g := &lateGossiper{rng: rand.New(rand.NewPCG(3, 9)), maxLate: 40}
	const rounds = 900
	var sent int64
	copies := 0
	for r := range rounds {
		n := 1 + int64(r%3)
		if res, _ := a.AllowN(ctx, "k", p, n); !res.Allowed {
			t.Fatalf("round %d: denied", r)
		}
		sent += n
		clock.Advance(100 * time.Millisecond)
		copies += g.publish(a.gossipFlush(clock.Now()))
		g.deliver(handler{b}, r+1, false)
	}
	g.deliver(handler{b}, 0, true)
	held := func() int64 {
		r, _ := b.Peek(ctx, "k", p)
		return p.Limit.Rate - r.Remaining - 1
	}
	if got := held(); got != sent {
		t.Errorf("the peer holds %d of the %d units sent", got, sent)
	}
	st, _ := b.gossipStats()
	if st.Duplicates != uint64(copies) || st.Late != 0 {
		t.Errorf("stats %+v: want %d duplicates (the copies), none late", st, copies)
	}

	// A round more than the dedup remembers late: refused and counted.
	a.AllowN(ctx, "k", p, 7)
	held1 := a.gossipFlush(clock.Now())
	for range 2 * gossip.DefaultRounds {
		a.AllowN(ctx, "k", p, 1)
		sent++
		for _, m := range a.gossipFlush(clock.Now()) {
			handler{b}.Gossip(m)
		}
	}
	for range 2 {
		for _, m := range held1 {
			handler{b}.Gossip(m)
		}
	}
	if got := held(); got != sent {
		t.Errorf("the peer holds %d units, want %d: all but the late round's 7", got, sent)
	}
	got := gather(t, reg)
	if got[`hotkey_gossip_refused_messages_total{reason="late"}`] != 2 || got[`hotkey_gossip_dropped_total{reason="late"}`] != 2 ||
		got[`hotkey_gossip_refused_messages_total{reason="duplicate"}`] != float64(copies) {
		t.Errorf("metrics %v: want 2 late messages, 2 late entries dropped, %d duplicates", got, copies)
	}
}
