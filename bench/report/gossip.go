package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/hotkeyd/hotkey"
	"github.com/hotkeyd/hotkey/bench/internal/scenario"
	"github.com/hotkeyd/hotkey/coordinator"
	"github.com/hotkeyd/hotkey/counter"
	"github.com/hotkeyd/hotkey/internal/natsserver"
	"github.com/hotkeyd/hotkey/loadgen"
)

// gossipEngines is the instances of the gossip scenario.
const gossipEngines = 10

// runGossip measures sync: gossip on 10 engines in one process, each with a
// NATS coordinator of its own connected to one node of a 3-node NATS
// cluster on loopback (round-robin) and the memory store: the overshoot in
// the design's case (100/min over the 10 at 100 ms rounds), admitted ÷ limit
// of 1,000/s at 3× load, the bytes a round of 100,000 keys puts on NATS,
// and the decision's cost against sync: store on the memory store.
func runGossip(ctx context.Context, s *setup) (*scenario.Section, error) {
	cluster, err := natsserver.StartCluster(3, natsserver.Options{})
	if err != nil {
		return nil, err
	}
	defer cluster.Close()

	design := s.scale(time.Minute, 10*time.Second)
	load := s.scale(30*time.Second, 5*time.Second)
	sec := &scenario.Section{Setup: fmt.Sprintf("%d engines in one process, each with the memory store and a NATS coordinator of its own on one node of a 3-node NATS cluster on loopback (engine i on node i mod 3), gossip interval %v; each request goes to an engine picked at random, open loop.",
		gossipEngines, hotkey.DefaultGossipInterval)}

	f, err := startGossipFleet(cluster, hotkey.DefaultGossipInterval, true)
	if err != nil {
		return nil, err
	}
	// The design's case: 100 per minute, fixed windows of a minute (or, in
	// quick mode, the same rate in windows of the run's length).
	const designKeys = 50
	designLimit := int64(math.Round(100 * design.Seconds() / 60))
	dp := &hotkey.Policy{Name: "design", Limit: hotkey.Limit{Algorithm: hotkey.FixedWindow, Rate: designLimit, Period: design}, Sync: hotkey.SyncGossip}
	dres, err := f.windows(ctx, "d", dp, designKeys, 2*float64(designKeys*designLimit)/design.Seconds(), design)
	if err != nil {
		f.Close()
		return nil, err
	}
	// 1,000/s at 3× load, fixed windows of 1 s.
	lp := &hotkey.Policy{Name: "load", Limit: hotkey.Limit{Algorithm: hotkey.FixedWindow, Rate: 1000, Period: time.Second}, Sync: hotkey.SyncGossip}
	lres, err := f.windows(ctx, "l", lp, 1, 3000, load)
	f.Close()
	if err != nil {
		return nil, err
	}

	sec.Printf("**The design's case.** %d keys, each with a limit of %d per fixed window of %s (100 per minute%s), offered twice that in all (%.1f/s over the keys, each request to a random key and engine) for %s. A key-window is one key's fixed window; those that reached the limit are the ones that can overshoot. The design expects 1–2 extra per minute; its bound is (instances − 1) × rate × (interval + delivery) = 9 × %.2f/s × (100 ms + delivery) ≈ 1.5.\n\n",
		designKeys, designLimit, seconds(design), quickNote(s.quick, "; in quick mode the window is the run's length and the limit scaled to it"), 2*float64(designKeys*designLimit)/design.Seconds(), seconds(design), 100.0/60)
	sec.Printf("| key-windows that reached the limit | extra admitted per key-window: mean | max | key-windows with 0 / 1 / 2 / ≥3 extra | key-windows denied under the limit | offered | admitted | denied | decisions across a window's edge |\n|---|---|---|---|---|---|---|---|---|\n")
	extra, hist := dres.extras(designLimit)
	sec.Printf("| %d | %.2f | %d | %d / %d / %d / %d | %d | %d | %d | %d | %d |\n\n", len(extra), mean(extra), slices.Max(append(extra, 0)),
		hist[0], hist[1], hist[2], hist[3], dres.shortWindows(designLimit), dres.offered(), dres.admitted(), dres.denied(), dres.edges())

	sec.Printf("**1,000/s at 3× load.** One key, a limit of 1,000 per fixed 1 s window, offered 3,000/s spread over the %d engines for %s; only the 1 s windows wholly inside the run are counted.\n\n", gossipEngines, seconds(load))
	sec.Printf("| 1 s windows | admitted ÷ limit overall | worst 1 s window | lowest 1 s window | offered | denied |\n|---|---|---|---|---|---|\n")
	overall, worst, lowest, n := lres.ratios(1000)
	sec.Printf("| %d | %.3f | %.3f | %.3f | %d | %d |\n\n", n, overall, worst, lowest, lres.offered(), lres.denied())
	sec.Printf("An instance decides on its own view, which lacks what its peers admitted since their last round reached it: the limit is overshot while the views catch up, up to (instances − 1) × rate × (interval + delivery) by the design's bound (9 × 1,000/s × 100 ms = 900 a window, 1.9× the limit, at most). A round that arrives after its window ended is charged to the next window, which then admits less.\n\n")

	if err := gossipBytes(cluster, s, sec); err != nil {
		return nil, err
	}
	if err := gossipCost(ctx, cluster, s, sec); err != nil {
		return nil, err
	}
	return sec, nil
}

// seconds formats d as "60 s".
func seconds(d time.Duration) string { return fmt.Sprintf("%.0f s", d.Seconds()) }

func quickNote(quick bool, note string) string {
	if quick {
		return note
	}
	return ""
}

// gossipFleet is the scenario's engines.
type gossipFleet struct {
	engines []*hotkey.Engine
	coords  []*coordinator.NATS
	conns   []*nats.Conn // the coordinators'
}

// coordinatorConn connects to s as a coordinator's connection is meant to
// be made (coordinator.NewNATS). The caller closes it.
func coordinatorConn(s *natsserver.Server) (*nats.Conn, error) {
	return s.Connect(nats.MaxReconnects(-1), nats.ReconnectBufSize(-1), nats.NoEcho())
}

// startGossipFleet starts gossipEngines engines with the given gossip
// interval on the cluster, and waits until each counts the others live
// and, if warm, until a unit admitted on any reaches all.
func startGossipFleet(cluster *natsserver.Cluster, interval time.Duration, warm bool) (f *gossipFleet, err error) {
	f = &gossipFleet{}
	defer func() {
		if err != nil {
			f.Close()
		}
	}()
	for i := range gossipEngines {
		nc, err := coordinatorConn(cluster.Server(i % 3))
		if err != nil {
			return f, err
		}
		f.conns = append(f.conns, nc)
		co, err := coordinator.NewNATS(nc, coordinator.Config{})
		if err != nil {
			return f, err
		}
		e, err := hotkey.New(counter.NewMemoryStore(counter.MemoryConfig{}),
			hotkey.WithCoordinator(co), hotkey.WithGossipInterval(interval))
		if err != nil {
			co.Close()
			return f, err
		}
		f.engines, f.coords = append(f.engines, e), append(f.coords, co)
	}
	deadline := time.Now().Add(30 * time.Second)
	for _, e := range f.engines {
		for e.Stats().Instances < gossipEngines {
			if time.Now().After(deadline) {
				return f, fmt.Errorf("an engine counts %d live instances after 30 s, want %d", e.Stats().Instances, gossipEngines)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	if !warm {
		return f, nil
	}
	return f, f.warm(deadline)
}

// warm has each engine admit a unit of a key of its own until every engine
// sees every key's unit: the gossip subject's interest has spread over the
// cluster's routes.
func (f *gossipFleet) warm(deadline time.Time) error {
	ctx := context.Background()
	p := &hotkey.Policy{Name: "warm", Limit: hotkey.Limit{Rate: 1000, Period: time.Hour}, Sync: hotkey.SyncGossip}
	for try := 0; ; try++ {
		keys := make([]string, len(f.engines))
		for i, e := range f.engines {
			keys[i] = fmt.Sprintf("warm:%d:%d", try, i)
			if _, err := e.Allow(ctx, keys[i], p); err != nil {
				return err
			}
		}
		for wait := time.Now().Add(time.Second); time.Now().Before(wait); time.Sleep(20 * time.Millisecond) {
			if f.seenBy(ctx, p, keys) {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return errors.New("gossip: the engines never saw each other's units")
		}
	}
}

// seenBy reports whether every engine's view of each key shows one unit used.
func (f *gossipFleet) seenBy(ctx context.Context, p *hotkey.Policy, keys []string) bool {
	for _, e := range f.engines {
		for _, k := range keys {
			r, err := e.Peek(ctx, k, p)
			if err != nil || r.Remaining > p.Limit.Rate-2 { // a take would leave 998 of 1000
				return false
			}
		}
	}
	return true
}

// Close stops the engines (their coordinators with them).
func (f *gossipFleet) Close() {
	for _, e := range f.engines {
		e.Close()
	}
	for _, nc := range f.conns {
		nc.Close()
	}
}

// windows runs keys keys prefixed with prefix under p (a fixed window) at
// rate requests/s in all for d, each request to a random key and engine,
// and counts each key's decisions per window.
func (f *gossipFleet) windows(ctx context.Context, prefix string, p *hotkey.Policy, keys int, rate float64, d time.Duration) (*windowCounts, error) {
	period := int64(p.Limit.Period)
	start := time.Now()
	t := &windowCounts{engines: f.engines, p: p, period: period, base: start.UnixNano() / period,
		index: map[string]int{}, from: start}
	t.wins = int((start.Add(d).UnixNano()+int64(5*time.Second))/period-t.base) + 1 // room for a pacer running late
	names := make([]string, keys)
	for i := range names {
		names[i] = fmt.Sprintf("%s%x:%d", prefix, rand.Uint32(), i)
		t.index[names[i]] = i
	}
	t.counts = make([]keyWindow, keys*t.wins)
	res, err := loadgen.Run(ctx, loadgen.Config{Target: t, Workload: &randomKey{names: names, r: rand.New(rand.NewPCG(1, 2))}, Rate: rate, Duration: d, Concurrency: 64}, nil, 0)
	if err != nil {
		return nil, err
	}
	if res.Errors > 0 {
		return nil, fmt.Errorf("%d errors, first %v", res.Errors, res.FirstError)
	}
	t.from, t.to = res.Start, res.Start.Add(d)
	return t, nil
}

// randomKey picks each request's key at random among names.
type randomKey struct {
	names []string
	r     *rand.Rand // used by the pacer's goroutine alone
}

func (w *randomKey) Key(int64, time.Duration) string { return w.names[w.r.IntN(len(w.names))] }

// windowCounts decides each request on an engine picked at random and
// counts, per key and fixed window of p, the decisions that began in it
// (started), the admissions and denials that began and ended in it
// (certain, denied), and the admissions that began in the window before
// and ended in it (into).
type windowCounts struct {
	engines  []*hotkey.Engine
	p        *hotkey.Policy
	period   int64 // ns
	base     int64 // window number of window 0
	wins     int
	index    map[string]int // read-only during a run
	counts   []keyWindow
	from, to time.Time // the run
}

func (t *windowCounts) Decide(ctx context.Context, key string, cost int64) (loadgen.Outcome, error) {
	k, ok := t.index[key]
	if !ok {
		return loadgen.Outcome{}, errors.New("gossip: unknown key " + key)
	}
	w0 := int(time.Now().UnixNano()/t.period - t.base)
	r, err := t.engines[rand.IntN(len(t.engines))].AllowN(ctx, key, t.p, cost)
	if err != nil {
		return loadgen.Outcome{}, err
	}
	w1 := int(time.Now().UnixNano()/t.period - t.base)
	if w0 < 0 || w1 >= t.wins {
		return loadgen.Outcome{}, fmt.Errorf("gossip: a decision in window %d, past the run's %d", w1, t.wins)
	}
	c := &t.counts[k*t.wins+w0]
	c.started.Add(1)
	switch {
	case !r.Allowed:
		c.denied.Add(1)
	case w1 == w0:
		c.certain.Add(1)
	default:
		t.counts[k*t.wins+w1].into.Add(1)
	}
	return loadgen.Outcome{Allowed: r.Allowed}, nil
}

// each calls f with every key-window's admissions (those that crossed
// into it counted in) and denials, and whether the run covered the window
// whole.
func (t *windowCounts) each(f func(admitted, denied int64, whole bool)) {
	for k := range len(t.index) {
		for w := range t.wins {
			c := &t.counts[k*t.wins+w]
			start := (t.base + int64(w)) * t.period
			whole := start >= t.from.UnixNano() && start+t.period <= t.to.UnixNano()
			f(c.certain.Load()+c.into.Load(), c.denied.Load(), whole)
		}
	}
}

// extras returns, for each key-window that reached limit, the admissions
// past it, and how many of those had 0, 1, 2 and 3 or more.
func (t *windowCounts) extras(limit int64) (extra []int64, hist [4]int) {
	t.each(func(admitted, _ int64, _ bool) {
		if admitted >= limit {
			x := admitted - limit
			extra = append(extra, x)
			hist[min(x, 3)]++
		}
	})
	return extra, hist
}

// shortWindows counts the key-windows with a denial that ended under limit.
func (t *windowCounts) shortWindows(limit int64) int {
	n := 0
	t.each(func(admitted, denied int64, _ bool) {
		if denied > 0 && admitted < limit {
			n++
		}
	})
	return n
}

// ratios returns admitted ÷ limit over the windows the run covered whole,
// the highest and lowest of one window, and their number.
func (t *windowCounts) ratios(limit int64) (overall, worst, lowest float64, n int) {
	var sum int64
	lowest = math.Inf(1)
	t.each(func(admitted, _ int64, whole bool) {
		if !whole {
			return
		}
		n++
		sum += admitted
		r := float64(admitted) / float64(limit)
		worst, lowest = max(worst, r), min(lowest, r)
	})
	if n == 0 {
		return 0, 0, 0, 0
	}
	return float64(sum) / float64(int64(n)*limit), worst, lowest, n
}

func (t *windowCounts) sum(f func(c *keyWindow) int64) int64 {
	var n int64
	for i := range t.counts {
		n += f(&t.counts[i])
	}
	return n
}

func (t *windowCounts) offered() int64 {
	return t.sum(func(c *keyWindow) int64 { return c.started.Load() })
}

func (t *windowCounts) admitted() int64 {
	return t.sum(func(c *keyWindow) int64 { return c.certain.Load() + c.into.Load() })
}

func (t *windowCounts) denied() int64 {
	return t.sum(func(c *keyWindow) int64 { return c.denied.Load() })
}

func (t *windowCounts) edges() int64 {
	return t.sum(func(c *keyWindow) int64 { return c.into.Load() })
}

func mean(xs []int64) float64 {
	if len(xs) == 0 {
		return 0
	}
	var s int64
	for _, x := range xs {
		s += x
	}
	return float64(s) / float64(len(xs))
}

// gossipActiveKeys is the keys each instance admits on in a round of the
// bytes measurement.
const gossipActiveKeys = 100_000

// gossipBytes measures the bytes and messages one round of 100,000 keys
// puts on NATS per instance. Ten instances each deciding 100,000 keys
// every 100 ms is 10M decisions/s, and each charging its 9 peers' rounds
// 90M charges/s, more than this machine does; so each instance decides
// its 100,000 keys once, under a gossip interval of a minute, and Close
// sends them as one round; the coordinators count the bytes published.
func gossipBytes(cluster *natsserver.Cluster, s *setup, sec *scenario.Section) error {
	reps := 3
	if s.quick {
		reps = 1
	}
	names := make([]string, gossipActiveKeys)
	for i := range names {
		names[i] = "user:" + strconv.Itoa(i)
	}
	p := &hotkey.Policy{Name: "api", Limit: hotkey.Limit{Rate: 1000, Period: time.Second}, Sync: hotkey.SyncGossip}
	var bytes, msgs, rounds uint64
	for range reps {
		f, err := startGossipFleet(cluster, time.Minute, false) // its rounds go at Close
		if err != nil {
			return err
		}
		before := make([]coordinator.Stats, len(f.coords))
		for i, co := range f.coords {
			before[i] = co.Stats()
		}
		var wg sync.WaitGroup
		var failed atomic.Pointer[error]
		for _, e := range f.engines {
			wg.Go(func() {
				ctx := context.Background()
				for _, k := range names {
					if r, err := e.Allow(ctx, k, p); err != nil || !r.Allowed {
						err = fmt.Errorf("gossip: a decision of the bytes run: %+v %w", r, err)
						failed.CompareAndSwap(nil, &err)
						return
					}
				}
			})
		}
		wg.Wait()
		if err := failed.Load(); err != nil {
			f.Close()
			return *err
		}
		// Close sends each engine's round; closing them at once keeps
		// their peers from charging 900,000 units each first.
		for _, e := range f.engines {
			wg.Go(func() { e.Close() })
		}
		wg.Wait()
		for i, co := range f.coords {
			st := co.Stats()
			if n := st.GossipPublishErrors - before[i].GossipPublishErrors; n > 0 {
				return fmt.Errorf("gossip: %d messages of a 100,000-key round not published", n)
			}
			bytes += st.GossipBytesPublished - before[i].GossipBytesPublished
			msgs += st.GossipPublished - before[i].GossipPublished
			rounds++
		}
	}
	perRound := float64(bytes) / float64(rounds)
	msgsPerRound := float64(msgs) / float64(rounds)
	perSecond := float64(time.Second / hotkey.DefaultGossipInterval)
	keyLen := len(p.Name + "|" + names[len(names)/2]) // the counter name, policy|key
	sec.Printf("**Bytes on NATS at 100,000 active keys.** Each of the %d instances admits on 100,000 distinct keys (\"user:N\" under policy \"api\": counter names of about %d bytes) in one round, one unit each; bytes and messages are the coordinators' count of what they published (envelopes and signatures included), %d round(s) per instance. Ten instances deciding 100,000 keys every %v would be 10M decisions/s, and each charging its 9 peers' rounds 9M charges/s: more than this machine does, so the rounds were filled at the machine's pace under a gossip interval of a minute and sent by Close, and the per-second figures are a round's × %.0f rounds/s.\n\n",
		gossipEngines, keyLen, reps, hotkey.DefaultGossipInterval, perSecond)
	sec.Printf("| bytes per round per instance | bytes per key | messages per round | sent per instance at %v | messages/s per instance | received per instance (9 peers) |\n|---|---|---|---|---|---|\n", hotkey.DefaultGossipInterval)
	sec.Printf("| %.0f | %.1f | %.1f | %.1f MB/s | %.0f | %.1f MB/s |\n\n", perRound, perRound/gossipActiveKeys, msgsPerRound,
		perRound*perSecond/1e6, msgsPerRound*perSecond, 9*perRound*perSecond/1e6)
	return nil
}

// gossipCost measures the decision's ns/op under sync: gossip against
// sync: store on the memory store: one engine, its NATS coordinator alone
// on the cluster (so no peer's rounds are charged during the run, but its
// own rounds are flushed and published every interval), the same 10,000
// keys, never denied; the modes alternate, medians of the rounds.
func gossipCost(ctx context.Context, cluster *natsserver.Cluster, s *setup, sec *scenario.Section) error {
	const keys = 10_000
	nc, err := coordinatorConn(cluster.Server(0))
	if err != nil {
		return err
	}
	defer nc.Close()
	co, err := coordinator.NewNATS(nc, coordinator.Config{})
	if err != nil {
		return err
	}
	e, err := hotkey.New(counter.NewMemoryStore(counter.MemoryConfig{}), hotkey.WithCoordinator(co))
	if err != nil {
		co.Close()
		return err
	}
	defer e.Close()
	names := make([]string, keys)
	for i := range names {
		names[i] = "user:" + strconv.Itoa(i)
	}
	lim := hotkey.Limit{Rate: 1_000_000_000, Period: time.Second}
	modes := []hotkey.Sync{hotkey.SyncStore, hotkey.SyncGossip}
	policies := []*hotkey.Policy{{Name: "cost", Limit: lim, Sync: hotkey.SyncStore}, {Name: "cost", Limit: lim, Sync: hotkey.SyncGossip}}
	for _, p := range policies {
		for _, k := range names {
			if _, err := e.Allow(ctx, k, p); err != nil {
				return err
			}
		}
	}
	d := s.scale(time.Second, 300*time.Millisecond)
	k := s.rounds(5, 3)
	sec.Printf("**Decision cost.** One engine (detector on) with the memory store and a NATS coordinator alone on the cluster, so its rounds are flushed and published every %v but no peer's are charged; the same 10,000 keys under a policy of each mode (limit 10^9/s, never denied), decided in turn; %v per mode and goroutine count, %d rounds alternating the modes, medians. The same comparison is `make bench BENCH=GossipDecision` (RunParallel).\n\n",
		hotkey.DefaultGossipInterval, d, k)
	sec.Printf("| goroutines | sync: store ns/op | sync: gossip ns/op | gossip ÷ store (target ≤ 1.15) |\n|---|---|---|---|\n")
	for _, g := range []int{1, runtime.GOMAXPROCS(0)} {
		var fns []func() (float64, error)
		for i := range modes {
			p := policies[i]
			fns = append(fns, func() (float64, error) { return decisionNs(ctx, e, p, names, g, d) })
		}
		got, err := scenario.Rounds(k, fns)
		if err != nil {
			return err
		}
		sec.Printf("| %d | %.0f | %.0f | %.3f |\n", g, got[0], got[1], got[1]/got[0])
	}
	sec.Printf("\nns/op is wall time per decision per goroutine: with more goroutines than free cores it rises for both modes alike.\n")
	return nil
}

// decisionNs decides names in turn under p from g goroutines for d and
// returns the wall nanoseconds per decision per goroutine.
func decisionNs(ctx context.Context, e *hotkey.Engine, p *hotkey.Policy, names []string, g int, d time.Duration) (float64, error) {
	var n atomic.Int64
	var failed atomic.Pointer[error]
	var wg sync.WaitGroup
	start := time.Now()
	for j := range g {
		wg.Go(func() {
			i, done := j*len(names)/g, int64(0)
			for time.Since(start) < d {
				for range 1000 {
					if r, err := e.Allow(ctx, names[i], p); err != nil || !r.Allowed {
						err = fmt.Errorf("gossip: a cost decision: %+v %w", r, err)
						failed.CompareAndSwap(nil, &err)
						return
					}
					if i++; i == len(names) {
						i = 0
					}
				}
				done += 1000
			}
			n.Add(done)
		})
	}
	wg.Wait()
	if err := failed.Load(); err != nil {
		return 0, *err
	}
	return float64(time.Since(start).Nanoseconds()) * float64(g) / float64(n.Load()), nil
}
