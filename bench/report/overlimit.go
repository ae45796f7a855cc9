package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/redis/go-redis/v9"
	"gonum.org/v1/plot/plotter"

	"github.com/hotkeyd/hotkey"
	"github.com/hotkeyd/hotkey/bench/internal/scenario"
	"github.com/hotkeyd/hotkey/counter"
	"github.com/hotkeyd/hotkey/internal/redistest"
	"github.com/hotkeyd/hotkey/loadgen"
)

// olLimit is the hot key's limit, per 1 s period, in the overlimit
// scenario; olBin is the width of its plot's bins.
const (
	olLimit = 2000
	olBin   = 100 * time.Millisecond
)

var olAlgorithms = []hotkey.Algorithm{hotkey.TokenBucket, hotkey.FixedWindow, hotkey.SlidingWindow, hotkey.SlidingLog}

// olRow is one run of the overlimit scenario: an algorithm, a sync mode
// and a load, as measured.
type olRow struct {
	system           string // hotkey's sync mode, or another limiter
	alg              hotkey.Algorithm
	load             float64 // × the limit
	decisions        int64
	admitted, denied int64
	calls            int64 // store calls: scripts (hotkey) or INCRBYs (envoyproxy/ratelimit)
	deniedCalls      float64
	ideal            int64
	worst            float64 // the worst window's admissions ÷ its limit
	worstN, worstLim int64
	over             int // windows over their limit
	p50, p99         float64
	bins             []int64 // admissions per olBin, from bin binFrom of the wall-clock second the row began in
	binFrom          int
}

// runOverlimit sends one hot key 1.5 and 10 times its limit, open loop,
// split over the reserve scenario's engines on one redis-server, for
// every algorithm under sync: store and sync: reserve, and counts store
// calls, admissions against an exact limiter's, each window's admissions
// against its limit, and latency.
func runOverlimit(ctx context.Context, s *setup) (*scenario.Section, error) {
	srv, err := redistest.Start(s.env.Dir)
	if err != nil {
		return nil, err
	}
	defer srv.Close()
	admin := redis.NewClient(&redis.Options{Addr: srv.Addr})
	defer admin.Close()
	hits := &denyHits{}
	f, err := startFleet(ctx, srv.Addr, hotkey.WithMetrics(hits))
	if err != nil {
		return nil, err
	}
	defer f.Close()

	d := s.scale(5*time.Second, 2*time.Second)
	loads := []float64{1.5, 10}
	only, err := olRowFilter()
	if err != nil {
		return nil, err
	}
	var rows []olRow
	var refused []string // what a sync mode refuses to keep, rather than a row
	for _, alg := range olAlgorithms {
		for _, mode := range []hotkey.Sync{hotkey.SyncStore, hotkey.SyncReserve} {
			for _, load := range loads {
				if !only.MatchString(fmt.Sprintf("%v/%s/%g", alg, mode, load)) {
					continue
				}
				if err := mode.Keeps(alg); err != nil {
					if !slices.Contains(refused, err.Error()) {
						refused = append(refused, err.Error())
					}
					continue
				}
				r, err := f.overLimit(ctx, admin, hits, alg, mode, load, d)
				if err != nil {
					return nil, fmt.Errorf("%v, %s, %.1f×: %w", alg, mode, load, err)
				}
				rows = append(rows, r)
			}
		}
	}

	rlsErr := errors.New("not run: OVERLIMIT_ROWS left it out")
	var rls []olRow
	var took time.Duration
	if only.MatchString("ratelimit") {
		rls, took, rlsErr = overLimitRLS(ctx, s, loads, d)
	}
	if rlsErr == nil {
		at := slices.IndexFunc(rows, func(r olRow) bool { return r.alg == hotkey.SlidingWindow })
		rows = slices.Insert(rows, at, rls...)
	}

	sec := &scenario.Section{Setup: fmt.Sprintf("%d engines in one process (NATS coordinator in process, detector off), each with a go-redis client and Redis store of its own, on one redis-server. One key, limit %d per 1 s (a token bucket's burst is %d too), offered %s its limit open loop (loadgen's pacing, up to 128 in flight) for %v per row, each request to the next engine in turn; lease %v; a fresh key per row.",
		reserveEngines, olLimit, olLimit, "1.5 and 10 times", d, counter.DefaultLease)}
	if rlsErr == nil {
		sec.Setup += fmt.Sprintf(" Beside the fixed window, envoyproxy/ratelimit %s@%s (built for the run in %.0f s; a process of its own on a redis-server of its own, as in the ratelimit scenario, with its over-limit cache on: LOCAL_CACHE_SIZE_IN_BYTES %d), given a fixed window of %d per second, on the same loads, asked over gRPC (loadgen's Envoy target, one connection).",
			rlsModule, rlsVersion, took.Seconds(), rlsCacheBytes, olLimit)
	}
	sec.Printf("Targets for `sync: reserve`, at 1.5× and 10×, every algorithm: at most 0.02 store calls per decision; admitted ÷ ideal between 0.97 and 1.00; no window over its limit; p99 no higher than `sync: store`'s in the same run. For `sync: store` at 10×: at most 0.05 store calls per denied decision.\n\n")
	sec.Printf("| algorithm | sync | load | decisions | admitted | store calls per decision | store calls per denied decision | admitted ÷ ideal | worst window ÷ limit | windows over the limit | p50 (ms) | p99 (ms) |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range rows {
		sec.Printf("| %v | %s | %.1f× | %d | %d | %.4f | %.4f | %.3f (%d of %d) | %.3f (%d of %d) | %d | %.2f | %.2f |\n",
			r.alg, r.system, r.load, r.decisions, r.admitted, float64(r.calls)/float64(max(r.decisions, 1)), r.deniedCalls,
			float64(r.admitted)/float64(max(r.ideal, 1)), r.admitted, r.ideal, r.worst, r.worstN, r.worstLim, r.over, r.p50, r.p99)
	}
	for _, r := range refused {
		sec.Printf("\nNo row: the engines refuse the policy (%s).\n", r)
	}
	sec.Printf("\nStore calls are the scripts the redis-server ran over the row (INFO commandstats before, and after the engines' sweepers have given the last blocks back). Store calls per denied decision: under `sync: store`, the denied decisions the deny cache did not answer (each a Take the store ran; Takes that meet in one round trip share a script) ÷ the denied; under `sync: reserve`, whose denials are decided from the engines' blocks, every store call of the row ÷ the denied (a bound above what the denials cost). The ideal is what one exact limiter of the same algorithm and limit, on one clock, admits of the same requests at the instants their decisions began: a token bucket that starts full; a fixed window that admits the limit in each 1 s window; a sliding window weighing the previous window's count by the part of it still inside (rounded down, as the store does); a sliding log that admits the limit in every 1 s. A window is a 1 s window of the wall clock (the store's window for the fixed and sliding windows), or for a sliding log the 1 s from each admission's start; it counts the admissions whose decision began and ended in it, and its limit is the limit, or for a token bucket the limit plus what the bucket held at the window's start (full at the row's first decision, less the admissions since, plus rate × the time since, at most the burst). Latency is counted from the instant each request was meant to be sent.\n\n")

	if rlsErr == nil {
		sec.Printf("envoyproxy/ratelimit's store calls are its INCRBYs (each pipelined with an EXPIRE); each admission is one, and its store calls per denied decision are the rest ÷ the denied. Its latency includes a gRPC round trip on loopback, which the engines' in-process decisions do not.\n\n")
	} else {
		sec.Printf("envoyproxy/ratelimit could not be run beside the fixed window: %v.\n\n", rlsErr)
	}
	var lines []series
	lines = append(lines, series{name: fmt.Sprintf("limit (%d per %v)", olLimit*int64(olBin)/int64(time.Second), olBin), dash: true})
	var end float64
	for _, r := range rows {
		if r.load != 10 || (r.alg != hotkey.TokenBucket && r.alg != hotkey.FixedWindow) {
			continue
		}
		l := series{name: fmt.Sprintf("%v, %s", r.alg, r.system)}
		for i, n := range r.bins {
			l.pts = append(l.pts, plotter.XY{X: (time.Duration(r.binFrom+i)*olBin + olBin/2).Seconds(), Y: float64(n)})
		}
		lines = append(lines, l)
		end = max(end, (time.Duration(r.binFrom+len(r.bins)) * olBin).Seconds())
	}
	lines[0].pts = plotter.XYs{{X: 0, Y: olLimit * olBin.Seconds()}, {X: end, Y: olLimit * olBin.Seconds()}}
	img, err := s.savePlot("overlimit", fmt.Sprintf("One key at 10× its limit: admitted per %v", olBin), "seconds from the wall-clock second the row began in", fmt.Sprintf("admitted per %v", olBin), lines)
	if err != nil {
		return nil, err
	}
	sec.Printf("%s\n", img)
	return sec, nil
}

// olRowFilter returns the regexp of the environment's OVERLIMIT_ROWS, which
// picks the rows to run by "algorithm/sync/load" (token_bucket/store/10) and
// envoyproxy/ratelimit's by "ratelimit"; every row when it is unset.
func olRowFilter() (*regexp.Regexp, error) {
	re, err := regexp.Compile(os.Getenv("OVERLIMIT_ROWS"))
	if err != nil {
		return nil, fmt.Errorf("OVERLIMIT_ROWS: %w", err)
	}
	return re, nil
}

// overLimit runs one row: a fresh key under alg and mode, offered load ×
// its limit for d.
func (f *fleet) overLimit(ctx context.Context, admin *redis.Client, hits *denyHits, alg hotkey.Algorithm, mode hotkey.Sync, load float64, d time.Duration) (olRow, error) {
	f.run++
	key := fmt.Sprintf("ol%d-%v-%s", f.run, alg, mode)
	p := &hotkey.Policy{Name: "hot", Limit: hotkey.Limit{Algorithm: alg, Rate: olLimit, Period: time.Second}, Sync: mode}
	t := &recordTarget{decide: func(ctx context.Context, i uint64) (bool, error) {
		r, err := f.c.Engines[i%uint64(len(f.c.Engines))].AllowN(ctx, key, p, 1)
		if err == nil && r.Degraded {
			err = errors.New("overlimit: a decision by the fallback")
		}
		return r.Allowed, err
	}}
	calls0, err := redistest.ScriptCalls(ctx, admin)
	if err != nil {
		return olRow{}, err
	}
	hits0, err := hits.sum()
	if err != nil {
		return olRow{}, err
	}
	res, err := t.run(ctx, key, load*olLimit, d)
	if err != nil {
		return olRow{}, err
	}
	time.Sleep(3 * counter.DefaultLease) // the sweepers return the last blocks
	calls1, err := redistest.ScriptCalls(ctx, admin)
	if err != nil {
		return olRow{}, err
	}
	hits1, err := hits.sum()
	if err != nil {
		return olRow{}, err
	}
	row := t.row(res, p.Limit)
	row.system, row.load, row.calls = mode.String(), load, calls1-calls0
	if mode == hotkey.SyncStore {
		row.deniedCalls = (float64(row.denied) - (hits1 - hits0)) / float64(max(row.denied, 1))
	} else {
		row.deniedCalls = float64(row.calls) / float64(max(row.denied, 1))
	}
	return row, nil
}

// olDecision is one decision of a row: when it began and ended, since
// the row's base instant, and whether it admitted.
type olDecision struct {
	start, end time.Duration
	allowed    bool
}

// recordTarget decides the i-th request with decide, and records each
// decision for the row's figures.
type recordTarget struct {
	decide func(ctx context.Context, i uint64) (bool, error)
	base   time.Time // set before the run
	next   atomic.Uint64
	mu     sync.Mutex // guards recs
	recs   []olDecision
}

func (t *recordTarget) Decide(ctx context.Context, _ string, _ int64) (loadgen.Outcome, error) {
	start := time.Since(t.base)
	allowed, err := t.decide(ctx, t.next.Add(1))
	if err != nil {
		return loadgen.Outcome{}, err
	}
	end := time.Since(t.base)
	t.mu.Lock()
	t.recs = append(t.recs, olDecision{start: start, end: end, allowed: allowed})
	t.mu.Unlock()
	return loadgen.Outcome{Allowed: allowed}, nil
}

// run sends key to t at rate for d, open loop.
func (t *recordTarget) run(ctx context.Context, key string, rate float64, d time.Duration) (*loadgen.Result, error) {
	t.base = time.Now()
	res, err := loadgen.Run(ctx, loadgen.Config{Target: t, Workload: loadgen.Fixed(key), Rate: rate, Duration: d, Concurrency: 128}, nil, 0)
	if err != nil {
		return nil, err
	}
	if res.Errors > 0 {
		return nil, fmt.Errorf("%d errors, first %v", res.Errors, res.FirstError)
	}
	return res, nil
}

// row computes a row's figures from what t recorded under lim.
func (t *recordTarget) row(res *loadgen.Result, lim hotkey.Limit) olRow {
	ms := func(q float64) float64 { return float64(res.Latency.Quantile(q)) / float64(time.Millisecond) }
	r := olRow{alg: lim.Algorithm, p50: ms(0.5), p99: ms(0.99)}
	recs := t.recs
	slices.SortFunc(recs, func(a, b olDecision) int { return cmp.Compare(a.start, b.start) })
	r.decisions = int64(len(recs))
	if len(recs) == 0 {
		return r
	}
	baseNano := t.base.UnixNano()
	window := func(at time.Duration) int64 { return (baseNano + int64(at)) / int64(lim.Period) }
	perWindow := map[int64]int64{}
	origin := window(recs[0].start) * int64(lim.Period)
	bin := func(at time.Duration) int { return int((baseNano + int64(at) - origin) / int64(olBin)) }
	r.binFrom = bin(recs[0].start)
	r.bins = make([]int64, bin(recs[len(recs)-1].start)-r.binFrom+1)
	var admittedBy []time.Duration // the admissions' starts, in order
	for _, d := range recs {
		if !d.allowed {
			r.denied++
			continue
		}
		r.admitted++
		admittedBy = append(admittedBy, d.start)
		if w := window(d.start); w == window(d.end) {
			perWindow[w]++
		}
		r.bins[bin(d.start)-r.binFrom]++
	}
	for w, n := range perWindow {
		l := lim.Rate
		if lim.Algorithm == hotkey.TokenBucket {
			// What the bucket held at the window's start, full at the
			// row's first decision and drained by the admissions since.
			at := max(time.Duration(w*int64(lim.Period)-baseNano), recs[0].start)
			before, _ := slices.BinarySearch(admittedBy, at)
			refill := int64(float64(lim.Rate) * float64(at-recs[0].start) / float64(lim.Period))
			l += max(0, min(lim.Capacity(), lim.Capacity()+refill-int64(before)))
		}
		if n > l {
			r.over++
		}
		if q := float64(n) / float64(l); q > r.worst {
			r.worst, r.worstN, r.worstLim = q, n, l
		}
	}
	if lim.Algorithm == hotkey.SlidingLog {
		r.worst, r.worstN, r.worstLim, r.over = 0, 0, lim.Rate, 0
		slidingWorst(&r, recs, lim)
	}
	r.ideal = exactAdmits(recs, lim, baseNano)
	return r
}

// slidingWorst sets r's worst window and windows over the limit for a
// sliding log, whose window is any period: the period from each
// admission's start, counting the admissions that began and ended in it.
func slidingWorst(r *olRow, recs []olDecision, lim hotkey.Limit) {
	for i, a := range recs {
		if !a.allowed {
			continue
		}
		var n int64
		for _, d := range recs[i:] {
			if d.start >= a.start+lim.Period {
				break
			}
			if d.allowed && d.end < a.start+lim.Period {
				n++
			}
		}
		if n > lim.Rate {
			r.over++
		}
		if q := float64(n) / float64(lim.Rate); q > r.worst {
			r.worst, r.worstN = q, n
		}
	}
}

// exactAdmits returns how many of recs (sorted by start) one exact limiter
// of lim, on one clock, admits at their starts; baseNano is the Unix
// instant, in nanoseconds, their starts count from.
func exactAdmits(recs []olDecision, lim hotkey.Limit, baseNano int64) int64 {
	period := float64(lim.Period)
	rate := float64(lim.Rate)
	var n int64
	switch lim.Algorithm {
	case hotkey.TokenBucket: // GCRA, starting full
		interval := period / rate
		tolerance := interval * float64(lim.Capacity())
		var tat float64
		for _, d := range recs {
			at := float64(d.start)
			if next := max(tat, at) + interval; next-at <= tolerance*(1+1e-9) {
				tat = next
				n++
			}
		}
	case hotkey.SlidingLog:
		var log []time.Duration
		for _, d := range recs {
			for len(log) > 0 && log[0] <= d.start-lim.Period {
				log = log[1:]
			}
			if int64(len(log)) < lim.Rate {
				log = append(log, d.start)
				n++
			}
		}
	default: // the window algorithms, on the wall clock's windows
		var w, cur, prev int64
		for i, d := range recs {
			at := baseNano + int64(d.start)
			switch aw := at / int64(lim.Period); {
			case i == 0:
				w = aw
			case aw == w+1:
				w, prev, cur = aw, cur, 0
			case aw > w+1:
				w, prev, cur = aw, 0, 0
			}
			est := cur
			if lim.Algorithm == hotkey.SlidingWindow {
				est += prev * (int64(lim.Period) - (at - w*int64(lim.Period))) / int64(lim.Period)
			}
			if est+1 <= lim.Rate {
				cur++
				n++
			}
		}
	}
	return n
}

// denyHits is a prometheus.Registerer that keeps the deny-cache hit
// counter of every engine given it (each registers its own: a
// prometheus.Registry would refuse the second) and drops the rest.
type denyHits struct {
	mu sync.Mutex // guards cs
	cs []prometheus.Metric
}

func (h *denyHits) Register(c prometheus.Collector) error {
	if m, ok := c.(prometheus.Metric); ok && strings.Contains(m.Desc().String(), `"hotkey_deny_cache_hits_total"`) {
		h.mu.Lock()
		h.cs = append(h.cs, m)
		h.mu.Unlock()
	}
	return nil
}

func (h *denyHits) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		h.Register(c)
	}
}

func (h *denyHits) Unregister(prometheus.Collector) bool { return false }

// sum returns the engines' deny-cache hits so far.
func (h *denyHits) sum() (float64, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.cs) == 0 {
		return 0, errors.New("overlimit: no engine registered its deny-cache hits")
	}
	var total float64
	for _, m := range h.cs {
		var pb dto.Metric
		if err := m.Write(&pb); err != nil {
			return 0, err
		}
		total += pb.GetCounter().GetValue()
	}
	return total, nil
}
