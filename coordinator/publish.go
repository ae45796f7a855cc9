package coordinator

import (
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

// requestSync asks the peers for their tables; replies are applied for
// SyncWait.
func (c *NATS) requestSync() {
	until := c.now().Add(c.cfg.SyncWait)
	c.syncUntil.Store(&until)
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
		if n := c.nc.Stats().Reconnects; n != lastReconnects {
			lastReconnects = n
			c.st.reconnects.Add(1)
			c.publish(c.subjHB, encodeControl(c.cfg.ID, typeHB))
			c.publishOwn()
			c.requestSync()
		}
	}
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
// its peers' (with the time they have left).
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
		c.st.syncAnswered.Add(1)
	}
}
