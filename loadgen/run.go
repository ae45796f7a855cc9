// Package loadgen drives a rate limiter with realistic load and measures
// what it did: an open-loop pacer sends requests at a target rate, whatever
// the target's speed, to keys a Workload picks (uniform, Zipf, a hot spot,
// a ramp, a flood), and a recorder counts the decisions and their latency.
//
// Latency is counted from the instant each request was meant to be sent,
// not from when a sender got to it. A target that stalls for 100 ms at
// 1,000 requests per second delays the 100 requests meant for those 100 ms,
// and each of them is recorded with its wait: a closed loop, which waits
// for each answer before it asks again, would record one slow request and
// hide the rest (coordinated omission).
//
// With a Limit stated for the watched key, a run also counts what a perfect
// limiter would have admitted of that key's requests (Result.Ideal), so a
// limiter's admitted ÷ ideal can be read from one run.
//
// Targets: a hotkeyd over HTTP (HTTP) and over NATS (NATS); any Envoy
// rate-limit service over gRPC (Envoy); any HTTP endpoint, 2xx admitted
// and 429 denied (Endpoint); embedded engines, several in one process over
// an in-process NATS server, are package loadgen/embedded.
package loadgen

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"
)

// Target decides requests. Decide is called from many goroutines at once.
type Target interface {
	Decide(ctx context.Context, key string, cost int64) (Outcome, error)
}

// Outcome is one decision as a target reports it.
type Outcome struct {
	Allowed bool
	// Shards is the number of subcounters that decided (1 if the key is not
	// split), where the target says; 0 where it does not.
	Shards int
	// Quota is what the target said of its limit with the decision.
	Quota Quota
}

// Config is one run.
type Config struct {
	Target   Target
	Workload Workload
	// Rate is the requests per second sent, whatever the target answers.
	// 0 runs a closed loop instead: each sender sends its next request as
	// soon as its last is answered, so the run measures how many the
	// target answers a second with Concurrency in flight, and a latency
	// counts from the send.
	Rate float64
	// Duration is how long requests are sent for; the run then waits for
	// the answers in flight.
	Duration time.Duration
	// Concurrency bounds the requests in flight (default 64). When all are
	// in flight, later requests wait for a sender, and their wait counts
	// in their latency.
	Concurrency int
	// Cost is each request's cost (default 1).
	Cost int64
	// Watch is a key whose decisions are also counted per Period (for
	// following a hot key through its splits): Result.Watched.
	Watch string
	// Period is the width of Result.Watched's buckets (default 1 s).
	Period time.Duration
	// Timeout bounds each decision (default 5 s); a decision past it is an
	// error.
	Timeout time.Duration
	// Limit, if set, is the limit Watch is measured against: Result.Ideal.
	Limit Limit
}

// Result is what a run measured.
type Result struct {
	Sent, Allowed, Denied, Errors int64
	// Latency is each answered request's latency from the instant it was
	// meant to be sent: errors are not in it.
	Latency Histogram
	// Start is when the first request was meant to be sent, and Elapsed
	// how long from then until the last answer.
	Start   time.Time
	Elapsed time.Duration
	// Watched holds Config.Watch's decisions per Config.Period, by the
	// instant each was meant to be sent, up to the last period with one.
	Watched []Bucket
	// FirstError is the first error a decision returned.
	FirstError error
	// Quotas counts the answers that said something of their limit
	// (Quota.Reported), and Quota is the one of them meant to be sent last.
	Quotas int64
	Quota  Quota
	// Ideal is, with Config.Limit, how many of Watch's requests a perfect
	// token bucket of that limit, fed them at the instants they were meant
	// for, would have admitted; 0 without.
	Ideal int64
}

// WatchedAllowed returns the watched key's admitted requests.
func (r *Result) WatchedAllowed() int64 {
	var n int64
	for _, b := range r.Watched {
		n += b.Allowed
	}
	return n
}

// OfIdeal returns the watched key's admitted requests ÷ Ideal: above 1, the
// target admitted more than its stated limit; 0 if Ideal is.
func (r *Result) OfIdeal() float64 {
	if r.Ideal == 0 {
		return 0
	}
	return float64(r.WatchedAllowed()) / float64(r.Ideal)
}

// Bucket is one period of the watched key.
type Bucket struct {
	Allowed int64 `json:"allowed"`
	Denied  int64 `json:"denied"`
	Errors  int64 `json:"errors"`
	// Shards is the most subcounters any decision in the period reported.
	Shards int `json:"shards"`
}

// Rate returns the decisions answered (allowed or denied) per second of the
// run.
func (r *Result) Rate() float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return float64(r.Allowed+r.Denied) / r.Elapsed.Seconds()
}

// Snapshot is a run's progress so far: what Progress reports.
type Snapshot struct {
	Elapsed                       time.Duration
	Sent, Allowed, Denied, Errors int64
	// P99 is over the decisions answered since the previous snapshot.
	P99 time.Duration
	// Shards is the watched key's subcounters in its latest decision.
	Shards int
}

// Run sends cfg's requests and returns what it measured. It returns early,
// with what it measured so far and ctx's error, if ctx ends; the requests
// that ctx's end cut short are left out, as if never sent. If progress is
// not nil, it is called every interval (and once at the end) with a
// snapshot, on a goroutine of its own.
func Run(ctx context.Context, cfg Config, progress func(Snapshot), interval time.Duration) (*Result, error) {
	if cfg.Target == nil || cfg.Workload == nil {
		return nil, errors.New("loadgen: a run needs a target and a workload")
	}
	if !(cfg.Rate >= 0) || math.IsInf(cfg.Rate, 1) || cfg.Duration <= 0 {
		return nil, fmt.Errorf("loadgen: rate %v must be finite and at least 0 (0: a closed loop), and duration %v positive", cfg.Rate, cfg.Duration)
	}
	cfg.Concurrency = max(cfg.Concurrency, 0)
	if cfg.Concurrency == 0 {
		cfg.Concurrency = 64
	}
	cfg.Cost = max(cfg.Cost, 1)
	if cfg.Period <= 0 {
		cfg.Period = time.Second
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 5 * time.Second
	}
	if cfg.Limit != (Limit{}) && (cfg.Limit.Units < 1 || cfg.Limit.Period <= 0) {
		return nil, fmt.Errorf("loadgen: limit of %d per %v: want at least 1 unit per a positive period", cfg.Limit.Units, cfg.Limit.Period)
	}
	r := newRun(cfg)
	jobs := make(chan job, cfg.Concurrency)
	if cfg.Rate == 0 {
		jobs = make(chan job) // handed to a free sender, never queued
	}
	var wg sync.WaitGroup
	for range cfg.Concurrency {
		wg.Go(func() { r.send(ctx, jobs) })
	}
	stopProgress := r.report(progress, interval)
	err := r.pace(ctx, jobs)
	close(jobs)
	wg.Wait()
	res := r.result()
	stopProgress(res)
	return res, err
}

// job is one request: its key and the instant it is meant for, zero in a
// closed loop, where it is meant for the instant a sender takes it.
type job struct {
	key      string
	intended time.Time
}

type run struct {
	cfg   Config
	start time.Time

	sent, allowed, denied, errs atomic.Int64
	shards                      atomic.Int64 // the watched key's, latest
	firstErr                    atomic.Pointer[error]

	ideal *ideal // the watched key's perfect limiter; nil without a Limit; the pacer's alone

	mu      sync.Mutex // guards the fields below
	hist    Histogram  // since the start
	recent  Histogram  // since the last snapshot
	watched []Bucket
	quotas  int64
	quota   Quota     // the reported quota meant last
	quotaAt time.Time // and when it was meant
}

func newRun(cfg Config) *run {
	r := &run{cfg: cfg, start: time.Now()}
	if cfg.Limit.Units > 0 {
		r.ideal = newIdeal(cfg.Limit)
	}
	return r
}

// pace hands out request i at start + i/rate, until Duration. A request
// whose instant has passed (the senders were all busy, or this goroutine
// slept late) goes at once: the pace never slows to the target's.
func (r *run) pace(ctx context.Context, jobs chan<- job) error {
	if r.cfg.Rate == 0 {
		return r.loop(ctx, jobs)
	}
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for i := int64(0); ; i++ {
		at := time.Duration(float64(i) / r.cfg.Rate * float64(time.Second))
		if at >= r.cfg.Duration {
			return nil
		}
		if d := time.Until(r.start.Add(at)); d > 0 {
			timer.Reset(d)
			select {
			case <-timer.C:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		if err := r.hand(ctx, jobs, job{key: r.cfg.Workload.Key(i, at), intended: r.start.Add(at)}, at); err != nil {
			return err
		}
	}
}

// hand gives j, meant for at into the run, to a sender, and feeds the
// ideal limiter if j is of the watched key.
func (r *run) hand(ctx context.Context, jobs chan<- job, j job, at time.Duration) error {
	select {
	case jobs <- j:
		r.sent.Add(1)
	case <-ctx.Done():
		return ctx.Err()
	}
	if r.ideal != nil && j.key == r.cfg.Watch {
		r.ideal.take(at, r.cfg.Cost)
	}
	return nil
}

// loop hands out requests as fast as the senders take them (a closed loop)
// until Duration has passed.
func (r *run) loop(ctx context.Context, jobs chan<- job) error {
	for i := int64(0); ; i++ {
		at := time.Since(r.start)
		if at >= r.cfg.Duration {
			return nil
		}
		if err := r.hand(ctx, jobs, job{key: r.cfg.Workload.Key(i, at)}, at); err != nil {
			return err
		}
	}
}

// send decides the jobs it is handed and records each.
func (r *run) send(ctx context.Context, jobs <-chan job) {
	// Latencies are merged under mu in batches (256, or 50 ms' worth), to
	// keep senders apart.
	var local Histogram
	var quotas int64
	var quota Quota
	var quotaAt time.Time
	flushed := time.Now()
	flush := func() {
		r.mu.Lock()
		r.hist.Merge(&local)
		r.recent.Merge(&local)
		r.quotas += quotas
		if quotas > 0 && !quotaAt.Before(r.quotaAt) {
			r.quota, r.quotaAt = quota, quotaAt
		}
		r.mu.Unlock()
		local, flushed, quotas = Histogram{}, time.Now(), 0
	}
	defer flush()
	for j := range jobs {
		if ctx.Err() != nil { // the run was stopped: this one is not sent
			r.sent.Add(-1)
			continue
		}
		if j.intended.IsZero() { // a closed loop's: meant for now
			j.intended = time.Now()
		}
		dctx, cancel := context.WithTimeout(ctx, r.cfg.Timeout)
		out, err := r.cfg.Target.Decide(dctx, j.key, r.cfg.Cost)
		cancel()
		done := time.Now()
		switch {
		case err != nil && ctx.Err() != nil:
			// Cut by the run's stop, not the target's failure: as if
			// never sent.
			r.sent.Add(-1)
			continue
		case err != nil:
			r.errs.Add(1)
			r.firstErr.CompareAndSwap(nil, &err)
		case out.Allowed:
			r.allowed.Add(1)
		default:
			r.denied.Add(1)
		}
		if err == nil && out.Quota.Reported {
			quotas++
			if !j.intended.Before(quotaAt) {
				quota, quotaAt = out.Quota, j.intended
			}
		}
		if err == nil {
			local.Record(done.Sub(j.intended))
			if local.Count() >= 256 || done.Sub(flushed) >= 50*time.Millisecond {
				flush()
			}
		}
		if j.key == r.cfg.Watch && r.cfg.Watch != "" {
			r.watch(j, out, err)
		}
	}
}

func (r *run) watch(j job, out Outcome, err error) {
	if err == nil && out.Shards > 0 {
		r.shards.Store(int64(out.Shards))
	}
	i := int(j.intended.Sub(r.start) / r.cfg.Period)
	r.mu.Lock()
	defer r.mu.Unlock()
	if i < 0 {
		return
	}
	for len(r.watched) <= i { // grown as the run goes: a long run costs no memory up front
		r.watched = append(r.watched, Bucket{})
	}
	b := &r.watched[i]
	switch {
	case err != nil:
		b.Errors++
	case out.Allowed:
		b.Allowed++
	default:
		b.Denied++
	}
	b.Shards = max(b.Shards, out.Shards)
}

// report calls progress every interval until the returned function is
// called with the result, which reports once more and stops it.
func (r *run) report(progress func(Snapshot), interval time.Duration) func(*Result) {
	if progress == nil {
		return func(*Result) {}
	}
	if interval <= 0 {
		interval = time.Second
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-t.C:
				progress(r.snapshot())
			case <-done:
				return
			}
		}
	})
	return func(*Result) {
		close(done)
		wg.Wait()
		progress(r.snapshot())
	}
}

func (r *run) snapshot() Snapshot {
	r.mu.Lock()
	p99 := r.recent.Quantile(0.99)
	r.recent = Histogram{}
	r.mu.Unlock()
	return Snapshot{
		Elapsed: time.Since(r.start),
		Sent:    r.sent.Load(), Allowed: r.allowed.Load(), Denied: r.denied.Load(), Errors: r.errs.Load(),
		P99:    p99,
		Shards: int(r.shards.Load()),
	}
}

func (r *run) result() *Result {
	r.mu.Lock()
	defer r.mu.Unlock()
	res := &Result{
		Sent: r.sent.Load(), Allowed: r.allowed.Load(), Denied: r.denied.Load(), Errors: r.errs.Load(),
		Latency: r.hist,
		Start:   r.start,
		Elapsed: time.Since(r.start),
		Watched: append([]Bucket(nil), r.watched...),
		Quotas:  r.quotas,
		Quota:   r.quota,
	}
	if r.ideal != nil {
		res.Ideal = r.ideal.admitted
	}
	if e := r.firstErr.Load(); e != nil {
		res.FirstError = *e
	}
	return res
}
