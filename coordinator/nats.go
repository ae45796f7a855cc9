package coordinator

import (
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/hotkeyd/hotkey/shard"
)

// NATS is a Coordinator sharing leases over NATS.
//
// Each instance publishes a lease for every key its detector announces hot
// and renews it every TTL/3; every instance keeps a table of the leases it
// hears, the level in force of a key being the highest level with an
// unexpired lease (expiry = local receipt time + ttl). Heartbeats count the
// live instances: a new origin counts once heard twice within 3 heartbeat
// intervals, and the count handed to the Handler is capped (MaxInstances).
// A joining or reconnected instance asks the others for their tables (join
// sync); without that it still converges within one renewal period. With a
// Secret, messages are signed and unsigned, stale or replayed ones dropped
// (sign.go).
//
// The table keeps, per key, this instance's own level and, for each level,
// the latest expiry any peer's lease gave it; origins are not stored, so a
// key costs the same however many peers lease it. A peer that lowers its
// level leaves its higher lease to lapse (within its ttl), and so does this
// instance: its own lower level takes effect here when its last lease at the
// higher level lapses on the peers, so that all instances move to the new
// level at about the same instant (a raise takes effect at once).
//
// Handler calls come from one dispatcher goroutine, shortly after the
// Announce or message that caused them. Changes are coalesced per key: the
// level a key ends at is always delivered, but levels it passed through
// while the Handler was busy may be skipped, and changes of different keys
// may be delivered in any order. Pending changes are bounded by the table
// (at most 2×MaxHotKeys), so a slow Handler cannot make them grow without
// bound.
//
// It also carries gossip (Gossiper): binary envelopes on
// <prefix>.<ns>.gossip (envelope.go), received on a subscription of their
// own and handed to a Handler that is a GossipHandler, and a join sync's
// answer includes that Handler's GossipSnapshot.
//
// While NATS is unreachable, own announcements still apply at once, peers'
// leases lapse and the live count falls to 1: the coordinator degrades to
// local coordination, and heals on reconnect.
//
// The connection is the caller's (NewNATS): the coordinator never closes it
// nor sets its handlers, so the caller may share it and keep its own. It
// notices reconnects (to republish its leases and ask for the tables again)
// and disconnects (Stats) by polling the connection, within a heartbeat.
type NATS struct {
	cfg        Config
	lim        limits
	log        *slog.Logger
	subjLease  string
	subjHB     string
	subjSync   string
	subjGossip string
	sweep      time.Duration // longest interval between expiry checks
	sign       *signer       // nil without Secret
	seenMsg    *replayGuard  // stamps on .lease, .hb and .sync; nil without Secret
	seenSync   *replayGuard  // stamps of sync replies, JSON and gossip; nil without Secret
	seenGossip *replayGuard  // stamps on <prefix>.<ns>.gossip; nil without Secret

	nc *nats.Conn // the caller's

	// Set by Start, then read-only.
	h         Handler
	ctlSubs   []*nats.Subscription // .lease, .hb and .sync, into ctl
	ctl       chan *nats.Msg       // control messages, in the order received
	gossipSub *nats.Subscription   // .gossip
	rs        regionState          // rounds between regions (regions.go)
	inboxSub  *nats.Subscription   // sync replies
	inbox     string

	// gossipMu is held while a payload is handed to the GossipHandler, so
	// that Gossip and GossipSync are never called at once nor after Close.
	// It guards gossipClosed.
	gossipMu     sync.Mutex
	gossipClosed bool
	// pubGossipMu is held by PublishGossip from stamp to publish, so that
	// its stamps go out in order.
	pubGossipMu sync.Mutex

	mu       sync.Mutex // guards the fields below, up to toldLive
	started  bool
	closed   bool
	table    *leaseTable
	announce map[string]struct{}  // own keys to publish at once
	syncQ    []string             // reply subjects of sync requests to answer
	peers    map[string]time.Time // live peer → time of last heartbeat
	once     map[string]time.Time // origin heard once, not live yet → time of that heartbeat
	live     int                  // instances to hand the Handler: 1 + len(peers), at most MaxInstances
	toldLive int                  // live count handed to the dispatcher

	syncUntil  atomic.Pointer[syncWindow] // when sync replies are applied; nil before Start
	syncQueued int                        // replies queued when the last was applied; the inbox subscription's goroutine's
	wakePub    chan struct{}
	wakeDisp   chan struct{}
	wakeSweep  chan struct{}
	done       chan struct{}
	wg         sync.WaitGroup
	st         counters
}

var _ Coordinator = (*NATS)(nil)

// NewNATS returns a NATS coordinator on nc for cfg, or an error wrapping
// ErrInvalidConfig if nc is nil or cfg invalid. It does not subscribe:
// Start does. nc, connected or still connecting, stays the caller's: the
// coordinator never closes it, and once it is closed carries nothing more
// (publishes fail, counted). The coordinator is meant for a connection that
// reconnects forever (nats.MaxReconnects(-1)) and buffers nothing while
// disconnected (nats.ReconnectBufSize(-1)), so that no lease stale by then
// is sent on reconnect; with nats.NoEcho its own messages are not sent back
// to it.
func NewNATS(nc *nats.Conn, cfg Config) (*NATS, error) {
	if nc == nil {
		return nil, configError{errors.New("coordinator: NewNATS needs a connection")}
	}
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, configError{err}
	}
	scope := cfg.Prefix + "." + cfg.Namespace
	if cfg.Region != "" {
		scope += "." + cfg.Region
	}
	subj := scope + "."
	c := &NATS{
		cfg:        cfg,
		nc:         nc,
		lim:        limits{maxMessage: cfg.MaxMessage, maxKeyLen: cfg.MaxKeyLen, maxTTL: cfg.MaxTTL},
		log:        cfg.Logger.With("coordinator", cfg.ID),
		subjLease:  subj + "lease",
		subjHB:     subj + "hb",
		subjSync:   subj + "sync",
		subjGossip: subj + "gossip",
		sweep:      min(max(min(cfg.TTL, cfg.Heartbeat)/4, 5*time.Millisecond), 250*time.Millisecond),
		announce:   make(map[string]struct{}),
		peers:      make(map[string]time.Time),
		once:       make(map[string]time.Time),
		live:       1,
		wakePub:    make(chan struct{}, 1),
		wakeDisp:   make(chan struct{}, 1),
		wakeSweep:  make(chan struct{}, 1),
		done:       make(chan struct{}),
	}
	if cfg.Secret != nil {
		c.sign = &signer{secret: cfg.Secret, scope: scope, window: cfg.MaxClockSkew}
		c.seenMsg = newReplayGuard(cfg.MaxClockSkew, cfg.MaxPeers)
		c.seenSync = newReplayGuard(cfg.MaxClockSkew, cfg.MaxPeers)
		c.seenGossip = newReplayGuard(cfg.MaxClockSkew, cfg.MaxPeers)
	}
	c.table = c.newTable()
	c.initRegions()
	return c, nil
}

// newTable returns an empty lease table whose changes wake the dispatcher
// and whose expiries wake the sweeper.
func (c *NATS) newTable() *leaseTable {
	t := newLeaseTable(c.cfg.ID, c.cfg.TTL, c.cfg.MaxHotKeys, c.sweep, c.now())
	t.onChange = func() { c.wake(c.wakeDisp) }
	t.onSooner = func() { c.wake(c.wakeSweep) }
	return t
}

// ID returns this instance's ID.
func (c *NATS) ID() string { return c.cfg.ID }

// now reads the coordinator's clock, Config.Now.
func (c *NATS) now() time.Time { return c.cfg.Now() }

// Start implements Coordinator: it subscribes, waits for the server to
// confirm the subscriptions if connected (up to the connection's
// nats.Timeout), tells h there is 1 instance, sends a heartbeat and a join
// sync request, and starts the goroutines. It does not wait for sync
// replies: they are applied as they arrive, while they keep coming (see
// Config.SyncWait). It fails on a closed connection, or one that cannot
// subscribe or flush, and the caller may fall back to Local. Announce applies locally whatever the connection.
func (c *NATS) Start(h Handler) error {
	if h == nil {
		return errors.New("coordinator: Start with a nil Handler")
	}
	lastReconnects, err := c.connect(h)
	if err != nil {
		return err
	}
	// Outside c.mu, so the Handler may call the coordinator; the dispatcher,
	// the only other caller of h, starts after.
	h.SetInstances(1)
	go c.publisher(lastReconnects)
	go c.sweeper()
	go c.dispatcher()
	go c.receiver()
	return nil
}

// connect does the part of Start under c.mu: subscribe, send a heartbeat
// and a sync request. It returns the connection's reconnect count.
func (c *NATS) connect(h Handler) (lastReconnects uint64, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case c.closed:
		return 0, errors.New("coordinator: Start after Close")
	case c.started:
		return 0, errors.New("coordinator: Start called twice")
	}
	c.table = c.newTable() // its first sweep is due a sweep interval from now
	if c.seenMsg != nil {
		// The guard remembers nothing from before this Start: a message
		// stamped earlier could be a replay it cannot tell.
		c.seenMsg.since(c.now())
		c.seenGossip.since(c.now())
	}
	if c.nc.IsClosed() {
		return 0, fmt.Errorf("coordinator: %w", nats.ErrConnectionClosed)
	}
	defer func() {
		if err != nil {
			c.unsubscribe()
		}
	}()
	// Set before subscribing: the gossip subscription hands payloads to h.
	c.h = h
	// One channel for the control subjects keeps their messages in the
	// order they came (a lease after the heartbeats before it), and the
	// gossip subject apart, with pending limits of its own, so that a flood
	// of gossip cannot hold up leases. A wildcard <prefix>.<ns>.* would take
	// the gossip too.
	c.ctl = make(chan *nats.Msg, maxControlPending)
	for _, subj := range []string{c.subjLease, c.subjHB, c.subjSync} {
		sub, err := c.nc.ChanSubscribe(subj, c.ctl)
		if err != nil {
			return 0, fmt.Errorf("coordinator: subscribe: %w", err)
		}
		c.ctlSubs = append(c.ctlSubs, sub)
	}
	if c.gossipSub, err = c.nc.Subscribe(c.subjGossip, c.onGossip); err != nil {
		return 0, fmt.Errorf("coordinator: subscribe: %w", err)
	}
	if err = c.subscribeRegions(); err != nil {
		return 0, err
	}
	c.inbox = c.nc.NewInbox()
	if c.inboxSub, err = c.nc.Subscribe(c.inbox, c.onSyncReply); err != nil {
		return 0, fmt.Errorf("coordinator: subscribe: %w", err)
	}
	// The subscriptions are in place on the server before anything is
	// asked of the peers. A connection not up yet (made with
	// nats.RetryOnFailedConnect) sends them when it connects; its first
	// connection counts as a reconnect, after which the publisher sends the
	// heartbeat and sync request that go nowhere now.
	reconnects := c.nc.Stats().Reconnects
	if c.nc.IsConnected() {
		if err = c.nc.FlushTimeout(c.nc.Opts.Timeout); err != nil {
			return 0, fmt.Errorf("coordinator: flush subscriptions to NATS: %w", err)
		}
		reconnects = c.nc.Stats().Reconnects
	}
	c.started = true
	c.toldLive = 1
	c.publish(c.subjHB, encodeControl(c.cfg.ID, typeHB))
	c.requestSync()
	c.wg.Add(4)
	return reconnects, nil
}

// Announce implements Coordinator. A level of 4, 16 or 64 becomes this
// instance's lease for key (replacing its previous one), published without
// waiting on the network; level 1 drops it, and peers let it lapse. A higher
// level is in force here at once; a lower one once the lease at the old
// level lapses on the peers (ttl after its last publication), as it does
// there. Other levels are ignored, as are calls before
// Start or after Close.
func (c *NATS) Announce(key string, _ uint64, level shard.Level) {
	if !level.Valid() {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.started || c.closed {
		return
	}
	changed, ok := c.table.setOwn(key, level, c.now())
	switch {
	case !ok:
		c.st.rejected.Add(1)
		c.log.Debug("coordinator: lease table full of own keys", "key", key)
	case !changed:
	case level == shard.Level1:
		delete(c.announce, key)
	case encodable(key, c.cfg.MaxKeyLen):
		c.announce[key] = struct{}{}
		c.wake(c.wakePub)
	default:
		c.st.unpublished.Add(1)
	}
}

// wake signals a goroutine without blocking.
func (c *NATS) wake(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// sweeper expires leases and peers.
//
// It runs every sweep interval, and also at the soonest expiry when that
// comes earlier, so that a lease lapses when its ttl is up rather than up to
// a sweep interval later: instances that received the same lease then leave
// its level within a millisecond or so of each other.
func (c *NATS) sweeper() {
	defer c.wg.Done()
	t := time.NewTimer(c.sweep)
	defer t.Stop()
	for {
		select {
		case <-c.done:
			return
		case <-t.C:
		case <-c.wakeSweep:
		}
		c.mu.Lock()
		t.Reset(max(c.sweepLocked(c.now()), time.Millisecond))
		c.mu.Unlock()
	}
}

// sweepLocked expires the leases and peers that are out of time at now. It
// returns how long after now it is due again. The caller holds c.mu.
func (c *NATS) sweepLocked(now time.Time) time.Duration {
	next := c.table.sweep(now)
	dead := now.Add(-peerTimeout * c.cfg.Heartbeat)
	for p, last := range c.peers {
		if !last.After(dead) {
			delete(c.peers, p)
		}
	}
	for p, first := range c.once {
		if !first.After(dead) {
			delete(c.once, p)
		}
	}
	c.setLiveLocked()
	if c.sign != nil {
		c.seenMsg.sweep(now)
		c.seenSync.sweep(now)
		c.seenGossip.sweep(now)
	}
	c.sweepRegions(now)
	return next
}

// dispatcher calls the Handler, one change at a time.
func (c *NATS) dispatcher() {
	defer c.wg.Done()
	for {
		select {
		case <-c.done:
			return
		case <-c.wakeDisp:
		}
		c.mu.Lock()
		batch := c.table.changes()
		live := 0
		if c.live != c.toldLive {
			live, c.toldLive = c.live, c.live
		}
		c.mu.Unlock()
		if live > 0 {
			c.h.SetInstances(live)
		}
		for k, ch := range batch {
			select {
			case <-c.done:
				return
			default:
			}
			c.h.SetLevel(k, ch.hash, ch.level)
		}
	}
}

// receiver hands the control messages to onMsg, one at a time.
func (c *NATS) receiver() {
	defer c.wg.Done()
	for {
		select {
		case <-c.done:
			return
		case m := <-c.ctl:
			c.onMsg(m)
		}
	}
}

// subs returns the subscriptions made so far.
func (c *NATS) subs() []*nats.Subscription {
	var subs []*nats.Subscription
	for _, s := range append(c.ctlSubs[:len(c.ctlSubs):len(c.ctlSubs)], c.gossipSub, c.rs.sub, c.inboxSub) {
		if s != nil {
			subs = append(subs, s)
		}
	}
	return subs
}

// unsubscribe removes the subscriptions made so far.
func (c *NATS) unsubscribe() {
	for _, s := range c.subs() {
		_ = s.Unsubscribe()
	}
}

// Close implements Coordinator: it stops the goroutines, unsubscribes and
// waits; the connection stays open, the caller's to close. The Handler is
// not called once Close has returned. Calling it again does nothing.
func (c *NATS) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	started := c.started
	c.mu.Unlock()
	if !started {
		return nil
	}
	close(c.done)
	c.unsubscribe()
	c.wg.Wait()
	c.gossipMu.Lock()
	c.gossipClosed = true
	c.gossipMu.Unlock()
	c.rs.mu.Lock()
	c.rs.closed = true
	c.rs.mu.Unlock()
	c.pubGossipMu.Lock() // a PublishGossip under way is done
	c.pubGossipMu.Unlock()
	return nil
}

// Connected implements Gossiper: whether the connection is up now. It is
// false before Start and after Close.
func (c *NATS) Connected() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.started && !c.closed && c.nc.IsConnected()
}

// MaxGossip implements Gossiper: Config.MaxMessage less GossipOverhead
// (65,429 bytes by default), fixed by NewNATS. The NATS servers' max_payload
// (1 MiB by default) must be at least MaxMessage.
func (c *NATS) MaxGossip() int { return c.cfg.MaxMessage - GossipOverhead }
