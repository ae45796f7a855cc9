package coordinator

import (
	"encoding/binary"
	"unicode/utf8"
)

// Gossip envelope, version 1: the binary message that carries a gossip
// payload (opaque to the coordinator) on <prefix>.<ns>.gossip, or a join
// sync's gossip snapshot to the requester's inbox.
//
//	version  byte, 1 (never '{': a sync reply is told from a JSON one by it)
//	flags    byte: 1 if signed; no other bit is set
//	origin   byte length (1..64), then the sender's ID, UTF-8
//	stamp    8 bytes, big-endian: the sender's stamp (sign.go), if signed
//	payload  to the end, or to the MAC if signed; at least 1 byte
//	mac      32 bytes, if signed: HMAC-SHA256 of every byte before it
//
// The MAC is made as the JSON messages' (sign.go) with another domain,
// "hotkey-gossip-mac-v1\n", so that no JSON message's MAC verifies as a
// gossip one. A receiver without a secret skips stamp and MAC.
const (
	envelopeVersion = 1
	flagSigned      = 1
	stampLen        = 8
	macSize         = 32
	// GossipOverhead is the most an envelope adds to its payload: the
	// longest origin, a stamp and a MAC. MaxGossip is MaxMessage less it.
	GossipOverhead = 1 + 1 + 1 + maxOriginLen + stampLen + macSize
)

// envelope is one decoded gossip envelope. Its slices point into the
// message's bytes.
type envelope struct {
	origin  string
	signed  bool
	stamp   int64  // 0 if not signed
	payload []byte // at least 1 byte
	body    []byte // the bytes the MAC covers: all but the MAC
	mac     []byte // nil if not signed
}

// appendEnvelope appends to b the envelope of payload from origin, with
// stamp if signed. A signed envelope still lacks its MAC: the caller
// appends it (signer.sealBinary).
func appendEnvelope(b []byte, origin string, signed bool, stamp int64, payload []byte) []byte {
	flags := byte(0)
	if signed {
		flags = flagSigned
	}
	b = append(b, envelopeVersion, flags, byte(len(origin)))
	b = append(b, origin...)
	if signed {
		b = binary.BigEndian.AppendUint64(b, uint64(stamp))
	}
	return append(b, payload...)
}

// isEnvelope reports whether data is meant as a gossip envelope rather
// than a JSON message.
func isEnvelope(data []byte) bool {
	return len(data) > 0 && data[0] == envelopeVersion
}

// decodeEnvelope parses one envelope of at most maxMessage bytes. With
// reasonNone its origin is 1 to 64 bytes of UTF-8, its payload not empty,
// and if signed its stamp positive and its MAC 32 bytes (not checked
// here). It never panics, and allocates only the origin.
func decodeEnvelope(data []byte, maxMessage int) (envelope, reason) {
	var e envelope
	if len(data) > maxMessage {
		return e, reasonSize
	}
	if len(data) < 3 || data[0] != envelopeVersion || data[1]&^flagSigned != 0 {
		return e, reasonEnvelope
	}
	e.signed = data[1] == flagSigned
	n := int(data[2])
	rest := data[3:]
	if n == 0 || n > maxOriginLen || n > len(rest) || !utf8.Valid(rest[:n]) {
		return e, reasonOrigin
	}
	e.origin, rest = string(rest[:n]), rest[n:]
	e.body = data
	if e.signed {
		if len(rest) < stampLen+1+macSize {
			return e, reasonEnvelope
		}
		e.stamp = int64(binary.BigEndian.Uint64(rest))
		if e.stamp <= 0 {
			return e, reasonTS
		}
		rest = rest[stampLen:]
		e.body = data[:len(data)-macSize]
		e.mac = rest[len(rest)-macSize:]
		rest = rest[:len(rest)-macSize]
	}
	if len(rest) == 0 {
		return e, reasonEnvelope
	}
	e.payload = rest
	return e, reasonNone
}
