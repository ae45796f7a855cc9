package counter

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// RedisConfig configures a RedisStore; zero fields take the defaults.
type RedisConfig struct {
	// Prefix is prepended to every counter name (default "hk:"). It must not
	// contain '{' or '}', so that a counter's own hash tag, if any, decides
	// its Cluster slot.
	Prefix string
	// Timeout is the deadline of one pipeline round trip (default 500ms).
	// Socket reads and writes honour it only when the client was built with
	// ContextTimeoutEnabled; otherwise the client's ReadTimeout and
	// WriteTimeout bound them.
	Timeout time.Duration
	// MaxBatch is the most Takes sent in one pipeline (default 256).
	MaxBatch int
	// Workers is the number of pipelines in flight at once (default 2).
	// More workers mean smaller batches: on a small server that costs more
	// server CPU per decision than it gains in overlap.
	Workers int
	// RefreshInterval is how often the node map of a Cluster or Ring is
	// re-read (default 10s).
	RefreshInterval time.Duration
	// SetupRetry, when positive, lets NewRedisStore return although the
	// setup (loading the scripts, reading the node map) failed, say
	// because the server cannot be reached yet: the store retries it every
	// SetupRetry until it succeeds, and until then Take, TakeBatch and
	// Reshard fail at once with ErrNotReady (wrapped), without a round
	// trip. Ready says which. Zero: NewRedisStore fails when its setup
	// does.
	SetupRetry time.Duration
}

// DefaultRedisConfig returns the defaults documented on RedisConfig.
func DefaultRedisConfig() RedisConfig {
	return RedisConfig{
		Prefix:          "hk:",
		Timeout:         500 * time.Millisecond,
		MaxBatch:        256,
		Workers:         2,
		RefreshInterval: 10 * time.Second,
	}
}

// Errors of the Redis store.
var (
	ErrStoreClosed = errors.New("store closed")
	// ErrNotReady is the error of a call before a store made with
	// RedisConfig.SetupRetry is set up: no round trip was made.
	ErrNotReady      = errors.New("store not set up yet")
	ErrInvalidPrefix = errors.New("redis prefix must not contain '{' or '}'")
	// ErrInvalidConfig is in every error NewRedisStore returns for a
	// RedisConfig it refuses (errors.Is).
	ErrInvalidConfig = errors.New("invalid store config")
	errBadReply      = errors.New("unexpected script reply")
)

// RedisStore runs the algorithms as Lua scripts on Redis: standalone, Ring
// or Cluster, through a redis.UniversalClient. It is safe for concurrent use.
//
// Concurrent Takes are coalesced by natural batching: each of Workers
// goroutines takes one queued call, adds whatever else is queued without
// waiting (up to MaxBatch), and sends them all in one round trip. Under low
// load a call pays no delay; under high load batches grow while a round trip
// is in flight. On a standalone server a batch costs one EVALSHA per
// algorithm (the scripts take many keys); on a Cluster or Ring, where a
// script's keys must live together, one EVALSHA per Take, pipelined.
type RedisStore struct {
	client   redis.UniversalClient
	cfg      RedisConfig
	shas     [numAlgorithms]any // SHA1 hex of each script, boxed once for command args
	multiKey bool               // one script call may carry many keys (one server)

	queue  chan *call
	done   chan struct{}   // closed by Close
	ctx    context.Context // parent of every round trip; cancelled by Close
	cancel context.CancelFunc
	wg     sync.WaitGroup // workers and refresher
	once   sync.Once      // guards Close

	placement atomic.Pointer[Placement]
	loadMu    sync.Mutex // serializes script reloads

	// batchWorkers are the workers TakeBatch runs its batches with, on
	// its caller's goroutine.
	batchWorkers sync.Pool

	// pipelines and calls count round trips and the Takes they carried, so
	// tests and benchmarks can see batching happen.
	pipelines, calls atomic.Uint64

	skew     atomic.Int64 // the server's clock minus ours, in ns
	skewRead atomic.Bool  // skew has been measured

	ready    atomic.Bool           // set up: scripts loaded, node map read
	setupErr atomic.Pointer[error] // the last failed setup's error, until ready
}

var _ Store = (*RedisStore)(nil)

// NewRedisStore loads the scripts (on every shard or master), reads the node
// map and starts the workers and, for a Ring or Cluster, the refresher. It
// does not own client: Close does not close it. ctx bounds the setup only.
// The server must be Redis 5 or later (scripts replicated by effects).
func NewRedisStore(ctx context.Context, client redis.UniversalClient, cfg RedisConfig) (*RedisStore, error) {
	def := DefaultRedisConfig()
	if cfg.Prefix == "" {
		cfg.Prefix = def.Prefix
	}
	if strings.ContainsAny(cfg.Prefix, "{}") {
		return nil, fmt.Errorf("redis store: %w: %w: %q", ErrInvalidConfig, ErrInvalidPrefix, cfg.Prefix)
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = def.Timeout
	}
	if cfg.MaxBatch <= 0 {
		cfg.MaxBatch = def.MaxBatch
	}
	if cfg.Workers <= 0 {
		cfg.Workers = def.Workers
	}
	if cfg.RefreshInterval <= 0 {
		cfg.RefreshInterval = def.RefreshInterval
	}
	s := &RedisStore{
		client: client,
		cfg:    cfg,
		queue:  make(chan *call, cfg.Workers*cfg.MaxBatch),
		done:   make(chan struct{}),
	}
	s.batchWorkers.New = func() any {
		w := s.newWorker()
		w.ordered = true
		return w
	}
	switch client.(type) {
	case *redis.ClusterClient, *redis.Ring:
	default:
		s.multiKey = true
	}
	for i, src := range scripts {
		sum := sha1.Sum([]byte(src))
		s.shas[i] = hex.EncodeToString(sum[:])
	}
	err := s.setup(ctx)
	if err != nil && cfg.SetupRetry <= 0 {
		return nil, err
	}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	for range cfg.Workers {
		s.wg.Add(1)
		go s.newWorker().loop()
	}
	s.wg.Add(1)
	if err != nil {
		s.setupErr.Store(&err)
		// Until set up, the store maps every name to one node, under a
		// version no node map read from the server has: a split key's
		// names change once the real map is read.
		var p Placement = singleNode{} // what a standalone server's map will be
		switch client.(type) {
		case *redis.ClusterClient, *redis.Ring:
			p = pendingNode{}
		}
		s.placement.Store(&p)
		go s.retrySetup()
	} else {
		go s.refresh()
	}
	return s, nil
}

// setup probes the servers, loads the scripts, reads the node map and
// measures the clock skew; then the store is ready.
func (s *RedisStore) setup(ctx context.Context) error {
	if err := probe(ctx, s.client); err != nil {
		return fmt.Errorf("redis store: %w", err)
	}
	if err := s.loadScripts(ctx); err != nil {
		return err
	}
	p, err := readPlacement(ctx, s.client, s.cfg.Prefix, 1)
	if err != nil {
		return fmt.Errorf("redis store: %w", err)
	}
	s.placement.Store(&p)
	s.ready.Store(true)
	s.measureSkew(ctx)
	return nil
}

// retrySetup retries the setup every SetupRetry until it succeeds or the
// store is closed, then refreshes.
func (s *RedisStore) retrySetup() {
	t := time.NewTicker(s.cfg.SetupRetry)
	defer t.Stop()
	for {
		select {
		case <-s.done:
			s.wg.Done()
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(s.ctx, max(s.cfg.Timeout, time.Second))
		err := s.setup(ctx)
		cancel()
		if err == nil {
			s.refresh() // calls wg.Done
			return
		}
		s.setupErr.Store(&err)
	}
}

// Ready returns nil once the store is set up (always, unless made with
// RedisConfig.SetupRetry and the setup has not succeeded yet); before, an
// error that wraps ErrNotReady and says why the last setup failed. Until
// then the store dials the server outside the client's pool, so a store that
// turns ready takes at once: the pool has not been driven into backing off
// its dials by the store's own retries.
func (s *RedisStore) Ready() error {
	if s.ready.Load() {
		return nil
	}
	return s.notReady()
}

func (s *RedisStore) notReady() error {
	if e := s.setupErr.Load(); e != nil {
		return fmt.Errorf("%w: %w", ErrNotReady, *e)
	}
	return ErrNotReady
}

func isSingle(p Placement) bool {
	_, ok := p.(singleNode)
	return ok
}

// ClockSkew returns the Redis server's clock minus this host's, as last
// measured (at setup, then every RefreshInterval), and whether it has been.
// Decisions never use the local clock: the scripts read TIME; this is for
// operators, since other tools on the host may trust its clock.
func (s *RedisStore) ClockSkew() (time.Duration, bool) {
	return time.Duration(s.skew.Load()), s.skewRead.Load()
}

// measureSkew reads TIME and compares it with the midpoint of the local
// instants around the call. A failed read keeps the last measure.
func (s *RedisStore) measureSkew(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	before := time.Now()
	t, err := s.client.Time(ctx).Result()
	after := time.Now()
	if err != nil {
		return
	}
	mid := before.Add(after.Sub(before) / 2)
	s.skew.Store(int64(t.Sub(mid)))
	s.skewRead.Store(true)
}

// loadScripts loads every script on every node that may receive it: one
// pipelined round trip per node, to all nodes at once.
func (s *RedisStore) loadScripts(ctx context.Context) error {
	s.loadMu.Lock()
	defer s.loadMu.Unlock()
	shard := func(ctx context.Context, c *redis.Client) error { return s.loadOn(ctx, c) }
	var err error
	switch c := s.client.(type) {
	case *redis.ClusterClient: // masters and replicas, so a promoted replica has them
		err = c.ForEachShard(ctx, shard)
	case *redis.Ring:
		err = c.ForEachShard(ctx, shard)
	default:
		err = s.loadOn(ctx, c)
	}
	if err != nil {
		return fmt.Errorf("redis store: %w", err)
	}
	return nil
}

// loadOn loads every script, Take's, Peek's, Charge's and ChargeTotals', on the node c talks to, in
// one round trip.
func (s *RedisStore) loadOn(ctx context.Context, c redis.Cmdable) error {
	cmds := make([]*redis.StringCmd, len(scripts))
	peeks := make([]*redis.StringCmd, len(peekSources))
	charges := make([]*redis.StringCmd, len(chargeSources))
	var total *redis.StringCmd
	_, _ = c.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, src := range scripts {
			cmds[i] = p.ScriptLoad(ctx, src)
		}
		for i, src := range peekSources {
			peeks[i] = p.ScriptLoad(ctx, src)
		}
		for i, src := range chargeSources {
			charges[i] = p.ScriptLoad(ctx, src)
		}
		total = p.ScriptLoad(ctx, totalSource)
		return nil
	}) // every command carries its own error
	for i, cmd := range cmds {
		if err := checkLoad(cmd, s.shas[i]); err != nil {
			return fmt.Errorf("load %v script: %w", Algorithm(i), err)
		}
	}
	for i, cmd := range peeks {
		if err := checkLoad(cmd, peekScripts[i].Hash()); err != nil {
			return fmt.Errorf("load %v peek script: %w", Algorithm(i), err)
		}
	}
	for i, cmd := range charges {
		if err := checkLoad(cmd, chargeScripts[i].Hash()); err != nil {
			return fmt.Errorf("load %v charge script: %w", Algorithm(i), err)
		}
	}
	if err := checkLoad(total, totalScript.Hash()); err != nil {
		return fmt.Errorf("load total script: %w", err)
	}
	return nil
}

func checkLoad(cmd *redis.StringCmd, sha any) error {
	if got, err := cmd.Result(); err != nil {
		return err
	} else if got != sha {
		return fmt.Errorf("server hashed script to %s, want %s", got, sha)
	}
	return nil
}

// call is one queued Take. Calls are pooled; a call whose Take gave up
// (ctx done, store closed) is left to the garbage collector, because a worker
// may still write to it.
type call struct {
	ctx context.Context
	key string // prefixed counter name
	alg Algorithm

	// Script arguments (see redis_scripts.go), passed to go-redis by pointer
	// so that building a command allocates nothing per call.
	rate, period, n int64 // period in µs
	gcra                  // the token bucket's figures in µs, and the capacity
	level           int64 // token bucket: its expiry span's level (spanLevel)
	incArg, tolArg  int64 // token bucket: gcraScript's arguments,
	ivArg           int64 // with this one

	res  Result
	err  error
	done chan struct{} // 1-buffered: the worker never blocks delivering
}

var callPool = sync.Pool{New: func() any { return &call{done: make(chan struct{}, 1)} }}

// finish delivers res or err (wrapped) to c's Take.
func (c *call) finish(res Result, err error) {
	if err != nil {
		c.err = fmt.Errorf("redis take: %w", err)
	} else {
		c.res = res
	}
	c.done <- struct{}{}
}

// release clears c and returns it to the pool. Only the Take that owns c and
// knows no worker holds it may call it.
func (c *call) release() {
	c.ctx, c.key, c.res, c.err = nil, "", Result{}, nil
	callPool.Put(c)
}

// Take implements Store: it queues the call for a worker and waits for its
// result, ctx or Close, whichever comes first. It blocks for about one round
// trip. An unknown algorithm is an error, never a panic.
func (s *RedisStore) Take(ctx context.Context, key string, _ uint64, lim Limit, n int64) (Result, error) {
	if lim.Algorithm >= numAlgorithms {
		return Result{}, fmt.Errorf("redis take: %w: %d", ErrUnknownAlgorithm, lim.Algorithm)
	}
	if !s.ready.Load() {
		return Result{}, fmt.Errorf("redis take: %w", s.notReady())
	}
	c := callPool.Get().(*call)
	c.ctx, c.key = ctx, s.cfg.Prefix+key
	c.setArgs(lim, n)
	select {
	case s.queue <- c:
	case <-ctx.Done():
		c.release()
		return Result{}, fmt.Errorf("redis take: %w", ctx.Err())
	case <-s.done:
		c.release()
		return Result{}, fmt.Errorf("redis take: %w", ErrStoreClosed)
	}
	select {
	case <-c.done:
	case <-ctx.Done():
		return Result{}, fmt.Errorf("redis take: %w", ctx.Err())
	case <-s.done:
		select {
		case <-c.done: // prefer a result that raced with Close
		default:
			return Result{}, fmt.Errorf("redis take: %w", ErrStoreClosed)
		}
	}
	res, err := c.res, c.err
	c.release()
	return res, err
}

// Placement returns the current node map snapshot. It never blocks.
func (s *RedisStore) Placement() Placement { return *s.placement.Load() }

// Close stops the workers and the refresher and waits for them. Takes still
// waiting return ErrStoreClosed (wrapped); so do later ones. Close does not
// close the client. Calling Close again does nothing.
func (s *RedisStore) Close() error {
	s.once.Do(func() {
		close(s.done)
		s.cancel()
		s.wg.Wait()
	})
	return nil
}

// refresh measures the clock skew and, for a Ring or Cluster, re-reads the
// node map every RefreshInterval until Close, publishing a new snapshot when
// the mapping changed. A failed read keeps the current snapshot.
func (s *RedisStore) refresh() {
	defer s.wg.Done()
	t := time.NewTicker(s.cfg.RefreshInterval)
	defer t.Stop()
	for {
		select {
		case <-s.done:
			return
		case <-t.C:
		}
		if old := s.Placement(); !isSingle(old) {
			ctx, cancel := context.WithTimeout(s.ctx, s.cfg.Timeout)
			p, err := readPlacement(ctx, s.client, s.cfg.Prefix, old.Version()+1)
			cancel()
			if err == nil && !samePlacement(old, p) {
				s.placement.Store(&p)
			}
		}
		s.measureSkew(s.ctx)
	}
}

// worker sends batches of calls; its slices are reused from batch to batch.
type worker struct {
	s      *RedisStore
	batch  []*call
	groups []group
	args   []any // arguments of every command of a round trip

	// Grouping (see group), reused from batch to batch: the calls of each
	// run, the runs of each script call, and the calls in script-call order.
	runOf   map[runKey]int
	callOf  map[runKey]int
	runs    [][]*call
	scripts [][]int
	order   []*call

	held []*call // TakeBatch's calls, in the order of its ops

	// ordered says the calls on one key must be decided in their order
	// in the batch (TakeBatch's workers); lastOf is group's scratch then.
	ordered bool
	lastOf  map[string]runKey
	waves   []int // the wave of each script call
}

// runKey is what the calls of a run share, or with no key what the runs of
// one script call share: the algorithm, the token-bucket arguments a script
// call carries once, and the key.
type runKey struct {
	alg                   Algorithm
	incArg, tolArg, ivArg int64
	key                   string
	wave                  int // ordered workers: see group
}

// group is the calls that share one EVALSHA.
type group struct {
	alg   Algorithm
	wave  int
	calls []*call
	cmd   *redis.IntSliceCmd
}

func (s *RedisStore) newWorker() *worker {
	return &worker{
		s:     s,
		batch: make([]*call, 0, s.cfg.MaxBatch),
		args:  make([]any, 0, 8*s.cfg.MaxBatch),
	}
}

// loop runs round trips until Close: it blocks for one call, drains what
// else is queued without waiting and sends the batch.
func (w *worker) loop() {
	defer w.s.wg.Done()
	for {
		w.batch = w.batch[:0]
		select {
		case <-w.s.done:
			return
		case c := <-w.s.queue:
			w.batch = append(w.batch, c)
		}
	drain:
		for len(w.batch) < w.s.cfg.MaxBatch {
			select {
			case c := <-w.s.queue:
				w.batch = append(w.batch, c)
			default:
				break drain
			}
		}
		w.run()
	}
}

// run sends w.batch in one round trip and delivers every call's result.
func (w *worker) run() {
	live := w.batch[:0]
	for _, c := range w.batch {
		if err := c.ctx.Err(); err != nil { // its Take has given up
			c.finish(Result{}, err)
			continue
		}
		live = append(live, c)
	}
	if len(live) == 0 {
		return
	}
	groups := w.group(live)
	w.exec(groups)
	if w.s.ctx.Err() != nil { // Close cut the round trip short
		for _, c := range live {
			c.finish(Result{}, ErrStoreClosed)
		}
		return
	}
	// A NOSCRIPT reply means the server lost its scripts (restart, SCRIPT
	// FLUSH, new master): reload them and retry those calls once. The
	// reload and the retry are round trips of their own, each with its own
	// Timeout: sharing the first one's left the retry no time on a busy
	// server.
	retry := groups[:0]
	for _, g := range groups {
		if redis.HasErrorPrefix(g.cmd.Err(), "NOSCRIPT") {
			retry = append(retry, g)
			continue
		}
		g.finish()
	}
	if len(retry) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(w.s.ctx, w.s.cfg.Timeout)
	err := w.s.loadScripts(ctx)
	cancel()
	if err != nil {
		for _, g := range retry {
			for _, c := range g.calls {
				c.finish(Result{}, err)
			}
		}
		return
	}
	w.exec(retry)
	for _, g := range retry {
		if w.s.ctx.Err() != nil {
			for _, c := range g.calls {
				c.finish(Result{}, ErrStoreClosed)
			}
			continue
		}
		g.finish()
	}
}

// group splits calls into script calls. The calls on one key, with one
// algorithm and for the token bucket one pair of script arguments, form a
// run, sent in one script call, next to each other and in their order: the
// script decides them one after the other, and a hot key's calls in a
// batch cost one script call, not one each. A script call carries the runs
// of one algorithm and, for the token bucket, one set of arguments, which
// it carries once; on a Cluster or Ring, where a script's keys must share a
// slot, it carries one run.
func (w *worker) group(calls []*call) []group {
	if w.runOf == nil {
		w.runOf, w.callOf = make(map[runKey]int), make(map[runKey]int)
	}
	clear(w.runOf)
	clear(w.callOf)
	if w.ordered {
		if w.lastOf == nil {
			w.lastOf = make(map[string]runKey)
		}
		clear(w.lastOf)
	}
	runs, scripts, waves := 0, 0, false
	for _, c := range calls {
		rk := runKey{alg: c.alg, key: c.key}
		if c.alg == TokenBucket {
			rk.incArg, rk.tolArg, rk.ivArg = c.incArg, c.tolArg, c.ivArg
		}
		if w.ordered {
			// A call on a key whose previous call had other arguments
			// starts a new wave on it: its run, and its script call, come
			// after every script call of the waves before.
			if last, seen := w.lastOf[c.key]; seen {
				rk.wave = last.wave
				if last.alg != rk.alg || last.incArg != rk.incArg || last.tolArg != rk.tolArg || last.ivArg != rk.ivArg {
					rk.wave++
					waves = true
				}
			}
			w.lastOf[c.key] = rk
		}
		r, isNew := slot(w.runOf, &w.runs, &runs, rk)
		if isNew { // the run's script call: its class's, or its own
			sk := rk
			if w.s.multiKey {
				sk.key = ""
			}
			g, newScript := slot(w.callOf, &w.scripts, &scripts, sk)
			if newScript {
				w.waves = append(w.waves[:g], rk.wave)
			}
			w.scripts[g] = append(w.scripts[g], r)
		}
		w.runs[r] = append(w.runs[r], c)
	}
	w.groups, w.order = w.groups[:0], slices.Grow(w.order[:0], len(calls))
	for g, rs := range w.scripts[:scripts] {
		start := len(w.order)
		for _, r := range rs {
			w.order = append(w.order, w.runs[r]...)
		}
		cs := w.order[start:len(w.order):len(w.order)]
		w.groups = append(w.groups, group{alg: cs[0].alg, wave: w.waves[g], calls: cs})
	}
	if waves {
		slices.SortStableFunc(w.groups, func(a, b group) int { return a.wave - b.wave })
	}
	return w.groups
}

// slot returns the index of k's list in lists, and whether k is new in
// this batch: a new k takes the next of the *used lists, emptied, which
// keeps the lists' arrays from batch to batch.
func slot[T any](index map[runKey]int, lists *[][]T, used *int, k runKey) (int, bool) {
	if i, ok := index[k]; ok {
		return i, false
	}
	i := *used
	index[k] = i
	if i == len(*lists) {
		*lists = append(*lists, nil)
	}
	(*lists)[i] = (*lists)[i][:0]
	*used++
	return i, true
}

// exec sends one EVALSHA per group, pipelined when there are several, in
// one round trip bounded by Timeout.
func (w *worker) exec(groups []group) {
	ctx, cancel := context.WithTimeout(w.s.ctx, w.s.cfg.Timeout)
	defer cancel()
	w.args = w.args[:0]
	calls := 0
	for i := range groups {
		g := &groups[i]
		start := len(w.args)
		w.args = append(w.args, "evalsha", w.s.shas[g.alg], len(g.calls))
		for _, c := range g.calls {
			w.args = append(w.args, &c.key)
		}
		if g.alg == TokenBucket { // shared by the group's calls
			w.args = g.calls[0].appendArgs(w.args)
		} else {
			for _, c := range g.calls {
				w.args = c.appendArgs(w.args)
			}
		}
		g.cmd = redis.NewIntSliceCmd(ctx, w.args[start:len(w.args):len(w.args)]...)
		g.cmd.SetFirstKeyPos(3)
		calls += len(g.calls)
	}
	w.s.pipelines.Add(1)
	w.s.calls.Add(uint64(calls))
	if len(groups) == 1 {
		_ = w.s.client.Process(ctx, groups[0].cmd)
		return
	}
	pipe := w.s.client.Pipeline()
	for _, g := range groups {
		_ = pipe.Process(ctx, g.cmd)
	}
	_, _ = pipe.Exec(ctx) // every command carries its own error
}

// finish delivers the results of g's calls.
func (g *group) finish() {
	v, err := g.cmd.Val(), g.cmd.Err()
	width := replyWidth[g.alg]
	n := width * len(g.calls)
	switch {
	case err != nil:
	case len(v) != n:
		err = errBadReply
	}
	for i, c := range g.calls {
		if err != nil {
			c.finish(Result{}, err)
		} else {
			c.finish(c.decode(v[i*width:(i+1)*width]), nil)
		}
	}
}
