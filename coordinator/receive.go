package coordinator

import (
	"time"

	"github.com/nats-io/nats.go"

	"github.com/hotkeyd/hotkey/shard"
)

// applyLeaseLocked merges a lease of peer origin, received at now, into the
// table. The caller holds c.mu.
func (c *NATS) applyLeaseLocked(origin, key string, level shard.Level, ttlMs int64, now time.Time) {
	if !c.table.applyLease(origin, key, level, time.Duration(ttlMs)*time.Millisecond, now) {
		c.st.rejected.Add(1)
	}
}

// heardLocked records a heartbeat of origin, received at now. A live peer's
// stays live; another origin becomes a live peer at its second heartbeat
// within the peer timeout, so that an origin heard once (one forged message)
// never counts. Origins heard once are capped at MaxPeers like live peers:
// a new one then takes the place of an arbitrary other, so that a flood of
// them delays a real peer at most (a Secret stops such floods). The caller
// holds c.mu.
func (c *NATS) heardLocked(origin string, now time.Time) {
	if _, ok := c.peers[origin]; ok {
		c.peers[origin] = now
		return
	}
	first, ok := c.once[origin]
	if ok && now.Sub(first) < peerTimeout*c.cfg.Heartbeat {
		if len(c.peers) >= c.cfg.MaxPeers {
			c.st.peersRejected.Add(1)
			return
		}
		delete(c.once, origin)
		c.peers[origin] = now
		c.setLiveLocked()
		return
	}
	if !ok && len(c.once) >= c.cfg.MaxPeers {
		for o := range c.once {
			delete(c.once, o)
			break
		}
		c.st.peersRejected.Add(1)
	}
	c.once[origin] = now
}

// setLiveLocked recomputes the live count. The caller holds c.mu.
func (c *NATS) setLiveLocked() {
	if n := min(1+len(c.peers), c.cfg.MaxInstances); n != c.live {
		c.live = n
		c.wake(c.wakeDisp)
	}
}

// onMsg receives the messages of <prefix>.<ns>.*: leases, heartbeats and
// sync requests. It runs on the subscription's goroutine.
func (c *NATS) onMsg(m *nats.Msg) {
	msg, now, ok := c.receive(m, c.seenMsg, func(msg message) reason {
		switch {
		case m.Subject == c.subjLease && msg.T == typeLease,
			m.Subject == c.subjHB && msg.T == typeHB:
		case m.Subject == c.subjSync && msg.T == typeSyncReq:
			if m.Reply == "" {
				return reasonReply
			}
		default:
			return reasonType
		}
		return reasonNone
	})
	if !ok {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return
	}
	switch msg.T {
	case typeLease:
		c.applyLeaseLocked(msg.Origin, msg.Key, msg.Level, msg.TTLms, now)
	case typeHB:
		c.heardLocked(msg.Origin, now)
	case typeSyncReq:
		if len(c.syncQ) >= maxSyncQueue {
			c.st.dropped.Add(1)
			return
		}
		c.syncQ = append(c.syncQ, m.Reply)
		c.wake(c.wakePub)
	}
}

// onSyncReply receives replies to this instance's sync requests: JSON
// leases, and gossip envelopes of the peers' snapshots.
func (c *NATS) onSyncReply(m *nats.Msg) {
	if len(m.Data) == 0 && m.Header.Get("Status") == "503" {
		// The server's "no responders": nobody else is subscribed to the
		// sync subject (yet).
		c.st.noResponders.Add(1)
		return
	}
	if isEnvelope(m.Data) {
		c.onGossipSync(m)
		return
	}
	msg, now, ok := c.receive(m, c.seenSync, func(msg message) reason {
		if msg.T != typeSync {
			return reasonType
		}
		return reasonNone
	})
	if !ok {
		return
	}
	if !c.syncReply(now) {
		c.st.lateReplies.Add(1)
		return
	}
	defer c.syncApplied()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return
	}
	c.st.syncReplies.Add(1)
	for _, l := range msg.Leases {
		c.applyLeaseLocked(msg.Origin, l.Key, l.Level, l.TTLms, now)
	}
}

// syncReply reports whether a sync reply received at now is to be applied:
// one already queued when the reply before it was applied (syncApplied),
// or one received in the window of the latest request (syncWindow); never
// past MaxSyncSpans × SyncWait after the request. Called on the inbox
// subscription's goroutine, as syncApplied.
func (c *NATS) syncReply(now time.Time) bool {
	w := c.syncUntil.Load()
	switch {
	case w == nil || now.After(w.asked.Add(MaxSyncSpans*c.cfg.SyncWait)):
		return false
	case c.syncQueued > 0:
		c.syncQueued--
		return true
	}
	return !now.After(w.until)
}

// syncApplied notes that a sync reply was applied: the window stays open
// until SyncWait from now, and the replies queued behind it meanwhile are
// in time, however long this instance took to apply it. So replies are
// taken as long as they keep coming, not for a fixed time.
func (c *NATS) syncApplied() {
	c.keepSync(c.now())
	if n, _, err := c.inboxSub.Pending(); err == nil {
		c.syncQueued = max(0, n-1) // nats.go counts the message in hand until its callback returns
	}
}

// keepSync keeps the latest sync's window open until SyncWait after now,
// and at most MaxSyncSpans × SyncWait after its request.
func (c *NATS) keepSync(now time.Time) {
	for {
		w := c.syncUntil.Load()
		if w == nil {
			return
		}
		until := now.Add(c.cfg.SyncWait)
		if last := w.asked.Add(MaxSyncSpans * c.cfg.SyncWait); until.After(last) {
			until = last
		}
		if !until.After(w.until) || c.syncUntil.CompareAndSwap(w, &syncWindow{asked: w.asked, until: until}) {
			return
		}
	}
}

// receive counts m, checks its signature (with a Secret), decodes it, and
// checks it further with check (its type against the subject). With a
// Secret, it also checks the stamp: within MaxClockSkew of the clock, and
// above the last one guard accepted from the origin. It drops m, counted,
// if it is invalid or this instance's own, and reports whether m is to be
// applied, with the time it was received at.
func (c *NATS) receive(m *nats.Msg, guard *replayGuard, check func(message) reason) (message, time.Time, bool) {
	now := c.now()
	c.st.received.Add(1)
	var msg message
	r := reasonNone
	if c.sign != nil && len(m.Data) <= c.lim.maxMessage {
		r = c.sign.verify(m.Subject, m.Data)
	}
	if r == reasonNone {
		msg, r = decode(m.Data, c.lim)
	}
	if r == reasonNone {
		r = check(msg)
	}
	if r == reasonNone && c.sign != nil && !fresh(msg.TS, now, c.cfg.MaxClockSkew) {
		r = reasonStale
	}
	if r != reasonNone {
		c.invalid(r, m.Subject)
		return msg, now, false
	}
	return msg, now, c.fromPeer(msg.Origin, msg.TS, m.Subject, guard, now)
}

// fromPeer reports whether a valid message from origin, stamped stamp and
// received on subject at now, is to be applied: not this instance's own
// (counted), and with a Secret, accepted by guard as no replay (refusals
// counted).
func (c *NATS) fromPeer(origin string, stamp int64, subject string, guard *replayGuard, now time.Time) bool {
	if origin == c.cfg.ID {
		c.st.own.Add(1)
		return false
	}
	if c.sign != nil {
		r, full := guard.accept(origin, stamp, now)
		if full {
			c.st.dropped.Add(1)
			return false
		}
		if r != reasonNone {
			c.invalid(r, subject)
			return false
		}
	}
	return true
}

func (c *NATS) invalid(r reason, subject string) {
	c.st.invalid[r].Add(1)
	c.log.Debug("coordinator: invalid message dropped", "reason", r.String(), "subject", subject)
}

// onGossip receives the messages of <prefix>.<ns>.gossip on the gossip
// subscription's goroutine, and hands each valid peer's payload to the
// Handler's Gossip.
func (c *NATS) onGossip(m *nats.Msg) {
	e, _, ok := c.receiveEnvelope(m, c.seenGossip)
	if !ok {
		return
	}
	c.handGossip(func(h GossipHandler) {
		h.Gossip(e.payload)
		c.st.gossipReceived.Add(1) // once handled: a reader of the count sees its charges
	})
}

// onGossipSync receives a gossip envelope of a peer's snapshot, sent to
// this instance's inbox in answer to its sync request, and hands its
// payload to the Handler's GossipSync if it came within SyncWait.
func (c *NATS) onGossipSync(m *nats.Msg) {
	e, now, ok := c.receiveEnvelope(m, c.seenSync)
	if !ok {
		return
	}
	if !c.syncReply(now) {
		c.st.lateReplies.Add(1)
		return
	}
	c.handGossip(func(h GossipHandler) {
		c.st.gossipSyncApplied.Add(1)
		h.GossipSync(e.payload)
	})
	c.syncApplied()
}

// handGossip calls f with the Handler if it is a GossipHandler, and counts
// the payload ignored if not. f is never called once Close has returned,
// nor while another f runs.
func (c *NATS) handGossip(f func(GossipHandler)) {
	h, ok := c.h.(GossipHandler)
	if !ok {
		c.st.gossipIgnored.Add(1)
		return
	}
	c.gossipMu.Lock()
	defer c.gossipMu.Unlock()
	if c.gossipClosed {
		return
	}
	f(h)
}

// receiveEnvelope counts m and decodes it as a gossip envelope. With a
// Secret, it checks the MAC for m's subject and the stamp: within
// MaxClockSkew of the clock, and above the last one guard accepted from
// the origin. It drops m, counted, if it is invalid or this instance's
// own, and reports whether its payload is to be handed on, with the time
// it was received at.
func (c *NATS) receiveEnvelope(m *nats.Msg, guard *replayGuard) (envelope, time.Time, bool) {
	now := c.now()
	c.st.received.Add(1)
	e, r := decodeEnvelope(m.Data, c.lim.maxMessage)
	if r == reasonNone && c.sign != nil {
		switch {
		case !e.signed:
			r = reasonUnsigned
		default:
			r = c.sign.verifyBinary(m.Subject, e.body, e.mac)
		}
		if r == reasonNone && !fresh(e.stamp, now, c.cfg.MaxClockSkew) {
			r = reasonStale
		}
	}
	if r != reasonNone {
		c.invalid(r, m.Subject)
		return e, now, false
	}
	return e, now, c.fromPeer(e.origin, e.stamp, m.Subject, guard, now)
}
