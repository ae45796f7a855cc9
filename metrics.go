package hotkey

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/hotkeyd/hotkey/coordinator"
	"github.com/hotkeyd/hotkey/counter"
	"github.com/hotkeyd/hotkey/gossip"
	"github.com/hotkeyd/hotkey/shard"
)

// Decision results, as the result label of hotkey_decisions_total.
const (
	resAllowed = iota
	resDenied
	resFallbackAllowed
	resFallbackDenied
	resError
	resInvalid
	resShadowDenied
	resFallbackShadowDenied
	numResults
)

var resultNames = [numResults]string{"allowed", "denied", "fallback_allowed", "fallback_denied", "error", "invalid", "shadow_denied", "fallback_shadow_denied"}

// metrics are an engine's Prometheus metrics. A nil *metrics keeps none:
// every method is a no-op on it.
type metrics struct {
	decisions       *prometheus.CounterVec
	nearLimit       *prometheus.CounterVec
	byPolicy        sync.Map // policyLabels → *policyCounters
	decisionSeconds prometheus.Histogram
	denyHits        prometheus.Counter
	storeSeconds    prometheus.Histogram
	storeErrors     prometheus.Counter
	levels          *prometheus.CounterVec
	breaker         *prometheus.CounterVec
}

// policyCounters are the counters of one policy, looked up once per
// decision.
type policyCounters struct {
	results [numResults]prometheus.Counter
	near    prometheus.Counter
}

// skewer is implemented by stores that measure their clock against ours.
type skewer interface {
	ClockSkew() (time.Duration, bool)
}

func newMetrics(r prometheus.Registerer, e *Engine) (*metrics, error) {
	m := &metrics{
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hotkey_decisions_total",
			Help: "Decisions by policy, result and the policy's sync mode: result is allowed, denied, fallback_allowed and fallback_denied (decided by the policy's fallback while the store could not answer), error, invalid (bad input), shadow_denied and fallback_shadow_denied (denied, by the store or the fallback, but admitted: the policy is in shadow mode); sync is store, reserve or gossip.",
		}, []string{"policy", "result", "sync"}),
		nearLimit: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hotkey_near_limit_total",
			Help: "Admitted decisions, by policy, that left less than 20% of the key's limit (remaining < limit/5: more than 80% used), as envoyproxy/ratelimit's near_limit; decisions of the fallback are not counted, since they do not read the key's counter.",
		}, []string{"policy"}),
		decisionSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "hotkey_decision_duration_seconds",
			Help:    "Time of one decision as its caller waits for it, fallback, error and bad input included (one observation per decision of hotkey_decisions_total): Allow or AllowN from call to return; each decision of an AllowBatch is observed once with the time the whole batch took, since its caller gets no answer before the batch returns.",
			Buckets: []float64{.00001, .000025, .00005, .0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1},
		}),
		denyHits: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "hotkey_deny_cache_hits_total",
			Help: "Takes the deny cache answered as denied without a store call (a decision on a split key may count two: its subcounter, then the one probed after it).",
		}),
		storeSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "hotkey_store_duration_seconds",
			Help:    "Time of one store call (Take), errors included.",
			Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1},
		}),
		storeErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "hotkey_store_errors_total",
			Help: "Decisions whose store calls failed (not counting the caller's own cancellation).",
		}),
		levels: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hotkey_level_changes_total",
			Help: "Changes of a key's level in force, by the new level (1 is a merge).",
		}, []string{"level"}),
		breaker: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hotkey_breaker_changes_total",
			Help: "Changes of the store circuit breaker's state, by the new state.",
		}, []string{"state"}),
	}
	cs := []prometheus.Collector{m.decisions, m.nearLimit, m.decisionSeconds, m.denyHits, m.storeSeconds, m.storeErrors, m.levels, m.breaker, engineCollector{e}}
	if region := e.opt.region; region != "" {
		info := prometheus.NewGauge(prometheus.GaugeOpts{
			Name:        "hotkey_region_info",
			Help:        "Always 1; the engine's region (WithRegion, hotkeyd's --region) as a label. Absent without a region.",
			ConstLabels: prometheus.Labels{"region": region},
		})
		info.Set(1)
		cs = append(cs, info)
	}
	for _, c := range cs {
		if err := r.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// policyLabels are a policy's labels on hotkey_decisions_total.
type policyLabels struct {
	name string
	sync Sync
}

// policy returns the counters of p: made once per policy name and sync
// mode, so that a decision costs one map lookup, not a label lookup per
// counter.
func (m *metrics) policy(p *Policy) *policyCounters {
	l := policyLabels{name: p.name()}
	if p != nil {
		l.sync = p.Sync
	}
	if c, ok := m.byPolicy.Load(l); ok {
		return c.(*policyCounters)
	}
	c := &policyCounters{near: m.nearLimit.WithLabelValues(l.name)}
	for i := range c.results {
		c.results[i] = m.decisions.WithLabelValues(l.name, resultNames[i], l.sync.String())
	}
	got, _ := m.byPolicy.LoadOrStore(l, c)
	return got.(*policyCounters)
}

func (m *metrics) decided(p *Policy, r Result, fallback bool) {
	if m == nil {
		return
	}
	i := resDenied
	switch {
	case fallback && r.ShadowDenied:
		i = resFallbackShadowDenied
	case r.ShadowDenied:
		i = resShadowDenied
	case fallback && r.Allowed:
		i = resFallbackAllowed
	case fallback:
		i = resFallbackDenied
	case r.Allowed:
		i = resAllowed
	}
	c := m.policy(p)
	c.results[i].Inc()
	if i == resAllowed && nearLimit(r) {
		c.near.Inc()
	}
}

// nearLimit reports whether admitted decision r left less than a fifth of
// its limit: remaining < limit/5, in exact arithmetic.
func nearLimit(r Result) bool {
	q := r.Limit / 5
	if r.Limit%5 != 0 {
		q++ // remaining < limit/5 ⇔ remaining < ⌈limit/5⌉ for an integer remaining
	}
	return r.Remaining < q
}

func (m *metrics) failed(p *Policy) {
	if m != nil {
		m.policy(p).results[resError].Inc()
	}
}

func (m *metrics) rejectInput(p *Policy) {
	if m != nil {
		m.policy(p).results[resInvalid].Inc()
	}
}

// decisionTook observes n decisions that took d each (see
// hotkey_decision_duration_seconds).
func (m *metrics) decisionTook(d time.Duration, n int) {
	if m == nil {
		return
	}
	s := d.Seconds()
	for range n {
		m.decisionSeconds.Observe(s)
	}
}

// denyHit counts a take the deny cache answered.
func (m *metrics) denyHit() {
	if m != nil {
		m.denyHits.Inc()
	}
}

func (m *metrics) storeFailure() {
	if m != nil {
		m.storeErrors.Inc()
	}
}

// storeCall observes the duration of a store call begun at start (a
// reading of monotonic).
func (m *metrics) storeCall(start time.Duration) {
	if m != nil {
		m.storeSeconds.Observe((monotonic() - start).Seconds())
	}
}

// storeTook observes a store call that took d.
func (m *metrics) storeTook(d time.Duration) {
	if m != nil {
		m.storeSeconds.Observe(d.Seconds())
	}
}

// clockBase is the origin of monotonic's readings.
var clockBase = time.Now()

// monotonic reads the monotonic clock, as the time since clockBase: one
// clock read (20 to 60 ns, by the machine), where time.Now makes two, wall
// and monotonic. The decision path reads it only when metrics are kept.
func monotonic() time.Duration { return time.Since(clockBase) }

func (m *metrics) levelChanged(level shard.Level) {
	if m != nil {
		m.levels.WithLabelValues(level.String()).Inc()
	}
}

func (m *metrics) breakerChanged(s BreakerState) {
	if m != nil {
		m.breaker.WithLabelValues(s.String()).Inc()
	}
}

// engineCollector reads gauges off the engine at scrape time: hot keys by
// level, the breaker, peers, clock skew, the NATS coordinator's message
// counts, the memory stores' refusals, what sync: reserve's and sync:
// gossip's stores did once a policy of theirs has been decided, and
// whether gossip is alone (see gossipAlone).
type engineCollector struct{ e *Engine }

var (
	descHotKeys      = prometheus.NewDesc("hotkey_hot_keys", "Keys split on this instance, by level.", []string{"level"}, nil)
	descBreaker      = prometheus.NewDesc("hotkey_breaker_open", "1 while the store circuit breaker is open, else 0.", nil, nil)
	descPeers        = prometheus.NewDesc("hotkey_peers", "Other live instances, as the coordinator sees them.", nil, nil)
	descSkew         = prometheus.NewDesc("hotkey_clock_skew_seconds", "The store's clock minus this host's, as last measured (Redis TIME).", nil, nil)
	descCoord        = prometheus.NewDesc("hotkey_coordinator_messages_total", "Coordinator messages by kind: published, received, invalid, rejected (lease table full), dropped, publish_errors, sync_replies (replies to this instance's join syncs applied: leases and gossip snapshot parts), late_replies (replies to its join syncs that came after the wait, not applied).", []string{"kind"}, nil)
	descReserve      = prometheus.NewDesc("hotkey_reserve_total", "sync: reserve, by event: local (a decision admitted from a block, with no store call), denied (a decision denied with no store call while the store lacked a block's worth), lease (a store call that leased a block), take (a decision taken on the store: a cold key, a cost its block lacked), return (a store call that gave a block's unused units back).", []string{"event"}, nil)
	descReserveUnits = prometheus.NewDesc("hotkey_reserve_returned_units_total", "sync: reserve: unused units of blocks given back, by outcome: back (the store took them back), kept (its rule kept them: a token bucket's held past their time, a window that ended).", []string{"outcome"}, nil)
	descGossipMsgs   = prometheus.NewDesc("hotkey_gossip_sent_messages_total", "sync: gossip: messages of this instance's rounds flushed for peers.", nil, nil)
	descGossipBytes  = prometheus.NewDesc("hotkey_gossip_sent_bytes_total", "sync: gossip: bytes of the messages flushed for peers.", nil, nil)
	descGossipErrs   = prometheus.NewDesc("hotkey_gossip_send_errors_total", "sync: gossip: messages the coordinator did not take (not connected, too large, closed), and rounds not encoded whole.", nil, nil)
	descGossipEnt    = prometheus.NewDesc("hotkey_gossip_entries_total", "sync: gossip: (key, units) entries by event: sent (flushed for peers), applied (a peer's units charged here, from its rounds or its snapshot), capped (a peer's entry charged less than it carried: more units than its limit admits in the round's span, or a snapshot's above the limit's capacity).", []string{"event"}, nil)
	descGossipRecv   = prometheus.NewDesc("hotkey_gossip_refused_messages_total", "sync: gossip: peers' messages not applied, by reason: duplicate (already applied, or replayed), late (a round older than the last 64 of its sender, or of the sender's earlier life: too late to tell from a duplicate, its units lost to this view), malformed (did not decode).", []string{"reason"}, nil)
	descGossipDrop   = prometheus.NewDesc("hotkey_gossip_dropped_total", "sync: gossip: keys dropped, by reason: round_full (admitted but not sent: the round's key cap), memory_full (a peer's units not charged: the memory store had no room), invalid_limit (a peer's entry under a limit that does not validate), snapshot_full (left out of join snapshots: their key cap), late (a peer's units not charged: their message came too late, see hotkey_gossip_refused_messages_total).", []string{"reason"}, nil)
	descGossipAlone  = prometheus.NewDesc("hotkey_gossip_alone", "1 while sync: gossip policies decide, or would decide, on this instance's counts alone: the coordinator carries no gossip or does not reach NATS. Present from the start with a coordinator that carries gossip (NATS), else from the first sync: gossip decision.", nil, nil)
	descRegionUnits  = prometheus.NewDesc("hotkey_region_units_total", "Units between regions, by direction and the other region. regions: exchange: sent (admitted here and sent to that region's daemons, counted once the coordinator took every message of the round), charged (admitted there and charged to this region's counters, each once). regions: shares: gave (this region's share granted to that region, taken from its counter first), granted (that region's share granted to this one, counted once).", []string{"direction", "region"}, nil)
	descRegionAge    = prometheus.NewDesc("hotkey_region_round_age_seconds", "Regions: seconds since this daemon last applied a round from the other region (or, before the first, since it started): every daemon of a region sends one every --region-interval, so an age far above the interval means that region's rounds do not arrive (cut off, down, or refused: hotkey_region_dropped_total).", []string{"region"}, nil)
	descRegionDrop   = prometheus.NewDesc("hotkey_region_dropped_total", "regions: exchange: what was not applied or not sent, by reason: region (a message from a region not in --regions, or from this one), malformed (a message that did not decode), policy (an entry under a policy not known here with regions: exchange), key (an entry whose key or limit this daemon refuses), store (an entry whose store keeps no totals, or whose charge failed), full (units admitted on a new key past the key cap, not sent), send_error (a message the coordinator did not take: not connected, closed, too large).", []string{"reason"}, nil)
	descRegionShare  = prometheus.NewDesc("hotkey_region_share_units", "regions: shares, per policy, in this region's current window: base (the region's share of each key before grants: the limit divided by the regions), granted (units other regions granted this one, all keys), gave (units this daemon granted other regions, all keys).", []string{"policy", "kind"}, nil)
	descMemFull      = prometheus.NewDesc("hotkey_memory_store_full_total", "Counters an in-process memory store refused to create, its stripe being full of live counters: takes of new keys (denied) and hot-key moves (left on the counters that hold the usage). By store: store (the engine's own, as hotkeyd's without Redis), local (the local fallback's).", []string{"store"}, nil)
)

func (c engineCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descHotKeys, descBreaker, descPeers, descSkew, descCoord, descMemFull, descReserve, descReserveUnits,
		descGossipMsgs, descGossipBytes, descGossipErrs, descGossipEnt, descGossipRecv, descGossipDrop, descGossipAlone,
		descRegionUnits, descRegionAge, descRegionDrop, descRegionShare} {
		ch <- d
	}
}

func (c engineCollector) Collect(ch chan<- prometheus.Metric) {
	e := c.e
	st := e.Stats()
	for _, l := range []shard.Level{shard.Level4, shard.Level16, shard.Level64} {
		ch <- prometheus.MustNewConstMetric(descHotKeys, prometheus.GaugeValue, float64(st.HotKeys[l]), l.String())
	}
	open := 0.0
	if st.Breaker == BreakerOpen {
		open = 1
	}
	ch <- prometheus.MustNewConstMetric(descBreaker, prometheus.GaugeValue, open)
	ch <- prometheus.MustNewConstMetric(descPeers, prometheus.GaugeValue, float64(st.Instances-1))
	if s, ok := e.store.(skewer); ok {
		if d, ok := s.ClockSkew(); ok {
			ch <- prometheus.MustNewConstMetric(descSkew, prometheus.GaugeValue, d.Seconds())
		}
	}
	if ms, ok := e.store.(*counter.MemoryStore); ok {
		ch <- prometheus.MustNewConstMetric(descMemFull, prometheus.CounterValue, float64(ms.Full()), "store")
	}
	ch <- prometheus.MustNewConstMetric(descMemFull, prometheus.CounterValue, float64(e.local.Full()), "local")
	if rs, ok := e.reserveStats(); ok {
		for event, v := range map[string]uint64{"local": rs.Local, "denied": rs.Denied, "lease": rs.Leases, "take": rs.Takes, "return": rs.Returns} {
			ch <- prometheus.MustNewConstMetric(descReserve, prometheus.CounterValue, float64(v), event)
		}
		ch <- prometheus.MustNewConstMetric(descReserveUnits, prometheus.CounterValue, float64(rs.Returned), "back")
		ch <- prometheus.MustNewConstMetric(descReserveUnits, prometheus.CounterValue, float64(rs.Unspent), "kept")
	}
	if gs, ok := e.gossipStats(); ok {
		c.collectGossip(ch, gs)
	}
	if alone, ok := e.gossipAlone(); ok {
		v := 0.0
		if alone {
			v = 1
		}
		ch <- prometheus.MustNewConstMetric(descGossipAlone, prometheus.GaugeValue, v)
	}
	if rs, ok := e.RegionStats(); ok {
		c.collectRegions(ch, rs, st.Coordinator)
	}
	for name, sh := range e.RegionShares() {
		for kind, v := range map[string]int64{"base": sh.Base, "granted": sh.Granted, "gave": sh.Gave} {
			ch <- prometheus.MustNewConstMetric(descRegionShare, prometheus.GaugeValue, float64(v), name, kind)
		}
	}
	if cs := st.Coordinator; cs != nil {
		for kind, v := range map[string]uint64{
			"published": cs.Published, "received": cs.Received, "invalid": cs.Invalid,
			"rejected": cs.Rejected, "dropped": cs.Dropped, "publish_errors": cs.PublishErrors,
			"sync_replies": cs.SyncReplies + cs.GossipSyncApplied, "late_replies": cs.LateReplies,
		} {
			ch <- prometheus.MustNewConstMetric(descCoord, prometheus.CounterValue, float64(v), kind)
		}
	}
}

// collectGossip sends what SyncGossip's store did, once the engine has
// one.
func (c engineCollector) collectGossip(ch chan<- prometheus.Metric, gs gossip.StoreStats) {
	add := func(d *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	add(descGossipMsgs, gs.Messages)
	add(descGossipBytes, gs.Bytes)
	add(descGossipErrs, c.e.gossipErrors.Load())
	add(descGossipEnt, gs.EntriesSent, "sent")
	add(descGossipEnt, gs.Applied, "applied")
	add(descGossipEnt, gs.Capped, "capped")
	add(descGossipRecv, gs.Duplicates, "duplicate")
	add(descGossipRecv, gs.Late, "late")
	add(descGossipRecv, gs.Malformed, "malformed")
	add(descGossipDrop, gs.RoundDropped, "round_full")
	add(descGossipDrop, gs.ChargesDropped, "memory_full")
	add(descGossipDrop, gs.Invalid, "invalid_limit")
	add(descGossipDrop, gs.SnapshotDropped, "snapshot_full")
	add(descGossipDrop, gs.LateEntries, "late")
}

// collectRegions sends what the exchange between regions did; cs, if
// not nil, counts the messages the coordinator dropped.
func (c engineCollector) collectRegions(ch chan<- prometheus.Metric, rs RegionStats, cs *coordinator.Stats) {
	for r, v := range rs.Sent {
		ch <- prometheus.MustNewConstMetric(descRegionUnits, prometheus.CounterValue, float64(v), "sent", r)
	}
	for r, v := range rs.Charged {
		ch <- prometheus.MustNewConstMetric(descRegionUnits, prometheus.CounterValue, float64(v), "charged", r)
	}
	for r, v := range rs.Gave {
		ch <- prometheus.MustNewConstMetric(descRegionUnits, prometheus.CounterValue, float64(v), "gave", r)
	}
	for r, v := range rs.Granted {
		ch <- prometheus.MustNewConstMetric(descRegionUnits, prometheus.CounterValue, float64(v), "granted", r)
	}
	now := c.e.opt.clock()
	for r := range rs.Sent {
		t, ok := rs.LastRound[r]
		if !ok {
			t = rs.Started // none yet: as old as the exchange
		}
		ch <- prometheus.MustNewConstMetric(descRegionAge, prometheus.GaugeValue, max(0, now.Sub(t).Seconds()), r)
	}
	for reason, v := range rs.Dropped {
		ch <- prometheus.MustNewConstMetric(descRegionDrop, prometheus.CounterValue, float64(v), reason)
	}
	ch <- prometheus.MustNewConstMetric(descRegionDrop, prometheus.CounterValue, float64(rs.Errors), "send_error")
	if cs != nil {
		ch <- prometheus.MustNewConstMetric(descRegionDrop, prometheus.CounterValue, float64(cs.InvalidBy["region"]), "region")
	}
}
