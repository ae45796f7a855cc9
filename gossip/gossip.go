// Package gossip holds the pieces of the gossip sync mode that need no
// network: the round that accumulates the units each key consumed on this
// instance, the binary codec of the messages that carry a round to peers,
// and the deduplication that applies each message once.
//
// Every interval an instance flushes the (limit, key, units) deltas of the
// keys it admitted on since the last flush: those its memory store's tally
// holds (counter.MemoryStore.TakeTallied), at most MaxKeys of them, and
// those past the tally's room in its Round, at most MaxKeys more (the rest
// are dropped and counted). A Codec encodes them into
// messages of at most MaxBytes: varint-framed entries grouped by limit,
// each message stamped with the sender's instance id, its start time, the
// round's number and the part's index, so that a round too large for one
// message goes out in several, never dropped. A receiver decodes each
// message (refusing malformed ones with an error, in memory bounded by the
// message's length), asks its Dedup whether that (sender, start, round,
// part) is new, and if so charges the units to its own counters
// (counter.MemoryStore.ChargeAt). Signing and transport are the
// coordinator's: a message is an opaque []byte to it.
//
// Store ties them together as a counter.Store: it decides on a memory store
// of its own and adds what it admits to the store's tally, in the cell the
// decision wrote, or past its room to its Round, under the limit encoded
// as the entry's Limit (EncodeLimit), so that a receiver charges the same
// limit's counter. A joining instance asks its peers for Snapshots, each
// key's used units in the peer's view, and charges what a snapshot holds
// above its own view (ApplySnapshot), so that peers' snapshots of one key
// do not add up.
package gossip

import (
	"errors"
	"fmt"
	"time"
)

// Defaults of Config.
const (
	// DefaultMaxBytes is well under NATS's default max_payload (1 MiB),
	// leaving room for the coordinator's signature.
	DefaultMaxBytes   = 64 << 10
	DefaultMaxKeys    = 1 << 17
	DefaultMaxKeyLen  = 512
	DefaultMaxSenders = 1024
	DefaultRounds     = 64
	// DefaultInterval is StoreConfig.Interval's default, the engine's
	// default gossip interval.
	DefaultInterval = 100 * time.Millisecond
)

// The codec's fixed bounds.
const (
	// MaxLimitLen is the longest limit identity carried, in bytes.
	MaxLimitLen = 255
	// MaxSenderLen is the longest sender instance id carried, in bytes.
	MaxSenderLen = 64
	// MaxParts is the most messages one round is split into; Encode refuses
	// a round that needs more, and Decode a part index at or past it. It
	// bounds Dedup's memory per round.
	MaxParts = 1024
)

// Errors. Decode's come wrapped with what was wrong and where.
var (
	ErrMalformed   = errors.New("gossip: malformed message")
	ErrTooLarge    = errors.New("gossip: message too large")
	ErrInvalid     = errors.New("gossip: invalid entry")
	ErrRoundTooBig = errors.New("gossip: round needs too many parts")
)

// Config configures a Round, a Codec and a Dedup. Zero fields take their
// defaults (DefaultConfig).
type Config struct {
	// MaxBytes is the largest message encoded or decoded (default 64 KiB),
	// at least MinBytes(MaxKeyLen).
	MaxBytes int
	// MaxKeys caps the keys a Round holds between flushes (default 1<<17);
	// adds of further keys are dropped and counted (Round.Dropped). A
	// Store's memory store tallies up to MaxKeys keys more, split over its
	// stripes, before its Round.
	MaxKeys int
	// MaxKeyLen is the longest key carried, in bytes (default 512, the
	// coordinator's).
	MaxKeyLen int
	// MaxSenders caps the senders a Dedup remembers (default 1024).
	MaxSenders int
	// Rounds is how many of a sender's latest rounds a Dedup remembers the
	// parts of (default 64, 6.4 s of rounds at the default interval): a
	// part late by fewer rounds is applied once, a part of an older round
	// is refused as late.
	Rounds int
}

// DefaultConfig returns the defaults documented on Config.
func DefaultConfig() Config {
	return Config{MaxBytes: DefaultMaxBytes, MaxKeys: DefaultMaxKeys, MaxKeyLen: DefaultMaxKeyLen,
		MaxSenders: DefaultMaxSenders, Rounds: DefaultRounds}
}

// withDefaults returns c with its zero fields set to their defaults.
func (c Config) withDefaults() Config {
	d := DefaultConfig()
	for _, f := range []struct{ v, d *int }{
		{&c.MaxBytes, &d.MaxBytes}, {&c.MaxKeys, &d.MaxKeys}, {&c.MaxKeyLen, &d.MaxKeyLen},
		{&c.MaxSenders, &d.MaxSenders}, {&c.Rounds, &d.Rounds},
	} {
		if *f.v <= 0 {
			*f.v = *f.d
		}
	}
	return c
}

// Validate reports whether c (its defaults filled in) can be used: a
// message of MaxBytes must hold one entry of the longest key and limit.
func (c Config) Validate() error {
	c = c.withDefaults()
	if min := MinBytes(c.MaxKeyLen); c.MaxBytes < min {
		return fmt.Errorf("gossip: MaxBytes %d is too small for MaxKeyLen %d: want at least %d", c.MaxBytes, c.MaxKeyLen, min)
	}
	return nil
}

// MinBytes is the smallest MaxBytes that holds a message of one entry of
// a key of maxKeyLen bytes under a limit of MaxLimitLen.
func MinBytes(maxKeyLen int) int {
	return headerMax + groupMax + uvarintLen(uint64(maxKeyLen)) + maxKeyLen + maxVarint
}

// Entry is the units a key consumed under a limit in one round.
type Entry struct {
	// Limit identifies the limit the units were admitted under (for the
	// engine, its policy and limit); 1 to MaxLimitLen bytes.
	Limit string
	// Key is the counter's key: 1 to MaxKeyLen bytes.
	Key string
	// Units is positive.
	Units int64
}
