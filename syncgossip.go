package hotkey

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"time"

	"github.com/hotkeyd/hotkey/coordinator"
	"github.com/hotkeyd/hotkey/counter"
	"github.com/hotkeyd/hotkey/gossip"
	"github.com/hotkeyd/hotkey/shard"
)

// gossipStore returns the store SyncGossip decisions are taken on, made on
// the first such decision (or the first peer's message): an engine that
// has none sends nothing. When the coordinator is a Gossiper, making it
// starts the goroutine that flushes its rounds to peers every interval.
func (e *Engine) gossipStore() *gossip.Store {
	if gs := e.gossip.Load(); gs != nil {
		return gs
	}
	e.gossipMu.Lock()
	defer e.gossipMu.Unlock()
	if gs := e.gossip.Load(); gs != nil {
		return gs
	}
	g, peers := e.coord.(coordinator.Gossiper)
	cfg := gossip.StoreConfig{
		ID:       e.gossipID,
		Gossip:   gossip.Config{MaxKeyLen: max(gossip.DefaultMaxKeyLen, e.opt.maxKeyLen)},
		Memory:   counter.MemoryConfig{Clock: e.opt.clock},
		Interval: e.opt.gossipInterval,
		Solo:     !peers && !e.opt.gossipRounds,
	}
	if peers {
		// A message too large for the coordinator is refused by it: at
		// least one entry of the longest key must fit.
		cfg.Gossip.MaxBytes = max(min(gossip.DefaultMaxBytes, g.MaxGossip()), gossip.MinBytes(cfg.Gossip.MaxKeyLen))
	}
	gs := gossip.NewStore(cfg)
	e.gossip.Store(gs)
	if peers && !e.closed.Load() {
		e.gossipDone = make(chan struct{})
		go e.gossipLoop(gs, g)
	}
	return gs
}

// gossipInstanceID returns an id for this engine's gossip messages.
func gossipInstanceID() string { return fmt.Sprintf("e-%016x", rand.Uint64()) }

// gossipLoop flushes gs's rounds to g's peers every interval until Close,
// then flushes a last round, so that the units admitted in it reach peers
// still deciding.
func (e *Engine) gossipLoop(gs *gossip.Store, g coordinator.Gossiper) {
	defer close(e.gossipDone)
	t := time.NewTicker(e.opt.gossipInterval)
	defer t.Stop()
	out := gossipOutage{log: e.log}
	for {
		select {
		case <-t.C:
			out.note(e.gossipSend(gs, g))
		case <-e.stop:
			out.note(e.gossipSend(gs, g))
			return
		}
	}
}

// gossipSend flushes gs's round and publishes its messages, counting
// those g does not take. It returns whether the round had messages to
// send, and the first error that kept it from being sent whole.
func (e *Engine) gossipSend(gs *gossip.Store, g coordinator.Gossiper) (sent bool, err error) {
	msgs, err := gs.Flush(e.opt.clock())
	if err != nil {
		e.gossipErrors.Add(1)
	}
	for _, m := range msgs {
		if perr := g.PublishGossip(m); perr != nil {
			e.gossipErrors.Add(1)
			if err == nil {
				err = perr
			}
		}
	}
	return len(msgs) > 0, err
}

// gossipOutage logs the rounds not sent whole once per outage: a warning
// at the first, with its error, and an Info at the next round sent whole,
// with how many failed meanwhile. A round with nothing to send changes
// nothing. Owned by the gossip loop: not safe for concurrent use.
type gossipOutage struct {
	log    *slog.Logger
	failed int // rounds not sent whole since the last one sent whole
}

// note records a round as gossipSend returned it.
func (o *gossipOutage) note(sent bool, err error) {
	switch {
	case err != nil:
		if o.failed == 0 {
			o.log.Warn("gossip round not sent whole: peers miss its units (logged once until a round is sent whole)", "error", err)
		}
		o.failed++
	case sent && o.failed > 0:
		o.log.Info("gossip round sent whole again", "failed_rounds", o.failed)
		o.failed = 0
	}
}

// gossipFlush is a round's messages at now, for a test delivering them by
// hand (see withGossipRounds).
func (e *Engine) gossipFlush(now time.Time) [][]byte {
	msgs, err := e.gossipStore().Flush(now)
	if err != nil {
		panic(err) // a test's: the round holds only what the codec carries
	}
	return msgs
}

// gossipApply charges a peer's message, for a test delivering it by hand.
func (e *Engine) gossipApply(payload []byte) error { return e.gossipStore().Apply(payload) }

// gossipStats returns what SyncGossip's store did; false before the first
// SyncGossip decision.
func (e *Engine) gossipStats() (gossip.StoreStats, bool) {
	gs := e.gossip.Load()
	if gs == nil {
		return gossip.StoreStats{}, false
	}
	return gs.Stats(), true
}

// gossipAlone reports whether SyncGossip policies decide, or would decide,
// on this instance's counts alone: the coordinator carries no gossip, or
// cannot reach NATS. known is true from the start with a coordinator that
// carries gossip, else from the first SyncGossip decision.
func (e *Engine) gossipAlone() (alone, known bool) {
	if g, peers := e.coord.(coordinator.Gossiper); peers {
		return !g.Connected(), true
	}
	return true, e.gossip.Load() != nil
}

// decideGossip decides n units of the counter name (hashed hash) under lim
// on the gossip store: never split, and never degraded (the memory store
// does not fail). A key the coordinator split stays whole; once merged it
// leaves the table here, as decideStore has it leave.
func (e *Engine) decideGossip(name string, hash uint64, lim Limit, n int64) Result {
	if ent := e.table.Lookup(name, hash); ent != nil && ent.Level() == shard.Level1 && e.table.Remove(ent, shard.Level1) {
		e.wakeSettle()
	}
	name, hash = unsplitCounter(name, hash)
	if r, ok := e.knownDenied(hash, lim, n); ok {
		return unsplit(r)
	}
	now := e.opt.clock()
	r := e.gossipStore().TakeAt(now, name, hash, lim, n)
	e.remember(hash, lim, n, r, now)
	return unsplit(r)
}

// peekGossip is Peek for a SyncGossip policy: this instance's view.
func (e *Engine) peekGossip(name string, hash uint64, lim Limit) Result {
	name, hash = unsplitCounter(name, hash)
	if r, ok := e.knownDenied(hash, lim, 1); ok {
		return unsplit(r)
	}
	r, _ := e.gossipStore().Peek(context.Background(), name, hash, lim)
	return unsplit(r)
}

// Gossip implements coordinator.GossipHandler: a peer's round is charged
// to this instance's counters.
func (h handler) Gossip(payload []byte) { h.e.gossipStore().Apply(payload) }

// GossipSnapshot implements coordinator.GossipHandler: this instance's view
// of its gossiped counters, sent as it is read; none before its first
// SyncGossip decision.
func (h handler) GossipSnapshot(maxBytes int, send func([]byte)) {
	if gs := h.e.gossip.Load(); gs != nil {
		gs.SnapshotTo(maxBytes, send)
	}
}

// GossipSync implements coordinator.GossipHandler: a peer's snapshot
// brings this instance's view up to the peer's.
func (h handler) GossipSync(payload []byte) { h.e.gossipStore().ApplySnapshot(payload) }

var _ coordinator.GossipHandler = handler{}
