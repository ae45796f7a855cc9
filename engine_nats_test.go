package hotkey

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/redis/go-redis/v9"

	"github.com/hotkeyd/hotkey/coordinator"
	"github.com/hotkeyd/hotkey/counter"
	"github.com/hotkeyd/hotkey/detector"
	"github.com/hotkeyd/hotkey/internal/natsserver"
	"github.com/hotkeyd/hotkey/internal/testkit"
	"github.com/hotkeyd/hotkey/shard"
)

// fleet is 3 engines on a 3-node NATS cluster, engine i on node i first,
// each recording the levels it applies.
type fleet struct {
	cluster *natsserver.Cluster
	cfg     coordinator.Config // of every coordinator
	conns   []*nats.Conn       // the coordinators', closed after the engines
	engines []*Engine
	coords  []*coordinator.NATS
	logs    []*levelLog
	applied chan appliedLevel // every level applied, by any engine
}

type appliedLevel struct {
	engine int
	key    string
	level  shard.Level
	at     time.Time
}

// natsConfig is the coordinator configuration of the tests: short ttl and
// heartbeats, so that lapses and membership show within a second.
func natsConfig() coordinator.Config {
	return coordinator.Config{
		TTL:       600 * time.Millisecond,
		Heartbeat: 200 * time.Millisecond,
		SyncWait:  200 * time.Millisecond,
	}
}

// dialNATS connects a coordinator's connection to the servers at urls, in
// that order, as coordinator.NewNATS says it is meant to be made,
// reconnecting quickly, with opts applied last. The caller closes it.
func dialNATS(urls []string, opts ...nats.Option) (*nats.Conn, error) {
	return nats.Connect(strings.Join(urls, ","), append([]nats.Option{
		nats.MaxReconnects(-1), nats.ReconnectWait(50 * time.Millisecond),
		nats.ReconnectBufSize(-1), nats.NoEcho(), nats.DontRandomize(),
	}, opts...)...)
}

// natsConn is dialNATS for one test, closed at cleanup: after the engines
// whose cleanups are registered later.
func natsConn(t *testing.T, urls []string, opts ...nats.Option) *nats.Conn {
	t.Helper()
	nc, err := dialNATS(urls, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// startFleet starts the cluster and n engines on store, with the
// coordinator configuration natsConfig.
func startFleet(t *testing.T, n int, store func() counter.Store, opts ...Option) *fleet {
	t.Helper()
	return startFleetConfig(t, natsConfig(), n, store, opts...)
}

// startFleetConfig starts the cluster and n engines on store, each with a
// coordinator configured as cfg on its own list of the cluster's URLs.
func startFleetConfig(t *testing.T, cfg coordinator.Config, n int, store func() counter.Store, opts ...Option) *fleet {
	t.Helper()
	c, err := natsserver.StartCluster(3, natsserver.Options{})
	if err != nil {
		t.Fatal(err)
	}
	f := &fleet{cluster: c, cfg: cfg, applied: make(chan appliedLevel, 100_000)}
	t.Cleanup(func() {
		for _, e := range f.engines {
			e.Close()
		}
		for _, nc := range f.conns {
			nc.Close()
		}
		c.Close()
	})
	for i := range n {
		f.add(t, i%3, store(), opts...)
	}
	return f
}

// add starts one more engine on store, connected to node first.
func (f *fleet) add(t *testing.T, node int, store counter.Store, opts ...Option) *Engine {
	t.Helper()
	urls := []string{f.cluster.URL(node)}
	for j := range f.cluster.Len() {
		if j != node {
			urls = append(urls, f.cluster.URL(j))
		}
	}
	nc, err := dialNATS(urls)
	if err != nil {
		t.Fatal(err)
	}
	f.conns = append(f.conns, nc)
	co, err := coordinator.NewNATS(nc, f.cfg)
	if err != nil {
		t.Fatal(err)
	}
	idx := len(f.engines)
	log := &levelLog{}
	hook := func(key string, level shard.Level) {
		log.hook(key, level)
		f.applied <- appliedLevel{idx, key, level, time.Now()}
	}
	e, err := New(store, append([]Option{WithoutDetector(), WithCoordinator(co), WithLevelHook(hook)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	f.engines, f.coords, f.logs = append(f.engines, e), append(f.coords, co), append(f.logs, log)
	return e
}

// patience is how long a test waits for an event on real servers (a
// route, a reconnect, a message, a breaker probe) before it fails. It only
// bounds a hang: a loaded 2-core machine can take seconds where a quiet one
// takes milliseconds, so the figures are logged, never asserted.
const patience = testkit.Patience

func memoryStores() counter.Store { return counter.NewMemoryStore(counter.MemoryConfig{}) }

// TestNATSConvergence: 200 keys announced hot from random instances are
// applied by every instance. The leases live an hour: on a loaded machine a
// renewal can come later than a short ttl, and the levels would lapse
// before the check.
func TestNATSConvergence(t *testing.T) {
	checkLeaks(t)
	cfg := natsConfig()
	cfg.TTL, cfg.MaxTTL = time.Hour, 2*time.Hour
	f := startFleetConfig(t, cfg, 3, memoryStores)
	testkit.For(t, patience, "membership", func() bool {
		for _, e := range f.engines {
			if e.liveInstances() != 3 {
				return false
			}
		}
		return true
	})
	const keys = 200
	levels := []shard.Level{4, 16, 64}
	want := map[string]shard.Level{}
	for i := range keys {
		key := fmt.Sprintf("conv:%d", i)
		want[key] = levels[i%3]
		f.coords[rand.IntN(3)].Announce(key, hashKey(key), want[key])
	}
	took := testkit.For(t, patience, "200 hot keys on every engine", func() bool {
		for _, e := range f.engines {
			for k, l := range want {
				if e.levelOf(k) != l {
					return false
				}
			}
		}
		return true
	})
	t.Logf("200 announcements applied by all 3 engines %v after the first (bound 10 s)", took)
	ctx := context.Background()
	for i, e := range f.engines {
		if r, err := e.Allow(ctx, "conv:5", pol(PerSecond(100_000))); err != nil || r.Shards != want["conv:5"] {
			t.Errorf("engine %d decided conv:5 on %d shards (%v), want %d", i, r.Shards, err, want["conv:5"])
		}
	}
}

// TestNATSJoin: an engine started while keys are hot applies them by join
// sync. The leases live an hour and are renewed every 20 minutes, so within
// the test's patience nothing but the sync can bring them; the sync waits
// for replies as long, so a slow machine cannot make them late.
func TestNATSJoin(t *testing.T) {
	checkLeaks(t)
	cfg := natsConfig()
	cfg.TTL, cfg.MaxTTL, cfg.SyncWait = time.Hour, 2*time.Hour, patience
	f := startFleetConfig(t, cfg, 2, memoryStores)
	for i := range 20 {
		key := fmt.Sprintf("join:%d", i)
		f.coords[i%2].Announce(key, hashKey(key), 16)
	}
	testkit.For(t, patience, "keys on the first engines", func() bool {
		return f.engines[0].levelOf("join:19") == 16 && f.engines[1].levelOf("join:0") == 16
	})
	start := time.Now()
	late := f.add(t, 2, memoryStores())
	started := time.Since(start)
	took := testkit.For(t, patience, "the table on a late engine", func() bool {
		for i := range 20 {
			if late.levelOf(fmt.Sprintf("join:%d", i)) != 16 {
				return false
			}
		}
		return true
	})
	st := f.coords[2].Stats()
	t.Logf("an engine started mid-episode applied 20 hot keys %v after New began; %d sync replies applied, %d late", started+took, st.SyncReplies, st.LateReplies)
	if st.SyncReplies == 0 {
		t.Errorf("the late engine has the table but applied no sync reply: %+v", st)
	}
}

// TestNATSFaults: the node under an engine goes down and the engine moves
// to another and renews its leases there; with NATS all down decisions go
// on, on local coordination; when NATS is back the table reconverges.
// Leases live 10 s here, so that no stall of a loaded machine lets one lapse
// by itself: the test waits for the renewal it needs instead.
func TestNATSFaults(t *testing.T) {
	checkLeaks(t)
	cfg := natsConfig()
	cfg.TTL = 10 * time.Second
	f := startFleetConfig(t, cfg, 3, memoryStores)
	ctx := context.Background()
	lim := PerSecond(100_000)
	f.coords[0].Announce("f1", hashKey("f1"), 16)
	testkit.For(t, patience, "f1 everywhere", func() bool { return f.engines[2].levelOf("f1") == 16 })

	// Node 0, under engine 0, goes down: engine 0 reconnects elsewhere and
	// renews its lease through another node. A lease it sent before (at
	// most a TTL from then, plus a second for one still in delivery) cannot
	// reach as far as the one the peers must end up holding.
	f.cluster.Shutdown(0)
	down := time.Now()
	renewed := func(c *coordinator.NATS) bool {
		for _, l := range c.Leases() {
			if l.Key == "f1" {
				return l.Level == 16 && l.Origin == f.coords[0].ID() && time.Now().Add(l.ExpiresIn).After(down.Add(cfg.TTL+time.Second))
			}
		}
		return false
	}
	took := testkit.For(t, patience, "a renewal of f1 through another node", func() bool {
		return f.coords[0].Stats().Reconnects > 0 && renewed(f.coords[1]) && renewed(f.coords[2])
	})
	t.Logf("engine 0 renewed f1 through another node %v after its node went down", took)
	for i, e := range f.engines {
		if e.levelOf("f1") != 16 {
			t.Fatalf("engine %d: f1 at %d after node 0 went down, want 16 (renewed through another node)", i, e.levelOf("f1"))
		}
	}
	f.coords[0].Announce("f2", hashKey("f2"), 4)
	testkit.For(t, patience, "f2 from the moved engine", func() bool { return f.engines[1].levelOf("f2") == 4 })

	// All of NATS down: no decision fails, and an instance still splits
	// what it finds hot itself.
	f.cluster.Shutdown(1)
	f.cluster.Shutdown(2)
	f.coords[1].Announce("f3", hashKey("f3"), 64)
	testkit.For(t, patience, "with NATS down, f3 on the engine that found it hot", func() bool { return f.engines[1].levelOf("f3") == 64 })
	for range 1000 {
		for i, e := range f.engines {
			if _, err := e.Allow(ctx, "f3", pol(lim)); err != nil {
				t.Fatalf("engine %d with NATS down: %v", i, err)
			}
		}
	}
	// Back: within one renewal period (ttl/3) of reconnecting, the others
	// have f3.
	for i := range 3 {
		if err := f.cluster.Restart(i); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.cluster.WaitMeshed(); err != nil {
		t.Fatal(err)
	}
	took = testkit.For(t, patience, "f3 everywhere after NATS came back", func() bool {
		return f.engines[0].levelOf("f3") == 64 && f.engines[2].levelOf("f3") == 64
	})
	t.Logf("table reconverged %v after the cluster was meshed again (renewal period %v)", took, cfg.TTL/3)
}

// TestNATSTransferRedis: 3 engines on one Redis, each taking a third of a
// stream at 3× the limit of one key, while a fourth coordinator (standing
// for the detector of some instance) takes the key through levels
// 1→4→16→4→1. Whatever the instances do at each transition, the key admits
// at most 2% more than an unsplit key on the same stream, and at most 5%
// over the limit in any period after the first.
func TestNATSTransferRedis(t *testing.T) {
	checkLeaks(t)
	client := redis.NewClient(&redis.Options{Addr: env.Server.Addr})
	store, err := counter.NewRedisStore(context.Background(), client, counter.RedisConfig{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close(); client.Close() })
	f := startFleet(t, 3, func() counter.Store { return store })
	driver, err := coordinator.NewNATS(natsConn(t, []string{f.cluster.URL(0)}), natsConfig())
	if err != nil {
		t.Fatal(err)
	}
	if err := driver.Start(nopHandler{}); err != nil {
		t.Fatal(err)
	}
	defer driver.Close()
	ref, err := New(store, WithoutDetector())
	if err != nil {
		t.Fatal(err)
	}
	defer ref.Close()
	testkit.For(t, patience, "membership", func() bool { return f.engines[0].liveInstances() == 4 })

	const limit = 320
	for _, alg := range []Algorithm{TokenBucket, SlidingWindow} {
		t.Run(alg.String(), func(t *testing.T) {
			key := fmt.Sprintf("tr:%v:%x", alg, rand.Uint64())
			lim := Limit{Algorithm: alg, Rate: limit, Period: time.Second}
			split, refc, periods := runFleetTransitions(t, f, ref, driver, key, lim)
			spread := f.spread(key)
			t.Logf("instances applied each level change within %v of each other", spread)
			if !checkTransitions(t, split, refc, limit, periods, float64(spread)/float64(lim.Period), fleetWorkers) {
				t.Error("split key handed out free quota across its transitions")
			}
		})
	}
}

// runFleetTransitions sends a stream at 3× lim for the phases of
// transitions, round robin over the fleet's engines, with the same stream on
// ref for an unsplit key; driver announces each phase's level. It returns
// the tallies and how many periods the stream lasted.
func runFleetTransitions(t *testing.T, f *fleet, ref *Engine, driver *coordinator.NATS, key string, lim Limit) (split, refc tally, periods float64) {
	t.Helper()
	ctx := context.Background()
	perPeriod := 3 * lim.Rate
	gap := lim.Period / time.Duration(perPeriod)
	// Start on a period boundary of the wall clock, which the local Redis
	// shares, so that windows and tallies line up.
	start := time.Now().Truncate(lim.Period).Add(lim.Period)
	time.Sleep(time.Until(start))
	var mu sync.Mutex
	work := make(chan int, 1024)
	var wg sync.WaitGroup
	var failed error
	for range fleetWorkers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				at := time.Since(start)
				r1, err1 := ref.Allow(ctx, key+":ref", pol(lim))
				r2, err2 := f.engines[i%len(f.engines)].Allow(ctx, key, pol(lim))
				p := int(at / lim.Period)
				mu.Lock()
				if err1 != nil || err2 != nil {
					failed = fmt.Errorf("%v, %v", err1, err2)
				}
				refc.add(p, r1.Allowed)
				split.add(p, r2.Allowed)
				mu.Unlock()
			}
		}()
	}
	i := 0
	var end time.Duration
	for _, ph := range transitions {
		driver.Announce(key, hashKey(key), ph.level)
		end += time.Duration(ph.periods * float64(lim.Period))
		for ; time.Duration(i)*gap < end; i++ {
			if d := time.Until(start.Add(time.Duration(i) * gap)); d > 0 {
				time.Sleep(d)
			}
			work <- i
		}
	}
	close(work)
	wg.Wait()
	periods = float64(time.Since(start)) / float64(lim.Period)
	if failed != nil {
		t.Fatal(failed)
	}
	for e, log := range f.logs {
		t.Logf("engine %d applied levels %v", e, log.of(key))
	}
	return split, refc, periods
}

// spread returns the longest time between the first and the last engine
// applying one of key's level changes, from what the engines applied so
// far (other keys' changes are dropped).
func (f *fleet) spread(key string) time.Duration {
	byEngine := map[int][]time.Time{}
	for {
		select {
		case a := <-f.applied:
			if a.key == key {
				byEngine[a.engine] = append(byEngine[a.engine], a.at)
			}
			continue
		default:
		}
		break
	}
	var longest time.Duration
	for i := 0; ; i++ {
		var first, last time.Time
		for e := range f.engines {
			if i >= len(byEngine[e]) {
				return longest
			}
			at := byEngine[e][i]
			if first.IsZero() || at.Before(first) {
				first = at
			}
			if at.After(last) {
				last = at
			}
		}
		longest = max(longest, last.Sub(first))
	}
}

// fleetWorkers is how many callers runFleetTransitions has deciding at once.
const fleetWorkers = 16

// nopHandler is the Handler of a coordinator that only announces.
type nopHandler struct{}

func (nopHandler) SetLevel(string, uint64, shard.Level) {}
func (nopHandler) SetInstances(int)                     {}

// TestNATSDetectorSplitsEverywhere: a key hot on one instance's detector is
// split on every instance, and merged back on all of them once it cools and
// the lease lapses.
func TestNATSDetectorSplitsEverywhere(t *testing.T) {
	checkLeaks(t)
	f := startFleet(t, 2, memoryStores)
	cfg := detector.DefaultConfig()
	cfg.Threshold = 200 // global: 600/s here, with 3 instances
	cfg.CoolDown = 300 * time.Millisecond
	hot := f.add(t, 2, memoryStores(), WithDetector(cfg))
	testkit.For(t, patience, "membership", func() bool { return hot.liveInstances() == 3 })
	ctx := context.Background()
	lim := PerSecond(1_000_000)
	deadline := time.Now().Add(20 * time.Second)
	for f.engines[0].levelOf("d") == 1 || f.engines[1].levelOf("d") == 1 {
		if time.Now().After(deadline) {
			t.Fatal("a key hot on one instance was not split on the others")
		}
		if _, err := hot.Allow(ctx, "d", pol(lim)); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("split on the other instances at levels %d and %d", f.engines[0].levelOf("d"), f.engines[1].levelOf("d"))
	testkit.For(t, patience, "merged everywhere once cold", func() bool {
		return f.engines[0].levelOf("d") == 1 && f.engines[1].levelOf("d") == 1 && hot.levelOf("d") == 1
	})
}
