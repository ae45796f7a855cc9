package hotkey

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hotkeyd/hotkey/coordinator"
	"github.com/hotkeyd/hotkey/counter"
	"github.com/hotkeyd/hotkey/gossip"
)

// RegionMode says what a policy's limit means across the regions of a
// fleet, each with its own store (WithRegion).
type RegionMode uint8

const (
	// RegionsIndependent: each region enforces the whole limit on its
	// own store, so N regions admit up to N times the limit between them.
	// The zero value.
	RegionsIndependent RegionMode = iota
	// RegionsExchange: the limit is global. Every region interval
	// (WithRegionInterval), each instance sends the other regions, per
	// key, the units it has admitted, and each region charges what it
	// receives to its own counter of the key: usage that admits nothing.
	// The regions together admit at most the limit plus (regions − 1) ×
	// rate × (interval + the slowest delivery between regions); cut off
	// from each other, each admits at most the limit. A key of such a
	// policy is never split: the other regions' units go to its one
	// counter.
	RegionsExchange
	// RegionsShares: the limit, a fixed window's, is split into one share
	// a region, adding up to it exactly, each kept on the region's own
	// store; a region never admits beyond its share, and shares move
	// toward demand within a window, a region with units to spare giving
	// them to one that runs out (regions_shares.go). All regions together
	// never admit more than the limit in a window, cut off from each other
	// too, at the price of denials where demand moved faster than the
	// shares.
	RegionsShares
	numRegionModes
)

var regionModeNames = [numRegionModes]string{"independent", "exchange", "shares"}

// String returns the mode's name: independent, exchange or shares.
func (m RegionMode) String() string {
	if m < numRegionModes {
		return regionModeNames[m]
	}
	return fmt.Sprintf("RegionMode(%d)", uint8(m))
}

// MarshalText returns the mode's name (see String); it fails for a value
// that is not one of the RegionMode constants.
func (m RegionMode) MarshalText() ([]byte, error) {
	if m >= numRegionModes {
		return nil, fmt.Errorf("unknown regions mode %d", uint8(m))
	}
	return []byte(regionModeNames[m]), nil
}

// UnmarshalText sets m to the mode named text (see String). An unknown
// name leaves m as it was.
func (m *RegionMode) UnmarshalText(text []byte) error {
	for i, n := range regionModeNames {
		if n == string(text) {
			*m = RegionMode(i)
			return nil
		}
	}
	return fmt.Errorf("unknown regions mode: %q (want independent, exchange or shares)", text)
}

// DefaultRegionInterval is WithRegionInterval's default.
const DefaultRegionInterval = time.Second

// regionKeep is how long a region keeps what it applied of another
// region's instance's total for a key (counter.TotalOp.Keep) beyond the
// key's period, during which the sender still sends it: longer than any
// message is accepted late (the coordinator's MaxClockSkew, 30 s by
// default, bounds a signed one's age).
const regionKeep = 2 * time.Minute

// maxRegionKeys bounds the keys an exchange holds totals of; past it the
// units admitted on a new key are not sent (counted as full).
const maxRegionKeys = 1 << 17

// exchange sends the units this engine admits under RegionsExchange
// policies to the other regions, and charges theirs to its store.
//
// A sender keeps, per (policy, key), the running total of the units it
// admitted in a segment: from the key's first admission until it has not
// been admitted for a period of its limit. Every interval it sends the
// totals of the keys admitted within their period, every one of them,
// whether it changed or not, so that a message lost, or a partition,
// costs nothing once a later one arrives. A receiver charges each total
// through counter.TotalCharger, which charges what is above the highest
// total it applied for that (sender, segment) and keeps that watermark
// beside the counter: a total applied twice, late or out of order charges
// nothing more, whichever instance of the region applies it. A segment
// that ends starts a new one on the key's next admission, with a total
// from 0 under a new name, so that a watermark forgotten after its keep
// never meets a total it saw.
type exchange struct {
	e        *Engine
	pub      coordinator.RegionPublisher
	to       []string // the other regions
	sender   string   // this life's id
	start    int64    // this life's start, Unix ns
	interval time.Duration
	round    *gossip.Round
	codec    *gossip.Codec

	policies sync.Map // name → *Policy: policies shared with other regions, decided or known (KnowPolicies)

	mu     sync.Mutex // guards totals, seg, seq
	totals map[xkey]*xtotal
	seg    uint64 // segments begun
	seq    uint64 // rounds sent

	shareMu sync.Mutex // guards shares
	shares  map[shareKey]*shareView
	grants  uint64 // grants sent; the region subscription's goroutine's

	sent    map[string]*atomic.Uint64 // units sent, by region to
	charged map[string]*atomic.Uint64 // units charged, by region from
	gave    map[string]*atomic.Uint64 // units granted (shares), by region to
	granted map[string]*atomic.Uint64 // units granted this region (shares), by region from
	last    map[string]*atomic.Int64  // when the last round from a region was applied, Unix ns; 0: never
	drops   [numXDrops]atomic.Uint64
	errors  atomic.Uint64 // messages the coordinator did not take

	done chan struct{} // closed when the loop has stopped
}

// xkey is a (policy, key) an exchange keeps a total of.
type xkey struct{ policy, key string }

// xtotal is the running total of a key's segment.
type xtotal struct {
	seg   uint64
	total int64
	last  int64 // when units were last added, Unix ns
	span  int64 // how long after last the total is sent: the limit's period, ns
}

// Why an exchange dropped what it received, or did not send.
const (
	xdropMalformed = iota // a message that did not decode
	xdropPolicy           // an entry under a policy not known here as RegionsExchange
	xdropKey              // an entry whose key or limit this engine refuses
	xdropStore            // an entry of a policy whose store keeps no totals, or whose charge failed
	xdropFull             // units admitted on a new key past maxRegionKeys, not sent
	xdropLate             // a need or grant of another window, or at a window's edge
	numXDrops
)

var xdropNames = [numXDrops]string{"malformed", "policy", "key", "store", "full", "late"}

// newExchange returns the exchange of e with the other regions of pub,
// or nil if there are none.
func newExchange(e *Engine, pub coordinator.RegionPublisher) *exchange {
	to := pub.Regions()
	if len(to) == 0 || e.opt.region == "" {
		return nil
	}
	cfg := gossip.Config{MaxKeyLen: max(gossip.DefaultMaxKeyLen, e.opt.maxKeyLen), MaxKeys: maxRegionKeys}
	cfg.MaxBytes = max(min(gossip.DefaultMaxBytes, pub.MaxGossip()), gossip.MinBytes(cfg.MaxKeyLen))
	x := &exchange{
		e:        e,
		pub:      pub,
		to:       to,
		sender:   gossipInstanceID(),
		start:    e.opt.clock().UnixNano(),
		interval: e.opt.regionInterval,
		round:    gossip.NewRound(cfg),
		codec:    gossip.NewCodec(cfg),
		totals:   make(map[xkey]*xtotal),
		shares:   make(map[shareKey]*shareView),
		sent:     make(map[string]*atomic.Uint64, len(to)),
		charged:  make(map[string]*atomic.Uint64, len(to)),
		gave:     make(map[string]*atomic.Uint64, len(to)),
		granted:  make(map[string]*atomic.Uint64, len(to)),
		last:     make(map[string]*atomic.Int64, len(to)),
		done:     make(chan struct{}),
	}
	for _, r := range to {
		x.sent[r], x.charged[r], x.last[r] = new(atomic.Uint64), new(atomic.Uint64), new(atomic.Int64)
		x.gave[r], x.granted[r] = new(atomic.Uint64), new(atomic.Uint64)
	}
	return x
}

// know makes p, a policy shared with other regions, known by its name:
// the other regions' totals (exchange), needs and grants (shares) under
// it are taken here.
func (x *exchange) know(p *Policy) {
	if v, ok := x.policies.Load(p.Name); !ok || v.(*Policy) != p {
		x.policies.Store(p.Name, p)
	}
}

// admitted adds n units admitted on key under p, a RegionsExchange
// policy, to the round.
func (x *exchange) admitted(p *Policy, key string, hash uint64, n int64) {
	x.know(p)
	x.round.Add(p.Name, key, hash, n)
}

// run sends a round every interval until stop is closed, then a last
// one, so that the units admitted in it reach the regions still deciding.
func (x *exchange) run(stop <-chan struct{}) {
	defer close(x.done)
	t := time.NewTicker(x.interval)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			x.send(x.e.opt.clock())
		case <-stop:
			x.send(x.e.opt.clock())
			return
		}
	}
}

// send publishes the round of now to every other region.
func (x *exchange) send(now time.Time) {
	msgs, units := x.flush(now)
	for _, to := range x.to {
		ok := true
		for _, m := range msgs {
			if err := x.pub.PublishRegion(to, m); err != nil {
				x.errors.Add(1)
				ok = false
			}
		}
		if ok {
			x.sent[to].Add(uint64(units))
		}
	}
}

// flush moves the round's units into the totals and returns the messages
// of the totals to send at now, and the units added since the last flush.
func (x *exchange) flush(now time.Time) ([][]byte, int64) {
	t := now.UnixNano()
	added := x.round.Flush()
	x.mu.Lock()
	defer x.mu.Unlock()
	var units int64
	for _, a := range added {
		k := xkey{a.Limit, a.Key}
		tot := x.totals[k]
		if tot != nil && t-tot.last > tot.span {
			tot = nil // its segment ended: the next begins
		}
		if tot == nil {
			if len(x.totals) >= maxRegionKeys {
				x.drops[xdropFull].Add(1)
				continue
			}
			span := int64(time.Minute)
			if v, ok := x.policies.Load(a.Limit); ok {
				span = int64(v.(*Policy).Limit.Period)
			}
			x.seg++
			tot = &xtotal{seg: x.seg, span: max(span, 2*int64(x.interval))}
			x.totals[k] = tot
		}
		tot.total += a.Units
		tot.last = t
		units += a.Units
	}
	entries := make([]gossip.Entry, 0, len(x.totals))
	for k, tot := range x.totals {
		if t-tot.last > tot.span {
			delete(x.totals, k) // not sent again: a later admission begins a segment
			continue
		}
		entries = append(entries, gossip.Entry{Limit: segLimit(tot.seg, k.policy), Key: k.key, Units: tot.total})
	}
	x.seq++
	h := gossip.Header{Sender: x.sender, Start: x.start, Round: x.seq}
	if len(entries) == 0 {
		// A round goes out every interval all the same: the other regions
		// tell one that stopped sending from one with nothing to send.
		m, err := x.codec.Empty(h)
		if err != nil {
			x.errors.Add(1)
			return nil, units
		}
		return [][]byte{m}, units
	}
	msgs, err := x.codec.Encode(h, entries)
	if err != nil {
		x.errors.Add(1)
	}
	return msgs, units
}

// segLimit is the limit field of a total's entry: its segment and policy.
func segLimit(seg uint64, policy string) string {
	return strconv.FormatUint(seg, 36) + ":" + policy
}

// parseSegLimit splits an entry's limit field into its segment and policy.
func parseSegLimit(s string) (seg, policy string, ok bool) {
	seg, policy, ok = strings.Cut(s, ":")
	return seg, policy, ok && seg != "" && policy != ""
}

// apply charges the totals of a message from region from, or handles its
// need or grant.
func (x *exchange) apply(from string, payload []byte) {
	if len(payload) > 0 && payload[0] == shareMagic {
		x.applyShare(from, payload)
		return
	}
	msg, err := x.codec.Decode(payload)
	if err != nil {
		x.drops[xdropMalformed].Add(1)
		return
	}
	sender := msg.Sender + "." + strconv.FormatInt(msg.Start, 36) + "."
	var byStore map[counter.TotalCharger][]counter.TotalOp
	for _, en := range msg.Entries {
		seg, name, ok := parseSegLimit(en.Limit)
		v, known := x.policies.Load(name)
		if !ok || !known || v.(*Policy).Regions != RegionsExchange {
			x.drops[xdropPolicy].Add(1)
			continue
		}
		p := v.(*Policy)
		cname, hash, err := x.e.counterName(en.Key, p, 1)
		if err != nil {
			x.drops[xdropKey].Add(1)
			continue
		}
		tc := x.e.totalCharger(p)
		if tc == nil {
			x.drops[xdropStore].Add(1)
			continue
		}
		stored, sh := unsplitCounter(cname, hash)
		if byStore == nil {
			byStore = make(map[counter.TotalCharger][]counter.TotalOp, 1)
		}
		// A total charges at most the limit's capacity at once: a backlog
		// beyond it (a long partition's, delivered when it heals) would
		// deny the key for longer than the period its units belonged to.
		byStore[tc] = append(byStore[tc], counter.TotalOp{Key: stored, Hash: sh, Limit: p.Limit, From: sender + seg, Total: en.Units, Keep: p.Limit.Period + regionKeep, Most: p.Limit.Capacity()})
	}
	ctx, cancel := context.WithTimeout(x.e.life, 5*time.Second)
	defer cancel()
	var charged int64
	for tc, ops := range byStore {
		tc.ChargeTotals(ctx, ops)
		for _, op := range ops {
			if op.Err != nil {
				x.drops[xdropStore].Add(1)
				continue
			}
			charged += op.Charged
		}
	}
	x.charged[from].Add(uint64(charged))
	x.last[from].Store(x.e.opt.clock().UnixNano())
}

// totalCharger returns the store p's counters are kept on, if it charges
// totals (counter.TotalCharger); nil if not.
func (e *Engine) totalCharger(p *Policy) counter.TotalCharger {
	var st counter.Store = e.store // SyncReserve leases from it
	if p.Sync == SyncGossip {
		st = e.gossipStore()
	}
	tc, _ := st.(counter.TotalCharger)
	return tc
}

// checkRegions checks that the engine keeps p's Regions (not
// RegionsIndependent): an error wrapping errors.ErrUnsupported if not.
func (e *Engine) checkRegions(p *Policy) error {
	switch {
	case p.Regions >= numRegionModes:
		return fmt.Errorf("policy %q: regions mode %d: %w", p.Name, uint8(p.Regions), errors.ErrUnsupported)
	case p.Name == "":
		return fmt.Errorf("regions %v: the policy needs a name, by which the regions know it: %w", p.Regions, errors.ErrUnsupported)
	case e.xr == nil:
		return fmt.Errorf("policy %q: regions %v without an exchange between regions (a region, and a coordinator that carries rounds to other regions): %w", p.Name, p.Regions, errors.ErrUnsupported)
	case p.Regions == RegionsShares:
		if err := checkShares(p); err != nil {
			return fmt.Errorf("%w: %w", err, errors.ErrUnsupported)
		}
	}
	return nil
}

// RegionRound implements coordinator.RegionHandler: another region's
// totals are charged to this region's store.
func (h handler) RegionRound(from string, payload []byte) {
	if x := h.e.xr; x != nil {
		x.apply(from, payload)
	}
}

var _ coordinator.RegionHandler = handler{}

// KnowPolicies tells the engine of policies it may not have decided yet,
// so that the units other regions admit under those with RegionsExchange
// are charged here from the start (a policy is known once decided too).
// A policy is known by its Name; a later one of the same name replaces
// it. Without a region exchange (WithRegion, and a coordinator that
// carries rounds between regions) it does nothing.
func (e *Engine) KnowPolicies(ps ...*Policy) {
	if e.xr == nil {
		return
	}
	for _, p := range ps {
		if p != nil && p.Regions != RegionsIndependent && p.Name != "" {
			e.xr.know(p)
		}
	}
}

// RegionStats is what an engine's exchange between regions did.
type RegionStats struct {
	Sent    map[string]uint64 // exchange: units admitted here and sent, by region
	Charged map[string]uint64 // exchange: units of other regions charged here, by region
	Gave    map[string]uint64 // shares: units of this region's shares granted to other regions, by region
	Granted map[string]uint64 // shares: units other regions granted this one, by region
	// LastRound is when the last round from each region was applied
	// (absent: never); Started, when the exchange began.
	LastRound map[string]time.Time
	Started   time.Time
	Dropped   map[string]uint64 // entries or messages dropped, by reason: malformed, policy, key, store, full, late
	Errors    uint64            // messages the coordinator did not take (not connected, closed, too large)
}

// RegionStats returns what the exchange between regions did; false
// without one.
func (e *Engine) RegionStats() (RegionStats, bool) {
	x := e.xr
	if x == nil {
		return RegionStats{}, false
	}
	s := RegionStats{Sent: map[string]uint64{}, Charged: map[string]uint64{}, Gave: map[string]uint64{}, Granted: map[string]uint64{}, LastRound: map[string]time.Time{}, Dropped: map[string]uint64{}, Errors: x.errors.Load()}
	for _, r := range x.to {
		s.Sent[r], s.Charged[r] = x.sent[r].Load(), x.charged[r].Load()
		s.Gave[r], s.Granted[r] = x.gave[r].Load(), x.granted[r].Load()
		if t := x.last[r].Load(); t != 0 {
			s.LastRound[r] = time.Unix(0, t)
		}
	}
	s.Started = time.Unix(0, x.start)
	for i, n := range xdropNames {
		s.Dropped[n] = x.drops[i].Load()
	}
	return s, true
}
