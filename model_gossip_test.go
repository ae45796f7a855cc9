package hotkey

import (
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"time"
)

// The gossip configurations of the model test run each engine on a gossip
// store of its own, with no coordinator: the test flushes each engine's
// round every simulated interval (each engine at an offset of its own) and
// delivers it to each other engine after a delay it draws, 0 or one
// interval, some rounds twice and some out of order, at random points among
// the decisions of the instant they are due. So it knows, at every
// admission, which units of the others the deciding engine has not been
// charged yet, and holds each key to the limit plus those units.

// modelGossipInterval is the simulated interval of a gossip run's rounds;
// a delivery takes 0 or one more.
const modelGossipInterval = time.Second

// modelGossipLag is the longest an admitted unit goes uncharged to a peer:
// up to an interval in the round, and a delivery.
const modelGossipLag = 2 * modelGossipInterval

// gossipRound is one flush of one engine: its messages, and the admissions
// they carry (indexes into modelRun.admitted by counter name).
type gossipRound struct {
	from   int
	msgs   [][]byte
	events map[string][]int
}

// gossipDelivery is a round due to reach an engine.
type gossipDelivery struct {
	due   time.Time
	round *gossipRound
	to    int
}

// gossipSim flushes and delivers the rounds of a gossip run's engines.
type gossipSim struct {
	m       *modelRun
	rng     *rand.Rand
	engines []*Engine
	now     func() time.Time
	advance func(time.Duration)

	next    []time.Time        // each engine's next flush
	pending []map[string][]int // admissions since each engine's last flush
	queue   []gossipDelivery
	// undelivered[name][i] is the units the other engines admitted on name
	// that engine i has not been charged yet.
	undelivered map[string][]int64
}

func newGossipSim(m *modelRun, rng *rand.Rand, engines []*Engine, now func() time.Time, advance func(time.Duration)) *gossipSim {
	g := &gossipSim{m: m, rng: rng, engines: engines, now: now, advance: advance, undelivered: map[string][]int64{}}
	for i := range engines {
		g.next = append(g.next, now().Add(time.Duration(i)*modelGossipInterval/time.Duration(len(engines))))
		g.pending = append(g.pending, map[string][]int{})
	}
	return g
}

// admitted notes that engine i admitted ev on name, and returns ev with
// what the run must know of it for the checks.
func (g *gossipSim) admitted(name string, i int, ev modelEvent) modelEvent {
	g.m.seq++
	ev.engine, ev.seq = i, g.m.seq
	ev.seen = make([]int, len(g.engines))
	for k := range ev.seen {
		ev.seen[k] = math.MaxInt
	}
	ev.seen[i] = ev.seq
	u := g.undelivered[name]
	if u == nil {
		u = make([]int64, len(g.engines))
		g.undelivered[name] = u
	}
	ev.undelivered = u[i]
	for k := range u {
		if k != i {
			u[k] = addSat(u[k], ev.units)
		}
	}
	g.pending[i][name] = append(g.pending[i][name], len(g.m.admitted[name]))
	return ev
}

// due returns the flushes (engine indexes) and deliveries due now.
func (g *gossipSim) due() (flushes, deliveries []int) {
	now := g.now()
	for i, t := range g.next {
		if !t.After(now) {
			flushes = append(flushes, i)
		}
	}
	for i, d := range g.queue {
		if !d.due.After(now) {
			deliveries = append(deliveries, i)
		}
	}
	return flushes, deliveries
}

// step does one thing due now, if any: a flush or a delivery.
func (g *gossipSim) step(op int) bool {
	flushes, deliveries := g.due()
	switch k := len(flushes) + len(deliveries); {
	case k == 0:
		return false
	case g.rng.IntN(k) < len(flushes):
		g.flush(op, flushes[g.rng.IntN(len(flushes))])
	default:
		i := deliveries[g.rng.IntN(len(deliveries))]
		d := g.queue[i]
		g.queue = slices.Delete(g.queue, i, i+1)
		g.deliver(op, d)
	}
	return true
}

// pass lets d of simulated time pass, doing what falls due on the way, in
// a random order at each instant, and all that is due before time moves on.
func (g *gossipSim) pass(op int, d time.Duration) {
	to := g.now().Add(d)
	for {
		for g.step(op) {
		}
		next := to
		for _, t := range g.next {
			if t.Before(next) {
				next = t
			}
		}
		for _, q := range g.queue {
			if q.due.Before(next) {
				next = q.due
			}
		}
		if !next.After(g.now()) {
			return
		}
		g.advance(next.Sub(g.now()))
	}
}

// flush flushes engine i's round and schedules its deliveries: to each
// other engine after 0 or one interval, a quarter of them again up to an
// interval later.
func (g *gossipSim) flush(op, i int) {
	now := g.now()
	for !g.next[i].After(now) {
		g.next[i] = g.next[i].Add(modelGossipInterval)
	}
	r := &gossipRound{from: i, msgs: g.engines[i].gossipFlush(now), events: g.pending[i]}
	g.pending[i] = map[string][]int{}
	if (len(r.msgs) == 0) != (len(r.events) == 0) {
		g.m.violate("op %d: engine %d flushed %d messages for %d counters admitted on", op, i, len(r.msgs), len(r.events))
	}
	if len(r.msgs) == 0 {
		return
	}
	for to := range g.engines {
		if to == i {
			continue
		}
		due := now.Add(time.Duration(g.rng.IntN(2)) * modelGossipInterval)
		g.queue = append(g.queue, gossipDelivery{due: due, round: r, to: to})
		if g.rng.IntN(4) == 0 {
			g.queue = append(g.queue, gossipDelivery{due: due.Add(time.Duration(g.rng.IntN(2)) * modelGossipInterval), round: r, to: to})
		}
	}
}

// deliver charges d's round to its engine: the first time, the round's
// units are charged; a duplicate must be refused whole.
func (g *gossipSim) deliver(op int, d gossipDelivery) {
	e := g.engines[d.to]
	before, _ := e.gossipStats()
	for _, msg := range d.round.msgs {
		if err := e.gossipApply(msg); err != nil {
			g.m.violate("op %d: engine %d refused engine %d's round: %v", op, d.to, d.round.from, err)
		}
	}
	after, _ := e.gossipStats()
	// A duplicate may arrive before the round itself (reordered): the
	// first to arrive is charged.
	first := true
	for name, idx := range d.round.events {
		for _, j := range idx {
			if g.m.admitted[name][j].seen[d.to] != math.MaxInt {
				first = false
			}
		}
	}
	if !first {
		if after.Applied != before.Applied || after.Duplicates-before.Duplicates != uint64(len(d.round.msgs)) {
			g.m.violate("op %d: engine %d's round delivered again to engine %d: %d entries applied, %d of %d messages refused", op, d.round.from, d.to, after.Applied-before.Applied, after.Duplicates-before.Duplicates, len(d.round.msgs))
		}
		return
	}
	if after.Duplicates != before.Duplicates || after.ChargesDropped != before.ChargesDropped || after.Invalid != before.Invalid {
		g.m.violate("op %d: engine %d's round to engine %d not charged whole: %+v, was %+v", op, d.round.from, d.to, after, before)
	}
	g.m.seq++
	for name, idx := range d.round.events {
		for _, j := range idx {
			ev := &g.m.admitted[name][j]
			ev.seen[d.to] = g.m.seq
			g.undelivered[name][d.to] -= ev.units
		}
	}
}

// gossipAllowance is what the other engines' units add to a window's
// bound, for a window's admissions evs (in the order decided): exactly,
// the fewest units admitted in it that an engine admitting in it had not
// been charged at its last admission; by the rate, the units the others
// admitted in it from modelGossipLag before the window's last admission
// on.
func gossipAllowance(evs []modelEvent) (exact, byRate int64) {
	if len(evs) == 0 {
		return 0, 0
	}
	last := map[int]int{} // engine → seq of its last admission in the window
	for _, ev := range evs {
		last[ev.engine] = ev.seq
	}
	exact = math.MaxInt64
	for i, s := range last {
		var u int64
		for _, ev := range evs {
			if ev.engine != i && ev.seen[i] > s {
				u = addSat(u, ev.units)
			}
		}
		exact = min(exact, u)
	}
	end := evs[len(evs)-1]
	for _, ev := range evs {
		if ev.engine != end.engine && !ev.at.Before(end.at.Add(-modelGossipLag)) {
			byRate = addSat(byRate, ev.units)
		}
	}
	return exact, byRate
}

// gossipRecent is the units the engines other than evs[i]'s admitted from
// modelGossipLag before evs[i] up to it: what the token bucket's bound
// allows by the rate.
func gossipRecent(evs []modelEvent, i int) int64 {
	var u int64
	for j := i - 1; j >= 0 && !evs[j].at.Before(evs[i].at.Add(-modelGossipLag)); j-- {
		if evs[j].engine != evs[i].engine {
			u = addSat(u, evs[j].units)
		}
	}
	return u
}

// gossipOver is what a gossip run saw under one policy: the worst
// overshoot of a counter past its bound, the exact and rate allowances
// there, and the least room the exact allowance left over an overshoot.
type gossipOver struct {
	over, exact, byRate int64
	room                int64 // math.MaxInt64 until an overshoot
}

// noteOver notes an overshoot of the counter name.
func (m *modelRun) noteOver(name string, over, exact, byRate int64) {
	if m.over == nil {
		m.over = map[string]gossipOver{}
	}
	policy, _, _ := strings.Cut(name, "|")
	w, ok := m.over[policy]
	if !ok {
		w = gossipOver{over: math.MinInt64, room: math.MaxInt64}
	}
	if over > w.over {
		w.over, w.exact, w.byRate = over, exact, byRate
	}
	if over > 0 {
		w.room = min(w.room, exact-over)
	}
	m.over[policy] = w
}
