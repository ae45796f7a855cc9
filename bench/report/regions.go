package main

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/redis/go-redis/v9"
	"gonum.org/v1/plot/plotter"

	"github.com/hotkeyd/hotkey"
	"github.com/hotkeyd/hotkey/bench/internal/scenario"
	"github.com/hotkeyd/hotkey/coordinator"
	"github.com/hotkeyd/hotkey/counter"
	"github.com/hotkeyd/hotkey/internal/natsserver"
	"github.com/hotkeyd/hotkey/internal/redistest"
)

// The regions scenario's fleet: 3 regions, 2 engines and NATS servers a
// region, a 1 s round interval, 50–200 ms on every link between regions.
var (
	rgRegions  = []string{"eu", "us", "ap"}
	rgModes    = []hotkey.RegionMode{hotkey.RegionsIndependent, hotkey.RegionsExchange, hotkey.RegionsShares}
	rgDelayLo  = 50 * time.Millisecond
	rgDelayHi  = 200 * time.Millisecond
	rgInterval = time.Second
)

const (
	rgEngines = 2    // a region
	rgLimit   = 1000 // a window, all regions together: rgRun's limit
	rgCut     = 0    // the region cut off in phase 3: eu
)

// rgPhase is one phase of the run: the load each region offers, × the
// limit per window.
type rgPhase struct {
	name string
	load []float64
}

var rgPhases = []rgPhase{
	{"1.5× in every region", []float64{1.5, 1.5, 1.5}},
	{"1.5× in all, 70/20/10", []float64{1.05, 0.3, 0.15}},
	{"1.5× in every region, eu cut off", []float64{1.5, 1.5, 1.5}},
	{"0.9× in all, 70/20/10", []float64{0.63, 0.18, 0.09}},
}

// rgFleet is the scenario's regions: a redis-server and a NATS cluster
// each, joined as a supercluster, and their engines.
type rgFleet struct {
	sc      *natsserver.Supercluster
	servers []*redistest.Server
	clients []*redis.Client
	stores  []*counter.RedisStore
	conns   []*nats.Conn
	engines [][]*hotkey.Engine // by region
}

// startRegionsFleet starts the regions, delays their links and waits until
// every engine counts its region's others live and a unit admitted under
// an exchange policy in any region reaches every engine's store.
func startRegionsFleet(ctx context.Context, dir string) (f *rgFleet, err error) {
	f = &rgFleet{engines: make([][]*hotkey.Engine, len(rgRegions))}
	defer func() {
		if err != nil {
			f.Close()
		}
	}()
	if f.sc, err = natsserver.StartSupercluster(rgRegions, rgEngines, natsserver.Options{}); err != nil {
		return f, err
	}
	f.sc.SetDelay(rgDelayLo, rgDelayHi)
	for ri, r := range rgRegions {
		srv, err := redistest.Start(dir)
		if err != nil {
			return f, err
		}
		f.servers = append(f.servers, srv)
		for i := range rgEngines {
			c := redis.NewClient(&redis.Options{Addr: srv.Addr})
			f.clients = append(f.clients, c)
			st, err := counter.NewRedisStore(ctx, c, counter.RedisConfig{})
			if err != nil {
				return f, err
			}
			f.stores = append(f.stores, st)
			nc, err := coordinatorConn(f.sc.Cluster(r).Server(i))
			if err != nil {
				return f, err
			}
			f.conns = append(f.conns, nc)
			co, err := coordinator.NewNATS(nc, coordinator.Config{Region: r, Regions: rgRegions})
			if err != nil {
				return f, err
			}
			e, err := hotkey.New(st, hotkey.WithoutDetector(), hotkey.WithCoordinator(co), hotkey.WithRegion(r), hotkey.WithRegionInterval(rgInterval))
			if err != nil {
				co.Close()
				return f, err
			}
			f.engines[ri] = append(f.engines[ri], e)
		}
	}
	deadline := time.Now().Add(60 * time.Second)
	for _, e := range f.all() {
		for e.Stats().Instances < rgEngines {
			if time.Now().After(deadline) {
				return f, fmt.Errorf("regions: an engine counts %d live instances after 60 s, want %d", e.Stats().Instances, rgEngines)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return f, f.warm(ctx, deadline)
}

func (f *rgFleet) all() []*hotkey.Engine {
	var es []*hotkey.Engine
	for _, r := range f.engines {
		es = append(es, r...)
	}
	return es
}

// warm has every engine admit a unit of a fresh key under an exchange
// policy until every engine's store holds all of them: the rounds'
// subjects have spread over the gateways.
func (f *rgFleet) warm(ctx context.Context, deadline time.Time) error {
	p := &hotkey.Policy{Name: "warm", Limit: hotkey.Limit{Algorithm: hotkey.FixedWindow, Rate: 1_000_000, Period: time.Hour}, Regions: hotkey.RegionsExchange}
	es := f.all()
	for _, e := range es {
		e.KnowPolicies(p)
	}
	for try := 0; ; try++ {
		key := fmt.Sprintf("warm:%x:%d", rand.Uint32(), try)
		for _, e := range es {
			if _, err := e.Allow(ctx, key, p); err != nil {
				return err
			}
		}
		for wait := time.Now().Add(5 * rgInterval); time.Now().Before(wait); time.Sleep(100 * time.Millisecond) {
			if seen, err := f.seen(ctx, key, p, int64(len(es))); err != nil {
				return err
			} else if seen {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return errors.New("regions: the regions never charged each other's units")
		}
	}
}

// seen reports whether every engine's store holds n units of key under p.
func (f *rgFleet) seen(ctx context.Context, key string, p *hotkey.Policy, n int64) (bool, error) {
	for _, e := range f.all() {
		r, err := e.Peek(ctx, key, p)
		if err != nil {
			return false, err
		}
		if r.Remaining > p.Limit.Rate-1-n { // a take would leave limit − 1 − n
			return false, nil
		}
	}
	return true, nil
}

// Close stops the engines (their coordinators with them), the stores, the
// connections and the servers.
func (f *rgFleet) Close() {
	for _, e := range f.all() {
		e.Close()
	}
	for _, st := range f.stores {
		st.Close()
	}
	for _, c := range f.clients {
		c.Close()
	}
	for _, nc := range f.conns {
		nc.Close()
	}
	if f.sc != nil {
		f.sc.Close()
	}
	for _, s := range f.servers {
		s.Close()
	}
}

// rgRecorder keeps the run's decisions.
type rgRecorder struct {
	mu       sync.Mutex // guards recs, firstErr
	recs     []rgDecision
	firstErr error
	errs     atomic.Int64
	degraded atomic.Int64
}

func (rec *rgRecorder) decide(ctx context.Context, e *hotkey.Engine, mode, region int, key string, p *hotkey.Policy) {
	start := time.Now().UnixNano()
	r, err := e.AllowN(ctx, key, p, 1)
	end := time.Now().UnixNano()
	if err != nil {
		if rec.errs.Add(1) == 1 {
			rec.mu.Lock()
			rec.firstErr = err
			rec.mu.Unlock()
		}
		return
	}
	if r.Degraded {
		rec.degraded.Add(1)
	}
	rec.mu.Lock()
	rec.recs = append(rec.recs, rgDecision{mode: mode, region: region, start: start, end: end, allowed: r.Allowed})
	rec.mu.Unlock()
}

// rgRun is the schedule of a run: its windows, phases and cut.
type rgRun struct {
	limit          int64         // a window, all regions together
	period         time.Duration // a window
	perPhase       int           // windows a phase
	cutAt, cutFor  time.Duration // into phase 3: early, while its first window's limit is still being used
	bin            time.Duration // of the plots
	t0             time.Time     // the first window's start
	cutFrom, cutTo time.Time     // as it happened
	rejoin         time.Duration // from Heal until WaitJoined returned
	rejoinErr      error
}

func (g *rgRun) phaseLen() time.Duration { return time.Duration(g.perPhase) * g.period }

// offer sends each region's load, phase by phase, open loop: each request
// is one decision per mode, on its keys, at the region's engines in turn.
func (g *rgRun) offer(ctx context.Context, f *rgFleet, keys []string, ps []*hotkey.Policy, rec *rgRecorder) {
	var wg sync.WaitGroup
	for ri := range rgRegions {
		wg.Go(func() {
			n := 0
			for k, ph := range rgPhases {
				start := g.t0.Add(time.Duration(k) * g.phaseLen())
				rate := ph.load[ri] * float64(g.limit) / g.period.Seconds()
				count := int(rate * g.phaseLen().Seconds())
				for i := range count {
					// Regions offset by a third of a request's spacing.
					at := start.Add(time.Duration((float64(i) + float64(ri)/3) / rate * float64(time.Second)))
					time.Sleep(time.Until(at))
					e := f.engines[ri][n%rgEngines]
					n++
					for m := range rgModes {
						wg.Go(func() { rec.decide(ctx, e, m, ri, keys[m], ps[m]) })
					}
				}
			}
		})
	}
	wg.Go(func() {
		time.Sleep(time.Until(g.t0.Add(2*g.phaseLen() + g.cutAt)))
		g.cutFrom = time.Now()
		f.sc.Cut(rgRegions[rgCut])
		time.Sleep(time.Until(g.cutFrom.Add(g.cutFor)))
		f.sc.Heal(rgRegions[rgCut])
		g.cutTo = time.Now()
		g.rejoinErr = f.sc.WaitJoined(60 * time.Second)
		g.rejoin = time.Since(g.cutTo)
	})
	wg.Wait()
}

// rgMode is one mode's figures.
type rgMode struct {
	worst13, worstPart, worstOutside float64 // ÷ the limit
	phase                            []float64
	phase2                           []float64 // per region, ÷ the limit, a window on average
	bound                            float64
	falseDenied                      int64
	falseWindows, p4Windows          int
	p4Offered                        int64
	edge                             int64
	windows                          []*rgWindow
}

// runRegions runs the regions scenario: 3 regions, one global limit per
// mode (independent, exchange, shares) on keys of their own at once,
// through four phases of load, and counts each window's admissions across
// regions.
func runRegions(ctx context.Context, s *setup) (*scenario.Section, error) {
	g := &rgRun{limit: rgLimit, period: time.Minute, perPhase: 2, cutAt: 2 * time.Second, cutFor: 30 * time.Second, bin: 5 * time.Second}
	if s.quick {
		g = &rgRun{limit: rgLimit, period: 10 * time.Second, perPhase: 1, cutAt: 500 * time.Millisecond, cutFor: 5 * time.Second, bin: time.Second}
	}
	f, err := startRegionsFleet(ctx, s.env.Dir)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var ps []*hotkey.Policy
	var keys []string
	tag := rand.Uint32()
	for _, m := range rgModes {
		ps = append(ps, &hotkey.Policy{Name: m.String(), Limit: hotkey.Limit{Algorithm: hotkey.FixedWindow, Rate: g.limit, Period: g.period}, Regions: m})
		keys = append(keys, fmt.Sprintf("rg%x:%s", tag, m))
	}
	for _, e := range f.all() {
		e.KnowPolicies(ps...)
	}
	before := f.regionStats()
	g.t0 = time.Now().Truncate(g.period).Add(g.period)
	rec := &rgRecorder{}
	g.offer(ctx, f, keys, ps, rec)
	if n := rec.errs.Load(); n > 0 {
		return nil, fmt.Errorf("regions: %d decisions failed, first: %w", n, rec.firstErr)
	}
	after := f.regionStats()
	return g.section(s, rec, before, after)
}

// rgStats is the engines' RegionStats, summed.
type rgStats struct {
	sent, charged uint64
	gave, granted uint64
	dropped       map[string]uint64
	errors        uint64
}

func (f *rgFleet) regionStats() rgStats {
	st := rgStats{dropped: map[string]uint64{}}
	for _, e := range f.all() {
		rs, _ := e.RegionStats()
		for _, n := range rs.Sent {
			st.sent += n
		}
		for _, n := range rs.Charged {
			st.charged += n
		}
		for _, n := range rs.Gave {
			st.gave += n
		}
		for _, n := range rs.Granted {
			st.granted += n
		}
		for k, n := range rs.Dropped {
			st.dropped[k] += n
		}
		st.errors += rs.Errors
	}
	return st
}

// figures computes mode m's figures from the run.
func (g *rgRun) figures(recs []rgDecision, m int) rgMode {
	ws := rgWindows(recs, m, len(rgRegions), g.period)
	t0 := g.t0.UnixNano()
	pl := int64(g.phaseLen())
	phase := func(k int) []*rgWindow { return between(ws, g.period, t0+int64(k)*pl, t0+int64(k+1)*pl) }
	var r rgMode
	var p13 []*rgWindow
	for k := range rgPhases {
		pw := phase(k)
		var sum int64
		for _, w := range pw {
			sum += w.total()
		}
		r.phase = append(r.phase, float64(sum)/float64(int64(max(1, len(pw)))*g.limit))
		if k < 3 {
			p13 = append(p13, pw...)
		}
	}
	for _, w := range p13 {
		s := w.index * int64(g.period)
		part := s < g.cutTo.UnixNano() && s+int64(g.period) > g.cutFrom.UnixNano()
		q := float64(w.total()) / float64(g.limit)
		if part {
			r.worstPart = max(r.worstPart, q)
		} else {
			r.worstOutside = max(r.worstOutside, q)
		}
	}
	r.worst13 = float64(worstWindow(p13)) / float64(g.limit)
	r.phase2 = make([]float64, len(rgRegions))
	p2 := phase(1)
	for _, w := range p2 {
		for ri, a := range w.admitted {
			r.phase2[ri] += float64(a) / float64(int64(len(p2))*g.limit)
		}
	}
	p4 := phase(3)
	r.falseDenied, r.falseWindows = falseDenials(p4, g.limit)
	r.p4Windows = len(p4)
	for _, w := range p4 {
		r.p4Offered += w.offeredTotal()
	}
	for _, w := range ws {
		r.edge += w.edge
	}
	r.windows = ws
	return r
}

// bound returns mode's stated bound ÷ the limit: for exchange, with the
// per-region rate at 1.5× and the slowest delivery, rgDelayHi.
func (g *rgRun) bound(mode hotkey.RegionMode) float64 {
	switch mode {
	case hotkey.RegionsExchange:
		rate := 1.5 * float64(g.limit) / g.period.Seconds()
		return (float64(g.limit) + float64(len(rgRegions)-1)*rate*(rgInterval+rgDelayHi).Seconds()) / float64(g.limit)
	case hotkey.RegionsShares:
		return 1
	default:
		return float64(len(rgRegions))
	}
}

func okWord(ok bool) string {
	if ok {
		return "met"
	}
	return "**not met**"
}

func (g *rgRun) section(s *setup, rec *rgRecorder, before, after rgStats) (*scenario.Section, error) {
	figs := make([]rgMode, len(rgModes))
	for m := range rgModes {
		figs[m] = g.figures(rec.recs, m)
	}
	in, ex, sh := figs[0], figs[1], figs[2]
	rate := 1.5 * float64(g.limit) / g.period.Seconds()
	sec := &scenario.Section{Setup: fmt.Sprintf("3 regions (%s) on loopback, each with a redis-server of its own and a NATS cluster of %d servers, the clusters joined by gateways as a supercluster, every link between regions delayed %d–%d ms (uniform, each way); %d engines a region, each with a Redis store and a NATS connection of its own to one server of its region's cluster, a coordinator with the region and the regions, the detector off, rounds every %s. One limit of %d per fixed window of %s (the wall clock's), one policy per mode (independent, exchange, shares) on a key of its own, all three decided at once on the same engines: each request is one decision per mode, at the region's engines in turn, open loop.",
		joinNames(rgRegions), rgEngines, rgDelayLo.Milliseconds(), rgDelayHi.Milliseconds(), rgEngines, seconds(rgInterval), g.limit, seconds(g.period))}
	if s.quick {
		sec.Setup += " Quick mode: windows of 10 s rather than a minute, one window a phase, a cut of 5 s."
	}
	sec.Printf("Four phases of %d window(s) each, from %s: ", g.perPhase, g.t0.UTC().Format("15:04:05"))
	for k, ph := range rgPhases {
		sec.Printf("(%d) %s (%s × the limit per window);", k+1, ph.name, loads(ph.load))
		if k < len(rgPhases)-1 {
			sec.Printf(" ")
		}
	}
	sec.Printf(" in phase 3, %s was cut off from the other regions %.1f s into its first window (while the limit was still being used: at 1.5× in every region it is spent in under a quarter of a window) for %.1f s, then healed (the supercluster rejoined %.1f s after).\n\n",
		rgRegions[rgCut], g.cutFrom.Sub(g.t0.Add(2*g.phaseLen())).Seconds(), g.cutTo.Sub(g.cutFrom).Seconds(), g.rejoin.Seconds())
	if g.rejoinErr != nil {
		sec.Printf("The supercluster did not rejoin: %v.\n\n", g.rejoinErr)
	}

	sec.Printf("Targets: exchange at most 1.10 × the limit in every window but the partition's, with the %d–%d ms delay: %s (worst %.3f). Shares at most 1.00 × in every window, the partition's included: %s (worst %.3f over every window of the run). Independent about 3× (phase 1, within 5%% of 3): %s (%.3f). False denials at 90%%: exchange at most 2%%: %s (%.2f%%); shares %.2f%% (measured).\n\n",
		rgDelayLo.Milliseconds(), rgDelayHi.Milliseconds(), okWord(ex.worstOutside <= 1.10), ex.worstOutside,
		okWord(worstWindow(sh.windows) <= g.limit), float64(worstWindow(sh.windows))/float64(g.limit),
		okWord(in.phase[0] >= 2.85 && in.phase[0] <= 3), in.phase[0],
		okWord(pct(ex.falseDenied, ex.p4Offered) <= 2), pct(ex.falseDenied, ex.p4Offered), pct(sh.falseDenied, sh.p4Offered))

	sec.Printf("| mode | worst window ÷ limit, phases 1–3 | stated bound ÷ limit | worst window ÷ limit, the partition's | worst window ÷ limit, phases 1–3 but the partition's | admitted a window ÷ limit, phase 1 / 2 / 3 / 4 | false denials at 90%% (denied ÷ offered) | windows with false denials |\n|---|---|---|---|---|---|---|---|\n")
	for m, mode := range rgModes {
		r := figs[m]
		sec.Printf("| %s | %.3f | %.3f | %.3f | %.3f | %.3f / %.3f / %.3f / %.3f | %.2f%% (%d of %d) | %d of %d |\n",
			mode, r.worst13, g.bound(mode), r.worstPart, r.worstOutside, r.phase[0], r.phase[1], r.phase[2], r.phase[3],
			pct(r.falseDenied, r.p4Offered), r.falseDenied, r.p4Offered, r.falseWindows, r.p4Windows)
	}
	sec.Printf("\nThe stated bound: independent, the %d regions × the limit; exchange, (limit + (regions − 1) × rate × (interval + slowest delivery)) ÷ limit = (%d + %d × %.1f/s × (%s + %d ms)) ÷ %d, taking for the rate what a region is offered at 1.5× (%.1f/s) and for the delivery the links' highest delay, %d ms; shares, the limit.\n\n",
		len(rgRegions), g.limit, len(rgRegions)-1, rate, seconds(rgInterval), rgDelayHi.Milliseconds(), g.limit, rate, rgDelayHi.Milliseconds())

	sec.Printf("Phase 2, admitted a window ÷ limit by region (demand: %s):\n\n| mode | %s |\n|---|---|---|---|\n", loads(rgPhases[1].load), joinCols(rgRegions))
	for m, mode := range rgModes {
		r := figs[m]
		sec.Printf("| %s | %.3f | %.3f | %.3f |\n", mode, r.phase2[0], r.phase2[1], r.phase2[2])
	}
	sec.Printf("\n")

	n := len(rgRegions)
	sec.Printf("What the run shows. Independent: each region enforces the whole limit on its own store, so at 1.5× everywhere the regions together admitted %.3f × the limit a window (phase 1). Exchange: a region admits at its own pace until the others' rounds reach it, an interval and a delivery later, so a window admits over the limit what the other regions admitted meanwhile: %.3f × at worst outside the cut, against the stated bound of %.3f. Cut off, %s and the other regions each admit up to the limit on their own (at most 2 × between the 2 sides): %.3f × in the cut's window(s). Shares: at most %.3f × in any window of the run, the cut included; in phase 2, %s, offered %.2f × the limit against a base share of 1/%d, admitted %.3f × a window, the others' unused shares granted to it. At 0.9×, a region whose demand is over its base share is denied until a grant arrives: %.2f%% of the requests (shares) against %.2f%% (exchange) were denied in windows that ended under the limit. Exchange charges what another region admitted when its round arrives, to the window current then: units admitted in the last %s and %d ms of a window count in the next one too.\n\n",
		in.phase[0], ex.worstOutside, g.bound(hotkey.RegionsExchange), rgRegions[rgCut], ex.worstPart,
		float64(worstWindow(sh.windows))/float64(g.limit), rgRegions[0], rgPhases[1].load[0], n, sh.phase2[0],
		pct(sh.falseDenied, sh.p4Offered), pct(ex.falseDenied, ex.p4Offered), seconds(rgInterval), rgDelayHi.Milliseconds())

	var decisions, denied int64
	for _, d := range rec.recs {
		decisions++
		if !d.allowed {
			denied++
		}
	}
	sec.Printf("A window is a fixed window of the wall clock, the stores' (the redis-servers run on the same clock). A window's admissions are those of all regions together whose decision ended in it; an admission that began in the window before counts in the one it ended in (%d, %d and %d such across the run, by mode); denials and requests offered count in the window they began in. Only windows wholly inside a phase count toward it. Worst window: the most one window admitted, ÷ the limit. The partition's windows are those that overlap the cut. A false denial is a denial in a window of phase 4 that ended with fewer admitted than the limit, all regions together; the rate is those denials ÷ every decision of the mode offered in phase 4. %d decisions in all (%d denied, %d by a fallback).",
		in.edge, ex.edge, sh.edge, decisions, denied, rec.degraded.Load())
	sec.Printf(" Across regions, the engines sent %d units in rounds (counted once per region sent to) and charged %d units of other regions' rounds (exchange), and gave %d units of their shares to other regions, which counted %d granted (shares; every engine of a region counts the grants it receives); messages or entries dropped: %s; messages not taken by the coordinator: %d.\n\n",
		after.sent-before.sent, after.charged-before.charged, after.gave-before.gave, after.granted-before.granted, dropped(before, after), after.errors-before.errors)

	for m, mode := range rgModes {
		img, err := g.plot(s, rec.recs, m, mode)
		if err != nil {
			return nil, err
		}
		sec.Printf("%s\n", img)
	}
	return sec, nil
}

// plot draws mode m's admissions per bin, a line per region and one for
// all regions, beside the limit's pace.
func (g *rgRun) plot(s *setup, recs []rgDecision, m int, mode hotkey.RegionMode) (string, error) {
	from := g.t0.UnixNano()
	to := g.t0.Add(time.Duration(len(rgPhases)) * g.phaseLen()).UnixNano()
	bins := rgBins(recs, m, len(rgRegions), from, to, g.bin)
	end := float64(to-from) / 1e9
	pace := float64(g.limit) * g.bin.Seconds() / g.period.Seconds()
	lines := []series{{name: fmt.Sprintf("the limit's pace (%.0f per %s)", pace, seconds(g.bin)), dash: true, pts: plotter.XYs{{X: 0, Y: pace}, {X: end, Y: pace}}}}
	all := make(plotter.XYs, len(bins[0]))
	for ri, r := range rgRegions {
		l := series{name: r}
		for i, n := range bins[ri] {
			x := (time.Duration(i)*g.bin + g.bin/2).Seconds()
			l.pts = append(l.pts, plotter.XY{X: x, Y: float64(n)})
			all[i].X, all[i].Y = x, all[i].Y+float64(n)
		}
		lines = append(lines, l)
	}
	lines = append(lines, series{name: "all regions", pts: all})
	title := fmt.Sprintf("regions: %s, admitted per %s (phases of %s; %s cut off in phase 3)", mode, seconds(g.bin), seconds(g.phaseLen()), rgRegions[rgCut])
	return s.savePlot("regions-"+mode.String(), title, "seconds from the first window's start", fmt.Sprintf("admitted per %s", seconds(g.bin)), lines)
}

func pct(n, of int64) float64 { return 100 * float64(n) / float64(max(of, 1)) }

func loads(l []float64) string {
	out := ""
	for i, x := range l {
		if i > 0 {
			out += " / "
		}
		out += fmt.Sprintf("%.2f", x)
	}
	return out + " (" + joinNames(rgRegions) + ")"
}

func joinNames(xs []string) string { return strings.Join(xs, ", ") }

func joinCols(xs []string) string { return strings.Join(xs, " | ") }

// dropped names the reasons the engines dropped rounds' entries or
// messages for during the run, with their counts.
func dropped(before, after rgStats) string {
	var out []string
	for _, k := range slices.Sorted(maps.Keys(after.dropped)) {
		if d := after.dropped[k] - before.dropped[k]; d > 0 {
			out = append(out, fmt.Sprintf("%s %d", k, d))
		}
	}
	if out == nil {
		return "none"
	}
	return strings.Join(out, ", ")
}
