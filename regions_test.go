package hotkey

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/redis/go-redis/v9"

	"github.com/hotkeyd/hotkey/coordinator"
	"github.com/hotkeyd/hotkey/counter"
	"github.com/hotkeyd/hotkey/internal/natsserver"
	"github.com/hotkeyd/hotkey/internal/redistest"
	"github.com/hotkeyd/hotkey/internal/testkit"
)

// regionNames are the regions of the exchange tests.
var regionNames = []string{"eu", "us", "ap"}

// regionFleet is one engine per region, each on a memory store of its own
// whose clock stands still (so a window never rolls over and counts
// compare), all on one NATS server: regions are subjects apart, which is
// what the exchange sees of a supercluster.
type regionFleet struct {
	srv     *natsserver.Server // one server for all regions; nil on a supercluster
	urls    func(region string) []string
	engines map[string]*Engine
	stores  map[string]*counter.MemoryStore
	conns   map[string]*nats.Conn // each region's engine's, the last started
	cfg     coordinator.Config
	clock   func() time.Time
}

// exchangeWindow is the exchange tests' policy: a fixed window of an hour.
func exchangeWindow(limit int64) *Policy {
	return &Policy{Name: "x", Limit: Limit{Algorithm: FixedWindow, Rate: limit, Period: time.Hour}, Regions: RegionsExchange}
}

func startRegions(t *testing.T, cfg coordinator.Config, opts ...Option) *regionFleet {
	t.Helper()
	srv, err := natsserver.Start(natsserver.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	// Half way into an hour: a window of an hour holds it, away from its
	// edges, whatever the hour.
	at := time.Now().Truncate(time.Hour).Add(30 * time.Minute)
	f := &regionFleet{srv: srv, urls: func(string) []string { return []string{srv.URL()} }, engines: map[string]*Engine{}, stores: map[string]*counter.MemoryStore{}, cfg: cfg, clock: func() time.Time { return at }}
	for _, r := range regionNames {
		f.start(t, r, opts...)
	}
	return f
}

// startSupercluster is startRegions on a NATS supercluster: a server a
// region, joined by gateways through fault proxies.
func startSupercluster(t *testing.T, cfg coordinator.Config, opts ...Option) (*regionFleet, *natsserver.Supercluster) {
	t.Helper()
	sc, err := natsserver.StartSupercluster(regionNames, 1, natsserver.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sc.Close)
	at := time.Now().Truncate(time.Hour).Add(30 * time.Minute)
	f := &regionFleet{urls: func(r string) []string { return sc.Cluster(r).URLs() }, engines: map[string]*Engine{}, stores: map[string]*counter.MemoryStore{}, cfg: cfg, clock: func() time.Time { return at }}
	for _, r := range regionNames {
		f.start(t, r, opts...)
	}
	return f, sc
}

// start starts region r's engine (again, after a restart: on the same
// store).
func (f *regionFleet) start(t *testing.T, r string, opts ...Option) *Engine {
	t.Helper()
	nc := natsConn(t, f.urls(r))
	if f.conns == nil {
		f.conns = map[string]*nats.Conn{}
	}
	f.conns[r] = nc
	cfg := f.cfg
	cfg.Region, cfg.Regions = r, regionNames
	co, err := coordinator.NewNATS(nc, cfg)
	if err != nil {
		t.Fatal(err)
	}
	st := f.stores[r]
	if st == nil {
		st = counter.NewMemoryStore(counter.MemoryConfig{Clock: f.clock})
		f.stores[r] = st
	}
	e, err := New(st, append([]Option{withClock(f.clock), WithoutDetector(), WithCoordinator(co), WithRegion(r), WithRegionInterval(20 * time.Millisecond)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	f.engines[r] = e
	return e
}

// used is how many units region r's counter of key under p holds.
func (f *regionFleet) used(t *testing.T, r, key string, p *Policy) int64 {
	t.Helper()
	res, err := f.engines[r].Peek(context.Background(), key, p)
	if err != nil {
		t.Fatal(err)
	}
	return p.Limit.Rate - res.Remaining - 1 + boolInt(!res.Allowed)
}

// take asks region r for n units of key under p, one at a time, and
// returns how many it admitted.
func (f *regionFleet) take(t *testing.T, r, key string, p *Policy, n int) int64 {
	t.Helper()
	var admitted int64
	for range n {
		res, err := f.engines[r].Allow(context.Background(), key, p)
		if err != nil {
			t.Fatal(err)
		}
		if res.Allowed {
			admitted++
		}
	}
	return admitted
}

// TestRegionsExchange: units one region admits are charged to the
// others' counters, each once: with every round delivered between the
// regions' turns, the three admit the limit between them, not 3×. Under
// RegionsIndependent, each admits the whole limit.
func TestRegionsExchange(t *testing.T) {
	f := startRegions(t, natsConfig())
	p := exchangeWindow(300)
	f.engines["us"].KnowPolicies(p)
	f.engines["ap"].KnowPolicies(p)
	total := f.take(t, "eu", "k", p, 100)
	testkit.For(t, time.Minute, "eu's 100 charged in us and ap", func() bool {
		return f.used(t, "us", "k", p) == 100 && f.used(t, "ap", "k", p) == 100
	})
	total += f.take(t, "us", "k", p, 150)
	testkit.For(t, time.Minute, "eu's and us's 250 charged everywhere", func() bool {
		return f.used(t, "eu", "k", p) == 250 && f.used(t, "ap", "k", p) == 250
	})
	total += f.take(t, "ap", "k", p, 400)
	if total != 300 {
		t.Fatalf("the regions admitted %d, want the limit, 300", total)
	}
	testkit.For(t, time.Minute, "the limit reached everywhere", func() bool {
		return f.used(t, "eu", "k", p) == 300 && f.used(t, "us", "k", p) == 300
	})
	// Rounds keep coming, totals unchanged: nothing more is charged.
	co := f.engines["eu"].coord.(*coordinator.NATS)
	before, rounds := f.engines["eu"].RegionStats()
	received := co.Stats().RegionReceived
	testkit.For(t, time.Minute, "10 more rounds in eu", func() bool { return co.Stats().RegionReceived >= received+10 })
	after, _ := f.engines["eu"].RegionStats()
	if !rounds || after.Charged["ap"] != before.Charged["ap"] || after.Charged["us"] != before.Charged["us"] || f.used(t, "eu", "k", p) != 300 {
		t.Fatalf("rounds resent: charged %v then %v; eu holds %d", before.Charged, after.Charged, f.used(t, "eu", "k", p))
	}

	ind := &Policy{Name: "i", Limit: p.Limit}
	var admitted int64
	for _, r := range regionNames {
		admitted += f.take(t, r, "k", ind, 400)
	}
	if admitted != 900 {
		t.Fatalf("independent regions admitted %d, want 3 × 300", admitted)
	}
}

// TestRegionsRoundsOnce: rounds redelivered, duplicated and reordered
// (without a Secret, which would drop the replays before they reach the
// exchange) charge nothing more: each region's counter holds what the
// others admitted, once.
func TestRegionsRoundsOnce(t *testing.T) {
	f := startRegions(t, natsConfig())
	p := exchangeWindow(1000)
	for _, r := range regionNames {
		f.engines[r].KnowPolicies(p)
	}
	// Every round sent to us, as sent.
	spy := natsConn(t, []string{f.srv.URL()})
	sub, err := spy.SubscribeSync("hotkey.default.regions.us.*")
	if err != nil {
		t.Fatal(err)
	}
	if err := spy.Flush(); err != nil {
		t.Fatal(err)
	}
	var rounds []*nats.Msg
	admitted := f.take(t, "eu", "k", p, 30)
	admitted += f.take(t, "ap", "k", p, 20)
	testkit.For(t, time.Minute, "eu's and ap's 50 charged in us", func() bool { return f.used(t, "us", "k", p) == admitted })
	rounds = drain(t, sub)
	if len(rounds) < 2 {
		t.Fatalf("%d rounds seen, want some", len(rounds))
	}
	// Replayed twice each, newest first.
	replay := slices.Clone(rounds)
	slices.Reverse(replay)
	for range 2 {
		for _, m := range replay {
			if err := spy.Publish(m.Subject, m.Data); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := spy.Flush(); err != nil { // the server has them: what eu sends next reaches us after them
		t.Fatal(err)
	}
	admitted += f.take(t, "eu", "k", p, 1)
	testkit.For(t, time.Minute, "eu's next unit charged in us", func() bool { return f.used(t, "us", "k", p) >= admitted })
	if got := f.used(t, "us", "k", p); got != admitted {
		t.Fatalf("us holds %d after %d rounds replayed twice, want the %d admitted", got, len(rounds), admitted)
	}
}

// TestRegionsRestart: an engine restarted (a new life, on the same store)
// sends totals the others charge apart from its previous life's: the
// units of both are charged once each.
func TestRegionsRestart(t *testing.T) {
	f := startRegions(t, natsConfig())
	p := exchangeWindow(1000)
	for _, r := range regionNames {
		f.engines[r].KnowPolicies(p)
	}
	admitted := f.take(t, "eu", "k", p, 40)
	if err := f.engines["eu"].Close(); err != nil { // its last round goes out
		t.Fatal(err)
	}
	testkit.For(t, time.Minute, "eu's 40 charged in us", func() bool { return f.used(t, "us", "k", p) == admitted })
	f.start(t, "eu")
	admitted += f.take(t, "eu", "k", p, 25)
	testkit.For(t, time.Minute, "eu's 65 charged in us and ap", func() bool {
		return f.used(t, "us", "k", p) == admitted && f.used(t, "ap", "k", p) == admitted
	})
	time.Sleep(5 * 20 * time.Millisecond) // more rounds: nothing more
	if got := f.used(t, "us", "k", p); got != admitted {
		t.Fatalf("us holds %d, want %d", got, admitted)
	}
}

// TestRegionsUnknown: a round from a region not in the fleet's list is
// dropped by the coordinator ("region"); an entry under a policy this
// region does not know as an exchange one, by the engine ("policy").
func TestRegionsUnknown(t *testing.T) {
	f := startRegions(t, natsConfig())
	p := exchangeWindow(1000)
	f.engines["eu"].KnowPolicies(p) // us does not know it
	f.take(t, "eu", "k", p, 10)
	testkit.For(t, time.Minute, "eu's entries dropped in us", func() bool {
		st, _ := f.engines["us"].RegionStats()
		return st.Dropped["policy"] > 0
	})
	if got := f.used(t, "us", "k", p); got != 0 {
		t.Fatalf("us charged %d under a policy it does not know", got)
	}
	spy := natsConn(t, []string{f.srv.URL()})
	co := f.engines["us"].coord.(*coordinator.NATS)
	before := co.Stats().InvalidBy["region"]
	for _, subj := range []string{"hotkey.default.regions.us.mars", "hotkey.default.regions.us.us"} {
		if err := spy.Publish(subj, []byte{1, 0, 1, 'x', 1}); err != nil {
			t.Fatal(err)
		}
	}
	testkit.For(t, time.Minute, "the rounds of mars and of us itself dropped", func() bool {
		return co.Stats().InvalidBy["region"] >= before+2
	})
}

// TestRegionsRefused: a RegionsExchange policy needs a name and an engine
// that exchanges with other regions.
func TestRegionsRefused(t *testing.T) {
	e, err := New(counter.NewMemoryStore(counter.MemoryConfig{}), WithoutDetector())
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	for _, p := range []*Policy{
		exchangeWindow(10),
		{Limit: Limit{Algorithm: FixedWindow, Rate: 10, Period: time.Hour}, Regions: RegionsExchange},
		{Name: "z", Limit: Limit{Algorithm: FixedWindow, Rate: 10, Period: time.Hour}, Regions: 9},
	} {
		if _, err := e.Allow(context.Background(), "k", p); !errors.Is(err, errors.ErrUnsupported) {
			t.Errorf("%+v: %v, want ErrUnsupported", p, err)
		}
	}
}

// sharesWindow is the shares tests' policy: a fixed window of an hour.
func sharesWindow(limit int64) *Policy {
	return &Policy{Name: "s", Limit: Limit{Algorithm: FixedWindow, Rate: limit, Period: time.Hour}, Regions: RegionsShares}
}

// TestRegionsShares: each region starts with a third of the limit; one
// that runs out is granted the others' spare units, so it admits more
// than its third; and all regions together, asked far more than the
// limit, never admit more than it.
func TestRegionsShares(t *testing.T) {
	f := startRegions(t, natsConfig())
	p := sharesWindow(300)
	for _, r := range regionNames {
		f.engines[r].KnowPolicies(p)
	}
	var eu int64
	testkit.For(t, time.Minute, "eu granted the others' spare units", func() bool {
		eu += f.take(t, "eu", "k", p, 50)
		return eu >= 250
	})
	var all int64 = eu
	for range 5 {
		for _, r := range regionNames {
			all += f.take(t, r, "k", p, 100)
		}
		time.Sleep(50 * time.Millisecond) // needs and grants between the turns
	}
	if all > 300 {
		t.Fatalf("the regions admitted %d, over the limit of 300 (eu %d before the others asked)", all, eu)
	}
	st, _ := f.engines["eu"].RegionStats()
	t.Logf("eu admitted %d alone, all %d; eu was granted %v", eu, all, st.Granted)
	sh := f.engines["eu"].RegionShares()["s"]
	if sh.Base != 100 || sh.Keys != 1 || sh.Granted != int64(st.Granted["us"]+st.Granted["ap"]) || sh.Granted < eu-100 {
		t.Errorf("eu's shares %+v; its stats %+v; admitted %d alone", sh, st, eu)
	}
}

// TestRegionsSharesGrantsOnce: grants redelivered and duplicated add to
// the share once each.
func TestRegionsSharesGrantsOnce(t *testing.T) {
	f := startRegions(t, natsConfig())
	p := sharesWindow(300)
	for _, r := range regionNames {
		f.engines[r].KnowPolicies(p)
	}
	spy := natsConn(t, []string{f.srv.URL()})
	sub, err := spy.SubscribeSync("hotkey.default.regions.eu.*")
	if err != nil {
		t.Fatal(err)
	}
	if err := spy.Flush(); err != nil {
		t.Fatal(err)
	}
	var eu int64
	testkit.For(t, time.Minute, "eu granted units", func() bool {
		eu += f.take(t, "eu", "k", p, 30)
		return eu > 100
	})
	grants := drain(t, sub) // and the empty rounds, which change nothing either
	before, _ := f.engines["eu"].RegionStats()
	for range 3 {
		for _, m := range grants {
			if err := spy.Publish(m.Subject, m.Data); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := spy.Flush(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	after, _ := f.engines["eu"].RegionStats()
	for _, r := range []string{"us", "ap"} {
		if after.Granted[r] != before.Granted[r] {
			t.Errorf("granted by %s: %d, then %d after %d grants replayed 3 times", r, before.Granted[r], after.Granted[r], len(grants))
		}
	}
}

// drain returns the messages sub holds now: rounds keep coming every
// interval, so it does not wait for a pause.
func drain(t *testing.T, sub *nats.Subscription) []*nats.Msg {
	t.Helper()
	n, _, err := sub.Pending()
	if err != nil {
		t.Fatal(err)
	}
	msgs := make([]*nats.Msg, 0, n)
	for range n {
		m, err := sub.NextMsg(time.Second)
		if err != nil {
			t.Fatal(err)
		}
		msgs = append(msgs, m)
	}
	return msgs
}

// TestRegionsPartition: three regions on a NATS supercluster, 50 to 200
// ms apart with jitter, one of them cut off. While cut, under exchange each side admits at most the limit
// (2 sides: at most twice it), and under shares all of them together at
// most the limit. Healed, each region is charged every unit the others
// admitted, once, the cut-off ones included.
func TestRegionsPartition(t *testing.T) {
	f, sc := startSupercluster(t, natsConfig())
	sc.SetDelay(50*time.Millisecond, 200*time.Millisecond)
	x, s := exchangeWindow(300), sharesWindow(300)
	for _, r := range regionNames {
		f.engines[r].KnowPolicies(x, s)
	}
	admitted := map[string]int64{}
	// Before the cut, eu admits a little under each policy, and the
	// others are charged it.
	admitted["eu"] += f.take(t, "eu", "k", x, 40)
	shared := f.take(t, "eu", "k", s, 40)
	testkit.For(t, time.Minute, "eu's 40 charged in us and ap", func() bool {
		return f.used(t, "us", "k", x) == 40 && f.used(t, "ap", "k", x) == 40
	})
	sc.Cut("ap")
	// Each side asks for far more than the limit, its regions in turns,
	// the rounds within the side delivered between the turns.
	for range 3 {
		for _, r := range regionNames {
			admitted[r] += f.take(t, r, "k", x, 100)
		}
		for _, r := range regionNames {
			shared += f.take(t, r, "k", s, 100)
		}
		time.Sleep(500 * time.Millisecond) // a round and a delivery
	}
	connected, cut := admitted["eu"]+admitted["us"], admitted["ap"]
	if connected > 300+100 || cut > 300 {
		// The connected side's regions took turns a round apart: at most
		// one turn's worth over the limit.
		t.Fatalf("exchange while cut: eu and us admitted %d, ap %d; want about the limit each side", connected, cut)
	}
	t.Logf("cut: exchange eu+us %d, ap %d; shares %d in all", connected, cut, shared)
	if shared > 300 {
		t.Fatalf("shares while cut: the regions admitted %d in all, over the limit of 300", shared)
	}
	sc.Heal("ap")
	if err := sc.WaitJoined(time.Minute); err != nil {
		t.Fatal(err)
	}
	// Healed: every region is charged what each other admitted, once.
	testkit.For(t, time.Minute, "every region charged the others' units", func() bool {
		for _, r := range regionNames {
			st, _ := f.engines[r].RegionStats()
			for from, n := range admitted {
				if from != r && st.Charged[from] != uint64(n) {
					return false
				}
			}
		}
		return true
	})
	time.Sleep(200 * time.Millisecond) // more rounds: nothing more
	for _, r := range regionNames {
		st, _ := f.engines[r].RegionStats()
		for from, n := range admitted {
			if from != r && st.Charged[from] != uint64(n) {
				t.Errorf("%s charged %d of %s's %d", r, st.Charged[from], from, n)
			}
		}
	}
}

// TestRegionsStoreLost: a region whose store lost its counters and
// watermarks (a redis-server restarted without persistence) is charged
// the others' totals again, each once, on the counters re-created.
func TestRegionsStoreLost(t *testing.T) {
	f := startRegions(t, natsConfig())
	p := exchangeWindow(1000)
	for _, r := range regionNames {
		f.engines[r].KnowPolicies(p)
	}
	others := f.take(t, "eu", "k", p, 30) + f.take(t, "ap", "k", p, 20)
	testkit.For(t, time.Minute, "eu's and ap's 50 charged in us", func() bool { return f.used(t, "us", "k", p) == others })
	if err := f.engines["us"].Close(); err != nil {
		t.Fatal(err)
	}
	f.stores["us"] = nil // a new, empty store
	f.start(t, "us").KnowPolicies(p)
	testkit.For(t, time.Minute, "eu's and ap's 50 charged in us again", func() bool { return f.used(t, "us", "k", p) >= others })
	time.Sleep(5 * 20 * time.Millisecond) // more rounds: nothing more
	if got := f.used(t, "us", "k", p); got != others {
		t.Fatalf("us holds %d after its store was lost, want the others' %d", got, others)
	}
}

// TestRegionsRedisRestarted: a region's redis-server killed and restarted
// without persistence loses its counters and the watermarks beside them:
// the other regions' totals, still sent, are charged again to the
// counters re-created, each once. Meanwhile the region's decisions fall
// back, and the rounds it cannot charge are dropped, counted.
func TestRegionsRedisRestarted(t *testing.T) {
	srv, err := natsserver.Start(natsserver.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	redisSrv := redistest.ForTest(t)
	client := redis.NewClient(&redis.Options{Addr: redisSrv.Addr, MaxRetries: -1})
	t.Cleanup(func() { client.Close() })
	rs, err := counter.NewRedisStore(context.Background(), client, counter.RedisConfig{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rs.Close() })
	// A day's window: the test is over long before the server's day ends
	// but at midnight UTC.
	p := &Policy{Name: "x", Limit: Limit{Algorithm: FixedWindow, Rate: 1000, Period: 24 * time.Hour}, Regions: RegionsExchange}
	engines := map[string]*Engine{}
	for _, r := range regionNames {
		cfg := natsConfig()
		cfg.Region, cfg.Regions = r, regionNames
		co, err := coordinator.NewNATS(natsConn(t, []string{srv.URL()}), cfg)
		if err != nil {
			t.Fatal(err)
		}
		var st counter.Store = counter.NewMemoryStore(counter.MemoryConfig{})
		if r == "us" {
			st = rs
		}
		e, err := New(st, WithoutDetector(), WithCoordinator(co), WithRegion(r), WithRegionInterval(20*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { e.Close() })
		e.KnowPolicies(p)
		engines[r] = e
	}
	used := func() int64 {
		r, err := engines["us"].Peek(context.Background(), "k", p)
		if err != nil {
			return -1 // the server is down
		}
		return p.Limit.Rate - r.Remaining - 1
	}
	var others int64
	for _, r := range []string{"eu", "ap"} {
		for range 25 {
			if res, err := engines[r].Allow(context.Background(), "k", p); err != nil || !res.Allowed {
				t.Fatalf("%s: %+v %v", r, res, err)
			}
			others++
		}
	}
	testkit.For(t, time.Minute, "eu's and ap's 50 charged on us's redis-server", func() bool { return used() == others })
	if err := redisSrv.Kill(); err != nil {
		t.Fatal(err)
	}
	testkit.For(t, time.Minute, "rounds dropped while us's redis-server is down", func() bool {
		st, _ := engines["us"].RegionStats()
		return st.Dropped["store"] > 0
	})
	if err := redisSrv.Restart(); err != nil {
		t.Fatal(err)
	}
	testkit.For(t, time.Minute, "eu's and ap's 50 charged again on the empty server", func() bool { return used() >= others })
	time.Sleep(5 * 20 * time.Millisecond) // more rounds: nothing more
	if got := used(); got != others {
		t.Fatalf("us's restarted redis-server holds %d, want the others' %d, once", got, others)
	}
}

// TestRegionsStopsSending: a region whose daemons stop (or are cut off)
// stops sending rounds; the others see its rounds age while another
// region's keep coming, every interval, though nobody admits anything.
func TestRegionsStopsSending(t *testing.T) {
	f := startRegions(t, natsConfig(), withClock(time.Now))
	testkit.For(t, time.Minute, "rounds from ap and us in eu", func() bool {
		st, _ := f.engines["eu"].RegionStats()
		return !st.LastRound["ap"].IsZero() && !st.LastRound["us"].IsZero()
	})
	if err := f.engines["ap"].Close(); err != nil {
		t.Fatal(err)
	}
	// A message that does not decode, on ap's connection after its last
	// round: once eu has dropped it, it has applied that round.
	malformed, _ := f.engines["eu"].RegionStats()
	if err := f.conns["ap"].Publish("hotkey.default.regions.eu.ap", []byte{1, 0, 1, 'x', 9}); err != nil {
		t.Fatal(err)
	}
	testkit.For(t, time.Minute, "ap's last message dropped in eu", func() bool {
		st, _ := f.engines["eu"].RegionStats()
		return st.Dropped["malformed"] > malformed.Dropped["malformed"]
	})
	before, _ := f.engines["eu"].RegionStats()
	testkit.For(t, time.Minute, "10 more rounds from us", func() bool {
		st, _ := f.engines["eu"].RegionStats()
		return st.LastRound["us"].Sub(before.LastRound["us"]) >= 10*20*time.Millisecond
	})
	after, _ := f.engines["eu"].RegionStats()
	if !after.LastRound["ap"].Equal(before.LastRound["ap"]) {
		t.Errorf("a round from ap, closed, at %v after %v", after.LastRound["ap"], before.LastRound["ap"])
	}
}
