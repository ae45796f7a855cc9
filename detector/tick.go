package detector

import (
	"cmp"
	"slices"
	"time"

	"github.com/hotkeyd/hotkey/shard"
)

// Tick advances the detector to now. It is due once per step
// (SubWindow/Steps; Start calls it): the first call at or after the end of
// the current step closes that step, and the others do nothing. Closing a
// step moves each key's exact count for it into the rates, steps keys up,
// and at the end of a sub-window also steps keys down, evicts cold keys from
// the exact table and moves on to the next sketch. A step closed late counts
// its whole length: rates are measured over the time that really passed.
// Level changes are sent on Events without blocking. Tick may be called from
// any goroutine; time must not go backwards.
func (d *Detector) Tick(now time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed || now.Before(d.next) {
		return
	}
	K := d.cfg.Steps
	i := int(d.step % int64(K))
	sub := d.step / int64(K)
	last := i == K-1 // the step closes the sub-window
	span := max(now.Sub(d.stepStart[(i+1)%K]), d.cfg.SubWindow)
	tl := d.localLocked()
	cur := int(d.cur.Load())
	for st := range d.smask + 1 { // a share of the spares, clean by the time they are current
		d.sk.clear(3*st+(cur+1)%3, i, K)
	}

	var winStart time.Time
	var promote uint64
	if last {
		winStart = d.subStart[(sub+1)%int64(d.cfg.Slots)] // of sub-window sub-Slots+1
		promote = uint64(d.promoteAt.Load())
	}
	victims := d.victims[:0]
	for _, n := range d.live {
		e := &d.ents[n]
		v := d.hits[n].n.Swap(0)
		st := &d.stepCount[n*K+i]
		e.stepSum += uint64(v) - uint64(*st)
		*st = v
		e.subAcc += uint64(v)
		r := float64(e.stepSum) / span.Seconds()
		if l := levelFor(r, tl); l > e.level {
			e.level, e.below = l, time.Time{}
			d.emitLocked(Event{Key: e.key, Hash: e.hash, Level: l, Rate: r})
		}
		if !last {
			continue
		}
		sl := &d.subCount[n*d.cfg.Slots+int(sub%int64(d.cfg.Slots))]
		c := uint32(min(e.subAcc, 1<<32-1))
		e.winSum += uint64(c) - uint64(*sl)
		*sl = c
		if e.subAcc >= promote {
			e.warm = sub
		}
		e.subAcc = 0
		switch {
		case e.level > shard.Level1:
			d.coolLocked(e, now, winStart, sub, tl)
		case d.coldLocked(e, sub):
			victims = append(victims, n)
		}
	}
	if last {
		d.pressure = 0
		victims = d.pressureLocked(victims, sub)
		for _, n := range victims {
			d.evictLocked(n)
		}
		if len(victims) > 0 {
			d.rebuildLocked()
		}
		d.noise, d.noiseMax = d.loadLocked(cur)
		d.cur.Store(int32((cur + 1) % 3))
		d.subStart[(sub+1)%int64(d.cfg.Slots)] = now
	} else {
		// A flood that starts loads the sketch within the sub-window:
		// follow it step by step rather than from the next one.
		noise, noiseMax := d.loadLocked(cur)
		d.noise, d.noiseMax = max(d.noise, noise), max(d.noiseMax, noiseMax)
	}
	d.setPromoteLocked()
	d.victims = victims[:0]
	d.step++
	d.stepStart[(i+1)%K] = now
	stepLen := d.cfg.SubWindow / time.Duration(K)
	d.next = d.origin.Add((now.Sub(d.origin)/stepLen + 1) * stepLen)
}

// loadLocked returns the mean counter of the sketches of slot summed over
// the stripes, and the highest of them.
func (d *Detector) loadLocked(slot int) (sum, highest float64) {
	for st := range d.smask + 1 {
		l := d.sk.load(3*st + slot)
		sum += l
		highest = max(highest, l)
	}
	return sum, highest
}

// coolLocked steps e down a level once its window rate has stayed under
// half of its level's up-threshold for CoolDown. The window is the last
// Slots sub-windows, or those since e entered the table if fewer.
func (d *Detector) coolLocked(e *entry, now, winStart time.Time, sub int64, tl float64) {
	if e.born > sub-int64(d.cfg.Slots)+1 {
		winStart = d.subStart[e.born%int64(d.cfg.Slots)]
	}
	r := float64(e.winSum) / now.Sub(winStart).Seconds()
	switch {
	case r >= upRate(e.level, tl)/2:
		e.below = time.Time{}
	case e.below.IsZero():
		e.below = now
	case now.Sub(e.below) >= d.cfg.CoolDown:
		e.level, e.below = e.level.Down(), now
		d.emitLocked(Event{Key: e.key, Hash: e.hash, Level: e.level, Rate: r})
	}
}

// pressureLocked adds to victims, when the table is more than 7/8 full even
// without them, the level-1 keys with the lowest counts in the sub-window
// that just closed, until it is 3/4 full, and sets pressure above the
// highest count evicted: for the next sub-window only warmer keys may take
// the room, and a key at T always may.
func (d *Detector) pressureLocked(victims []int, sub int64) []int {
	c := d.cfg.Capacity
	if len(d.live)-len(victims) <= c-c/8 {
		return victims
	}
	marked := len(victims)
	for _, n := range d.live {
		if e := &d.ents[n]; e.level == shard.Level1 && !d.coldLocked(e, sub) {
			victims = append(victims, n)
		}
	}
	cand := victims[marked:]
	j := int(sub % int64(d.cfg.Slots))
	slices.SortFunc(cand, func(a, b int) int {
		return cmp.Compare(d.subCount[a*d.cfg.Slots+j], d.subCount[b*d.cfg.Slots+j])
	})
	need := min(len(d.live)-marked-(c-c/4), len(cand))
	if need > 0 {
		d.pressure = d.subCount[cand[need-1]*d.cfg.Slots+j] + 1
	}
	return victims[:marked+need]
}

// coldLocked reports whether e has stayed under the promotion threshold for
// the last Slots sub-windows, sub included.
func (d *Detector) coldLocked(e *entry, sub int64) bool {
	return sub-e.warm >= int64(d.cfg.Slots)
}

// evictLocked frees entry n. Lookups through the index in use may still
// find it until rebuildLocked swaps in the new one; its hash is cleared
// first, so they miss.
func (d *Detector) evictLocked(n int) {
	e := &d.ents[n]
	d.hashes[n].Store(0)
	last := d.live[len(d.live)-1]
	d.live[e.pos] = last
	d.ents[last].pos = e.pos
	d.live = d.live[:len(d.live)-1]
	*e = entry{}
	d.free = append(d.free, n)
	d.full.Store(false)
}

// rebuildLocked fills the spare index with the live entries and swaps it in.
func (d *Detector) rebuildLocked() {
	x := &d.idx[1-d.act]
	x.reset()
	for _, n := range d.live {
		x.insert(d.ents[n].hash, n)
	}
	d.table.Store(x)
	d.act = 1 - d.act
}

// emitLocked sends ev on Events, or counts it as dropped if Events is full.
func (d *Detector) emitLocked(ev Event) {
	select {
	case d.events <- ev:
	default:
		d.dropped.Add(1)
	}
}

// upRate returns the rate at which a key steps up to level (4, 16 or 64),
// for a local threshold tl: tl, 4·tl, 16·tl.
func upRate(level shard.Level, tl float64) float64 { return tl * float64(level) / 4 }

// levelFor returns the level that rate r calls for: the highest level whose
// up-threshold r reaches, or 1.
func levelFor(r, tl float64) shard.Level {
	for l := shard.MaxLevel; l > shard.Level1; l /= 4 {
		if r >= upRate(l, tl) {
			return l
		}
	}
	return shard.Level1
}
