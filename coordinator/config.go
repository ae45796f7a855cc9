package coordinator

import (
	"bytes"
	"cmp"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"
	"unicode/utf8"
)

// ErrInvalidConfig is in every error NewNATS returns for a Config it
// refuses, or a nil connection (errors.Is); the error's text says which
// field and why.
var ErrInvalidConfig = errors.New("coordinator: invalid config")

// configError is a refused Config: errors.Is finds ErrInvalidConfig and the
// cause in it, and its text is the cause's.
type configError struct{ error }

func (e configError) Unwrap() []error { return []error{ErrInvalidConfig, e.error} }

// Defaults of Config.
const (
	DefaultPrefix       = "hotkey"
	DefaultNamespace    = "default"
	DefaultTTL          = 3 * time.Second
	DefaultMaxTTL       = time.Minute
	DefaultHeartbeat    = time.Second
	DefaultMaxHotKeys   = 10000
	DefaultMaxKeyLen    = 512
	DefaultMaxPeers     = 1024
	DefaultMaxInstances = 64
	DefaultMaxClockSkew = 30 * time.Second
	DefaultMaxMessage   = 64 << 10
	DefaultSyncWait     = 500 * time.Millisecond
	// MaxSyncSpans bounds how long replies to one join sync are applied:
	// at most MaxSyncSpans × SyncWait after the request (30 s at the
	// default), however the replies keep coming.
	MaxSyncSpans = 60

	// MinInterval is the shortest TTL and Heartbeat accepted.
	MinInterval = 10 * time.Millisecond
	// maxIDLen bounds Config.ID, which travels as a message's origin.
	maxIDLen = maxOriginLen
	// MinSecret is the shortest Secret accepted, in bytes.
	MinSecret = 16
	// maxTokenLen bounds Prefix and Namespace.
	maxTokenLen = 64
	// maxSyncQueue bounds the sync requests waiting for an answer; more are
	// dropped (and counted).
	maxSyncQueue = 16
	// maxControlPending bounds the lease, heartbeat and sync request
	// messages received and not handled yet; more are dropped (and
	// counted), as nats.go drops past a subscription's pending limits.
	maxControlPending = 1 << 16
	// peerTimeout is how many heartbeat intervals a peer stays live without
	// a heartbeat, and within how many a new origin must be heard twice to
	// count as a peer.
	peerTimeout = 3
)

// Config configures a NATS coordinator; the connection is NewNATS's
// argument. Zero fields take the defaults given; NewNATS rejects invalid
// values with an error saying which.
type Config struct {
	// Prefix and Namespace name the subjects: <Prefix>.<Namespace>.lease,
	// .hb, .sync and .gossip. Instances share leases only within one namespace.
	// Each is 1 to 64 of A-Z a-z 0-9 - _ (defaults "hotkey", "default").
	Prefix    string
	Namespace string
	// Region, if set, keeps instances of one namespace in different regions
	// of a NATS supercluster apart: the subjects become
	// <Prefix>.<Namespace>.<Region>.lease, .hb, .sync and .gossip, so that
	// leases, membership and gossip stay within the region. 1 to 64 of A-Z
	// a-z 0-9 - _; empty: no region.
	Region string
	// Regions, with Region, are the regions of the fleet (Region among
	// them or not): the coordinator carries RegionHandler payloads to and
	// from the others (regions.go). Each 1 to 64 of A-Z a-z 0-9 - _.
	Regions []string
	// ID names this instance in messages; unique per instance, 1 to 64
	// bytes of UTF-8 (default 16 random hex digits).
	ID string

	// TTL is the time to live of this instance's leases (default 3 s),
	// renewed every TTL/3 while the key stays announced. At least
	// MinInterval and at most MaxTTL.
	TTL time.Duration
	// MaxTTL is the longest ttl accepted from a message (default 1 min).
	MaxTTL time.Duration
	// Heartbeat is the interval between heartbeats (default 1 s). A new
	// origin counts as a live peer once two of its heartbeats came within 3
	// intervals (so one forged message cannot add a peer), and stays live
	// until 3 intervals pass without its heartbeat. At least MinInterval.
	Heartbeat time.Duration
	// SyncWait is how long replies to a join sync are applied after the
	// request, and after each reply applied (default 500 ms): a large
	// snapshot is taken while its parts keep coming, for at most
	// MaxSyncSpans × SyncWait after the request.
	SyncWait time.Duration

	// MaxHotKeys caps the distinct keys in the lease table, own and peers'
	// (default 10000). A peer's lease for a new key is dropped while the
	// table is full; an own lease for a new key evicts a key held only by
	// peers.
	MaxHotKeys int
	// MaxKeyLen is the longest key accepted from a message, in bytes
	// (default 512). Longer own keys are applied locally but not published.
	MaxKeyLen int
	// MaxPeers caps the live peers tracked for membership (default 1024),
	// and apart from them the origins heard once: when those are full, a
	// new one takes the place of an arbitrary other.
	MaxPeers int
	// MaxInstances caps the instance count handed to the Handler
	// (SetInstances), whatever the live count (default 64, or MaxPeers+1 if
	// smaller; at most MaxPeers+1). That count divides the hot-key threshold
	// and the local fallback share of every key, so the cap bounds what a
	// client forging heartbeats can do to them: divide them by MaxInstances
	// at worst, not by MaxPeers. Set it to the largest fleet a namespace
	// runs: past it, each instance detects keys as if there were only
	// MaxInstances instances (later) and its fallback share is
	// limit/MaxInstances (larger than its part of the limit).
	MaxInstances int
	// MaxMessage is the largest message accepted or sent, in bytes (default
	// 64 KiB); sync replies are split to fit, and a gossip payload may be
	// MaxMessage - GossipOverhead (MaxGossip). It must leave room for a
	// lease of the longest key: at least 6×(MaxKeyLen+64)+128, and 79 more
	// with a Secret.
	MaxMessage int

	// Secret, if set, is a key every instance of the namespace shares:
	// each message published carries a stamp (Now) and an HMAC-SHA256 of
	// the message, its subject and namespace (sign.go says exactly what),
	// and received messages that are unsigned, wrongly signed, stamped more
	// than MaxClockSkew from this instance's clock or (but for sync replies)
	// before this instance's Start, or replayed, are dropped
	// and counted in Stats.InvalidBy ("unsigned", "signature", "stale",
	// "replay"). At least MinSecret bytes: use 32 random ones. Instances
	// with and without it, or with different ones, ignore each other's
	// messages. Without it, any client that may publish on the coordination
	// subjects can forge leases and heartbeats: NATS permissions
	// (docs/operations.md) are the first wall, the secret the second. The
	// coordinator keeps a copy.
	Secret []byte
	// MaxClockSkew is how far a signed message's stamp may be from this
	// instance's clock, either way, for it to be accepted (default 30 s):
	// clock skew between hosts plus delivery delay must fit in it. Used only
	// with Secret. At least MinInterval.
	MaxClockSkew time.Duration

	// Logger receives invalid messages, rejections and the reconnections
	// handled at Debug; the connection's own events are its owner's to log.
	// Default: discard.
	Logger *slog.Logger

	// Now is the clock read for every decision about time: when leases
	// expire, whether a sync reply came within SyncWait, when a peer is no
	// longer live. Nil means time.Now; it must be safe for concurrent use.
	// Only the wake-ups run on real timers: renewals every TTL/3,
	// heartbeats, and expiry checks every quarter of TTL or Heartbeat
	// (whichever is shorter; at most 250 ms). A clock that tests move by
	// hand takes effect at the next expiry check after it moved.
	Now func() time.Time
}

// withDefaults returns c with zero fields set to their defaults, or an error
// naming the first invalid field.
func (c Config) withDefaults() (Config, error) {
	c.Prefix = cmp.Or(c.Prefix, DefaultPrefix)
	c.Namespace = cmp.Or(c.Namespace, DefaultNamespace)
	if !validToken(c.Prefix) {
		return c, fmt.Errorf("coordinator: Prefix %q: want 1 to %d of A-Z a-z 0-9 - _", c.Prefix, maxTokenLen)
	}
	if !validToken(c.Namespace) {
		return c, fmt.Errorf("coordinator: Namespace %q: want 1 to %d of A-Z a-z 0-9 - _", c.Namespace, maxTokenLen)
	}
	if c.Region != "" && !validToken(c.Region) {
		return c, fmt.Errorf("coordinator: Region %q: want 1 to %d of A-Z a-z 0-9 - _", c.Region, maxTokenLen)
	}
	for _, r := range c.Regions {
		if !validToken(r) {
			return c, fmt.Errorf("coordinator: Regions: %q: want 1 to %d of A-Z a-z 0-9 - _", r, maxTokenLen)
		}
	}
	if len(c.Regions) > 0 && c.Region == "" {
		return c, fmt.Errorf("coordinator: Regions %v without a Region of this instance's", c.Regions)
	}
	c.Regions = slices.Clone(c.Regions)
	if c.ID == "" {
		var b [8]byte
		_, _ = rand.Read(b[:])
		c.ID = hex.EncodeToString(b[:])
	}
	if len(c.ID) > maxIDLen || !utf8.ValidString(c.ID) {
		return c, fmt.Errorf("coordinator: ID %q: want 1 to %d bytes of UTF-8", c.ID, maxIDLen)
	}
	durations := []struct {
		name string
		d    *time.Duration
		def  time.Duration
	}{
		{"TTL", &c.TTL, DefaultTTL},
		{"MaxTTL", &c.MaxTTL, DefaultMaxTTL},
		{"Heartbeat", &c.Heartbeat, DefaultHeartbeat},
		{"SyncWait", &c.SyncWait, DefaultSyncWait},
		{"MaxClockSkew", &c.MaxClockSkew, DefaultMaxClockSkew},
	}
	for _, f := range durations {
		if *f.d < 0 {
			return c, fmt.Errorf("coordinator: %s %v is negative", f.name, *f.d)
		}
		*f.d = cmp.Or(*f.d, f.def)
	}
	if c.TTL < MinInterval || c.Heartbeat < MinInterval || c.MaxClockSkew < MinInterval {
		return c, fmt.Errorf("coordinator: TTL %v, Heartbeat %v and MaxClockSkew %v must be at least %v", c.TTL, c.Heartbeat, c.MaxClockSkew, MinInterval)
	}
	if c.TTL > c.MaxTTL {
		return c, fmt.Errorf("coordinator: TTL %v is over MaxTTL %v: peers would reject these leases", c.TTL, c.MaxTTL)
	}
	ints := []struct {
		name string
		n    *int
		def  int
	}{
		{"MaxHotKeys", &c.MaxHotKeys, DefaultMaxHotKeys},
		{"MaxKeyLen", &c.MaxKeyLen, DefaultMaxKeyLen},
		{"MaxPeers", &c.MaxPeers, DefaultMaxPeers},
		{"MaxMessage", &c.MaxMessage, DefaultMaxMessage},
	}
	for _, f := range ints {
		if *f.n < 0 {
			return c, fmt.Errorf("coordinator: %s %d is negative", f.name, *f.n)
		}
		*f.n = cmp.Or(*f.n, f.def)
	}
	switch {
	case c.MaxInstances < 0:
		return c, fmt.Errorf("coordinator: MaxInstances %d is negative", c.MaxInstances)
	case c.MaxInstances == 0:
		c.MaxInstances = min(DefaultMaxInstances, c.MaxPeers+1)
	case c.MaxInstances > c.MaxPeers+1:
		return c, fmt.Errorf("coordinator: MaxInstances %d is over MaxPeers+1 (%d)", c.MaxInstances, c.MaxPeers+1)
	}
	if c.Secret != nil {
		if len(c.Secret) < MinSecret {
			return c, fmt.Errorf("coordinator: Secret is %d bytes: want at least %d", len(c.Secret), MinSecret)
		}
		c.Secret = bytes.Clone(c.Secret)
	}
	if min := minMessage(c.MaxKeyLen, c.Secret != nil); c.MaxMessage < min {
		return c, fmt.Errorf("coordinator: MaxMessage %d is too small for MaxKeyLen %d: want at least %d", c.MaxMessage, c.MaxKeyLen, min)
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return c, nil
}

// minMessage is the smallest MaxMessage that holds a lease of a key of
// maxKeyLen bytes, every byte escaped (6 bytes in JSON), and of the longest
// origin, signed or not.
func minMessage(maxKeyLen int, signed bool) int {
	n := 6*(maxKeyLen+maxOriginLen) + 128
	if signed {
		n += sealOverhead
	}
	return n
}

// validToken reports whether s is a subject token of 1 to maxTokenLen
// letters, digits, '-' or '_'.
func validToken(s string) bool {
	if s == "" || len(s) > maxTokenLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		b := s[i]
		if !('a' <= b && b <= 'z' || 'A' <= b && b <= 'Z' || '0' <= b && b <= '9' || b == '-' || b == '_') {
			return false
		}
	}
	return true
}
