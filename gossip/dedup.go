package gossip

import (
	"sync"
	"time"
)

// Dedup decides which messages to apply, so that each (sender, start,
// round, part) is applied once: a duplicated, replayed or reordered message
// changes nothing, and a message late by up to Rounds rounds is still
// applied, once. Per sender it remembers the start of its latest life, its
// highest round, and which parts of its last Rounds rounds came:
//
//   - a later start is a restart: the sender's rounds count anew;
//   - an earlier start is a previous life's message: refused as Late (Stale);
//   - a round Rounds or more behind the highest is refused as Late
//     (TooOld): its parts are no longer remembered, so it cannot be told
//     from a duplicate, and its units are lost to this view;
//   - any other part is accepted once, and refused after (Duplicate).
//
// It remembers at most MaxSenders senders, each in about 32 bytes a round
// remembered (2 KiB at the default 64), and 120 bytes more for a round
// with a part past the 64th; a new sender past that takes the place of
// the one heard from least recently (Evicted), whose older messages would
// then be accepted again: a sender restarting under a new id leaves its
// old one to be evicted so. The zero value is not usable; it is safe for
// concurrent use.
type Dedup struct {
	rounds, maxSenders int

	mu      sync.Mutex // guards senders, tick and stats
	senders map[string]*sender
	tick    uint64 // counts accepts, to find the least recent sender
	stats   DedupStats
}

// DedupStats counts a Dedup's refusals and evictions.
type DedupStats struct {
	Duplicate uint64 // a part already applied
	Stale     uint64 // a part of a sender's previous life
	TooOld    uint64 // a part of a round older than the last Rounds
	Evicted   uint64 // senders forgotten for a new one
}

// sender is what a Dedup remembers of one sender.
type sender struct {
	start int64
	high  uint64 // highest round accepted in this life
	seen  uint64 // tick of the last accept
	at    int64  // Unix ns of the last accept checked with a time, or 0
	// parts[r % len(parts)] holds round r's parts, if round is r.
	parts []roundParts
}

// roundParts are the parts of a round that came: the first 64 in lo, the
// others, rare, in hi once one came.
type roundParts struct {
	round uint64
	used  bool
	lo    uint64
	hi    *[MaxParts/64 - 1]uint64
}

// mark notes part, and reports whether it was noted before.
func (p *roundParts) mark(part int) (seen bool) {
	w, bit := &p.lo, uint64(1)<<(part%64)
	if part >= 64 {
		if p.hi == nil {
			p.hi = new([MaxParts/64 - 1]uint64)
		}
		w = &p.hi[part/64-1]
	}
	seen = *w&bit != 0
	*w |= bit
	return seen
}

// NewDedup returns a Dedup configured by cfg (MaxSenders, Rounds).
func NewDedup(cfg Config) *Dedup {
	cfg = cfg.withDefaults()
	return &Dedup{rounds: cfg.Rounds, maxSenders: cfg.MaxSenders, senders: make(map[string]*sender)}
}

// Verdict is what Dedup.Check says of a message.
type Verdict uint8

const (
	// Accepted: the message is new; apply it.
	Accepted Verdict = iota
	// Duplicate: the part was accepted before.
	Duplicate
	// Late: a part of a round older than the last Rounds, or of the
	// sender's previous life; it may never have been applied, but cannot
	// be told from a duplicate any more.
	Late
	// OutOfRange: a part index past MaxParts (Decode never returns one).
	OutOfRange
)

// Accept is Check for a caller that keeps no time: it reports whether the
// message h heads is new, and notes it.
func (d *Dedup) Accept(h Header) bool {
	v, _ := d.Check(h, time.Time{})
	return v == Accepted
}

// Check reports whether the message h heads, received at now, is new, and
// notes it: a caller applies the message if and only if Check says
// Accepted. With it comes the time since the sender's previous message
// accepted (0 for its first, or if either was checked without a time).
func (d *Dedup) Check(h Header, now time.Time) (Verdict, time.Duration) {
	if h.Part < 0 || h.Part >= MaxParts {
		return OutOfRange, 0
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	s := d.senders[h.Sender]
	switch {
	case s == nil:
		if len(d.senders) >= d.maxSenders {
			d.evictLocked()
		}
		s = &sender{start: h.Start, high: h.Round, parts: make([]roundParts, d.rounds)}
		d.senders[h.Sender] = s
	case h.Start < s.start:
		d.stats.Stale++
		return Late, 0
	case h.Start > s.start:
		*s = sender{start: h.Start, high: h.Round, parts: s.parts}
		clear(s.parts)
	case s.high >= uint64(d.rounds) && h.Round <= s.high-uint64(d.rounds):
		d.stats.TooOld++
		return Late, 0
	}
	s.high = max(s.high, h.Round)
	p := &s.parts[h.Round%uint64(len(s.parts))]
	if !p.used || p.round != h.Round {
		hi := p.hi
		if hi != nil {
			clear(hi[:])
		}
		*p = roundParts{round: h.Round, used: true, hi: hi}
	}
	if p.mark(h.Part) {
		d.stats.Duplicate++
		return Duplicate, 0
	}
	d.tick++
	s.seen = d.tick
	var since time.Duration
	if !now.IsZero() {
		at := now.UnixNano()
		if s.at != 0 && at > s.at {
			since = time.Duration(at - s.at)
		}
		s.at = at
	}
	return Accepted, since
}

// evictLocked forgets the sender heard from least recently.
func (d *Dedup) evictLocked() {
	var oldest string
	var at uint64
	first := true
	for id, s := range d.senders {
		if first || s.seen < at {
			oldest, at, first = id, s.seen, false
		}
	}
	delete(d.senders, oldest)
	d.stats.Evicted++
}

// Stats returns the refusals and evictions so far.
func (d *Dedup) Stats() DedupStats {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.stats
}

// Senders returns the number of senders remembered.
func (d *Dedup) Senders() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.senders)
}
