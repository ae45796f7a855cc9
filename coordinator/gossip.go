package coordinator

// GossipHandler is a Handler that takes part in gossip: the per-round
// counts of the engine's gossip-synced policies (see package gossip). A
// coordinator that carries gossip (a Gossiper) hands it its peers'
// payloads; Local has no peers and never calls these methods. To the
// coordinator a payload is opaque bytes.
type GossipHandler interface {
	Handler
	// Gossip is given the payload of a peer's gossip message: checked as
	// the coordinator's other messages are (signature and freshness with a
	// Secret), and never this instance's own. It is called from the
	// coordinator's receiving goroutine, possibly at the same time as the
	// Handler's other methods, and should return quickly.
	Gossip(payload []byte)
	// GossipSnapshot calls send with each payload, of at most maxBytes,
	// that carries this instance's current view of its gossiped counters,
	// as soon as it is built: send hands it to the joining peers that asked
	// (sync requests), and may block on the network; it keeps no reference
	// to the payload. It is called off the decision path.
	GossipSnapshot(maxBytes int, send func(payload []byte))
	// GossipSync is given one payload of a peer's snapshot, received in
	// answer to this instance's sync request (at Start and after a
	// reconnect) within SyncWait of the request or of the last reply
	// applied, checked as Gossip's are. Gossip and
	// GossipSync are never called at the same time, nor after Close has
	// returned.
	GossipSync(payload []byte)
}

// Gossiper is a Coordinator that carries gossip between instances.
type Gossiper interface {
	Coordinator
	// PublishGossip sends payload to every peer, signed as the
	// coordinator's other messages are. It returns an error if the
	// message was not handed to NATS: larger than MaxGossip, not
	// connected, or closed. It may block on the network, so it is called
	// off the decision path.
	PublishGossip(payload []byte) error
	// MaxGossip is the largest payload PublishGossip takes and
	// GossipSnapshot is asked for. It does not change.
	MaxGossip() int
	// Connected reports whether the coordinator reaches NATS now. While it
	// does not, a gossip-synced policy decides on this instance's counts
	// alone.
	Connected() bool
}
