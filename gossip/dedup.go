package gossip

import "sync"

// Dedup decides which messages to apply, so that each (sender, start,
// round, part) is applied once: a duplicated, replayed or late-reordered
// message changes nothing. Per sender it remembers the start of its latest
// life, its highest round, and which parts of its last Rounds rounds came:
//
//   - a later start is a restart: the sender's rounds count anew;
//   - an earlier start is a previous life's message: refused (Stale);
//   - a round more than Rounds behind the highest is refused (TooOld):
//     its parts are no longer remembered;
//   - any other part is accepted once, and refused after (Duplicate).
//
// It remembers at most MaxSenders senders, each in O(Rounds · MaxParts/64)
// words; a new sender past that takes the place of the one heard from
// least recently (Evicted), whose older messages would then be accepted
// again: a sender restarting under a new id leaves its old one to be
// evicted so. The zero value is not usable; it is safe for concurrent use.
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
	// parts[r % len(parts)] holds round r's parts, if round is r.
	parts []roundParts
}

type roundParts struct {
	round uint64
	used  bool
	bits  [MaxParts / 64]uint64
}

// NewDedup returns a Dedup configured by cfg (MaxSenders, Rounds).
func NewDedup(cfg Config) *Dedup {
	cfg = cfg.withDefaults()
	return &Dedup{rounds: cfg.Rounds, maxSenders: cfg.MaxSenders, senders: make(map[string]*sender)}
}

// Accept reports whether the message h heads is new, and notes it: a
// caller applies the message if and only if Accept says so. A part past
// MaxParts is refused (Decode never returns one).
func (d *Dedup) Accept(h Header) bool {
	if h.Part < 0 || h.Part >= MaxParts {
		return false
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
		return false
	case h.Start > s.start:
		*s = sender{start: h.Start, high: h.Round, parts: s.parts}
		clear(s.parts)
	case s.high >= uint64(d.rounds) && h.Round <= s.high-uint64(d.rounds):
		d.stats.TooOld++
		return false
	}
	s.high = max(s.high, h.Round)
	p := &s.parts[h.Round%uint64(len(s.parts))]
	if !p.used || p.round != h.Round {
		*p = roundParts{round: h.Round, used: true}
	}
	w, bit := h.Part/64, uint64(1)<<(h.Part%64)
	if p.bits[w]&bit != 0 {
		d.stats.Duplicate++
		return false
	}
	p.bits[w] |= bit
	d.tick++
	s.seen = d.tick
	return true
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
