package coordinator

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nats.go"

	"github.com/hotkeyd/hotkey/shard"
)

// Defaults of Config.
const (
	DefaultPrefix         = "hotkey"
	DefaultNamespace      = "default"
	DefaultTTL            = 3 * time.Second
	DefaultMaxTTL         = time.Minute
	DefaultHeartbeat      = time.Second
	DefaultMaxHotKeys     = 10000
	DefaultMaxKeyLen      = 512
	DefaultMaxPeers       = 1024
	DefaultMaxInstances   = 64
	DefaultMaxClockSkew   = 30 * time.Second
	DefaultMaxMessage     = 64 << 10
	DefaultSyncWait       = 500 * time.Millisecond
	DefaultReconnectWait  = 500 * time.Millisecond
	DefaultConnectTimeout = 2 * time.Second

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
	// peerTimeout is how many heartbeat intervals a peer stays live without
	// a heartbeat, and within how many a new origin must be heard twice to
	// count as a peer.
	peerTimeout = 3
)

// Config configures a NATS coordinator. Zero fields take the defaults
// given; NewNATS rejects invalid values with an error saying which.
type Config struct {
	// Conn is an established connection to use. The coordinator does not
	// own it: Close leaves it open, and connection events (reconnects) are
	// noticed by polling, within a heartbeat. Set either Conn or URLs.
	Conn *nats.Conn
	// URLs are the servers to dial (nats:// or tls://, several for a
	// cluster). The coordinator owns that connection: it reconnects
	// forever (waiting ReconnectWait between rounds over the servers), and
	// Close closes it.
	URLs []string

	// Credentials for dialing, at most one kind: User and Password, Token,
	// an nkey seed file, or a credentials (JWT) file.
	User, Password string
	Token          string
	NkeySeedFile   string
	CredsFile      string
	// TLS for dialing: CAFile verifies the server (PEM); CertFile and
	// KeyFile (PEM) are a client certificate, for servers that verify
	// clients. Either turns TLS on.
	CAFile            string
	CertFile, KeyFile string
	// ConnectTimeout bounds dialing one server (default 2 s).
	ConnectTimeout time.Duration
	// ReconnectWait is the pause before a server is tried again after a
	// failed attempt (default 500 ms; nats.go adds jitter).
	ReconnectWait time.Duration
	// NATSOptions are applied last when dialing, to set anything else.
	NATSOptions []nats.Option

	// Prefix and Namespace name the subjects: <Prefix>.<Namespace>.lease,
	// .hb and .sync. Instances share leases only within one namespace.
	// Each is 1 to 64 of A-Z a-z 0-9 - _ (defaults "hotkey", "default").
	Prefix    string
	Namespace string
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
	// request (default 500 ms).
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
	// 64 KiB); sync replies are split to fit. It must leave room for a
	// lease of the longest key: at least 6×(MaxKeyLen+64)+128, and 79 more
	// with a Secret.
	MaxMessage int

	// Secret, if set, is a key every instance of the namespace shares:
	// each message published carries a stamp (Now) and an HMAC-SHA256 of
	// the message, its subject and namespace (sign.go says exactly what),
	// and received messages that are unsigned, wrongly signed, stamped more
	// than MaxClockSkew from this instance's clock, or replayed, are dropped
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

	// Logger receives connection events at Info and Warn; invalid messages
	// and rejections at Debug. Default: discard.
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
	if err := checkConnConfig(&c); err != nil {
		return c, err
	}
	if c.ConnectTimeout == 0 {
		c.ConnectTimeout = DefaultConnectTimeout
	}
	if c.ReconnectWait == 0 {
		c.ReconnectWait = DefaultReconnectWait
	}
	if c.Prefix == "" {
		c.Prefix = DefaultPrefix
	}
	if c.Namespace == "" {
		c.Namespace = DefaultNamespace
	}
	if !validToken(c.Prefix) {
		return c, fmt.Errorf("coordinator: Prefix %q: want 1 to %d of A-Z a-z 0-9 - _", c.Prefix, maxTokenLen)
	}
	if !validToken(c.Namespace) {
		return c, fmt.Errorf("coordinator: Namespace %q: want 1 to %d of A-Z a-z 0-9 - _", c.Namespace, maxTokenLen)
	}
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
		if *f.d == 0 {
			*f.d = f.def
		}
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
		if *f.n == 0 {
			*f.n = f.def
		}
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

// NATS is a Coordinator sharing leases over NATS.
//
// Each instance publishes a lease for every key its detector announces hot
// and renews it every TTL/3; every instance keeps a table of the leases it
// hears, the level in force of a key being the highest level with an
// unexpired lease (expiry = local receipt time + ttl). Heartbeats count the
// live instances: a new origin counts once heard twice within 3 heartbeat
// intervals, and the count handed to the Handler is capped (MaxInstances).
// A joining or reconnected instance asks the others for their tables (join
// sync); without that it still converges within one renewal period. With a
// Secret, messages are signed and unsigned, stale or replayed ones dropped
// (sign.go).
//
// The table keeps, per key, this instance's own level and, for each level,
// the latest expiry any peer's lease gave it; origins are not stored, so a
// key costs the same however many peers lease it. A peer that lowers its
// level leaves its higher lease to lapse (within its ttl), and so does this
// instance: its own lower level takes effect here when its last lease at the
// higher level lapses on the peers, so that all instances move to the new
// level at about the same instant (a raise takes effect at once).
//
// Handler calls come from one dispatcher goroutine, shortly after the
// Announce or message that caused them. Changes are coalesced per key: the
// level a key ends at is always delivered, but levels it passed through
// while the Handler was busy may be skipped, and changes of different keys
// may be delivered in any order. Pending changes are bounded by the table
// (at most 2×MaxHotKeys), so a slow Handler cannot make them grow without
// bound.
//
// While NATS is unreachable, own announcements still apply at once, peers'
// leases lapse and the live count falls to 1: the coordinator degrades to
// local coordination, and heals on reconnect.
type NATS struct {
	cfg       Config
	lim       limits
	log       *slog.Logger
	subjLease string
	subjHB    string
	subjSync  string
	sweep     time.Duration // longest interval between expiry checks
	sign      *signer       // nil without Secret
	seenMsg   *replayGuard  // stamps on <prefix>.<ns>.*; nil without Secret
	seenSync  *replayGuard  // stamps of sync replies; nil without Secret

	// Set by Start, then read-only.
	h        Handler
	nc       *nats.Conn
	owned    bool
	sub      *nats.Subscription // <prefix>.<ns>.*
	inboxSub *nats.Subscription // sync replies
	inbox    string

	mu       sync.Mutex // guards the fields below, up to toldLive
	started  bool
	closed   bool
	table    *leaseTable
	announce map[string]struct{}  // own keys to publish at once
	syncQ    []string             // reply subjects of sync requests to answer
	peers    map[string]time.Time // live peer → time of last heartbeat
	once     map[string]time.Time // origin heard once, not live yet → time of that heartbeat
	live     int                  // instances to hand the Handler: 1 + len(peers), at most MaxInstances
	toldLive int                  // live count handed to the dispatcher

	syncUntil atomic.Pointer[time.Time] // until when sync replies are applied; nil before Start
	wakePub   chan struct{}
	wakeDisp  chan struct{}
	wakeSweep chan struct{}
	done      chan struct{}
	wg        sync.WaitGroup
	st        counters
}

var _ Coordinator = (*NATS)(nil)

// NewNATS returns a NATS coordinator for cfg, or an error if cfg is
// invalid. It does not connect: Start does.
func NewNATS(cfg Config) (*NATS, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	subj := cfg.Prefix + "." + cfg.Namespace + "."
	c := &NATS{
		cfg:       cfg,
		lim:       limits{maxMessage: cfg.MaxMessage, maxKeyLen: cfg.MaxKeyLen, maxTTL: cfg.MaxTTL},
		log:       cfg.Logger.With("coordinator", cfg.ID),
		subjLease: subj + "lease",
		subjHB:    subj + "hb",
		subjSync:  subj + "sync",
		sweep:     min(max(min(cfg.TTL, cfg.Heartbeat)/4, 5*time.Millisecond), 250*time.Millisecond),
		announce:  make(map[string]struct{}),
		peers:     make(map[string]time.Time),
		once:      make(map[string]time.Time),
		live:      1,
		wakePub:   make(chan struct{}, 1),
		wakeDisp:  make(chan struct{}, 1),
		wakeSweep: make(chan struct{}, 1),
		done:      make(chan struct{}),
	}
	if cfg.Secret != nil {
		c.sign = &signer{secret: cfg.Secret, scope: cfg.Prefix + "." + cfg.Namespace}
		c.seenMsg = newReplayGuard(cfg.MaxClockSkew, cfg.MaxPeers)
		c.seenSync = newReplayGuard(cfg.MaxClockSkew, cfg.MaxPeers)
	}
	c.table = c.newTable()
	return c, nil
}

// newTable returns an empty lease table whose changes wake the dispatcher
// and whose expiries wake the sweeper.
func (c *NATS) newTable() *leaseTable {
	t := newLeaseTable(c.cfg.ID, c.cfg.TTL, c.cfg.MaxHotKeys, c.sweep, c.now())
	t.onChange = func() { c.wake(c.wakeDisp) }
	t.onSooner = func() { c.wake(c.wakeSweep) }
	return t
}

// ID returns this instance's ID.
func (c *NATS) ID() string { return c.cfg.ID }

// now reads the coordinator's clock, Config.Now.
func (c *NATS) now() time.Time { return c.cfg.Now() }

// Start implements Coordinator: it connects (unless given a Conn),
// subscribes, tells h there is 1 instance, sends a heartbeat and a join sync
// request, and starts the goroutines. It does not wait for sync replies:
// they are applied as they arrive, for SyncWait. If the first connection
// fails (no server reachable, bad credentials, TLS), Start returns the error
// and the caller may fall back to Local; once connected, the coordinator
// reconnects forever. Announce applies locally whatever the connection.
func (c *NATS) Start(h Handler) error {
	if h == nil {
		return errors.New("coordinator: Start with a nil Handler")
	}
	lastReconnects, err := c.connect(h)
	if err != nil {
		return err
	}
	// Outside c.mu, so the Handler may call the coordinator; the dispatcher,
	// the only other caller of h, starts after.
	h.SetInstances(1)
	go c.publisher(lastReconnects)
	go c.sweeper()
	go c.dispatcher()
	return nil
}

// connect does the part of Start under c.mu: connect, subscribe, send a
// heartbeat and a sync request. It returns the connection's reconnect count.
func (c *NATS) connect(h Handler) (lastReconnects uint64, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case c.closed:
		return 0, errors.New("coordinator: Start after Close")
	case c.started:
		return 0, errors.New("coordinator: Start called twice")
	}
	c.table = c.newTable() // its first sweep is due a sweep interval from now
	c.nc = c.cfg.Conn
	if c.nc == nil {
		opts, err := c.dialOptions()
		if err != nil {
			return 0, err
		}
		if c.nc, err = nats.Connect(strings.Join(c.cfg.URLs, ","), opts...); err != nil {
			return 0, fmt.Errorf("coordinator: connect to NATS at %s: %w", redactAll(c.cfg.URLs), err)
		}
		c.owned = true
	}
	defer func() {
		if err != nil {
			c.unsubscribe()
			if c.owned {
				c.nc.Close()
			}
		}
	}()
	if c.sub, err = c.nc.Subscribe(c.cfg.Prefix+"."+c.cfg.Namespace+".*", c.onMsg); err != nil {
		return 0, fmt.Errorf("coordinator: subscribe: %w", err)
	}
	c.inbox = c.nc.NewInbox()
	if c.inboxSub, err = c.nc.Subscribe(c.inbox, c.onSyncReply); err != nil {
		return 0, fmt.Errorf("coordinator: subscribe: %w", err)
	}
	// The subscriptions are in place on the server before anything is
	// asked of the peers.
	if err = c.nc.FlushTimeout(c.cfg.ConnectTimeout); err != nil {
		return 0, fmt.Errorf("coordinator: flush subscriptions to NATS: %w", err)
	}
	c.h = h
	c.started = true
	c.toldLive = 1
	c.publish(c.subjHB, encodeControl(c.cfg.ID, typeHB))
	c.requestSync()
	c.wg.Add(3)
	return c.nc.Stats().Reconnects, nil
}

// Announce implements Coordinator. A level of 4, 16 or 64 becomes this
// instance's lease for key (replacing its previous one), published without
// waiting on the network; level 1 drops it, and peers let it lapse. A higher
// level is in force here at once; a lower one once the lease at the old
// level lapses on the peers (ttl after its last publication), as it does
// there. Other levels are ignored, as are calls before
// Start or after Close.
func (c *NATS) Announce(key string, _ uint64, level int) {
	if !shard.ValidLevel(level) {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.started || c.closed {
		return
	}
	changed, ok := c.table.setOwn(key, level, c.now())
	switch {
	case !ok:
		c.st.rejected.Add(1)
		c.log.Debug("coordinator: lease table full of own keys", "key", key)
	case !changed:
	case level == shard.Level1:
		delete(c.announce, key)
	case encodable(key, c.cfg.MaxKeyLen):
		c.announce[key] = struct{}{}
		c.wake(c.wakePub)
	default:
		c.st.unpublished.Add(1)
	}
}

// applyLease merges a lease of peer origin, received at now, into the
// table. Called with c.mu held.
func (c *NATS) applyLease(origin, key string, level int, ttlMs int64, now time.Time) {
	if !c.table.applyLease(origin, key, level, time.Duration(ttlMs)*time.Millisecond, now) {
		c.st.rejected.Add(1)
	}
}

// heard records a heartbeat of origin, received at now. A live peer's
// stays live; another origin becomes a live peer at its second heartbeat
// within the peer timeout, so that an origin heard once (one forged message)
// never counts. Origins heard once are capped at MaxPeers like live peers:
// a new one then takes the place of an arbitrary other, so that a flood of
// them delays a real peer at most (a Secret stops such floods). Called
// with c.mu held.
func (c *NATS) heard(origin string, now time.Time) {
	if _, ok := c.peers[origin]; ok {
		c.peers[origin] = now
		return
	}
	first, ok := c.once[origin]
	if ok && now.Sub(first) < peerTimeout*c.cfg.Heartbeat {
		if len(c.peers) >= c.cfg.MaxPeers {
			c.st.peersRejected.Add(1)
			return
		}
		delete(c.once, origin)
		c.peers[origin] = now
		c.setLive()
		return
	}
	if !ok && len(c.once) >= c.cfg.MaxPeers {
		for o := range c.once {
			delete(c.once, o)
			break
		}
		c.st.peersRejected.Add(1)
	}
	c.once[origin] = now
}

// setLive recomputes the live count. Called with c.mu held.
func (c *NATS) setLive() {
	if n := min(1+len(c.peers), c.cfg.MaxInstances); n != c.live {
		c.live = n
		c.wake(c.wakeDisp)
	}
}

// wake signals a goroutine without blocking.
func (c *NATS) wake(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// onMsg receives the messages of <prefix>.<ns>.*: leases, heartbeats and
// sync requests. It runs on the subscription's goroutine.
func (c *NATS) onMsg(m *nats.Msg) {
	msg, now, ok := c.receive(m, c.seenMsg, func(msg message) reason {
		switch {
		case m.Subject == c.subjLease && msg.T == typeLease,
			m.Subject == c.subjHB && msg.T == typeHB:
		case m.Subject == c.subjSync && msg.T == typeSyncReq:
			if m.Reply == "" {
				return reasonReply
			}
		default:
			return reasonType
		}
		return reasonNone
	})
	if !ok {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return
	}
	switch msg.T {
	case typeLease:
		c.applyLease(msg.Origin, msg.Key, msg.Level, msg.TTLms, now)
	case typeHB:
		c.heard(msg.Origin, now)
	case typeSyncReq:
		if len(c.syncQ) >= maxSyncQueue {
			c.st.dropped.Add(1)
			return
		}
		c.syncQ = append(c.syncQ, m.Reply)
		c.wake(c.wakePub)
	}
}

// onSyncReply receives replies to this instance's sync requests.
func (c *NATS) onSyncReply(m *nats.Msg) {
	if len(m.Data) == 0 && m.Header.Get("Status") == "503" {
		// The server's "no responders": nobody else is subscribed to the
		// sync subject (yet).
		c.st.noResponders.Add(1)
		return
	}
	msg, now, ok := c.receive(m, c.seenSync, func(msg message) reason {
		if msg.T != typeSync {
			return reasonType
		}
		return reasonNone
	})
	if !ok {
		return
	}
	if until := c.syncUntil.Load(); until == nil || now.After(*until) {
		c.st.lateReplies.Add(1)
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return
	}
	c.st.syncReplies.Add(1)
	for _, l := range msg.Leases {
		c.applyLease(msg.Origin, l.Key, l.Level, l.TTLms, now)
	}
}

// receive counts m, checks its signature (with a Secret), decodes it, and
// checks it further with check (its type against the subject). With a
// Secret, it also checks the stamp: within MaxClockSkew of the clock, and
// above the last one guard accepted from the origin. It drops m, counted,
// if it is invalid or this instance's own, and reports whether m is to be
// applied, with the time it was received at.
func (c *NATS) receive(m *nats.Msg, guard *replayGuard, check func(message) reason) (message, time.Time, bool) {
	now := c.now()
	c.st.received.Add(1)
	var msg message
	r := reasonNone
	if c.sign != nil && len(m.Data) <= c.lim.maxMessage {
		r = c.sign.verify(m.Subject, m.Data)
	}
	if r == reasonNone {
		msg, r = decode(m.Data, c.lim)
	}
	if r == reasonNone {
		r = check(msg)
	}
	if r == reasonNone && c.sign != nil && !fresh(msg.TS, now, c.cfg.MaxClockSkew) {
		r = reasonStale
	}
	if r != reasonNone {
		c.invalid(r, m.Subject)
		return msg, now, false
	}
	if msg.Origin == c.cfg.ID {
		c.st.own.Add(1)
		return msg, now, false
	}
	if c.sign != nil {
		r, full := guard.accept(msg.Origin, msg.TS, now)
		if full {
			c.st.dropped.Add(1)
			return msg, now, false
		}
		if r != reasonNone {
			c.invalid(r, m.Subject)
			return msg, now, false
		}
	}
	return msg, now, true
}

func (c *NATS) invalid(r reason, subject string) {
	c.st.invalid[r].Add(1)
	c.log.Debug("coordinator: invalid message dropped", "reason", r.String(), "subject", subject)
}

// seal returns msg signed for subject, or msg itself without a Secret.
func (c *NATS) seal(subject string, msg []byte) []byte {
	if c.sign == nil {
		return msg
	}
	return c.sign.seal(subject, msg, c.now())
}

// publish sends one message, signed with a Secret; failures are counted,
// never returned: the table heals by renewal and resync.
func (c *NATS) publish(subject string, data []byte) {
	if err := c.nc.Publish(subject, c.seal(subject, data)); err != nil {
		c.st.publishErrors.Add(1)
		return
	}
	c.st.published.Add(1)
}

// requestSync asks the peers for their tables; replies are applied for
// SyncWait.
func (c *NATS) requestSync() {
	until := c.now().Add(c.cfg.SyncWait)
	c.syncUntil.Store(&until)
	if err := c.nc.PublishRequest(c.subjSync, c.inbox, c.seal(c.subjSync, encodeControl(c.cfg.ID, typeSyncReq))); err != nil {
		c.st.publishErrors.Add(1)
		return
	}
	c.st.published.Add(1)
	c.st.syncRequests.Add(1)
}

// publisher sends everything this instance publishes: announced leases at
// once, renewals every TTL/3, heartbeats, sync answers, and after a
// reconnect every own lease and a sync request. Publishing may block on the
// network (nats.go writes through when its buffer fills), so it never runs
// under c.mu nor on an Announce caller.
func (c *NATS) publisher(lastReconnects uint64) {
	defer c.wg.Done()
	renew := time.NewTicker(c.cfg.TTL / 3)
	defer renew.Stop()
	hb := time.NewTicker(c.cfg.Heartbeat)
	defer hb.Stop()
	for {
		select {
		case <-c.done:
			return
		case <-c.wakePub:
			c.publishAnnounced()
			c.answerSync()
		case <-renew.C:
			c.publishOwn()
		case <-hb.C:
			c.publish(c.subjHB, encodeControl(c.cfg.ID, typeHB))
		}
		if n := c.nc.Stats().Reconnects; n != lastReconnects {
			lastReconnects = n
			c.st.reconnects.Add(1)
			c.publish(c.subjHB, encodeControl(c.cfg.ID, typeHB))
			c.publishOwn()
			c.requestSync()
		}
	}
}

// publishAnnounced publishes the own leases announced since the last call.
func (c *NATS) publishAnnounced() {
	c.mu.Lock()
	if len(c.announce) == 0 {
		c.mu.Unlock()
		return
	}
	leases := make(map[string]int, len(c.announce))
	for k := range c.announce {
		if l, ok := c.table.own[k]; ok {
			leases[k] = l
		}
	}
	clear(c.announce)
	c.table.published(leases, c.now())
	c.mu.Unlock()
	c.publishLeases(leases)
}

// publishOwn publishes every own lease (renewal).
func (c *NATS) publishOwn() {
	c.mu.Lock()
	leases := maps.Clone(c.table.own)
	c.table.published(leases, c.now())
	c.mu.Unlock()
	c.publishLeases(leases)
}

func (c *NATS) publishLeases(leases map[string]int) {
	for k, l := range leases {
		if encodable(k, c.cfg.MaxKeyLen) {
			c.publish(c.subjLease, encodeLease(c.cfg.ID, k, l, c.cfg.TTL))
		}
	}
}

// answerSync answers the queued sync requests with every unexpired lease
// this instance knows: its own (with a full TTL, since it renews them) and
// its peers' (with the time they have left).
func (c *NATS) answerSync() {
	type item struct {
		key   string
		level int
		ttl   time.Duration
	}
	c.mu.Lock()
	if len(c.syncQ) == 0 {
		c.mu.Unlock()
		return
	}
	replyTo := c.syncQ
	c.syncQ = nil
	var items []item
	c.table.each(c.now(), func(key string, level int, ttl time.Duration, own bool) {
		if !own || encodable(key, c.cfg.MaxKeyLen) {
			items = append(items, item{key, level, ttl})
		}
	})
	c.mu.Unlock()
	limit := c.cfg.MaxMessage
	if mp := c.nc.MaxPayload(); mp > 0 && int64(limit) > mp {
		limit = int(mp)
	}
	if c.sign != nil {
		limit -= sealOverhead
	}
	ch := newSyncChunker(c.cfg.ID, limit)
	for _, it := range items {
		ch.add(it.key, it.level, it.ttl)
	}
	chunks := ch.done()
	for _, reply := range replyTo {
		for _, b := range chunks {
			c.publish(reply, b)
		}
		c.st.syncAnswered.Add(1)
	}
}

// sweeper expires leases and peers.
//
// It runs every sweep interval, and also at the soonest expiry when that
// comes earlier, so that a lease lapses when its ttl is up rather than up to
// a sweep interval later: instances that received the same lease then leave
// its level within a millisecond or so of each other.
func (c *NATS) sweeper() {
	defer c.wg.Done()
	t := time.NewTimer(c.sweep)
	defer t.Stop()
	for {
		select {
		case <-c.done:
			return
		case <-t.C:
		case <-c.wakeSweep:
		}
		c.mu.Lock()
		t.Reset(max(c.sweepLocked(c.now()), time.Millisecond))
		c.mu.Unlock()
	}
}

// sweepLocked expires the leases and peers that are out of time at now. It
// returns how long after now it is due again. Called with c.mu held.
func (c *NATS) sweepLocked(now time.Time) time.Duration {
	next := c.table.sweep(now)
	dead := now.Add(-peerTimeout * c.cfg.Heartbeat)
	for p, last := range c.peers {
		if !last.After(dead) {
			delete(c.peers, p)
		}
	}
	for p, first := range c.once {
		if !first.After(dead) {
			delete(c.once, p)
		}
	}
	c.setLive()
	if c.sign != nil {
		c.seenMsg.sweep(now)
		c.seenSync.sweep(now)
	}
	return next
}

// dispatcher calls the Handler, one change at a time.
func (c *NATS) dispatcher() {
	defer c.wg.Done()
	for {
		select {
		case <-c.done:
			return
		case <-c.wakeDisp:
		}
		c.mu.Lock()
		batch := c.table.changes()
		live := 0
		if c.live != c.toldLive {
			live, c.toldLive = c.live, c.live
		}
		c.mu.Unlock()
		if live > 0 {
			c.h.SetInstances(live)
		}
		for k, ch := range batch {
			select {
			case <-c.done:
				return
			default:
			}
			c.h.SetLevel(k, ch.hash, ch.level)
		}
	}
}

// unsubscribe removes the subscriptions made so far.
func (c *NATS) unsubscribe() {
	for _, s := range []*nats.Subscription{c.sub, c.inboxSub} {
		if s != nil {
			_ = s.Unsubscribe()
		}
	}
}

// Close implements Coordinator: it stops the goroutines, unsubscribes,
// closes the connection if the coordinator dialed it, and waits. The
// Handler is not called once Close has returned. Calling it again does
// nothing.
func (c *NATS) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	started := c.started
	c.mu.Unlock()
	if !started {
		return nil
	}
	close(c.done)
	c.unsubscribe()
	if c.owned {
		c.nc.Close()
	}
	c.wg.Wait()
	return nil
}

// Stats are a coordinator's counters since Start, for metrics.
type Stats struct {
	Published     uint64            // messages published: leases, heartbeats, sync requests and answers
	PublishErrors uint64            // publishes nats.go refused (disconnected, closed, too large); renewal and resync repair them
	Received      uint64            // messages received, valid or not
	Own           uint64            // own messages received back and ignored
	Invalid       uint64            // invalid messages dropped: the sum of InvalidBy
	InvalidBy     map[string]uint64 // invalid messages by reason: size, json, version, type, origin, key, level, ttl, reply, ts; with a Secret also unsigned, signature, stale, replay
	Rejected      uint64            // valid leases for a new key dropped because MaxHotKeys keys were held
	PeersRejected uint64            // origins not made live peers because MaxPeers were live, or forgotten after one heartbeat because MaxPeers others were heard once
	Dropped       uint64            // messages lost to slow consumption, sync requests left unanswered (too many queued), and signed messages of a new origin while MaxPeers origins' stamps were kept
	LateReplies   uint64            // sync replies that came after SyncWait, not applied
	Unpublished   uint64            // own leases applied here only: key not UTF-8 or over MaxKeyLen
	SyncRequests  uint64            // join syncs sent (at Start and after each reconnect)
	SyncAnswered  uint64            // peers' sync requests answered
	SyncReplies   uint64            // sync reply messages applied
	NoResponders  uint64            // sync requests nobody else was subscribed to (the server said so)
	Reconnects    uint64            // reconnections handled (own leases republished, table resynced)
	Disconnects   uint64            // disconnections seen (owned connections only)
	AsyncErrors   uint64            // asynchronous NATS errors, e.g. slow consumer (owned connections only)
	Keys          int               // distinct keys in the lease table
	OwnKeys       int               // keys this instance holds a lease for
	Peers         int               // live peers, this instance excluded (the Handler is told min(1+Peers, MaxInstances))
	PendingPeers  int               // origins heard once, live at their second heartbeat within 3 intervals
}

// counters are the atomic counters behind Stats.
type counters struct {
	published, publishErrors, received, own, rejected, peersRejected atomic.Uint64
	dropped, lateReplies, unpublished, syncRequests, syncAnswered    atomic.Uint64
	syncReplies, noResponders, reconnects, disconnects, asyncErrors  atomic.Uint64
	invalid                                                          [numReasons]atomic.Uint64
}

// Stats returns the coordinator's counters.
func (c *NATS) Stats() Stats {
	s := Stats{
		Published:     c.st.published.Load(),
		PublishErrors: c.st.publishErrors.Load(),
		Received:      c.st.received.Load(),
		Own:           c.st.own.Load(),
		InvalidBy:     make(map[string]uint64),
		Rejected:      c.st.rejected.Load(),
		PeersRejected: c.st.peersRejected.Load(),
		Dropped:       c.st.dropped.Load(),
		LateReplies:   c.st.lateReplies.Load(),
		Unpublished:   c.st.unpublished.Load(),
		SyncRequests:  c.st.syncRequests.Load(),
		SyncAnswered:  c.st.syncAnswered.Load(),
		SyncReplies:   c.st.syncReplies.Load(),
		NoResponders:  c.st.noResponders.Load(),
		Reconnects:    c.st.reconnects.Load(),
		Disconnects:   c.st.disconnects.Load(),
		AsyncErrors:   c.st.asyncErrors.Load(),
	}
	for r := reasonNone + 1; r < numReasons; r++ {
		if n := c.st.invalid[r].Load(); n > 0 {
			s.InvalidBy[r.String()] = n
			s.Invalid += n
		}
	}
	c.mu.Lock()
	s.Keys, s.OwnKeys, s.Peers, s.PendingPeers = len(c.table.keys), len(c.table.own), len(c.peers), len(c.once)
	started := c.started
	c.mu.Unlock()
	if started {
		for _, sub := range []*nats.Subscription{c.sub, c.inboxSub} {
			if n, err := sub.Dropped(); err == nil {
				s.Dropped += uint64(n)
			}
		}
	}
	return s
}

// Lease is one key of the lease table, as Leases reports it.
type Lease struct {
	Key string
	// Level is the level in force: 4, 16 or 64.
	Level int
	// ExpiresIn is how long the lease holding Level lasts unless renewed:
	// the latest-expiring lease at that level, this instance's own
	// included (renewed every TTL/3 while its detector finds the key hot).
	ExpiresIn time.Duration
	// Origin is the ID of the instance whose lease that is. For a lease
	// learned by join sync it is the instance that answered.
	Origin string
}

// Leases returns the keys split now (level in force above 1), each with
// the lease that holds its level, ordered by level (highest first), then
// key. It reads the table under the coordinator's lock: meant for status
// pages, not for the decision path.
func (c *NATS) Leases() []Lease {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.started {
		return nil
	}
	return c.table.leases(c.now())
}
