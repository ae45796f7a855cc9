package coordinator

import (
	"errors"
	"fmt"
	"maps"
	"time"

	"github.com/hotkeyd/hotkey/shard"
)

// seal returns msg signed for subject, or msg itself without a Secret.
func (c *NATS) seal(subject string, msg []byte) []byte {
	if c.sign == nil {
		return msg
	}
	return c.sign.seal(subject, msg, c.now())
}

// publish sends one message, signed with a Secret; failures are counted,
// never returned: the table heals by renewal and resync.
func (c *NATS) publish(subject string, data []byte) {
	if err := c.nc.Publish(subject, c.seal(subject, data)); err != nil {
		c.st.publishErrors.Add(1)
		return
	}
	c.st.published.Add(1)
}

// Errors of PublishGossip, wrapped with context.
var (
	ErrGossipSize   = errors.New("coordinator: gossip payload empty or larger than MaxGossip")
	ErrNotConnected = errors.New("coordinator: not connected to NATS")
	ErrClosed       = errors.New("coordinator: not started, or closed")
)

var _ Gossiper = (*NATS)(nil)

// envelope returns payload in a gossip envelope for subject: signed, with
// a stamp, with a Secret.
func (c *NATS) envelope(subject string, payload []byte) []byte {
	b := make([]byte, 0, len(payload)+GossipOverhead)
	if c.sign == nil {
		return appendEnvelope(b, c.cfg.ID, false, 0, payload)
	}
	b = appendEnvelope(b, c.cfg.ID, true, c.sign.stamp(c.now()), payload)
	return c.sign.sealBinary(subject, b)
}

// PublishGossip implements Gossiper: it publishes payload, in an envelope
// (signed with a Secret), on <prefix>.<ns>.gossip. It returns an error
// wrapping ErrGossipSize for an empty payload or one over MaxGossip,
// ErrClosed before Start or after Close, ErrNotConnected while the
// connection is down, or nats.go's; each is counted in
// Stats.GossipPublishErrors. Calls are serialized, and one may block while
// nats.go flushes its buffer. The caller keeps payload.
func (c *NATS) PublishGossip(payload []byte) error {
	if len(payload) == 0 || len(payload) > c.MaxGossip() {
		c.st.gossipPublishErrors.Add(1)
		return fmt.Errorf("%w: %d bytes, at most %d", ErrGossipSize, len(payload), c.MaxGossip())
	}
	c.pubGossipMu.Lock()
	defer c.pubGossipMu.Unlock()
	if err := c.canPublish(); err != nil {
		c.st.gossipPublishErrors.Add(1)
		return fmt.Errorf("coordinator: publish gossip: %w", err)
	}
	data := c.envelope(c.subjGossip, payload)
	if err := c.nc.Publish(c.subjGossip, data); err != nil {
		c.st.gossipPublishErrors.Add(1)
		return fmt.Errorf("coordinator: publish gossip: %w", err)
	}
	c.st.gossipPublished.Add(1)
	c.st.gossipBytes.Add(uint64(len(data)))
	return nil
}

// canPublish returns ErrClosed before Start or after Close, and
// ErrNotConnected while the connection is down; nil if a payload may go.
func (c *NATS) canPublish() error {
	c.mu.Lock()
	live := c.started && !c.closed
	c.mu.Unlock()
	switch {
	case !live:
		return ErrClosed
	case !c.nc.IsConnected():
		return ErrNotConnected
	}
	return nil
}

// syncWindow is when replies to the latest join sync are applied: until
// SyncWait after the request or after the last reply applied, and at most
// MaxSyncSpans × SyncWait after the request.
type syncWindow struct{ asked, until time.Time }

// requestSync asks the peers for their tables; replies are applied as
// they come (see syncWindow).
func (c *NATS) requestSync() {
	now := c.now()
	c.syncUntil.Store(&syncWindow{asked: now, until: now.Add(c.cfg.SyncWait)})
	if err := c.nc.PublishRequest(c.subjSync, c.inbox, c.seal(c.subjSync, encodeControl(c.cfg.ID, typeSyncReq))); err != nil {
		c.st.publishErrors.Add(1)
		return
	}
	c.st.published.Add(1)
	c.st.syncRequests.Add(1)
}

// publisher sends everything this instance publishes: announced leases at
// once, renewals every TTL/3, heartbeats, sync answers, and after a
// reconnect every own lease and a sync request. Publishing may block on the
// network (nats.go writes through when its buffer fills), so it never runs
// under c.mu nor on an Announce caller.
func (c *NATS) publisher(lastReconnects uint64) {
	defer c.wg.Done()
	conn := connWatch{reconnects: lastReconnects, down: !c.nc.IsConnected()}
	renew := time.NewTicker(c.cfg.TTL / 3)
	defer renew.Stop()
	hb := time.NewTicker(c.cfg.Heartbeat)
	defer hb.Stop()
	for {
		select {
		case <-c.done:
			return
		case <-c.wakePub:
			c.publishAnnounced()
			c.answerSync()
		case <-renew.C:
			c.publishOwn()
		case <-hb.C:
			c.publish(c.subjHB, encodeControl(c.cfg.ID, typeHB))
		}
		disconnects, reconnected := conn.poll(c.nc.Stats().Reconnects, c.nc.IsConnected())
		c.st.disconnects.Add(disconnects)
		if reconnected {
			c.st.reconnects.Add(1)
			c.log.Debug("coordinator: reconnected to NATS: own leases published again, tables asked for")
			c.publish(c.subjHB, encodeControl(c.cfg.ID, typeHB))
			c.publishOwn()
			c.requestSync()
		}
	}
}

// connWatch follows a connection the coordinator does not own by polling
// it: its reconnect count (nats.Statistics) and whether it is up.
type connWatch struct {
	reconnects uint64 // the connection's count when last polled
	down       bool   // it was down when last polled, and that was counted
}

// poll takes the connection's reconnect count and state now, and returns
// the disconnects since the last poll and whether it reconnected since.
// Every reconnect follows a disconnect, so disconnects too short to be
// polled count as well; the first connection of one made with
// nats.RetryOnFailedConnect counts as a reconnect but not as a disconnect,
// being down when first polled.
func (w *connWatch) poll(reconnects uint64, connected bool) (disconnects uint64, reconnected bool) {
	if reconnects != w.reconnects {
		disconnects = reconnects - w.reconnects
		if w.down {
			disconnects--
		}
		w.reconnects, reconnected = reconnects, true
		w.down = false
	}
	if !connected && !w.down {
		w.down = true
		disconnects++
	}
	return disconnects, reconnected
}

// publishAnnounced publishes the own leases announced since the last call.
func (c *NATS) publishAnnounced() {
	c.mu.Lock()
	if len(c.announce) == 0 {
		c.mu.Unlock()
		return
	}
	leases := make(map[string]shard.Level, len(c.announce))
	for k := range c.announce {
		if l, ok := c.table.own[k]; ok {
			leases[k] = l
		}
	}
	clear(c.announce)
	c.table.published(leases, c.now())
	c.mu.Unlock()
	c.publishLeases(leases)
}

// publishOwn publishes every own lease (renewal).
func (c *NATS) publishOwn() {
	c.mu.Lock()
	leases := maps.Clone(c.table.own)
	c.table.published(leases, c.now())
	c.mu.Unlock()
	c.publishLeases(leases)
}

func (c *NATS) publishLeases(leases map[string]shard.Level) {
	for k, l := range leases {
		if encodable(k, c.cfg.MaxKeyLen) {
			c.publish(c.subjLease, encodeLease(c.cfg.ID, k, l, c.cfg.TTL))
		}
	}
}

// answerSync answers the queued sync requests with every unexpired lease
// this instance knows: its own (with a full TTL, since it renews them) and
// its peers' (with the time they have left); and, if the Handler is a
// GossipHandler, with the payloads of its GossipSnapshot, taken once for
// all the requests queued and sent as it builds them, so that the first
// reach the joiners while the rest are built.
func (c *NATS) answerSync() {
	type item struct {
		key   string
		level shard.Level
		ttl   time.Duration
	}
	c.mu.Lock()
	if len(c.syncQ) == 0 {
		c.mu.Unlock()
		return
	}
	replyTo := c.syncQ
	c.syncQ = nil
	var items []item
	c.table.each(c.now(), func(key string, level shard.Level, ttl time.Duration, own bool) {
		if !own || encodable(key, c.cfg.MaxKeyLen) {
			items = append(items, item{key, level, ttl})
		}
	})
	c.mu.Unlock()
	limit := c.cfg.MaxMessage
	if mp := c.nc.MaxPayload(); mp > 0 && int64(limit) > mp {
		limit = int(mp)
	}
	if c.sign != nil {
		limit -= sealOverhead
	}
	ch := newSyncChunker(c.cfg.ID, limit)
	for _, it := range items {
		ch.add(it.key, it.level, it.ttl)
	}
	chunks := ch.done()
	for _, reply := range replyTo {
		for _, b := range chunks {
			c.publish(reply, b)
		}
	}
	if gh, ok := c.h.(GossipHandler); ok {
		gh.GossipSnapshot(c.MaxGossip(), func(p []byte) {
			for _, reply := range replyTo {
				c.publishGossipSync(reply, p)
			}
		})
	}
	c.st.syncAnswered.Add(uint64(len(replyTo)))
}

// publishGossipSync sends one payload of this instance's gossip snapshot
// to reply, the inbox of a sync request, in an envelope signed for it.
// Failures are counted, never returned, as publish's.
func (c *NATS) publishGossipSync(reply string, payload []byte) {
	if len(payload) == 0 || len(payload) > c.MaxGossip() {
		c.st.publishErrors.Add(1)
		return
	}
	if err := c.nc.Publish(reply, c.envelope(reply, payload)); err != nil {
		c.st.publishErrors.Add(1)
		return
	}
	c.st.published.Add(1)
	c.st.gossipSyncSent.Add(1)
}
