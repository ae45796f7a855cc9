package coordinator

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
)

// Rounds between regions. With Config.Region and Config.Regions set, a
// NATS coordinator also carries the payloads of a RegionHandler between the
// regions of a supercluster: PublishRegion(to, payload) publishes on
//
//	<prefix>.<ns>.regions.<to>.<from>
//
// in a gossip envelope (envelope.go), signed with a Secret as the gossip
// is, but under the scope <prefix>.<ns> that every region shares (a
// region's own messages are signed under <prefix>.<ns>.<region>, which
// another region cannot verify, so that neither can pass for the other).
// Every instance of a region subscribes to <prefix>.<ns>.regions.<own>.*
// (no queue group: each applies what it receives, and the Handler makes
// that idempotent) and hands a payload to the Handler's RegionRound with
// the region that sent it, read from the subject and covered by the MAC.
// A message from a region not in Config.Regions, or from its own, is
// dropped and counted by reason "region"; the gossip checks (envelope,
// signature, stale, replay) apply as they do to gossip.

// RegionHandler is a Handler that takes part in the exchange between
// regions. The coordinator hands it the payloads of other regions'
// instances; to the coordinator a payload is opaque bytes.
type RegionHandler interface {
	Handler
	// RegionRound is given the payload of an instance of region from,
	// one of Config.Regions other than this one's, checked as gossip is
	// (signature and freshness with a Secret). It is called from the
	// region subscription's goroutine, never at the same time as another
	// RegionRound, nor after Close has returned, and should return
	// quickly: payloads wait behind it, up to nats.go's pending limits.
	RegionRound(from string, payload []byte)
}

// RegionPublisher is a Coordinator that carries payloads between regions.
type RegionPublisher interface {
	Coordinator
	// PublishRegion sends payload to every instance of region to, signed
	// as gossip is. It returns an error if the message was not handed to
	// NATS: to not another region of Config.Regions, payload empty or
	// over MaxGossip, not connected, or closed. It may block on the
	// network.
	PublishRegion(to string, payload []byte) error
	// MaxGossip is the largest payload PublishRegion takes.
	MaxGossip() int
	// Regions returns the other regions of Config.Regions, sorted.
	Regions() []string
}

var _ RegionPublisher = (*NATS)(nil)

// ErrRegion is wrapped by PublishRegion's error for a region it does not
// send to.
var ErrRegion = fmt.Errorf("coordinator: not another region of Config.Regions")

// regionState is what a NATS coordinator keeps for the exchange between
// regions; the zero value (no Config.Regions) carries nothing.
type regionState struct {
	others []string     // Config.Regions but Config.Region, sorted
	prefix string       // <prefix>.<ns>.regions.
	sign   *signer      // scope <prefix>.<ns>; nil without Secret
	seen   *replayGuard // stamps on the region subjects; nil without Secret
	sub    *nats.Subscription
	st     regionCounters

	// mu is held while a payload is handed to the Handler, so that
	// RegionRound is never called twice at once nor after Close. It
	// guards closed.
	mu     sync.Mutex
	closed bool
}

// regionCounters are the counters behind the Region fields of Stats.
type regionCounters struct {
	published, publishErrors, bytes, received, ignored atomic.Uint64
}

// initRegions sets up c.rs from the configuration. The caller is NewNATS.
func (c *NATS) initRegions() {
	if c.cfg.Region == "" || len(c.cfg.Regions) == 0 {
		return
	}
	scope := c.cfg.Prefix + "." + c.cfg.Namespace
	c.rs.prefix = scope + ".regions."
	for _, r := range c.cfg.Regions {
		if r != c.cfg.Region && !slices.Contains(c.rs.others, r) {
			c.rs.others = append(c.rs.others, r)
		}
	}
	slices.Sort(c.rs.others)
	if c.cfg.Secret != nil {
		c.rs.sign = &signer{secret: c.cfg.Secret, scope: scope, window: c.cfg.MaxClockSkew}
		c.rs.seen = newReplayGuard(c.cfg.MaxClockSkew, c.cfg.MaxPeers)
	}
}

// Regions implements RegionPublisher.
func (c *NATS) Regions() []string { return slices.Clone(c.rs.others) }

// subscribeRegions subscribes to the rounds sent to this region, if it
// exchanges with others. The caller holds c.mu, in connect.
func (c *NATS) subscribeRegions() (err error) {
	if len(c.rs.others) == 0 {
		return nil
	}
	if c.rs.seen != nil {
		c.rs.seen.since(c.now())
	}
	c.rs.sub, err = c.nc.Subscribe(c.rs.prefix+c.cfg.Region+".*", c.onRegion)
	if err != nil {
		return fmt.Errorf("coordinator: subscribe: %w", err)
	}
	return nil
}

// PublishRegion implements RegionPublisher: it publishes payload, in an
// envelope (signed with a Secret), on <prefix>.<ns>.regions.<to>.<own>.
// Errors are counted in Stats.RegionPublishErrors and wrap ErrRegion,
// ErrGossipSize, ErrClosed, ErrNotConnected or nats.go's. Calls are
// serialized with PublishGossip's.
func (c *NATS) PublishRegion(to string, payload []byte) error {
	if !slices.Contains(c.rs.others, to) {
		c.rs.st.publishErrors.Add(1)
		return fmt.Errorf("%w: %q", ErrRegion, to)
	}
	if len(payload) == 0 || len(payload) > c.MaxGossip() {
		c.rs.st.publishErrors.Add(1)
		return fmt.Errorf("%w: %d bytes, at most %d", ErrGossipSize, len(payload), c.MaxGossip())
	}
	c.pubGossipMu.Lock()
	defer c.pubGossipMu.Unlock()
	if err := c.canPublish(); err != nil {
		c.rs.st.publishErrors.Add(1)
		return fmt.Errorf("coordinator: publish to region %s: %w", to, err)
	}
	subject := c.rs.prefix + to + "." + c.cfg.Region
	b := make([]byte, 0, len(payload)+GossipOverhead)
	if c.rs.sign == nil {
		b = appendEnvelope(b, c.cfg.ID, false, 0, payload)
	} else {
		b = c.rs.sign.sealBinary(subject, appendEnvelope(b, c.cfg.ID, true, c.rs.sign.stamp(c.now()), payload))
	}
	if err := c.nc.Publish(subject, b); err != nil {
		c.rs.st.publishErrors.Add(1)
		return fmt.Errorf("coordinator: publish to region %s: %w", to, err)
	}
	c.rs.st.published.Add(1)
	c.rs.st.bytes.Add(uint64(len(b)))
	return nil
}

// onRegion receives a message of <prefix>.<ns>.regions.<own>.<from> on the
// region subscription's goroutine, and hands a valid one's payload to the
// Handler's RegionRound.
func (c *NATS) onRegion(m *nats.Msg) {
	now := c.now()
	c.st.received.Add(1)
	from := m.Subject[strings.LastIndexByte(m.Subject, '.')+1:]
	if !slices.Contains(c.rs.others, from) {
		c.invalid(reasonRegion, m.Subject)
		return
	}
	e, r := decodeEnvelope(m.Data, c.lim.maxMessage)
	if r == reasonNone && c.rs.sign != nil {
		switch {
		case !e.signed:
			r = reasonUnsigned
		default:
			r = c.rs.sign.verifyBinary(m.Subject, e.body, e.mac)
		}
		if r == reasonNone && !fresh(e.stamp, now, c.cfg.MaxClockSkew) {
			r = reasonStale
		}
	}
	if r != reasonNone {
		c.invalid(r, m.Subject)
		return
	}
	if !c.fromPeer(e.origin, e.stamp, m.Subject, c.rs.seen, now) {
		return
	}
	h, ok := c.h.(RegionHandler)
	if !ok {
		c.rs.st.ignored.Add(1)
		return
	}
	c.rs.mu.Lock()
	defer c.rs.mu.Unlock()
	if c.rs.closed {
		return
	}
	h.RegionRound(from, e.payload)
	c.rs.st.received.Add(1)
}

// sweepRegions forgets the stamps of origins quiet for long. The caller
// holds c.mu.
func (c *NATS) sweepRegions(now time.Time) {
	if c.rs.seen != nil {
		c.rs.seen.sweep(now)
	}
}
