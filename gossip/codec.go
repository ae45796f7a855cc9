package gossip

import (
	"encoding/binary"
	"fmt"
	"math"
	"slices"
	"strings"
)

// The wire format, version 1. All integers are varints (encoding/binary):
//
//	version      byte, 1
//	sender       uvarint length (1..MaxSenderLen), bytes: the instance id
//	start        varint: the sender's start, Unix ns (tells its lives apart)
//	round        uvarint: the round's number in that life
//	part         uvarint: the message's index in the round (< MaxParts)
//	groups, to the end of the message, each:
//	  limit      uvarint length (1..MaxLimitLen), bytes
//	  count      uvarint (≥ 1), then count entries:
//	    key      uvarint length (1..MaxKeyLen), bytes
//	    units    uvarint (1..MaxInt64)
//
// An entry costs its key's length plus 2 bytes for a key under 128 bytes
// and under 128 units, 3 up to 16,383 units.
const version = 1

const (
	maxVarint = binary.MaxVarintLen64
	maxUnits  = math.MaxInt64
	// headerMax is the longest header: version, sender, start, round, part.
	headerMax = 1 + 1 + MaxSenderLen + maxVarint + maxVarint + 2
	// groupMax is the longest group header: limit and count.
	groupMax = 2 + MaxLimitLen + 5
	// minEntry is the shortest entry: a 1-byte key and its units.
	minEntry = 3
)

// Header says where a message comes from and which part of which round
// it carries: a receiver applies each (Sender, Start, Round, Part) once
// (see Dedup).
type Header struct {
	// Sender is the sending instance's id, 1 to MaxSenderLen bytes.
	Sender string
	// Start is when the sender's instance started (Unix ns): a restarted
	// sender keeping its id starts a later life, whose rounds count anew.
	Start int64
	// Round numbers the sender's rounds in this life, upwards.
	Round uint64
	// Part is the message's index in its round, below MaxParts.
	Part int
}

// Message is one decoded message.
type Message struct {
	Header
	Entries []Entry
}

// Codec encodes rounds into messages and decodes them, within its
// configuration's MaxBytes and MaxKeyLen. It is immutable and safe for
// concurrent use.
type Codec struct {
	maxBytes, maxKeyLen int
}

// NewCodec returns a codec configured by cfg. It panics if cfg does not
// Validate: a configuration is the program's own.
func NewCodec(cfg Config) *Codec {
	if err := cfg.Validate(); err != nil {
		panic(err)
	}
	cfg = cfg.withDefaults()
	return &Codec{maxBytes: cfg.MaxBytes, maxKeyLen: cfg.MaxKeyLen}
}

// Encode returns the messages that carry entries as round h.Round of
// h.Sender's life h.Start, each of at most MaxBytes, with parts numbered
// from 0 (h.Part is ignored): a round too large for one message is split,
// never cut. It returns no message for no entries, and an error, wrapping
// ErrInvalid, for an entry or header the format cannot carry, or wrapping
// ErrRoundTooBig for a round of more than MaxParts messages. It reorders
// entries (grouping them by Limit); the messages are the caller's.
func (c *Codec) Encode(h Header, entries []Entry) ([][]byte, error) {
	if h.Sender == "" || len(h.Sender) > MaxSenderLen {
		return nil, fmt.Errorf("%w: sender id of %d bytes, want 1 to %d", ErrInvalid, len(h.Sender), MaxSenderLen)
	}
	for _, e := range entries {
		if err := c.check(e); err != nil {
			return nil, err
		}
	}
	slices.SortFunc(entries, func(a, b Entry) int { return strings.Compare(a.Limit, b.Limit) })
	var msgs [][]byte
	var buf []byte
	entriesIn := 0 // in buf
	open := func() error {
		if len(msgs) == MaxParts {
			return fmt.Errorf("%w: more than %d messages of %d bytes", ErrRoundTooBig, MaxParts, c.maxBytes)
		}
		h.Part = len(msgs)
		buf = appendHeader(make([]byte, 0, c.maxBytes), h)
		msgs = append(msgs, nil)
		entriesIn = 0
		return nil
	}
	if len(entries) > 0 {
		if err := open(); err != nil {
			return nil, err
		}
	}
	for i := 0; i < len(entries); {
		j := i + 1
		for j < len(entries) && entries[j].Limit == entries[i].Limit {
			j++
		}
		limit := entries[i].Limit
		for i < j {
			// The most entries of the group that fit with the group's
			// header in what is left of the message.
			room, n, size := c.maxBytes-len(buf), 0, 0
			head := func(n int) int { return uvarintLen(uint64(len(limit))) + len(limit) + uvarintLen(uint64(n)) }
			for i+n < j {
				s := entrySize(entries[i+n])
				if head(n+1)+size+s > room {
					break
				}
				size += s
				n++
			}
			if n == 0 {
				if entriesIn == 0 { // cannot happen for a valid Config
					return nil, fmt.Errorf("%w: entry of %q does not fit in %d bytes", ErrInvalid, entries[i].Key, c.maxBytes)
				}
				msgs[len(msgs)-1] = buf
				if err := open(); err != nil {
					return nil, err
				}
				continue
			}
			buf = appendString(buf, limit)
			buf = binary.AppendUvarint(buf, uint64(n))
			for _, e := range entries[i : i+n] {
				buf = appendString(buf, e.Key)
				buf = binary.AppendUvarint(buf, uint64(e.Units))
			}
			entriesIn += n
			i += n
		}
	}
	if len(msgs) > 0 {
		msgs[len(msgs)-1] = buf
	}
	return msgs, nil
}

// check reports whether e can be carried.
func (c *Codec) check(e Entry) error {
	switch {
	case e.Limit == "" || len(e.Limit) > MaxLimitLen:
		return fmt.Errorf("%w: limit id of %d bytes, want 1 to %d", ErrInvalid, len(e.Limit), MaxLimitLen)
	case e.Key == "" || len(e.Key) > c.maxKeyLen:
		return fmt.Errorf("%w: key of %d bytes, want 1 to %d", ErrInvalid, len(e.Key), c.maxKeyLen)
	case e.Units <= 0:
		return fmt.Errorf("%w: %d units of %q, want a positive count", ErrInvalid, e.Units, e.Key)
	}
	return nil
}

// Empty returns a message of h with no entries: a round that carries only
// that it was sent, such as a heartbeat. It fails, as Encode does, for a
// sender id out of bounds.
func (c *Codec) Empty(h Header) ([]byte, error) {
	if h.Sender == "" || len(h.Sender) > MaxSenderLen {
		return nil, fmt.Errorf("%w: sender id of %d bytes, want 1 to %d", ErrInvalid, len(h.Sender), MaxSenderLen)
	}
	return appendHeader(nil, h), nil
}

func appendHeader(b []byte, h Header) []byte {
	b = append(b, version)
	b = appendString(b, h.Sender)
	b = binary.AppendVarint(b, h.Start)
	b = binary.AppendUvarint(b, h.Round)
	return binary.AppendUvarint(b, uint64(h.Part))
}

func appendString(b []byte, s string) []byte {
	return append(binary.AppendUvarint(b, uint64(len(s))), s...)
}

func entrySize(e Entry) int {
	return uvarintLen(uint64(len(e.Key))) + len(e.Key) + uvarintLen(uint64(e.Units))
}

func uvarintLen(x uint64) int {
	n := 1
	for x >= 0x80 {
		x >>= 7
		n++
	}
	return n
}

// Decode returns the message data holds, or an error wrapping ErrTooLarge
// for data over MaxBytes or ErrMalformed for anything the format does not
// allow (see codec.go), saying what and at which byte. It never panics,
// and allocates at most a copy of data and one Entry per 3 bytes of it;
// the message's strings share that copy, not data.
func (c *Codec) Decode(data []byte) (Message, error) {
	if len(data) > c.maxBytes {
		return Message{}, fmt.Errorf("%w: %d bytes, at most %d", ErrTooLarge, len(data), c.maxBytes)
	}
	d := decoder{s: string(data)}
	var m Message
	if v := d.byte(); d.err == nil && v != version {
		return Message{}, fmt.Errorf("%w: version %d, want %d", ErrMalformed, v, version)
	}
	m.Sender = d.string("sender", MaxSenderLen)
	m.Start = d.varint("start")
	m.Round = d.uvarint("round", math.MaxUint64)
	m.Part = int(d.uvarint("part", MaxParts-1))
	for d.err == nil && d.off < len(d.s) {
		limit := d.string("limit", MaxLimitLen)
		n := d.uvarint("count", uint64((len(d.s)-d.off)/minEntry))
		if d.err == nil && n == 0 {
			d.fail("count", "0")
		}
		for range n {
			key := d.string("key", c.maxKeyLen)
			u := d.uvarint("units", maxUnits)
			if d.err == nil && u == 0 {
				d.fail("units", "0")
			}
			if d.err != nil {
				break
			}
			m.Entries = append(m.Entries, Entry{Limit: limit, Key: key, Units: int64(u)})
		}
	}
	if d.err != nil {
		return Message{}, d.err
	}
	return m, nil
}

// decoder reads a message, keeping the first error.
type decoder struct {
	s   string
	off int
	err error
}

func (d *decoder) fail(field, what string) {
	if d.err == nil {
		d.err = fmt.Errorf("%w: %s at byte %d: %s", ErrMalformed, field, d.off, what)
	}
}

func (d *decoder) byte() byte {
	if d.err != nil {
		return 0
	}
	if d.off >= len(d.s) {
		d.fail("version", "empty")
		return 0
	}
	d.off++
	return d.s[d.off-1]
}

// uvarint reads a uvarint of at most max.
func (d *decoder) uvarint(field string, max uint64) uint64 {
	if d.err != nil {
		return 0
	}
	var x uint64
	var shift uint
	for i := d.off; i < len(d.s) && i-d.off < maxVarint; i++ {
		b := d.s[i]
		if b < 0x80 {
			if i-d.off == maxVarint-1 && b > 1 {
				break // past 64 bits
			}
			x |= uint64(b) << shift
			if x > max {
				d.fail(field, fmt.Sprintf("%d, at most %d", x, max))
				return 0
			}
			d.off = i + 1
			return x
		}
		x |= uint64(b&0x7f) << shift
		shift += 7
	}
	d.fail(field, "truncated or overlong varint")
	return 0
}

func (d *decoder) varint(field string) int64 {
	ux := d.uvarint(field, math.MaxUint64)
	x := int64(ux >> 1)
	if ux&1 != 0 {
		x = ^x
	}
	return x
}

// string reads a length-prefixed string of 1 to max bytes.
func (d *decoder) string(field string, max int) string {
	n := d.uvarint(field+" length", uint64(max))
	if d.err != nil {
		return ""
	}
	if n == 0 {
		d.fail(field, "empty")
		return ""
	}
	if uint64(len(d.s)-d.off) < n {
		d.fail(field, fmt.Sprintf("%d bytes, %d left", n, len(d.s)-d.off))
		return ""
	}
	s := d.s[d.off : d.off+int(n)]
	d.off += int(n)
	return s
}
