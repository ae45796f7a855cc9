package hotkey

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hotkeyd/hotkey/coordinator"
	"github.com/hotkeyd/hotkey/counter"
	"github.com/hotkeyd/hotkey/detector"
	"github.com/hotkeyd/hotkey/gossip"
	"github.com/hotkeyd/hotkey/shard"
	"github.com/hotkeyd/hotkey/split"
)

// prefetcher is implemented by stores that can start loading a key's
// counter, by its hash, ahead of a decision (the memory store).
type prefetcher interface{ Prefetch(hash uint64) }

// placer is implemented by stores that know how counter names map to nodes.
type placer interface{ Placement() counter.Placement }

// sharer is implemented by stores that know whether other engines decide
// on them (the memory store, see MemoryStore.Attach).
type sharer interface {
	Attach() (detach func())
	Shared() bool
}

// Engine makes rate-limit decisions on a Store. It is safe for concurrent
// use. The zero value is not usable; call New.
type Engine struct {
	store    counter.Store
	placer   placer // nil: one node
	opt      options
	seed     uint64 // per instance: offsets subcounter choice
	table    *split.Table
	deny     *denyCache         // nil: disabled
	prefetch prefetcher         // nil: the store has no use for the hint
	sharer   sharer             // nil: the store does not say
	detach   func()             // ends this engine's Attach; nil if none
	batcher  counter.Batcher    // nil: a batch's takes go one by one
	leaser   counter.LeaseStore // the store, if it leases (SyncReserve); else nil

	reserveMu sync.Mutex                           // guards the making of reserve, and Close's of it
	reserve   atomic.Pointer[counter.ReserveStore] // made on the first SyncReserve decision
	// The store of SyncGossip policies, made on the first, and the
	// goroutine that flushes its rounds to peers (gossipDone closed when it
	// has stopped; nil if none was started).
	gossipMu     sync.Mutex // guards the making of gossip, and gossipDone
	gossip       atomic.Pointer[gossip.Store]
	gossipDone   chan struct{}
	gossipID     string
	gossipErrors atomic.Uint64      // rounds or messages not handed to the coordinator
	xr           *exchange          // the exchange with other regions; nil if none
	detect       *detector.Detector // nil: disabled
	coord        coordinator.Coordinator
	reshard      counter.Resharder // nil: no state transfer
	instances    atomic.Int32      // live instances, as the coordinator last said
	brk          *breaker
	local        *counter.MemoryStore // FallbackLocal's counters
	metrics      *metrics             // nil: none kept
	log          *slog.Logger
	refuse       refusals
	settleNow    chan struct{} // wakes the loop to settle merged and refused keys
	settling     sync.Mutex    // serialises settle's passes
	life         context.Context
	endLife      context.CancelFunc // called by Close: ends the loop's store calls
	stop         chan struct{}      // closed by Close
	done         chan struct{}      // closed when the event loop has stopped
	closed       atomic.Bool
}

// New returns an engine deciding on store. The engine does not own store:
// Close leaves it open.
func New(store counter.Store, opts ...Option) (*Engine, error) {
	if store == nil {
		return nil, fmt.Errorf("hotkey: %w: nil store", ErrInvalidConfig)
	}
	o := defaultOptions()
	for _, opt := range opts {
		if err := opt(&o); err != nil {
			return nil, fmt.Errorf("hotkey: %w: %w", ErrInvalidConfig, err)
		}
	}
	e := &Engine{store: store, opt: o, seed: rand.Uint64(), log: o.logger, settleNow: make(chan struct{}, 1)}
	e.local = counter.NewMemoryStore(counter.MemoryConfig{MaxKeys: o.localKeys, Clock: o.clock})
	e.brk = newBreaker(o.breakerFailures, o.breakerProbe, o.breakerMaxProbe, o.clock, e.breakerChanged)
	if o.registerer != nil {
		m, err := newMetrics(o.registerer, e)
		if err != nil {
			return nil, fmt.Errorf("hotkey: metrics: %w", err)
		}
		e.metrics = m
	}
	e.placer, _ = store.(placer)
	e.prefetch, _ = store.(prefetcher)
	e.batcher, _ = store.(counter.Batcher)
	e.leaser, _ = store.(counter.LeaseStore)
	if e.sharer, _ = store.(sharer); e.sharer != nil {
		e.detach = e.sharer.Attach()
	}
	// The deny cache saves store calls; a memory store's call costs what a
	// lookup in the cache does.
	if _, inProcess := store.(*counter.MemoryStore); o.denyCache > 0 && !inProcess {
		e.deny = newDenyCache(o.denyCache)
	}
	if rs, ok := store.(counter.Resharder); ok && o.transfer {
		e.reshard = rs
	}
	e.table = split.NewTable(e.splitConfig())
	e.opt.splitKeys = make(map[string]shard.Level, len(o.staticKeys))
	for _, sk := range o.staticKeys {
		if err := e.checkKey(sk.key); err != nil {
			return nil, fmt.Errorf("hotkey: %w: split key: %w", ErrInvalidConfig, err)
		}
		e.opt.splitKeys[nameOf(sk.policy, sk.key)] = sk.level
	}
	for k, level := range e.opt.splitKeys {
		if !e.table.Set(k, hashKey(k), level, shard.Level1, nil) {
			return nil, fmt.Errorf("hotkey: %w: more split keys than max hot keys (%d)", ErrInvalidConfig, o.maxHotKeys)
		}
	}
	e.instances.Store(1)
	if o.detect {
		d, err := detector.New(o.detector, time.Now())
		if err != nil {
			return nil, fmt.Errorf("hotkey: %w: %w", ErrInvalidConfig, err)
		}
		e.detect = d
	}
	e.coord = o.coord
	if e.coord == nil {
		e.coord = &coordinator.Local{}
	}
	e.gossipID = gossipInstanceID()
	// A peer's gossip, handed over from Start on, may make the gossip
	// store, whose goroutine stops with e.stop.
	e.stop, e.done = make(chan struct{}), make(chan struct{})
	// Other regions' rounds, handed over from Start on, are charged
	// within the engine's life.
	e.life, e.endLife = context.WithCancel(context.Background())
	if pub, ok := e.coord.(coordinator.RegionPublisher); ok {
		e.xr = newExchange(e, pub)
	}
	if err := e.coord.Start(handler{e}); err != nil {
		e.endLife()
		e.closeGossip()
		return nil, fmt.Errorf("hotkey: coordinator: %w", err)
	}
	if e.xr != nil {
		go e.xr.run(e.stop)
	}
	if e.detect != nil {
		e.detect.Start()
	}
	go e.loop()
	return e, nil
}

// skewCheck is how often the engine looks at the store's clock skew, and
// maxSkew how much it takes a warning.
const (
	skewCheck = 10 * time.Second
	maxSkew   = 100 * time.Millisecond
)

// checkSkew logs a warning when the store's clock skew crosses maxSkew
// (warned says it already had), and a note when it is back under.
func (e *Engine) checkSkew(warned bool) bool {
	s, ok := e.store.(skewer)
	if !ok {
		return false
	}
	d, ok := s.ClockSkew()
	if !ok {
		return warned
	}
	over := d > maxSkew || d < -maxSkew
	switch {
	case over && !warned:
		e.log.Warn("clock skew between this host and the store", "skew", d, "warn_above", maxSkew)
	case !over && warned:
		e.log.Info("clock skew back under the warning level", "skew", d)
	}
	return over
}

// loop hands the detector's level changes to the coordinator, and settles
// merged and refused keys (see settle), until Close.
func (e *Engine) loop() {
	defer close(e.done)
	var events <-chan detector.Event
	if e.detect != nil {
		events = e.detect.Events()
	}
	retry := time.NewTicker(settleRetry)
	defer retry.Stop()
	skewTick := time.NewTicker(skewCheck)
	defer skewTick.Stop()
	skewed := false
	unsettled := false
	for {
		select {
		case <-skewTick.C:
			skewed = e.checkSkew(skewed)
		case ev, ok := <-events:
			if !ok {
				events = nil // closed by Close
				continue
			}
			e.coord.Announce(ev.Key, ev.Hash, ev.Level)
		case <-e.settleNow:
			unsettled = e.settle()
		case <-retry.C:
			if unsettled {
				unsettled = e.settle()
			}
		case <-e.stop:
			return
		}
	}
}

// reserveStore returns the blocks SyncReserve decisions are taken from,
// made on the first: an engine that has none runs no sweeper. Once the
// engine is closed it returns the store: no block outlives Close.
func (e *Engine) reserveStore() counter.Store {
	if rs := e.reserve.Load(); rs != nil {
		return rs
	}
	e.reserveMu.Lock()
	defer e.reserveMu.Unlock()
	if rs := e.reserve.Load(); rs != nil {
		return rs
	}
	if e.closed.Load() {
		return e.store
	}
	// Time since now, on Go's monotonic clock when the engine's clock
	// reads it (time.Now does): a step of the wall clock is not seen.
	since := e.opt.monotonic
	if since == nil {
		start := e.opt.clock()
		since = func() time.Duration { return e.opt.clock().Sub(start) }
	}
	// A store in this process answers at once: nothing to lease ahead for.
	_, inMemory := e.leaser.(*counter.MemoryStore)
	rs := counter.NewReserveStore(e.leaser, counter.ReserveConfig{Lease: e.opt.reserveLease, Instances: e.liveInstances, Clock: since, Sweep: e.opt.reserveSweep, Ahead: !inMemory})
	e.reserve.Store(rs)
	return rs
}

// reserveStats returns what SyncReserve's store did; false before the
// first SyncReserve decision.
func (e *Engine) reserveStats() (counter.ReserveStats, bool) {
	rs := e.reserve.Load()
	if rs == nil {
		return counter.ReserveStats{}, false
	}
	return rs.Stats(), true
}

// closeGossip closes e.stop, which ends the engine's loop and gossip's,
// and waits for gossip's last round to be sent.
func (e *Engine) closeGossip() {
	close(e.stop)
	e.gossipMu.Lock()
	done := e.gossipDone
	e.gossipMu.Unlock()
	if done != nil {
		<-done
	}
}

// splitConfig configures the split table: its cap, and the store's side of
// a move and of a placement.
func (e *Engine) splitConfig() split.Config {
	c := split.Config{MaxKeys: e.opt.maxHotKeys, MinShare: e.opt.minShare, Static: e.opt.splitAll}
	if e.reshard != nil {
		c.Mover = mover{e}
	}
	if e.placer != nil {
		c.Placer = nodeMap{e.placer}
	}
	if e.sharer != nil {
		c.Sharer = e.sharer
	}
	return c
}

// nodeMap is the store's placer as the split table asks it.
type nodeMap struct{ placer }

func (m nodeMap) Placement() shard.Placement { return m.placer.Placement() }

// handler applies the coordinator's decisions to the engine.
type handler struct{ e *Engine }

// SetLevel implements coordinator.Handler. A key split statically
// (WithSplitKeys, withSplitAll) never goes below its static level. When the
// table is full (WithMaxHotKeys), the level waits, and the table comes to
// hold the highest-ranked keys (see settle). A key merged back stays in the
// table, at level 1, until its usage is back on the unsplit counter.
func (h handler) SetLevel(key string, hash uint64, level shard.Level) {
	e := h.e
	e.refuse.mu.Lock()
	defer e.refuse.mu.Unlock()
	delete(e.refuse.keys, key) // a newer level replaces one the table refused
	static := e.staticLevel(key)
	switch {
	case level > static:
		held, p := e.table.Outside(key, hash)
		if !e.table.Set(key, hash, level, held, p) {
			e.refusedLocked(key, hash, level)
			return
		}
	case static > shard.Level1:
		if e.table.Lookup(key, hash) == nil && e.opt.splitKeys[key] == 0 {
			return // under withSplitAll, and never split above it
		}
		e.table.Set(key, hash, static, static, e.placement())
		level = static
		e.wakeSettle() // a key promoted under withSplitAll leaves the table
	default:
		if !e.table.Merge(key, hash) {
			return
		}
		e.wakeSettle()
	}
	if ent := e.table.Lookup(key, hash); ent != nil {
		// Whatever the node map is now, the key's counters at this level
		// may be written under it: a later move reads them so.
		ent.NotePlacement(e.placement())
	}
	e.applied(key, level)
}

// applied logs and counts a level applied to key.
func (e *Engine) applied(key string, level shard.Level) {
	e.log.Info("hot key level", "key", key, "level", level)
	e.metrics.levelChanged(level)
	if e.opt.levelHook != nil {
		e.opt.levelHook(key, level)
	}
}

// breakerChanged logs and counts a change of the breaker's state.
func (e *Engine) breakerChanged(s BreakerState, cause error) {
	if s == BreakerOpen {
		e.log.Warn("store circuit breaker opened: decisions follow their fallback", "error", cause)
	} else {
		e.log.Info("store circuit breaker closed: the store answers again")
	}
	e.metrics.breakerChanged(s)
}

// SetInstances implements coordinator.Handler: the detector compares local
// rates with its threshold over the live instances.
func (h handler) SetInstances(n int) {
	h.e.instances.Store(int32(n))
	if h.e.detect != nil {
		h.e.detect.SetInstances(n)
	}
}

// liveInstances returns the number of live instances, as the coordinator
// last reported it (1 with the Local coordinator).
func (e *Engine) liveInstances() int { return int(e.instances.Load()) }

// levelOf returns the level key (a counter name) is split to on this
// engine: 1 if it is not split.
func (e *Engine) levelOf(key string) shard.Level {
	hash := hashKey(key)
	if ent := e.table.Lookup(key, hash); ent != nil {
		return ent.Level()
	}
	return e.staticLevel(key)
}

// staticLevel returns the level WithSplitKeys and withSplitAll give key: 1
// if neither splits it.
func (e *Engine) staticLevel(key string) shard.Level {
	return max(e.opt.splitKeys[key], e.table.Floor())
}

// Close stops the engine and waits for its goroutines: later decisions
// return ErrClosed. SyncGossip's last round goes to peers before the
// coordinator is closed. It does not close the store. Safe to call twice.
func (e *Engine) Close() error {
	if e.closed.Swap(true) {
		return nil
	}
	if e.detect != nil {
		e.detect.Close()
	}
	e.endLife()
	e.closeGossip()
	if e.xr != nil {
		<-e.xr.done // its last round is sent
	}
	<-e.done
	e.reserveMu.Lock()
	if rs := e.reserve.Load(); rs != nil {
		rs.Close() // its blocks' unused units go back
	}
	e.reserveMu.Unlock()
	if e.detach != nil {
		e.detach()
	}
	return e.coord.Close()
}
