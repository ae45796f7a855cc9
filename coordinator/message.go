package coordinator

import (
	"bytes"
	"encoding/json"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/hotkeyd/hotkey/shard"
)

// Wire format: small JSON objects, version 1.
//
//	{"v":1,"t":"lease","origin":"a1b2…","key":"k","level":16,"ttl_ms":3000}   on <prefix>.<ns>.lease
//	{"v":1,"t":"hb","origin":"a1b2…"}                                         on <prefix>.<ns>.hb
//	{"v":1,"t":"sync_req","origin":"a1b2…"}   with a reply subject           on <prefix>.<ns>.sync
//	{"v":1,"t":"sync","origin":"c3d4…","leases":[{"key":"k","level":16,"ttl_ms":2100},…]}  to that reply subject
//
// A lease says origin wants key split to level for ttl_ms from receipt. A
// sync reply lists the leases its sender knows of, its own and its peers',
// each with the time it has left; one reply may come in several messages.
// Unknown fields are ignored, so a later version-1 sender may add some. A
// coordinator with a secret adds two, ts and mac, to every message it
// publishes (sign.go); one without ignores them.
const (
	wireVersion = 1

	typeLease   = "lease"
	typeHB      = "hb"
	typeSyncReq = "sync_req"
	typeSync    = "sync"

	// maxOriginLen bounds an origin (an instance ID), in bytes.
	maxOriginLen = 64
)

// message is one decoded message. Only the fields of its type are set.
type message struct {
	V      int         `json:"v"`
	T      string      `json:"t"`
	Origin string      `json:"origin"`
	Key    string      `json:"key,omitempty"`
	Level  shard.Level `json:"level,omitempty"`
	TTLms  int64       `json:"ttl_ms,omitempty"`
	Leases []wireLease `json:"leases,omitempty"`
	// TS is the sender's stamp, in microseconds since the Unix epoch, on
	// signed messages; 0 when absent. The MAC is checked on the bytes,
	// before decoding, and not kept.
	TS int64 `json:"ts,omitempty"`
}

// wireLease is one lease of a sync reply.
type wireLease struct {
	Key   string      `json:"key"`
	Level shard.Level `json:"level"`
	TTLms int64       `json:"ttl_ms"`
}

// reason says why a message was dropped as invalid.
type reason uint8

const (
	reasonNone     reason = iota
	reasonSize            // larger than MaxMessage
	reasonJSON            // not a JSON object of the message's shape
	reasonVersion         // v is not 1
	reasonType            // unknown t, or a type not expected on its subject
	reasonOrigin          // origin empty, too long or not UTF-8
	reasonKey             // key empty or longer than MaxKeyLen
	reasonLevel           // level not 4, 16 or 64
	reasonTTL             // ttl_ms not in (0, MaxTTL]
	reasonReply           // a sync request without a reply subject
	reasonTS              // ts negative (a gossip envelope's stamp: not positive)
	reasonEnvelope        // a gossip envelope that is malformed: version, flags, length
	// With a secret only (sign.go):
	reasonUnsigned  // no MAC
	reasonSignature // a MAC, but not the right one
	reasonStale     // ts more than MaxClockSkew from the receiver's clock, or (not a sync reply) before its Start
	reasonReplay    // ts not above the last one accepted from that origin

	reasonRegion // a round between regions from this region, or from one not in Config.Regions
	numReasons
)

var reasonNames = [numReasons]string{
	reasonNone:      "none",
	reasonSize:      "size",
	reasonJSON:      "json",
	reasonVersion:   "version",
	reasonType:      "type",
	reasonOrigin:    "origin",
	reasonKey:       "key",
	reasonLevel:     "level",
	reasonTTL:       "ttl",
	reasonReply:     "reply",
	reasonTS:        "ts",
	reasonEnvelope:  "envelope",
	reasonUnsigned:  "unsigned",
	reasonSignature: "signature",
	reasonStale:     "stale",
	reasonReplay:    "replay",
	reasonRegion:    "region",
}

func (r reason) String() string {
	if r < numReasons {
		return reasonNames[r]
	}
	return "reason(" + strconv.Itoa(int(r)) + ")"
}

// limits are what a decoder accepts.
type limits struct {
	maxMessage int
	maxKeyLen  int
	maxTTL     time.Duration
}

// decode parses and validates one message. A message it returns with
// reasonNone is fully valid: known version and type, a sane origin, and for
// leases (alone or in a sync reply) a key, a level of 4, 16 or 64 and a ttl
// in (0, maxTTL]. Otherwise the reason says what was wrong first, and the
// message must be dropped.
func decode(data []byte, lim limits) (message, reason) {
	var m message
	if len(data) > lim.maxMessage {
		return m, reasonSize
	}
	// Only objects: json.Unmarshal would take "null" as an empty message.
	if d := bytes.TrimLeft(data, " \t\r\n"); len(d) == 0 || d[0] != '{' {
		return m, reasonJSON
	}
	if err := json.Unmarshal(data, &m); err != nil {
		return message{}, reasonJSON
	}
	if m.V != wireVersion {
		return m, reasonVersion
	}
	if n := len(m.Origin); n == 0 || n > maxOriginLen || !utf8.ValidString(m.Origin) {
		return m, reasonOrigin
	}
	if m.TS < 0 {
		return m, reasonTS
	}
	switch m.T {
	case typeLease:
		return m, checkLease(m.Key, m.Level, m.TTLms, lim)
	case typeHB, typeSyncReq:
		return m, reasonNone
	case typeSync:
		for _, l := range m.Leases {
			if r := checkLease(l.Key, l.Level, l.TTLms, lim); r != reasonNone {
				return m, r
			}
		}
		return m, reasonNone
	}
	return m, reasonType
}

// checkLease validates one lease's fields.
func checkLease(key string, level shard.Level, ttlMs int64, lim limits) reason {
	switch {
	case key == "" || len(key) > lim.maxKeyLen:
		return reasonKey
	case !level.Split():
		return reasonLevel
	case ttlMs <= 0 || ttlMs > lim.maxTTL.Milliseconds():
		return reasonTTL
	}
	return reasonNone
}

// encodable reports whether key can go on the wire unchanged: JSON strings
// carry UTF-8 only (json.Marshal would replace invalid bytes), and peers
// reject keys over maxKeyLen.
func encodable(key string, maxKeyLen int) bool {
	return key != "" && len(key) <= maxKeyLen && utf8.ValidString(key)
}

// ttlMillis returns d in whole milliseconds, rounded up, at least 1.
func ttlMillis(d time.Duration) int64 {
	return max(1, int64((d+time.Millisecond-1)/time.Millisecond))
}

// encodeLease returns a lease message.
func encodeLease(origin, key string, level shard.Level, ttl time.Duration) []byte {
	b, _ := json.Marshal(message{V: wireVersion, T: typeLease, Origin: origin, Key: key, Level: level, TTLms: ttlMillis(ttl)})
	return b
}

// encodeControl returns a message of type t without body (hb, sync_req).
func encodeControl(origin, t string) []byte {
	b, _ := json.Marshal(message{V: wireVersion, T: t, Origin: origin})
	return b
}

// syncChunker builds sync replies of at most max bytes each.
type syncChunker struct {
	max    int
	head   []byte // {"v":1,"t":"sync","origin":"…","leases":[
	buf    []byte
	n      int // leases in buf
	chunks [][]byte
}

func newSyncChunker(origin string, max int) *syncChunker {
	head, _ := json.Marshal(message{V: wireVersion, T: typeSync, Origin: origin})
	// head is {…}; reopen it to append the leases array.
	head = append(head[:len(head)-1], `,"leases":[`...)
	return &syncChunker{max: max, head: head}
}

// add appends one lease, starting a new chunk when this one would overflow.
// A lease too large for any chunk is skipped (it cannot happen when max
// leaves room for the longest key, which the config checks).
func (s *syncChunker) add(key string, level shard.Level, ttl time.Duration) {
	item, _ := json.Marshal(wireLease{Key: key, Level: level, TTLms: ttlMillis(ttl)})
	const tail = len("]}")
	if len(s.head)+len(item)+tail > s.max {
		return
	}
	if s.n > 0 && len(s.buf)+1+len(item)+tail > s.max {
		s.flush()
	}
	if s.n == 0 {
		s.buf = append(s.buf[:0:0], s.head...)
	} else {
		s.buf = append(s.buf, ',')
	}
	s.buf = append(s.buf, item...)
	s.n++
}

func (s *syncChunker) flush() {
	if s.n > 0 {
		s.chunks = append(s.chunks, append(s.buf, "]}"...))
		s.buf, s.n = nil, 0
	}
}

// done returns the chunks, none if no lease was added.
func (s *syncChunker) done() [][]byte {
	s.flush()
	return s.chunks
}
