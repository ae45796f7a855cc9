package coordinator

import (
	"sync/atomic"
	"time"

	"github.com/hotkeyd/hotkey/shard"
)

// Stats are a coordinator's counters since Start, for metrics.
type Stats struct {
	Published     uint64            // messages published: leases, heartbeats, sync requests and answers
	PublishErrors uint64            // publishes nats.go refused (disconnected, closed, too large); renewal and resync repair them
	Received      uint64            // messages received, valid or not
	Own           uint64            // own messages received back and ignored
	Invalid       uint64            // invalid messages dropped: the sum of InvalidBy
	InvalidBy     map[string]uint64 // invalid messages by reason: size, json, version, type, origin, key, level, ttl, reply, ts, envelope (a malformed gossip envelope); with a Secret also unsigned, signature, stale, replay
	Rejected      uint64            // valid leases for a new key dropped because MaxHotKeys keys were held
	PeersRejected uint64            // origins not made live peers because MaxPeers were live, or forgotten after one heartbeat because MaxPeers others were heard once
	Dropped       uint64            // messages lost to slow consumption, sync requests left unanswered (too many queued), and signed messages of a new origin while MaxPeers origins' stamps were kept
	LateReplies   uint64            // sync replies that came after SyncWait, not applied
	Unpublished   uint64            // own leases applied here only: key not UTF-8 or over MaxKeyLen
	SyncRequests  uint64            // join syncs sent (at Start and after each reconnect)
	SyncAnswered  uint64            // peers' sync requests answered
	SyncReplies   uint64            // sync reply messages applied
	NoResponders  uint64            // sync requests nobody else was subscribed to (the server said so)
	Reconnects    uint64            // reconnections handled (own leases republished, table resynced)
	Disconnects   uint64            // disconnections of the connection, counted within a heartbeat (or at the reconnect that follows)
	Keys          int               // distinct keys in the lease table
	OwnKeys       int               // keys this instance holds a lease for
	Peers         int               // live peers, this instance excluded (the Handler is told min(1+Peers, MaxInstances))
	PendingPeers  int               // origins heard once, live at their second heartbeat within 3 intervals

	// Gossip (Gossiper). Gossip messages count in Received, Own, Invalid and
	// Dropped too; the snapshots sent in sync answers in Published.
	GossipPublished      uint64 // gossip messages PublishGossip handed to NATS
	GossipPublishErrors  uint64 // PublishGossip calls that returned an error: payload empty or over MaxGossip, not connected, closed, or refused by nats.go
	GossipBytesPublished uint64 // bytes of those messages, envelopes included
	GossipReceived       uint64 // peers' gossip payloads the Handler's Gossip has handled
	GossipIgnored        uint64 // valid gossip payloads dropped because the Handler is no GossipHandler
	GossipSyncSent       uint64 // gossip snapshot payloads sent in answer to peers' sync requests
	GossipSyncApplied    uint64 // peers' gossip snapshot payloads handed to the Handler's GossipSync (late ones count in LateReplies)

	// Rounds between regions (RegionPublisher). Their messages count in
	// Received, Own, Invalid (a message from no other region of
	// Config.Regions as "region") and Dropped too.
	RegionPublished      uint64 // messages PublishRegion handed to NATS
	RegionPublishErrors  uint64 // PublishRegion calls that returned an error
	RegionBytesPublished uint64 // bytes of those messages, envelopes included
	RegionReceived       uint64 // other regions' payloads the Handler's RegionRound has handled
	RegionIgnored        uint64 // valid payloads dropped because the Handler is no RegionHandler
}

// counters are the atomic counters behind Stats.
type counters struct {
	published, publishErrors, received, own, rejected, peersRejected atomic.Uint64
	dropped, lateReplies, unpublished, syncRequests, syncAnswered    atomic.Uint64
	syncReplies, noResponders, reconnects, disconnects               atomic.Uint64
	invalid                                                          [numReasons]atomic.Uint64

	gossipPublished, gossipPublishErrors, gossipBytes, gossipReceived atomic.Uint64
	gossipIgnored, gossipSyncSent, gossipSyncApplied                  atomic.Uint64
}

// Stats returns the coordinator's counters.
func (c *NATS) Stats() Stats {
	s := Stats{
		Published:     c.st.published.Load(),
		PublishErrors: c.st.publishErrors.Load(),
		Received:      c.st.received.Load(),
		Own:           c.st.own.Load(),
		InvalidBy:     make(map[string]uint64),
		Rejected:      c.st.rejected.Load(),
		PeersRejected: c.st.peersRejected.Load(),
		Dropped:       c.st.dropped.Load(),
		LateReplies:   c.st.lateReplies.Load(),
		Unpublished:   c.st.unpublished.Load(),
		SyncRequests:  c.st.syncRequests.Load(),
		SyncAnswered:  c.st.syncAnswered.Load(),
		SyncReplies:   c.st.syncReplies.Load(),
		NoResponders:  c.st.noResponders.Load(),
		Reconnects:    c.st.reconnects.Load(),
		Disconnects:   c.st.disconnects.Load(),

		GossipPublished:      c.st.gossipPublished.Load(),
		GossipPublishErrors:  c.st.gossipPublishErrors.Load(),
		GossipBytesPublished: c.st.gossipBytes.Load(),
		GossipReceived:       c.st.gossipReceived.Load(),
		GossipIgnored:        c.st.gossipIgnored.Load(),
		GossipSyncSent:       c.st.gossipSyncSent.Load(),
		GossipSyncApplied:    c.st.gossipSyncApplied.Load(),

		RegionPublished:      c.rs.st.published.Load(),
		RegionPublishErrors:  c.rs.st.publishErrors.Load(),
		RegionBytesPublished: c.rs.st.bytes.Load(),
		RegionReceived:       c.rs.st.received.Load(),
		RegionIgnored:        c.rs.st.ignored.Load(),
	}
	for r := reasonNone + 1; r < numReasons; r++ {
		if n := c.st.invalid[r].Load(); n > 0 {
			s.InvalidBy[r.String()] = n
			s.Invalid += n
		}
	}
	c.mu.Lock()
	s.Keys, s.OwnKeys, s.Peers, s.PendingPeers = len(c.table.keys), len(c.table.own), len(c.peers), len(c.once)
	started := c.started
	c.mu.Unlock()
	if started {
		for _, sub := range c.subs() {
			if n, err := sub.Dropped(); err == nil {
				s.Dropped += uint64(n)
			}
		}
	}
	return s
}

// Lease is one key of the lease table, as Leases reports it.
type Lease struct {
	Key string
	// Level is the level in force: 4, 16 or 64.
	Level shard.Level
	// ExpiresIn is how long the lease holding Level lasts unless renewed:
	// the latest-expiring lease at that level, this instance's own
	// included (renewed every TTL/3 while its detector finds the key hot).
	ExpiresIn time.Duration
	// Origin is the ID of the instance whose lease that is. For a lease
	// learned by join sync it is the instance that answered.
	Origin string
}

// Leases returns the keys split now (level in force above 1), each with
// the lease that holds its level, ordered by level (highest first), then
// key. It reads the table under the coordinator's lock: meant for status
// pages, not for the decision path.
func (c *NATS) Leases() []Lease {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.started {
		return nil
	}
	return c.table.leases(c.now())
}

var _ Reporter = (*NATS)(nil)
