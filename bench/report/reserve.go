package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hotkeyd/hotkey"
	"github.com/hotkeyd/hotkey/bench/internal/scenario"
	"github.com/hotkeyd/hotkey/counter"
	"github.com/hotkeyd/hotkey/internal/redistest"
	"github.com/hotkeyd/hotkey/loadgen"
	"github.com/hotkeyd/hotkey/loadgen/embedded"
)

// The reserve scenario's workload: coldKeys keys at coldRate each and one
// key at hotRate, all at 90% of fixed 1 s windows.
const (
	reserveEngines = 3
	coldKeys       = 1000
	coldRate       = 10     // per key per second
	hotRate        = 20_000 // per second, over the engines
	coldLimit      = 11     // per 1 s window: coldRate is 91% of it
	hotLimit       = 22_222 // per 1 s window: hotRate is 90% of it
)

// runReserve measures sync: reserve against sync: store on 3 engines, each
// with a Redis client of its own, on a redis-server of the scenario's own
// (so that INFO commandstats counts only its scripts): store calls per
// decision, admissions in every 1 s window of every key, and false
// denials, on an open-loop workload at 90% of each key's limit; then
// decisions/s of one hot key never denied, closed loop, the two modes
// alternated.
func runReserve(ctx context.Context, s *setup) (*scenario.Section, error) {
	srv, err := redistest.Start(s.env.Dir)
	if err != nil {
		return nil, err
	}
	defer srv.Close()
	admin := redis.NewClient(&redis.Options{Addr: srv.Addr})
	defer admin.Close()
	f, err := startFleet(ctx, srv.Addr)
	if err != nil {
		return nil, err
	}
	defer f.Close()

	d := s.scale(10*time.Second, 2*time.Second)
	sec := &scenario.Section{Setup: fmt.Sprintf("%d engines in one process (NATS coordinator in process, detector off), each with a go-redis client and Redis store of its own, on one redis-server; each request goes to an engine picked at random. Open loop for %v per mode: %d keys at %d/s each (in turn, so each key is offered %d in every 1 s window) and one key at %d/s, %d/s in all; fixed 1 s windows, limits %d per window for the %d keys and %d for the hot key (the offered load is 91%% and 90%% of them); lease %v.",
		reserveEngines, d, coldKeys, coldRate, coldRate, hotRate, coldKeys*coldRate+hotRate, coldLimit, coldKeys, hotLimit, counter.DefaultLease)}
	sec.Printf("| sync | decisions/s | store calls per decision | the hot key alone | the other keys alone | engine-key-windows per decision | worst key-window: admitted ÷ limit | key-windows over the limit | false denials ÷ offered | denied ÷ offered | key-windows offered over the limit |\n|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, mode := range []hotkey.Sync{hotkey.SyncReserve, hotkey.SyncStore} {
		all, err := f.openLoop(ctx, admin, mode, d, 0)
		if err != nil {
			return nil, err
		}
		hot, err := f.openLoop(ctx, admin, mode, s.scale(3*time.Second, time.Second), 1)
		if err != nil {
			return nil, err
		}
		cold, err := f.openLoop(ctx, admin, mode, s.scale(3*time.Second, time.Second), 2)
		if err != nil {
			return nil, err
		}
		sec.Printf("| %s | %.0f | %.4f | %.4f | %.4f | %.4f | %s | %d of %d | %.4f%% (%d of %d) | %.4f%% (%d) | %d |\n",
			mode, all.rate, all.perDecision, hot.perDecision, cold.perDecision, all.floor, all.worst(), all.over, all.windows,
			100*float64(all.falseDenied)/float64(all.offered), all.falseDenied, all.offered,
			100*float64(all.denied)/float64(all.offered), all.denied, all.busy)
	}
	sec.Printf("\nStore calls are the scripts the redis-server ran (INFO commandstats before and after, the blocks' returns included); the hot key's and the other keys' are from runs of their part of the workload alone. Engine-key-windows are the (engine, key, 1 s window) triples with at least one decision: a block ends with the window that counted it, so each such triple costs at least one lease or take, and their number per decision is the fewest of those that any instance leasing from fixed 1 s windows can make on this workload (takes that meet in one round trip share a script; a lease is a script of its own). A key-window counts the admissions whose decision began and ended in that window (the window the store or block decided them in); the worst is shown with, after a +, the admissions that crossed into or out of it. The load is paced at 90%% of every key's limit, but a pacer that falls behind sends what it owes at once, and a window can then be offered more than its limit: a false denial is one in a key-window that ended with fewer admissions than its limit (counting those that crossed its edges), and the last column counts the key-windows in which more decisions began than the limit. The targets: at most 0.1 store calls per decision, no window over its limit, at most 2%% denied.\n\n")

	if err := f.throughput(ctx, admin, s, sec); err != nil {
		return nil, err
	}
	return sec, nil
}

// fleet is the scenario's engines and their stores.
type fleet struct {
	c       *embedded.Cluster
	clients []*redis.Client
	stores  []*counter.RedisStore
	run     int // runs so far: each run's keys are new
}

// startFleet starts the engines on the redis-server at addr, with opts
// after WithoutDetector, and waits until each counts the others live (so
// a block is at most a third of a limit).
func startFleet(ctx context.Context, addr string, opts ...hotkey.Option) (f *fleet, err error) {
	f = &fleet{}
	defer func() {
		if err != nil {
			f.Close()
		}
	}()
	f.c, err = embedded.Start(embedded.Config{
		Instances: reserveEngines,
		Store: func(int) (counter.Store, error) {
			client := redis.NewClient(&redis.Options{Addr: addr, PoolSize: 64})
			f.clients = append(f.clients, client)
			st, err := counter.NewRedisStore(ctx, client, counter.RedisConfig{Prefix: "reserve:"})
			if err != nil {
				return nil, err
			}
			f.stores = append(f.stores, st)
			return st, nil
		},
		Options: append([]hotkey.Option{hotkey.WithoutDetector()}, opts...),
	})
	if err != nil {
		return f, err
	}
	deadline := time.Now().Add(30 * time.Second)
	for _, e := range f.c.Engines {
		for e.Stats().Instances < reserveEngines {
			if time.Now().After(deadline) {
				return f, fmt.Errorf("an engine counts %d live instances after 30 s, want %d", e.Stats().Instances, reserveEngines)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return f, nil
}

// Close stops the engines (returning their blocks), then their stores and
// clients.
func (f *fleet) Close() {
	if f.c != nil {
		f.c.Close()
	}
	for _, st := range f.stores {
		st.Close()
	}
	for _, c := range f.clients {
		c.Close()
	}
}

// openResult is what one open-loop run measured.
type openResult struct {
	rate                    float64 // decisions answered per second
	perDecision             float64 // store calls per decision
	floor                   float64 // (engine, key, window) triples with a decision, per decision: the fewest leases or takes windows allow
	offered, denied         int64
	falseDenied             int64 // denials in a key-window that ended with room
	windows, over           int   // key-windows checked, and those with more certain admissions than the limit
	busy                    int   // key-windows where more decisions began than the limit (the pacer ran late, then caught up)
	worstCertain, worstEdge int64 // the key-window with most admissions over its limit: its certain ones and those crossing its edges
	worstLimit              int64
}

// worst formats the worst key-window.
func (r openResult) worst() string {
	if r.worstLimit == 0 {
		return "–"
	}
	return fmt.Sprintf("%.3f (%d+%d of %d)", float64(r.worstCertain)/float64(r.worstLimit), r.worstCertain, r.worstEdge, r.worstLimit)
}

// openLoop runs the workload (part 0: all of it, 1: the hot key alone, 2:
// the other keys alone) under mode for d, on keys of its own.
func (f *fleet) openLoop(ctx context.Context, admin *redis.Client, mode hotkey.Sync, d time.Duration, part int) (openResult, error) {
	f.run++
	prefix := fmt.Sprintf("r%d-%s:", f.run, mode)
	cold := &hotkey.Policy{Name: "cold", Limit: hotkey.Limit{Algorithm: hotkey.FixedWindow, Rate: coldLimit, Period: time.Second}, Sync: mode}
	hot := &hotkey.Policy{Name: "hot", Limit: hotkey.Limit{Algorithm: hotkey.FixedWindow, Rate: hotLimit, Period: time.Second}, Sync: mode}
	wins := int(d/time.Second) + 10 // room for a pacer running late
	t := &windowTarget{engines: f.c.Engines, base: time.Now().Unix(), wins: wins, index: map[string]int{}}
	var w loadgen.Workload
	var rate float64
	switch part {
	case 0:
		w, rate = loadgen.Hotspot(prefix+"hot", hotRate, &inTurn{prefix: prefix + "k"}), coldKeys*coldRate+hotRate
	case 1:
		w, rate = loadgen.Fixed(prefix+"hot"), hotRate
	default:
		w, rate = &inTurn{prefix: prefix + "k"}, coldKeys*coldRate
	}
	if part != 2 {
		t.add(prefix+"hot", hot)
	}
	if part != 1 {
		for i := range coldKeys {
			t.add(prefix+"k"+strconv.Itoa(i), cold)
		}
	}
	t.counts = make([]keyWindow, len(t.keys)*wins)
	t.seen = make([]atomic.Bool, len(t.engines)*len(t.keys)*wins)
	calls0, err := redistest.ScriptCalls(ctx, admin)
	if err != nil {
		return openResult{}, err
	}
	res, err := loadgen.Run(ctx, loadgen.Config{Target: t, Workload: w, Rate: rate, Duration: d, Concurrency: 128}, nil, 0)
	if err != nil {
		return openResult{}, err
	}
	if res.Errors > 0 {
		return openResult{}, fmt.Errorf("%d errors, first %v", res.Errors, res.FirstError)
	}
	time.Sleep(3 * counter.DefaultLease) // the sweepers return the last blocks
	calls1, err := redistest.ScriptCalls(ctx, admin)
	if err != nil {
		return openResult{}, err
	}
	out := openResult{rate: res.Rate(), offered: res.Allowed + res.Denied, denied: res.Denied}
	out.perDecision = float64(calls1-calls0) / float64(out.offered)
	var seen int
	for i := range t.seen {
		if t.seen[i].Load() {
			seen++
		}
	}
	out.floor = float64(seen) / float64(out.offered)
	for k, p := range t.keys {
		lim := p.Limit.Rate
		for i := range wins {
			c := &t.counts[k*wins+i]
			certain, edge := c.certain.Load(), c.into.Load()
			if i+1 < wins {
				edge += t.counts[k*wins+i+1].into.Load()
			}
			if c.started.Load() > lim {
				out.busy++
			}
			if certain+edge < lim {
				out.falseDenied += c.denied.Load()
			}
			if certain+edge == 0 {
				continue
			}
			out.windows++
			if certain > lim {
				out.over++
			}
			if out.worstLimit == 0 || float64(certain)/float64(lim) > float64(out.worstCertain)/float64(out.worstLimit) {
				out.worstCertain, out.worstEdge, out.worstLimit = certain, edge, lim
			}
		}
	}
	return out, nil
}

// inTurn sends to prefix0 … prefix(coldKeys-1) in turn, so that each is
// offered the same in every window.
type inTurn struct {
	prefix string
	next   int
	names  []string
}

func (w *inTurn) Key(int64, time.Duration) string {
	if w.names == nil {
		for i := range coldKeys {
			w.names = append(w.names, w.prefix+strconv.Itoa(i))
		}
	}
	k := w.names[w.next]
	w.next = (w.next + 1) % len(w.names)
	return k
}

// keyWindow counts one key's decisions in one 1 s window: those that
// began in it, the admissions and denials that began and ended in it, and
// the admissions that began in the window before and ended in it.
type keyWindow struct{ started, certain, denied, into atomic.Int64 }

// windowTarget decides each request on an engine picked at random, under
// its key's policy, and counts admissions per key and 1 s window.
type windowTarget struct {
	engines []*hotkey.Engine
	base    int64 // the Unix second of window 0
	wins    int
	index   map[string]int // key → its row in counts; read-only during a run
	keys    []*hotkey.Policy
	counts  []keyWindow
	// seen marks each (engine, key, window) that decided at least once:
	// each must have called the store at least once in its window, since
	// no block outlives the window that counted it.
	seen []atomic.Bool
}

func (t *windowTarget) add(key string, p *hotkey.Policy) {
	t.index[key] = len(t.keys)
	t.keys = append(t.keys, p)
}

func (t *windowTarget) Decide(ctx context.Context, key string, cost int64) (loadgen.Outcome, error) {
	k, ok := t.index[key]
	if !ok {
		return loadgen.Outcome{}, errors.New("reserve: unknown key " + key)
	}
	t0 := time.Now().Unix()
	w := int(t0 - t.base)
	if w < 0 || w+1 >= t.wins {
		return loadgen.Outcome{}, fmt.Errorf("reserve: a decision in window %d, past the run's %d", w, t.wins)
	}
	e := rand.IntN(len(t.engines))
	if s := &t.seen[(e*len(t.keys)+k)*t.wins+w]; !s.Load() {
		s.Store(true)
	}
	c := &t.counts[k*t.wins+w]
	c.started.Add(1)
	r, err := t.engines[e].AllowN(ctx, key, t.keys[k], cost)
	if err == nil && r.Degraded {
		err = errors.New("reserve: a decision by the fallback")
	}
	if err != nil {
		return loadgen.Outcome{}, err
	}
	switch t1 := time.Now().Unix(); {
	case t1 == t0 && r.Allowed:
		c.certain.Add(1)
	case t1 == t0:
		c.denied.Add(1)
	case t1 == t0+1 && r.Allowed:
		t.counts[k*t.wins+w+1].into.Add(1)
	case t1 > t0+1:
		return loadgen.Outcome{}, fmt.Errorf("reserve: a decision of %d s", t1-t0)
	}
	return loadgen.Outcome{Allowed: r.Allowed}, nil
}

// throughput measures decisions/s of one hot key, never denied, from 16
// goroutines per engine, under sync: store and sync: reserve alternated,
// with the redis-server's CPU and scripts over each run.
func (f *fleet) throughput(ctx context.Context, admin *redis.Client, s *setup, sec *scenario.Section) error {
	const perEngine = 16
	d := s.scale(3*time.Second, time.Second)
	k := s.rounds(3, 1)
	type total struct{ wall, cpu, calls, decisions float64 }
	totals := make([]total, 2)
	modes := []hotkey.Sync{hotkey.SyncStore, hotkey.SyncReserve}
	var fns []func() (float64, error)
	for i, mode := range modes {
		fns = append(fns, func() (float64, error) {
			f.run++
			key := fmt.Sprintf("tp%d", f.run)
			p := &hotkey.Policy{Name: "tp", Limit: hotkey.Limit{Rate: 1_000_000_000, Period: time.Second}, Sync: mode}
			cpu0, err := serverCPU(ctx, admin)
			if err != nil {
				return 0, err
			}
			calls0, err := redistest.ScriptCalls(ctx, admin)
			if err != nil {
				return 0, err
			}
			start := time.Now()
			rate, err := scenario.Throughput(perEngine*len(f.c.Engines), d, func(r *rand.Rand) error {
				res, err := f.c.Engines[r.IntN(len(f.c.Engines))].Allow(ctx, key, p)
				if err == nil && !res.Allowed {
					err = errors.New("reserve: a throughput decision denied")
				}
				return err
			})
			if err != nil {
				return 0, err
			}
			wall := time.Since(start).Seconds()
			cpu1, err := serverCPU(ctx, admin)
			if err != nil {
				return 0, err
			}
			calls1, err := redistest.ScriptCalls(ctx, admin)
			if err != nil {
				return 0, err
			}
			t := &totals[i]
			t.wall += wall
			t.cpu += cpu1 - cpu0
			t.calls += float64(calls1 - calls0)
			t.decisions += rate * wall
			return rate, nil
		})
	}
	got, err := scenario.Rounds(k, fns)
	if err != nil {
		return err
	}
	sec.Printf("Throughput where every decision of `sync: store` is a script on the redis-server: one hot key with a limit of 10^9/s (never denied), %d goroutines per engine deciding it closed loop, %v per mode, %d round(s) alternating the modes, medians.\n\n", perEngine, d, k)
	sec.Printf("| sync | decisions/s per redis-server | ÷ sync: store | store calls/s | store calls per decision | redis-server CPU busy | decisions per redis-server CPU second | ÷ sync: store |\n|---|---|---|---|---|---|---|---|\n")
	for i, mode := range modes {
		t := totals[i]
		sec.Printf("| %s | %.0f | %.1f | %.0f | %.4f | %.0f%% | %.3g | %.0f |\n", mode, got[i], got[i]/got[0], t.calls/t.wall, t.calls/t.decisions, 100*t.cpu/t.wall,
			t.decisions/t.cpu, (t.decisions/t.cpu)/(totals[0].decisions/totals[0].cpu))
	}
	sec.Printf("\nRedis CPU busy is the server's CPU seconds (INFO cpu, user and system) over the run's seconds: its one thread at 100%% is the store's limit. The engines share the machine's cores with it, so under `sync: store` the server is not quite saturated; decisions per redis-server CPU second is what one server would decide when it is.\n")
	return nil
}

// serverCPU returns the CPU seconds, user and system, the server c talks
// to has used.
func serverCPU(ctx context.Context, c *redis.Client) (float64, error) {
	info, err := c.Info(ctx, "cpu").Result()
	if err != nil {
		return 0, err
	}
	var sum float64
	for line := range strings.Lines(info) {
		name, v, _ := strings.Cut(strings.TrimSpace(line), ":")
		if name == "used_cpu_sys" || name == "used_cpu_user" {
			x, err := strconv.ParseFloat(v, 64)
			if err != nil {
				return 0, fmt.Errorf("INFO cpu %q: %w", line, err)
			}
			sum += x
		}
	}
	return sum, nil
}
