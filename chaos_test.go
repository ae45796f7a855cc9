package hotkey

// The chaos tests put the engine under concurrent load against real servers
// that they kill, slow down, partition and flood, and check what callers see:
// counts and bounds, never tight times (the machine may be 2 noisy cores);
// the times they measure are logged. `make chaos` runs them with -v, and the
// flood at full size without the race detector.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	"github.com/hotkeyd/hotkey/coordinator"
	"github.com/hotkeyd/hotkey/counter"
	"github.com/hotkeyd/hotkey/detector"
	"github.com/hotkeyd/hotkey/internal/faultproxy"
	"github.com/hotkeyd/hotkey/internal/natsserver"
	"github.com/hotkeyd/hotkey/internal/redistest"
	"github.com/hotkeyd/hotkey/internal/testkit"
	"github.com/hotkeyd/hotkey/loadgen"
	"github.com/hotkeyd/hotkey/shard"
)

// The store timeout and breaker of the Redis fault tests: short, so that
// the tests are quick, but a whole second for a round trip, so that a
// loaded machine does not time out on a healthy server.
const (
	chaosTimeout  = time.Second
	chaosProbe    = 300 * time.Millisecond
	chaosMaxProbe = 2 * time.Second
)

// chaosClient returns a client of addr that fails fast: no retries, one
// dial attempt, chaosTimeout on every step. Its pool is large enough that
// the dial errors of these tests never start go-redis's background redialer,
// which could outlive Close.
func chaosClient(t *testing.T, addr string) *redis.Client {
	c := redis.NewClient(&redis.Options{
		Addr:                     addr,
		Protocol:                 2,
		DisableIdentity:          true,
		MaxRetries:               -1,
		DialerRetries:            1,
		DialTimeout:              chaosTimeout,
		ReadTimeout:              chaosTimeout,
		WriteTimeout:             chaosTimeout,
		ContextTimeoutEnabled:    true,
		PoolSize:                 64,
		MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
	})
	t.Cleanup(func() { c.Close() })
	return c
}

// chaosStore returns a Redis store on client with chaosTimeout per round
// trip, closed when the test ends.
func chaosStore(t *testing.T, client *redis.Client) *counter.RedisStore {
	t.Helper()
	s, err := counter.NewRedisStore(context.Background(), client, counter.RedisConfig{Timeout: chaosTimeout, Prefix: "chaos:"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// breakerLog is a slog handler that records when an engine's circuit
// breaker opened and closed, from the engine's own events.
type breakerLog struct {
	mu             sync.Mutex
	opened, closed []time.Time
}

func (l *breakerLog) Enabled(context.Context, slog.Level) bool { return true }
func (l *breakerLog) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l *breakerLog) WithGroup(string) slog.Handler            { return l }

func (l *breakerLog) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case strings.Contains(r.Message, "circuit breaker opened"):
		l.opened = append(l.opened, r.Time)
	case strings.Contains(r.Message, "circuit breaker closed"):
		l.closed = append(l.closed, r.Time)
	}
	return nil
}

// first returns the first time in ts at or after since, or the zero time.
func (l *breakerLog) first(ts *[]time.Time, since time.Time) time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, at := range *ts {
		if !at.Before(since) {
			return at
		}
	}
	return time.Time{}
}

// probeWait returns the wait before the next probe of e's open breaker (it
// doubles after each failed probe).
func probeWait(e *Engine) time.Duration {
	e.brk.mu.Lock()
	defer e.brk.mu.Unlock()
	return e.brk.wait
}

// failStore counts the Takes that fail, by whether the engine's breaker
// was closed when the call went out (a call let through as usual) or open
// (a probe: only probes go out while it is open).
type failStore struct {
	counter.Store
	e                    *Engine // set before the first decision
	failed, probesFailed atomic.Int64

	mu     sync.Mutex // guards probes
	probes []probeCall
}

// probeCall is one call that went out while the breaker was open.
type probeCall struct {
	start, end time.Time
	err        error
}

func (s *failStore) Take(ctx context.Context, key string, hash uint64, lim Limit, n int64) (counter.Result, error) {
	probe := s.e.brk.State() == BreakerOpen
	start := time.Now()
	r, err := s.Store.Take(ctx, key, hash, lim, n)
	if probe {
		s.mu.Lock()
		s.probes = append(s.probes, probeCall{start, time.Now(), err})
		s.mu.Unlock()
	}
	if err != nil {
		if probe {
			s.probesFailed.Add(1)
		} else {
			s.failed.Add(1)
		}
	}
	return r, err
}

// probesAfter returns the probes that ended after t.
func (s *failStore) probesAfter(t time.Time) []probeCall {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []probeCall
	for _, p := range s.probes {
		if p.end.After(t) {
			out = append(out, p)
		}
	}
	return out
}

// quantile returns the q-quantile of ds (0 if empty).
func latencyQuantile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[min(len(s)-1, int(q*float64(len(s))))]
}

// loadGroup runs workers until stop, which the test's cleanup also calls,
// so that a failing test leaves no goroutine behind.
type loadGroup struct {
	wg   sync.WaitGroup
	done chan struct{}
	once sync.Once
}

func newLoadGroup(t *testing.T) *loadGroup {
	g := &loadGroup{done: make(chan struct{})}
	t.Cleanup(g.stop)
	return g
}

func (g *loadGroup) goWork(f func(stop <-chan struct{})) {
	g.wg.Add(1)
	go func() { defer g.wg.Done(); f(g.done) }()
}

func (g *loadGroup) stop() {
	g.once.Do(func() { close(g.done) })
	g.wg.Wait()
}

// stopWithin stops the workers and fails t if one is still in a decision
// after d: every decision must be answered.
func (g *loadGroup) stopWithin(t *testing.T, d time.Duration) {
	t.Helper()
	g.once.Do(func() { close(g.done) })
	stopped := make(chan struct{})
	go func() { g.wg.Wait(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(d):
		t.Fatalf("a decision was not answered %v after the load stopped", d)
	}
}

// killTally is what one worker of TestChaosRedisKilled saw, per policy.
type killTally struct {
	decisions, errs, degraded, wrong [4]int
	firstErr                         error
	healthy, healthyDegraded         int // decisions before the kill and after the breakers closed again, and those degraded
	shareAllowed                     int // the share key, while degraded
	shareFirst, shareLast            time.Time
	openLat                          []time.Duration // decisions made while the breaker was open
	maxLat                           time.Duration
}

// TestChaosRedisKilled: two instances (each told there are 2) on one
// redis-server, 8 goroutines deciding with the local, closed and open
// fallbacks; the server is SIGKILLed mid-load, left down for a second and
// restarted. Callers see no error and every decision is answered; each
// breaker opens on its first failures and closes after a probe succeeds
// once the server is back (how long that took is logged); while open,
// local admits each instance's share of the limit, closed only the
// allowlist, open everything.
func TestChaosRedisKilled(t *testing.T) {
	checkLeaks(t)
	srv, err := redistest.Start(env.Dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })

	const instances, workers = 2, 8
	engines := make([]*Engine, instances)
	stores := make([]*failStore, instances)
	logs := make([]*breakerLog, instances)
	for i := range engines {
		stores[i] = &failStore{Store: chaosStore(t, chaosClient(t, srv.Addr))}
		logs[i] = &breakerLog{}
		e, err := New(stores[i], WithoutDetector(), WithBreaker(3, chaosProbe, chaosMaxProbe), WithLogger(slog.New(logs[i])))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { e.Close() })
		stores[i].e = e
		handler{e}.SetInstances(instances) // as a coordinator of 2 instances would
		engines[i] = e
	}

	lim := PerSecond(5000)
	shareLim := PerSecond(200) // while open: 100 + 100/s per instance
	policies := []*Policy{
		{Name: "local", Limit: lim, OnStoreFailure: FallbackLocal},
		{Name: "closed", Limit: lim, OnStoreFailure: FallbackClosed, Allowlist: []string{"c:0", "c:1"}},
		{Name: "open", Limit: lim, OnStoreFailure: FallbackOpen},
		{Name: "share", Limit: shareLim, OnStoreFailure: FallbackLocal},
	}
	type job struct {
		p      int
		key    string
		listed bool
	}
	var jobs []job
	for i := range 6 {
		jobs = append(jobs, job{0, fmt.Sprint("l:", i), false}, job{1, fmt.Sprint("c:", i), i < 2}, job{2, fmt.Sprint("o:", i), false})
	}
	share := job{3, "share", false}

	var killNs, healedNs atomic.Int64
	tallies := make([]*killTally, workers)
	load := newLoadGroup(t)
	for w := range workers {
		tl := &killTally{}
		tallies[w] = tl
		e := engines[w%instances]
		load.goWork(func(stop <-chan struct{}) {
			ctx := context.Background()
			for k := 0; ; k++ {
				select {
				case <-stop:
					return
				default:
				}
				j := share // every third decision: the share key, driven far over its share
				if k%3 != 0 {
					j = jobs[(k+w)%len(jobs)]
				}
				wasOpen := e.brk.State() == BreakerOpen
				start := time.Now()
				r, err := e.AllowN(ctx, j.key, policies[j.p], 1)
				end := time.Now()
				lat := end.Sub(start)
				tl.decisions[j.p]++
				tl.maxLat = max(tl.maxLat, lat)
				if err != nil {
					tl.errs[j.p]++
					if tl.firstErr == nil {
						tl.firstErr = err
					}
					continue
				}
				// Before the kill and after the breakers closed again, the
				// store decides.
				before := killNs.Load() == 0 || end.UnixNano() < killNs.Load()
				after := healedNs.Load() != 0 && start.UnixNano() > healedNs.Load()
				if before || after {
					tl.healthy++
					if r.Degraded {
						tl.healthyDegraded++
					}
				}
				if !r.Degraded {
					continue
				}
				tl.degraded[j.p]++
				if wasOpen && e.brk.State() == BreakerOpen {
					tl.openLat = append(tl.openLat, lat)
				}
				switch p := policies[j.p]; {
				case p.OnStoreFailure == FallbackClosed && r.Allowed != j.listed,
					p.OnStoreFailure == FallbackOpen && !r.Allowed:
					tl.wrong[j.p]++
				}
				if j == share {
					if r.Allowed {
						tl.shareAllowed++
					}
					if tl.shareFirst.IsZero() {
						tl.shareFirst = start
					}
					tl.shareLast = end
				}
			}
		})
	}

	// Load on a healthy server, then the kill. Calls that failed before it
	// (timeouts of a loaded machine) are not counted against the breaker.
	time.Sleep(300 * time.Millisecond)
	failed0 := make([]int64, instances)
	for i, s := range stores {
		failed0[i] = s.failed.Load()
	}
	killAt := time.Now()
	killNs.Store(killAt.UnixNano())
	if err := srv.Kill(); err != nil {
		t.Fatal(err)
	}
	testkit.For(t, patience, "both breakers open after the kill", func() bool {
		return engines[0].brk.State() == BreakerOpen && engines[1].brk.State() == BreakerOpen
	})
	time.Sleep(time.Second) // down, under load: probes fail
	failed := make([]int64, instances)
	probes := make([]int64, instances)
	for i, s := range stores {
		failed[i], probes[i] = s.failed.Load()-failed0[i], s.probesFailed.Load()
	}
	restartAt := time.Now()
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	backAt := time.Now()
	var wait time.Duration
	for _, e := range engines {
		wait = max(wait, probeWait(e))
	}
	testkit.For(t, patience, "both breakers closed after the restart", func() bool {
		return engines[0].brk.State() == BreakerClosed && engines[1].brk.State() == BreakerClosed
	})
	healedNs.Store(time.Now().UnixNano())
	time.Sleep(300 * time.Millisecond) // healthy again
	load.stopWithin(t, patience)

	// Per engine: when its breaker opened and closed, and what failed.
	// The breaker opens on the third failure in a row. Each of the other
	// goroutines on the engine may have had a call in flight then, which
	// fails after; and a success answered before the kill but reported
	// after a failure resets the run, costing at most 2 more failures, once
	// per goroutine. So with g goroutines an engine sees at least 3 and at
	// most 3 + 3(g-1) failed calls before probing starts.
	perEngine := workers / instances
	maxFailed := int64(3 + 3*(perEngine-1))
	for i, e := range engines {
		opened, closed := logs[i].first(&logs[i].opened, killAt), logs[i].first(&logs[i].closed, killAt)
		if opened.IsZero() || closed.IsZero() {
			t.Fatalf("engine %d: breaker opened at %v and closed at %v: an event is missing from its log", i, opened, closed)
		}
		t.Logf("engine %d: breaker open %v after the kill, after %d failed calls (bound %d: 3 in a row, plus in-flight and late successes of %d goroutines); %d failed probes while down; closed %v after the server answered again (next-probe interval then %v)",
			i, opened.Sub(killAt).Round(time.Millisecond), failed[i], maxFailed, perEngine, probes[i], closed.Sub(backAt).Round(time.Millisecond), wait)
		// Only a probe the server answered closes the breaker: one that
		// succeeded must have started before the close.
		var probesBack []string
		good := false
		for _, p := range stores[i].probesAfter(restartAt) {
			probesBack = append(probesBack, fmt.Sprintf("at %+v for %v: %v", p.start.Sub(backAt).Round(time.Millisecond), p.end.Sub(p.start).Round(time.Millisecond), p.err))
			good = good || (p.err == nil && !p.start.After(closed))
		}
		t.Logf("engine %d: probes since the restart began (times from the server's return): %v", i, probesBack)
		if !good {
			t.Errorf("engine %d: breaker closed with no successful probe before it; probes: %v", i, probesBack)
		}
		if failed[i] < 3 || failed[i] > maxFailed {
			t.Errorf("engine %d: %d failed store calls between the kill and the breaker opening, want 3 to %d", i, failed[i], maxFailed)
		}
		if e.brk.State() != BreakerClosed {
			t.Errorf("engine %d: breaker %v at the end", i, e.brk.State())
		}
	}

	var sum killTally
	shareAllowed := make([]int, instances)
	shareFirst := make([]time.Time, instances)
	shareLast := make([]time.Time, instances)
	for w, tl := range tallies {
		for p := range policies {
			sum.decisions[p] += tl.decisions[p]
			sum.errs[p] += tl.errs[p]
			sum.degraded[p] += tl.degraded[p]
			sum.wrong[p] += tl.wrong[p]
		}
		if sum.firstErr == nil {
			sum.firstErr = tl.firstErr
		}
		sum.healthy += tl.healthy
		sum.healthyDegraded += tl.healthyDegraded
		sum.openLat = append(sum.openLat, tl.openLat...)
		sum.maxLat = max(sum.maxLat, tl.maxLat)
		i := w % instances
		shareAllowed[i] += tl.shareAllowed
		if !tl.shareFirst.IsZero() && (shareFirst[i].IsZero() || tl.shareFirst.Before(shareFirst[i])) {
			shareFirst[i] = tl.shareFirst
		}
		if tl.shareLast.After(shareLast[i]) {
			shareLast[i] = tl.shareLast
		}
	}
	for p, pol := range policies {
		t.Logf("%s: %d decisions, %d degraded, %d errors", pol.Name, sum.decisions[p], sum.degraded[p], sum.errs[p])
		if sum.errs[p] > 0 {
			t.Errorf("%s: %d errors returned to callers (first: %v), want 0", pol.Name, sum.errs[p], sum.firstErr)
		}
		if sum.degraded[p] == 0 {
			t.Errorf("%s: no degraded decision while the server was down", pol.Name)
		}
		if sum.wrong[p] > 0 {
			t.Errorf("%s: %d degraded answers its fallback forbids (closed: only the allowlist passes; open: everything)", pol.Name, sum.wrong[p])
		}
	}
	// A call may time out on a loaded machine even with the server up:
	// allow 1% of degraded answers.
	t.Logf("server up (before the kill, after the breakers closed): %d decisions, %d degraded", sum.healthy, sum.healthyDegraded)
	if sum.healthy == 0 || float64(sum.healthyDegraded) > 0.01*float64(sum.healthy) {
		t.Errorf("with the server up, %d of %d decisions degraded: want the store to decide (at least 99%%)", sum.healthyDegraded, sum.healthy)
	}
	t.Logf("decision latency while the breaker was open: p50 %v, p99 %v, max %v over %d decisions; slowest decision of the run %v",
		latencyQuantile(sum.openLat, 0.5), latencyQuantile(sum.openLat, 0.99), latencyQuantile(sum.openLat, 1), len(sum.openLat), sum.maxLat)

	// While degraded, the share key decides on each instance's memory, at
	// half its limit: at most half the burst plus half the rate over the
	// time it was decided there.
	for i := range instances {
		window := shareLast[i].Sub(shareFirst[i])
		quota := float64(shareLim.Capacity())/instances + float64(shareLim.Rate)/instances*window.Seconds()
		t.Logf("engine %d: share key admitted %d while degraded over %v, its share of the limit %.0f (limit ÷ %d instances): %.3f of it",
			i, shareAllowed[i], window.Round(time.Millisecond), quota, instances, float64(shareAllowed[i])/quota)
		if float64(shareAllowed[i]) > 1.02*quota+1 {
			t.Errorf("engine %d admitted %d for the share key while the store was down, over its share %.0f (+2%%)", i, shareAllowed[i], quota)
		}
		if float64(shareAllowed[i]) < quota/2 {
			t.Errorf("engine %d admitted %d for the share key, under half its share %.0f: the key was not driven over its share", i, shareAllowed[i], quota)
		}
	}
}

// TestChaosRedisSlow: the store answers 30 s late (a delaying proxy) with a
// 1 s store timeout. Callers see the timeout, not the store's late answer:
// the error fallback returns ErrStoreUnavailable, the others a degraded
// decision, every decision well before the store could have answered, and
// the breaker opens; it closes once the store is fast again.
func TestChaosRedisSlow(t *testing.T) {
	checkLeaks(t)
	proxy, err := faultproxy.New(env.Server.Addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { proxy.Close() })
	store := chaosStore(t, chaosClient(t, proxy.Addr()))
	bl := &breakerLog{}
	e, err := New(store, WithoutDetector(), WithBreaker(3, chaosProbe, chaosMaxProbe), WithLogger(slog.New(bl)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	lim := PerSecond(100_000)
	policies := []*Policy{
		{Name: "error", Limit: lim, OnStoreFailure: FallbackError},
		{Name: "local", Limit: lim, OnStoreFailure: FallbackLocal},
		{Name: "open", Limit: lim, OnStoreFailure: FallbackOpen},
	}
	ctx := context.Background()
	prefix := fmt.Sprintf("slow:%x:", rand.Uint64())
	for _, p := range policies {
		if r, err := e.AllowN(ctx, prefix+"warm", p, 1); err != nil || r.Degraded || !r.Allowed {
			t.Fatalf("%s, store fast: %+v, %v", p.Name, r, err)
		}
	}

	const delay, workers = 30 * time.Second, 8
	type tally struct {
		maxLat              time.Duration
		timedOut            []time.Duration // error fallback, failed on the store itself
		degradedLat         []time.Duration
		shortCircuit, wrong int
		firstWrong          error
	}
	tallies := make([]*tally, workers)
	proxy.SetDelay(delay)
	slowAt := time.Now()
	load := newLoadGroup(t)
	for w := range workers {
		tl := &tally{}
		tallies[w] = tl
		load.goWork(func(stop <-chan struct{}) {
			for k := w; ; k++ {
				select {
				case <-stop:
					return
				default:
				}
				p := policies[k%len(policies)]
				start := time.Now()
				r, err := e.AllowN(ctx, prefix+strconv.Itoa(k%8), p, 1)
				lat := time.Since(start)
				tl.maxLat = max(tl.maxLat, lat)
				switch {
				case err != nil && p.OnStoreFailure == FallbackError && errors.Is(err, ErrStoreUnavailable):
					if errors.Is(err, ErrBreakerOpen) {
						tl.shortCircuit++
					} else {
						tl.timedOut = append(tl.timedOut, lat)
					}
				case err != nil:
					tl.wrong++
					tl.firstWrong = err
				case r.Degraded:
					tl.degradedLat = append(tl.degradedLat, lat)
					if p.OnStoreFailure == FallbackOpen && !r.Allowed {
						tl.wrong++
					}
				}
			}
		})
	}
	testkit.For(t, patience, "breaker open on the slow store", func() bool { return e.brk.State() == BreakerOpen })
	time.Sleep(time.Second) // probes meet the slow store
	proxy.SetDelay(0)
	fastAt := time.Now()
	// The next probe is due within the current interval; a probe that
	// misses the timeout on a loaded machine doubles it (up to 2 s).
	testkit.For(t, patience, "breaker closed once the store is fast", func() bool { return e.brk.State() == BreakerClosed })
	load.stopWithin(t, patience)

	var timedOut, degradedLat []time.Duration
	var maxLat time.Duration
	shortCircuit, wrong := 0, 0
	var firstWrong error
	for _, tl := range tallies {
		timedOut = append(timedOut, tl.timedOut...)
		degradedLat = append(degradedLat, tl.degradedLat...)
		maxLat = max(maxLat, tl.maxLat)
		shortCircuit += tl.shortCircuit
		wrong += tl.wrong
		if tl.firstWrong != nil {
			firstWrong = tl.firstWrong
		}
	}
	opened := bl.first(&bl.opened, slowAt)
	closed := bl.first(&bl.closed, fastAt)
	t.Logf("store delayed %v, timeout %v: breaker open %v after the delay began, closed %v after it ended",
		delay, chaosTimeout, opened.Sub(slowAt).Round(time.Millisecond), closed.Sub(fastAt).Round(time.Millisecond))
	t.Logf("error fallback: %d calls timed out on the store (p50 %v, max %v), %d answered at once by the open breaker; degraded answers: %d (p99 %v, max %v); slowest decision %v (bound %v)",
		len(timedOut), latencyQuantile(timedOut, 0.5), latencyQuantile(timedOut, 1), shortCircuit, len(degradedLat), latencyQuantile(degradedLat, 0.99), latencyQuantile(degradedLat, 1), maxLat, delay/2)
	if opened.IsZero() || closed.IsZero() {
		t.Errorf("breaker opened at %v, closed at %v: an event is missing from its log", opened, closed)
	}
	if len(timedOut) == 0 {
		t.Error("no caller of the error fallback saw the store time out")
	}
	if shortCircuit == 0 || len(degradedLat) == 0 {
		t.Errorf("%d errors from the open breaker, %d degraded answers: want some of each", shortCircuit, len(degradedLat))
	}
	if wrong > 0 {
		t.Errorf("%d wrong answers (an error from a fallback that must decide, an error not wrapping ErrStoreUnavailable, open denying); last: %v", wrong, firstWrong)
	}
	// A decision cut by the timeout ends long before the store's answer
	// could come; half the delay leaves a loaded machine 14 s of slack.
	if maxLat > delay/2 {
		t.Errorf("a decision took %v on a store delayed %v with timeout %v, want under %v: it waited for the store, not the timeout", maxLat, delay, chaosTimeout, delay/2)
	}
}

// engineTarget is loadgen's target of one engine deciding under p.
type engineTarget struct {
	e *Engine
	p *Policy
}

func (t engineTarget) Decide(ctx context.Context, key string, cost int64) (loadgen.Outcome, error) {
	r, err := t.e.AllowN(ctx, key, t.p, cost)
	return loadgen.Outcome{Allowed: r.Allowed, Shards: int(r.Shards)}, err
}

// drivePaced sends rate decisions per second for key on e during d, from
// workers senders on loadgen's open-loop schedule, and returns what it
// measured. A decision may take up to a minute: only a hang is an error.
func drivePaced(t *testing.T, e *Engine, key string, lim Limit, rate int, d time.Duration, workers int) *loadgen.Result {
	res, err := loadgen.Run(context.Background(), loadgen.Config{
		Target: engineTarget{e, pol(lim)}, Workload: loadgen.Fixed(key),
		Rate: float64(rate), Duration: d, Concurrency: workers, Timeout: time.Minute,
	}, nil, 0)
	if err != nil {
		t.Error(err)
	}
	return res
}

// routedTo reports whether s has a route to the server named name.
func routedTo(s *natsserver.Server, name string) bool {
	rz, err := s.Server().Routez(nil)
	if err != nil {
		return false
	}
	for _, r := range rz.Routes {
		if r.RemoteName == name {
			return true
		}
	}
	return false
}

// TestChaosNATSPartition: two engines, each on its own NATS server, both on
// one Redis; the servers' route goes through a proxy, which is cut. Each
// side goes on deciding alone and splits a key hot on both sides by itself;
// together they admit at most twice the limit (each side at most the whole
// limit). Once the route is back the engines agree on the levels again
// (how long that took, against a renewal period, is logged).
func TestChaosNATSPartition(t *testing.T) {
	checkLeaks(t)
	cluster := func(name string, routes ...string) natsserver.Options {
		return natsserver.Options{Configure: func(o *server.Options) {
			o.ServerName = name
			o.Cluster = server.ClusterOpts{Name: "chaos", Host: "127.0.0.1", Port: server.RANDOM_PORT, NoAdvertise: true}
			if len(routes) > 0 {
				o.Routes = server.RoutesFromStr(strings.Join(routes, ","))
			}
		}}
	}
	a, err := natsserver.Start(cluster("chaos-a"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.Shutdown)
	proxy, err := faultproxy.New(a.Server().ClusterAddr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { proxy.Close() })
	b, err := natsserver.Start(cluster("chaos-b", "nats://"+proxy.Addr()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Shutdown)
	routed := func() bool { return routedTo(a, "chaos-b") && routedTo(b, "chaos-a") }
	testkit.For(t, patience, "route between the servers through the proxy", routed)

	// Alone, a side splits a key at 20/s to 4, at 80/s to 16, at 320/s to
	// 64: far under what the streams send, so that a loaded machine that
	// sends them late and bunched still splits both keys.
	det := detector.DefaultConfig()
	det.Threshold = 20
	ncfg := natsConfig()
	var engines []*Engine
	for _, s := range []*natsserver.Server{a, b} {
		client := redis.NewClient(&redis.Options{Addr: env.Server.Addr})
		t.Cleanup(func() { client.Close() })
		store, err := counter.NewRedisStore(context.Background(), client, counter.RedisConfig{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { store.Close() })
		nc := natsConn(t, []string{s.URL()}, nats.IgnoreDiscoveredServers()) // stay on this side
		co, err := coordinator.NewNATS(nc, natsConfig())
		if err != nil {
			t.Fatal(err)
		}
		e, err := New(store, WithCoordinator(co), WithDetector(det))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { e.Close() })
		engines = append(engines, e)
	}
	ea, eb := engines[0], engines[1]
	testkit.For(t, patience, "each engine sees 2 instances", func() bool { return ea.liveInstances() == 2 && eb.liveInstances() == 2 })

	proxy.Cut()
	cutAt := time.Now()
	apart := testkit.For(t, patience, "partition: no route, each engine alone", func() bool {
		return !routedTo(a, "chaos-b") && !routedTo(b, "chaos-a") && ea.liveInstances() == 1 && eb.liveInstances() == 1
	})

	// Both sides drive key at 3× its limit; side A alone drives key2, so
	// that only A splits it.
	const limit, window = 400, 2 * time.Second
	lim := PerSecond(limit)
	key := fmt.Sprintf("part:%x", rand.Uint64())
	key2 := fmt.Sprintf("part2:%x", rand.Uint64())
	streams := make([]*loadgen.Result, 3)
	var wg sync.WaitGroup
	for i, f := range []func() *loadgen.Result{
		func() *loadgen.Result { return drivePaced(t, ea, key, lim, 3*limit, window, 8) },
		func() *loadgen.Result { return drivePaced(t, eb, key, lim, 3*limit, window, 8) },
		func() *loadgen.Result { return drivePaced(t, ea, key2, PerSecond(1_000_000), 300, window, 2) },
	} {
		wg.Add(1)
		go func() { defer wg.Done(); streams[i] = f() }()
	}
	wg.Wait()
	for i, s := range streams {
		if s.Errors > 0 {
			t.Errorf("stream %d: %d errors during the partition (first: %v), want 0", i, s.Errors, s.FirstError)
		}
	}
	if ea.liveInstances() != 1 || eb.liveInstances() != 1 || routed() {
		t.Fatalf("the partition healed during the window: instances %d and %d", ea.liveInstances(), eb.liveInstances())
	}
	levels := fmt.Sprintf("%s at %d and %d, %s at %d and %d", key, ea.levelOf(key), eb.levelOf(key), key2, ea.levelOf(key2), eb.levelOf(key2))
	if ea.levelOf(key) == 1 || eb.levelOf(key) == 1 || ea.levelOf(key2) == 1 || eb.levelOf(key2) != 1 {
		t.Errorf("levels at the end of the partition: %s; want the hot key split on both sides, key2 split on A only", levels)
	}
	start := streams[0].Start
	if streams[1].Start.Before(start) {
		start = streams[1].Start
	}
	end := streams[0].Start.Add(streams[0].Elapsed)
	if e1 := streams[1].Start.Add(streams[1].Elapsed); e1.After(end) {
		end = e1
	}
	quota := float64(limit) + float64(limit)*end.Sub(start).Seconds()
	total := streams[0].Allowed + streams[1].Allowed
	ratio := float64(total) / quota
	t.Logf("partitioned %v after the cut; over %v at 3× the limit of %d/s on each side (%.0f/s and %.0f/s decided), A admitted %d, B %d: %d of a quota of %.0f = %.2f× (bound 2×); levels %s",
		apart.Round(time.Millisecond), end.Sub(start).Round(time.Millisecond), limit, streams[0].Rate(), streams[1].Rate(),
		streams[0].Allowed, streams[1].Allowed, total, quota, ratio, levels)
	if ratio > 2*1.02 {
		t.Errorf("the two sides admitted %.2f× the quota while partitioned, want at most 2× (+2%%)", ratio)
	}

	proxy.Restore()
	restoreAt := time.Now()
	testkit.For(t, patience, "route back through the proxy", routed)
	routeUp := time.Now()
	// A renews its leases every ttl/3: B hears key2 at the next renewal
	// after the route is back, once interest has crossed the new route.
	// The keys stay hot on A's detector for its cool-down (a minute), far
	// longer than the wait.
	agreed := testkit.For(t, patience, "B learns key2 from A and the engines agree on the levels", func() bool {
		return eb.levelOf(key2) > 1 && ea.levelOf(key) == eb.levelOf(key) && ea.levelOf(key2) == eb.levelOf(key2)
	})
	t.Logf("route back %v after the restore (%v after the cut); levels agreed %v after the route (renewal period %v): %s at %d and %d, %s at %d and %d",
		routeUp.Sub(restoreAt).Round(time.Millisecond), routeUp.Sub(cutAt).Round(time.Millisecond), agreed.Round(time.Millisecond), ncfg.TTL/3,
		key, ea.levelOf(key), eb.levelOf(key), key2, ea.levelOf(key2), eb.levelOf(key2))
}

// floodKeys is how many distinct keys TestChaosFlood sends: 10M, or 500k
// under the race detector, where the engine is about 10 times slower
// (still twice the memory store's bound, so that its room is reused).
func floodKeys() int {
	if raceEnabled {
		return 500_000
	}
	return 10_000_000
}

// TestChaosFlood: distinct keys, each decided once, through an engine with
// a detector at 200/s on a memory store, with 3 hot keys in the same stream
// (one decision in three, so that each stays over the threshold even on a
// slow machine under -race). The heap grows by at most 64 MiB, every hot
// key is split (recall 1.0), and no key is refused for want of room: a
// flood key's counter (100/s) expires 10 ms after its one decision, and
// makes room for the next.
//
// The memory store holds at most 2^18 counters (about 100 bytes each: 24
// MiB, measured), reusing the room of expired ones beyond it: a bound the
// flood crosses 38 times over (twice under -race). The default bound, 2^20 counters, takes about
// 100 MiB full, over this budget by itself. The rest of the engine is fixed
// in size: the detector (4.3 MiB on 2 cores), the deny cache (0.5 MiB), the
// split table (hot keys only).
func TestChaosFlood(t *testing.T) {
	checkLeaks(t)
	const maxKeys, hot = 1 << 18, 3
	n := floodKeys()
	workers := 2
	if raceEnabled {
		workers = 1 // leave a core to the packages go test runs alongside
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	store := counter.NewMemoryStore(counter.MemoryConfig{MaxKeys: maxKeys})
	// The detector at 200/s rather than its default 1000/s: a loaded
	// machine under -race was measured at 16k decisions/s, under 2k/s per
	// hot key, and could go slower still. A cold key, decided once, is
	// nowhere near either.
	det := detector.DefaultConfig()
	det.Threshold = 200
	e, err := New(store, WithDetector(det))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	hotKeys := make([]string, hot)
	for i := range hotKeys {
		hotKeys[i] = fmt.Sprint("hot:", i)
	}
	coldLim, hotLim := PerSecond(100), PerSecond(1_000_000)
	var errs atomic.Int64
	start := time.Now()
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx := context.Background()
			for i := w; i < n; i += workers {
				// A new string each time: the store keeps it.
				if _, err := e.Allow(ctx, "flood:"+strconv.Itoa(i), pol(coldLim)); err != nil {
					errs.Add(1)
				}
				if i%2 == 0 {
					if _, err := e.Allow(ctx, hotKeys[(i/2)%hot], pol(hotLim)); err != nil {
						errs.Add(1)
					}
				}
			}
		}()
	}
	wg.Wait()
	took := time.Since(start)
	detected := func() int {
		k := 0
		for _, h := range hotKeys {
			if e.levelOf(h) > 1 {
				k++
			}
		}
		return k
	}
	// Levels are applied by the engine's loop, shortly after the detector
	// says, and stay up for its cool-down (a minute): wait for them.
	waited := time.Now()
	for detected() < hot && time.Since(waited) < patience {
		time.Sleep(10 * time.Millisecond)
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	grew := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	levels := make([]shard.Level, hot)
	for i, h := range hotKeys {
		levels[i] = e.levelOf(h)
	}
	t.Logf("%d distinct keys and %d hot decisions in %v (%.0f decisions/s): heap grew %.1f MiB (bound 64), store holds %d counters (bound %d), refused %d; hot keys at levels %v: recall %d/%d",
		n, (n+1)/2, took.Round(time.Millisecond), float64(n+(n+1)/2)/took.Seconds(), float64(grew)/(1<<20), store.Len(), maxKeys, store.Full(), levels, detected(), hot)
	if errs.Load() > 0 {
		t.Errorf("%d decisions failed", errs.Load())
	}
	if grew > 64<<20 {
		t.Errorf("heap grew by %.1f MiB, want at most 64", float64(grew)/(1<<20))
	}
	if store.Len() > maxKeys {
		t.Errorf("store holds %d counters, over its bound %d", store.Len(), maxKeys)
	}
	if store.Full() != 0 {
		t.Errorf("store refused %d keys for want of room, though every flood key's counter expires 10 ms after its decision", store.Full())
	}
	if detected() != hot {
		t.Errorf("hot keys at levels %v: recall %d/%d, want every hot key split", levels, detected(), hot)
	}
	runtime.KeepAlive(e)
	runtime.KeepAlive(store)
}

// evalCalls returns how many scripts Redis has run (redistest.ScriptCalls).
func evalCalls(t *testing.T, c *redis.Client) int64 {
	t.Helper()
	n, err := redistest.ScriptCalls(context.Background(), c)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestChaosDenyCache: one attacker at 10× its limit on real Redis, with the
// deny cache on (its default size). Redis's own count of script calls says
// what the denied decisions cost: every admitted decision costs one call
// (the key stays whole, and the attacker sends one request at a time, so no
// batching), the rest is what denials cost: at most 0.05 per denial. A raised limit takes effect on
// the next decision, though the deny cache still holds a denial under the
// old one.
func TestChaosDenyCache(t *testing.T) {
	checkLeaks(t)
	srv, err := redistest.Start(env.Dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	client := redis.NewClient(&redis.Options{Addr: srv.Addr, Protocol: 2, DisableIdentity: true,
		MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}})
	t.Cleanup(func() { client.Close() })
	rs, err := counter.NewRedisStore(context.Background(), client, counter.RedisConfig{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rs.Close() })
	store := &testkit.Store{Store: rs}
	// Without the detector: at 10× a limit of 50/s the attacker stays under
	// its threshold anyway, but a stall and catch-up could split the key,
	// and the arithmetic below wants it whole.
	e, err := New(store, WithoutDetector())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	ctx := context.Background()

	const limit, attack, window = 50, 500, 2 * time.Second
	for _, alg := range []Algorithm{FixedWindow, TokenBucket} {
		t.Run(alg.String(), func(t *testing.T) {
			key := fmt.Sprintf("attack:%v:%x", alg, rand.Uint64())
			lim := Limit{Algorithm: alg, Rate: limit, Period: time.Second}
			calls0, takes0 := evalCalls(t, client), store.Takes.Load()
			began := time.Now()
			// One sender, paced: each decision is over before the next.
			res, err := loadgen.Run(ctx, loadgen.Config{
				Target: engineTarget{e, pol(lim)}, Workload: loadgen.Fixed(key),
				Rate: attack, Duration: window, Concurrency: 1, Timeout: time.Minute, Watch: key, Period: window,
			}, nil, 0)
			if err != nil || res.Errors > 0 {
				t.Fatalf("attack: %v, %d errors (first %v)", err, res.Errors, res.FirstError)
			}
			if s := res.Watched[0].Shards; s != 1 {
				t.Fatalf("the key was split %d ways", s)
			}
			allowed, denied, elapsed := int(res.Allowed), int(res.Denied), res.Elapsed
			calls, takes := evalCalls(t, client)-calls0, store.Takes.Load()-takes0
			if calls != takes {
				t.Errorf("Redis ran %d script calls for %d Takes, want one each", calls, takes)
			}
			denyCalls := calls - int64(allowed)
			perDenied := float64(denyCalls) / float64(denied)
			t.Logf("%v over %v at %d/s, limit %d/s: %d admitted, %d denied; Redis ran %d script calls: %.3f per denied decision beyond the admitted ones (%.3f counting all)",
				alg, elapsed.Round(time.Millisecond), attack, limit, allowed, denied, calls, perDenied, float64(calls)/float64(denied))
			// Held to its limit: a burst and the refill over the time the
			// attack really took (a loaded machine stretches it); for the
			// fixed window, the limit in each window the attack touched
			// (windows start at whole seconds, on Redis's clock, which is
			// this machine's).
			quota := 1.02*float64(limit)*(1+elapsed.Seconds()) + 1
			if alg == FixedWindow {
				windows := time.Now().Unix() - began.Unix() + 1
				quota = float64(limit * windows)
			}
			if float64(allowed) > quota {
				t.Errorf("%d admitted over %v, over the limit's %.0f: the attacker was not held to its limit", allowed, elapsed, quota)
			}
			if denied == 0 {
				t.Fatalf("no decision denied over %v at %d/s against %d/s", elapsed, attack, limit)
			}
			// A fixed window's first denial is cached until the window
			// ends; a token bucket's admission that empties the bucket is
			// cached as a denial until the next unit is due, and each
			// denial until its retry-after.
			if perDenied > 0.05 {
				t.Errorf("%.3f Redis calls per denied decision, want at most 0.05", perDenied)
			}

			// The deny cache holds a denial under lim now: a request under
			// lim is denied without a call, one under 10× lim goes to Redis
			// and is decided there under the new limit.
			for {
				before := store.Takes.Load()
				r, err := e.Allow(ctx, key, pol(lim))
				if err != nil {
					t.Fatal(err)
				}
				if !r.Allowed && store.Takes.Load() == before {
					break // a cached denial
				}
			}
			raised := lim
			raised.Rate *= 10
			before := store.Takes.Load()
			r, err := e.Allow(ctx, key, pol(raised))
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("%v: under %d/s after a cached denial under %d/s: %+v", alg, raised.Rate, limit, r)
			if store.Takes.Load() != before+1 || r.Limit != raised.Capacity() {
				t.Errorf("raised limit answered from the deny cache (%d store calls, limit %d in the result), want one call under the raised limit", store.Takes.Load()-before, r.Limit)
			}
			// A fixed window holds limit units of the raised limit's ten
			// times as many. A token bucket keeps its state in time, and a
			// 10× rate with 10× the burst is as full as before: it admits
			// once the raised limit's next unit is due, within 1/(10·limit).
			if alg == FixedWindow && !r.Allowed {
				t.Error("raised limit denied")
			}
			if alg == TokenBucket && !r.Allowed && r.RetryAfter > time.Second/time.Duration(raised.Rate)+time.Millisecond {
				t.Errorf("raised limit denied with retry-after %v, want at most the raised limit's unit %v", r.RetryAfter, time.Second/time.Duration(raised.Rate))
			}
		})
	}
}

// TestChaosCallerDeadlines: callers pass deadlines (100 ms) shorter than
// the store's timeout (10 s) to a store that has stalled. Each call cut by
// a deadline counts as a failure of the store, so the breaker opens after
// 3, and every decision, those cut included, gets its policy's fallback.
// A call the caller cancels says nothing of the store.
func TestChaosCallerDeadlines(t *testing.T) {
	checkLeaks(t)
	proxy, err := faultproxy.New(env.Server.Addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { proxy.Close() })
	rs, err := counter.NewRedisStore(context.Background(), chaosClient(t, proxy.Addr()), counter.RedisConfig{Timeout: 10 * time.Second, Prefix: "chaos:"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rs.Close() })
	store := &testkit.Store{Store: rs}
	e, err := New(store, WithoutDetector(), WithBreaker(3, time.Hour, time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	p := &Policy{Name: "gateway", Limit: PerSecond(1000), OnStoreFailure: FallbackLocal}
	key := fmt.Sprintf("deadline:%x", rand.Uint64())
	if r, err := e.AllowN(context.Background(), key, p, 1); err != nil || r.Degraded {
		t.Fatalf("store fast: %+v, %v", r, err)
	}

	proxy.SetDelay(30 * time.Second)
	// Cancelled by the caller: an error, and no verdict on the store.
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(50*time.Millisecond, cancel)
	if _, err := e.AllowN(ctx, key, p, 1); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled call: %v, want context.Canceled", err)
	}
	if got := e.brk.fails.Load(); got != 0 {
		t.Fatalf("a cancelled call counted %d failures", got)
	}

	const calls = 30
	errs, degraded := 0, 0
	takes := store.Takes.Load()
	for range calls {
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		r, err := e.AllowN(ctx, key, p, 1)
		cancel()
		switch {
		case err != nil:
			errs++
		case r.Degraded:
			degraded++
		}
	}
	calls0 := store.Takes.Load() - takes
	t.Logf("%d decisions with 100 ms deadlines on a store stalled 30 s: %d errors, %d degraded, %d store calls, breaker %v", calls, errs, degraded, calls0, e.brk.State())
	if errs != 0 || degraded != calls {
		t.Errorf("%d errors, %d degraded of %d: want every decision from the fallback", errs, degraded, calls)
	}
	if e.brk.State() != BreakerOpen || calls0 != 3 {
		t.Errorf("breaker %v after %d store calls, want open after 3", e.brk.State(), calls0)
	}
}
