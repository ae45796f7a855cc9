package gossip

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hotkeyd/hotkey/counter"
)

// StoreConfig configures a Store. Zero fields take their defaults.
type StoreConfig struct {
	// ID is this instance's id in the messages it sends: 1 to
	// MaxSenderLen bytes, unique among the instances that gossip together.
	ID string
	// Gossip configures the round, codec and dedup (DefaultConfig).
	Gossip Config
	// Memory configures the store's own memory store; its Clock is the
	// store's clock (default time.Now). Its TallyKeys is set to
	// Gossip.MaxKeys (0 if Solo): the store notes what it admits in the
	// memory store's tally first, in its Round when the tally has no room.
	Memory counter.MemoryConfig
	// SnapshotKeys caps the keys remembered for Snapshot (default
	// DefaultMaxKeys); a key past it is counted (SnapshotDropped) and left
	// out of snapshots until a sweep finds room.
	SnapshotKeys int
	// Interval is how often peers flush their rounds (default
	// DefaultInterval): a peer's entry charges at most what its limit
	// admits over Interval plus the time since the sender's previous
	// message (counter.Limit.MaxAdmitted), what the peer could have
	// admitted in the round.
	Interval time.Duration
	// Solo keeps no round: the store has no peers to send it to, and
	// decides as its memory store alone; Flush returns nothing.
	Solo bool
}

// StoreStats counts what a Store did since it was made.
type StoreStats struct {
	Rounds      uint64 // flushes that sent at least one message
	Messages    uint64 // messages flushed
	Bytes       uint64 // bytes of the messages flushed
	EntriesSent uint64 // (limit, key) deltas flushed

	Applied         uint64 // entries charged from peers' messages and snapshots
	Duplicates      uint64 // messages refused by the dedup as applied before: duplicated or replayed
	Late            uint64 // messages refused by the dedup as too late to tell (Late): a round older than the last Config.Rounds, or of the sender's previous life; their units are lost to this view
	LateEntries     uint64 // the entries of those messages
	Malformed       uint64 // messages that did not decode
	Invalid         uint64 // entries refused: their limit did not parse or Validate
	Capped          uint64 // entries charged less than they carried: more than their limit admits in the round's span, or a snapshot's above its capacity
	RoundDropped    uint64 // adds the round did not hold: its key cap (see Round.Add)
	TallyFull       uint64 // admissions the memory store's tally did not hold, noted in the round (see MemoryStore.TakeTallied)
	ChargesDropped  uint64 // charges the memory store had no room for (see MemoryStore.ChargeAt)
	SnapshotDropped uint64 // keys left out of snapshots: SnapshotKeys was reached
}

// Store is a counter.Store for the gossip sync mode: it decides on a
// memory store of its own, and notes what it admits in the memory store's
// tally, in the cell the decision wrote, or in a Round when the tally has
// no room for it. Flush hands out both's deltas as messages for peers, Apply charges a
// peer's to its own counters, and Snapshot and ApplySnapshot bring a
// joining instance up to its peers' view. It is safe for concurrent use;
// Take never blocks on I/O.
type Store struct {
	mem      *counter.MemoryStore
	clock    func() time.Time
	id       string
	solo     bool
	start    int64
	interval time.Duration
	cfg      Config
	round    *Round
	codec    *Codec
	dedup    *Dedup
	limits   [limitCache]atomic.Pointer[limitID]
	keys     keySet

	flushMu sync.Mutex // guards seq, last; serialises Flush
	seq     uint64     // the last round's number
	last    int        // the last round's entries

	rounds, messages, bytes, sent                      atomic.Uint64
	applied, malformed, invalid, chargesDropped, dupes atomic.Uint64
	tallyFull, capped, late, lateEntries               atomic.Uint64
}

var (
	_ counter.Store        = (*Store)(nil)
	_ counter.Peeker       = (*Store)(nil)
	_ counter.TotalCharger = (*Store)(nil)
)

// limitCache is the number of limits whose encoding a Store keeps, direct
// mapped: a decision under one of them encodes nothing.
const limitCache = 64

type limitID struct {
	lim counter.Limit
	id  string // EncodeLimit(lim)
	fp  uint64 // the round's limitFP(id)
}

// NewStore returns a store configured by cfg. It panics if cfg.ID is
// empty or longer than MaxSenderLen, or cfg.Gossip does not Validate: a
// configuration is the program's own.
func NewStore(cfg StoreConfig) *Store {
	if cfg.ID == "" || len(cfg.ID) > MaxSenderLen {
		panic(fmt.Sprintf("gossip: instance id of %d bytes, want 1 to %d", len(cfg.ID), MaxSenderLen))
	}
	if cfg.Memory.Clock == nil {
		cfg.Memory.Clock = time.Now
	}
	if cfg.SnapshotKeys <= 0 {
		cfg.SnapshotKeys = DefaultMaxKeys
	}
	if cfg.Interval <= 0 {
		cfg.Interval = DefaultInterval
	}
	g := cfg.Gossip.withDefaults()
	cfg.Memory.TallyKeys = g.MaxKeys
	if cfg.Solo {
		cfg.Memory.TallyKeys = 0
	}
	s := &Store{
		mem:      counter.NewMemoryStore(cfg.Memory),
		clock:    cfg.Memory.Clock,
		id:       cfg.ID,
		solo:     cfg.Solo,
		interval: cfg.Interval,
		cfg:      g,
		round:    NewRound(g),
		codec:    NewCodec(g),
		dedup:    NewDedup(g),
		keys:     keySet{index: make(map[roundKey]int), max: cfg.SnapshotKeys},
	}
	s.start = s.clock().UnixNano()
	return s
}

// Take implements counter.Store: TakeAt at the store's clock.
func (s *Store) Take(_ context.Context, key string, hash uint64, lim counter.Limit, n int64) (counter.Result, error) {
	return s.TakeAt(s.clock(), key, hash, lim, n), nil
}

// TakeAt is the memory store's TakeAt; an admitted take's n units join
// the memory store's tally or the round, to go to peers at the next Flush
// (unless Solo).
func (s *Store) TakeAt(now time.Time, key string, hash uint64, lim counter.Limit, n int64) counter.Result {
	if s.solo {
		return s.mem.TakeAt(now, key, hash, lim, n)
	}
	l := s.limitID(lim)
	if n > 0 && key != "" && len(key) <= s.cfg.MaxKeyLen { // what the codec carries
		r, tallied := s.mem.TakeTallied(now, key, hash, lim, n, l.id)
		if !tallied {
			s.tallyFull.Add(1)
			s.round.add(l.id, l.fp, key, hash, n)
		}
		return r
	}
	r := s.mem.TakeAt(now, key, hash, lim, n)
	if r.Allowed {
		s.round.add(l.id, l.fp, key, hash, n) // dropped and counted
	}
	return r
}

// Peek implements counter.Peeker on the store's own view.
func (s *Store) Peek(ctx context.Context, key string, hash uint64, lim counter.Limit) (counter.Result, error) {
	return s.mem.Peek(ctx, key, hash, lim)
}

// ChargeTotals implements counter.TotalCharger on the store's own view:
// the memory store's ChargeTotals. What it charges is not tallied: it
// goes to no peer.
func (s *Store) ChargeTotals(ctx context.Context, ops []counter.TotalOp) {
	s.mem.ChargeTotals(ctx, ops)
}

// Prefetch is the memory store's Prefetch.
func (s *Store) Prefetch(hash uint64) { s.mem.Prefetch(hash) }

// Close implements counter.Store. The store holds no goroutines.
func (s *Store) Close() error { return s.mem.Close() }

// Memory returns the memory store the store decides on. Its tally is the
// store's: a DrainTally by another caller takes units from the next Flush.
func (s *Store) Memory() *counter.MemoryStore { return s.mem }

// limitID returns lim's encoding and its fingerprint in the round, from
// the cache when it holds them.
func (s *Store) limitID(lim counter.Limit) *limitID {
	h := uint64(lim.Algorithm) ^ uint64(lim.Rate)*0x9e3779b97f4a7c15 ^ uint64(lim.Period)*0xc2b2ae3d27d4eb4f ^ uint64(lim.Burst)*0x165667b19e3779f9
	slot := &s.limits[(h>>32)%limitCache]
	if c := slot.Load(); c != nil && c.lim == lim {
		return c
	}
	id := EncodeLimit(lim)
	c := &limitID{lim, id, s.round.limitFP(id)}
	slot.Store(c)
	return c
}

// Flush empties the memory store's tally and the round into messages for
// peers (a key may have an entry from each: peers charge both), each of at most
// MaxBytes, stamped with the store's id, its start and the next round
// number: a round too large for MaxParts messages goes out as several
// rounds, never cut. now times the sweep of the keys kept for snapshots.
// It returns no message when nothing was admitted since the last Flush.
// The messages are the caller's. Calls are serialised.
func (s *Store) Flush(now time.Time) ([][]byte, error) {
	s.flushMu.Lock()
	defer s.flushMu.Unlock()
	entries := make([]Entry, 0, s.last)
	s.mem.DrainTally(func(limit, key string, units int64) {
		entries = append(entries, Entry{Limit: limit, Key: key, Units: units})
	})
	entries = s.round.appendFlush(entries)
	s.last = len(entries)
	if len(entries) == 0 {
		return nil, nil
	}
	s.noteKeys(now, entries)
	msgs, err := encodeSplit(s.codec, Header{Sender: s.id, Start: s.start}, entries, func() uint64 {
		s.seq++
		s.rounds.Add(1)
		return s.seq
	})
	for _, m := range msgs {
		s.bytes.Add(uint64(len(m)))
	}
	s.messages.Add(uint64(len(msgs)))
	s.sent.Add(uint64(len(entries)))
	return msgs, err
}

// encodeSplit encodes entries with c under h, each call of round giving a
// round number: halves of a round too large for MaxParts messages are
// encoded as rounds of their own.
func encodeSplit(c *Codec, h Header, entries []Entry, round func() uint64) ([][]byte, error) {
	h.Round = round()
	msgs, err := c.Encode(h, entries)
	if !errors.Is(err, ErrRoundTooBig) || len(entries) < 2 {
		return msgs, err
	}
	half := len(entries) / 2
	a, err := encodeSplit(c, h, entries[:half], round)
	if err != nil {
		return a, err
	}
	b, err := encodeSplit(c, h, entries[half:], round)
	return append(a, b...), err
}

// noteKeys remembers the keys of entries for snapshots.
func (s *Store) noteKeys(now time.Time, entries []Entry) {
	var limits limitParser
	s.keys.mu.Lock()
	defer s.keys.mu.Unlock()
	for _, e := range entries {
		if lim, ok := limits.parse(e.Limit); ok { // not ok: the store encoded a limit a caller did not validate
			s.keys.noteLocked(s, now, roundKey{e.Limit, e.Key}, lim)
		}
	}
}

// limitParser parses the limits of a run of entries, each encoding once:
// entries come grouped by limit, and the groups of a round's stripes may
// repeat one.
type limitParser struct {
	last   string
	lim    counter.Limit
	ok     bool
	parsed map[string]limitParse
}

type limitParse struct {
	lim counter.Limit
	ok  bool
}

// parse returns the limit id encodes, and whether it is valid.
func (p *limitParser) parse(id string) (counter.Limit, bool) {
	if p.parsed != nil && id == p.last {
		return p.lim, p.ok
	}
	if p.parsed == nil {
		p.parsed = make(map[string]limitParse)
	}
	r, seen := p.parsed[id]
	if !seen {
		lim, err := ParseLimit(id)
		r = limitParse{lim, err == nil}
		p.parsed[id] = r
	}
	p.last, p.lim, p.ok = id, r.lim, r.ok
	return r.lim, r.ok
}

// Apply charges the units of a peer's message to the store's counters,
// once: a message Dedup has seen changes nothing. It returns an error for
// a message that does not decode (counted as malformed); entries whose
// limit is invalid are skipped and counted.
func (s *Store) Apply(payload []byte) error {
	m, err := s.codec.Decode(payload)
	if err != nil {
		s.malformed.Add(1)
		return err
	}
	now := s.clock()
	switch v, since := s.dedup.Check(m.Header, now); v {
	case Accepted:
		s.charge(now, m.Entries, s.interval+since)
	case Late:
		s.late.Add(1)
		s.lateEntries.Add(uint64(len(m.Entries)))
	default:
		s.dupes.Add(1)
	}
	return nil
}

// charge charges entries to the store's counters at now: each entry's
// units, at most what its limit admits over span; or for a snapshot (join,
// span < 0) what its units, at most the limit's capacity, are above the
// store's own view of the key.
func (s *Store) charge(now time.Time, entries []Entry, span time.Duration) {
	join := span < 0
	var limits limitParser
	var charged []snapKey
	for _, e := range entries {
		lim, ok := limits.parse(e.Limit)
		if !ok {
			s.invalid.Add(1)
			continue
		}
		hash := counter.Hash(e.Key)
		n := e.Units
		most := lim.Capacity() // a snapshot's units are used units of a view
		if !join {
			most = lim.MaxAdmitted(span)
		}
		if n > most {
			n = most
			s.capped.Add(1)
		}
		if join {
			n -= used(s.mem, e.Key, hash, lim)
			if n <= 0 {
				continue
			}
		}
		if !s.mem.ChargeAt(now, e.Key, hash, lim, n) {
			s.chargesDropped.Add(1)
			continue
		}
		s.applied.Add(1)
		charged = append(charged, snapKey{roundKey{e.Limit, e.Key}, lim})
	}
	s.keys.mu.Lock() // once for the message's keys
	for _, k := range charged {
		s.keys.noteLocked(s, now, k.rk, k.lim)
	}
	s.keys.mu.Unlock()
}

// used is how many units of key's counter under lim are used in m's view:
// its capacity less what a Take would leave.
func used(m *counter.MemoryStore, key string, hash uint64, lim counter.Limit) int64 {
	r, _ := m.Peek(context.Background(), key, hash, lim)
	u := lim.Capacity() - r.Remaining
	if r.Allowed {
		u-- // the peek's own unit
	}
	return max(0, u)
}

// Snapshot returns the messages SnapshotTo sends, for a caller that wants
// them all at once. The messages are the caller's.
func (s *Store) Snapshot(maxBytes int) [][]byte {
	var msgs [][]byte
	s.SnapshotTo(maxBytes, func(m []byte) { msgs = append(msgs, m) })
	return msgs
}

// SnapshotTo calls send with messages of at most maxBytes each that carry
// the units each key remembered (SnapshotKeys) has used in this store's
// view, for a joining peer (ApplySnapshot): each message as soon as its
// keys are read, so that a peer of many keys has the first on their way
// while it reads the rest. Keys with nothing used are left out and
// forgotten. It sends nothing if maxBytes cannot hold an entry of the
// longest key (MinBytes). Decisions and charges go on meanwhile: a key is
// read when its message is built, and a key moved by a sweep of the full
// key set meanwhile (see SnapshotKeys) may be left out. send owns each
// message.
func (s *Store) SnapshotTo(maxBytes int, send func([]byte)) {
	cfg := s.cfg
	cfg.MaxBytes = min(cfg.MaxBytes, maxBytes)
	if cfg.Validate() != nil {
		return
	}
	codec := NewCodec(cfg)
	// A batch is sent once it holds snapshotPart entries, or the next
	// entry might not fit in one message (its entries' sizes, and a group
	// header for each limit in it): a message reaches the joiner every
	// snapshotPart peeks, well within its wait for the next. The keys are
	// read snapshotPart at a time, each window copied under the lock.
	var batch []Entry
	groups := map[string]bool{}
	size, room := 0, cfg.MaxBytes-headerMax
	sendBatch := func() {
		msgs, _ := codec.Encode(Header{Sender: s.id, Start: s.start}, batch) // entries the store noted: valid
		for _, m := range msgs {
			send(m)
		}
		batch, size = batch[:0], 0
		clear(groups)
	}
	var window, unused []snapKey
	for next := 0; ; next += len(window) {
		s.keys.mu.Lock()
		window = append(window[:0], s.keys.list[min(next, len(s.keys.list)):min(next+snapshotPart, len(s.keys.list))]...)
		s.keys.mu.Unlock()
		if len(window) == 0 {
			break
		}
		for _, k := range window {
			u := used(s.mem, k.rk.key, counter.Hash(k.rk.key), k.lim)
			if u <= 0 {
				unused = append(unused, k)
				continue
			}
			e := Entry{Limit: k.rk.limit, Key: k.rk.key, Units: u}
			n := entrySize(e)
			if !groups[e.Limit] {
				n += groupMax
			}
			if size+n > room && len(batch) > 0 || len(batch) == snapshotPart {
				sendBatch()
				n = entrySize(e) + groupMax
			}
			batch = append(batch, e)
			groups[e.Limit] = true
			size += n
		}
	}
	if len(batch) > 0 {
		sendBatch()
	}
	s.keys.mu.Lock()
	for _, k := range unused {
		if used(s.mem, k.rk.key, counter.Hash(k.rk.key), k.lim) <= 0 {
			s.keys.removeLocked(k.rk)
		}
	}
	s.keys.mu.Unlock()
}

// snapshotPart is the most entries SnapshotTo puts in one message.
const snapshotPart = 1024

// ApplySnapshot brings the store's view up to a peer's snapshot message:
// each key is charged what the peer's used units are above its own, so
// that several peers' snapshots of one key are not added up. It returns
// an error for a message that does not decode (counted as malformed).
func (s *Store) ApplySnapshot(payload []byte) error {
	m, err := s.codec.Decode(payload)
	if err != nil {
		s.malformed.Add(1)
		return err
	}
	s.charge(s.clock(), m.Entries, -1)
	return nil
}

// Stats returns what the store did since it was made.
func (s *Store) Stats() StoreStats {
	s.keys.mu.Lock()
	snapDropped := s.keys.dropped
	s.keys.mu.Unlock()
	return StoreStats{
		Rounds: s.rounds.Load(), Messages: s.messages.Load(), Bytes: s.bytes.Load(), EntriesSent: s.sent.Load(),
		Applied: s.applied.Load(), Duplicates: s.dupes.Load(), Malformed: s.malformed.Load(), Invalid: s.invalid.Load(), Capped: s.capped.Load(),
		Late: s.late.Load(), LateEntries: s.lateEntries.Load(),
		RoundDropped: s.round.Dropped(), TallyFull: s.tallyFull.Load(), ChargesDropped: s.chargesDropped.Load(), SnapshotDropped: snapDropped,
	}
}

// keySet is the keys a Store's snapshots carry: those it admitted on or
// was charged, at most max of them, in a list a snapshot reads a window at
// a time. When it is full, a sweep (at most one a second) forgets the keys
// with nothing used; a new key that still finds no room is counted and
// left out.
type keySet struct {
	mu        sync.Mutex // guards index, list, nextSweep, dropped
	index     map[roundKey]int
	list      []snapKey // list[index[k]].rk == k
	max       int
	nextSweep time.Time
	dropped   uint64
}

type snapKey struct {
	rk  roundKey
	lim counter.Limit
}

// keySweep is the least time between two sweeps of a full keySet.
const keySweep = time.Second

func (k *keySet) noteLocked(s *Store, now time.Time, rk roundKey, lim counter.Limit) {
	if _, ok := k.index[rk]; ok {
		return // lim is rk.limit's: held already
	}
	if len(k.list) >= k.max && !now.Before(k.nextSweep) {
		k.nextSweep = now.Add(keySweep)
		for i := 0; i < len(k.list); {
			if e := k.list[i]; used(s.mem, e.rk.key, counter.Hash(e.rk.key), e.lim) <= 0 {
				k.removeLocked(e.rk) // moves the last key to i
				continue
			}
			i++
		}
	}
	if len(k.list) >= k.max {
		k.dropped++
		return
	}
	k.index[rk] = len(k.list)
	k.list = append(k.list, snapKey{rk, lim})
}

// removeLocked forgets rk, if held, moving the last key to its place.
func (k *keySet) removeLocked(rk roundKey) {
	i, ok := k.index[rk]
	if !ok {
		return
	}
	last := len(k.list) - 1
	k.list[i] = k.list[last]
	k.index[k.list[i].rk] = i
	k.list[last] = snapKey{}
	k.list = k.list[:last]
	delete(k.index, rk)
}

// len returns the number of keys held.
func (k *keySet) len() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return len(k.list)
}
