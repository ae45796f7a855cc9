package coordinator

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// Signed messages. With Config.Secret set, every message a coordinator
// publishes ends in two more fields, a stamp and a MAC, the MAC last:
//
//	{"v":1,"t":"hb","origin":"a1b2…","ts":1772366400000001,"mac":"<43 characters>"}
//
// ts is the sender's clock (Config.Now) in microseconds since the Unix
// epoch, made strictly increasing per sender (a stamp is one more than the
// previous one when the clock has not moved on), but for a clock stepped
// back by more than MaxClockSkew: its stamps follow the clock at once,
// since those of the step were stale to peers whose clocks agree with it
// now. mac is the unpadded
// base64url HMAC-SHA256, keyed with the secret, of
//
//	"hotkey-mac-v1\n" + <prefix>.<namespace> + "\n" + subject + "\n" + body
//
// where subject is the one the message is published on (the sync reply's is
// the requester's inbox) and body is the message's bytes up to, not
// including, `,"mac":"`. So the MAC covers every byte of the message but
// itself, whatever the JSON says, and a message cannot be moved to another
// subject, namespace or prefix, or to another instance's inbox. Subject
// mappings on the NATS server that rewrite these subjects break it.
//
// A receiver with a secret drops, counting them by reason, messages that
// are not signed ("unsigned"), whose MAC is wrong ("signature"), whose
// stamp is more than MaxClockSkew from its own clock either way ("stale"),
// or whose stamp is not above the last one it accepted from that origin
// ("replay": kept per origin for twice MaxClockSkew, after which a replay
// is stale anyway). A replayed heartbeat or lease is therefore refused even
// within the window. What a receiver remembers starts at its Start, so a
// lease, heartbeat or sync request stamped before then is stale too: a
// restarted instance accepts no replay of its previous life's window. Sync
// replies are exempt: each is signed for the inbox of one Start, which is
// new each time. A receiver without a secret ignores ts and mac, as it
// ignores any field it does not know.
const (
	macDomain = "hotkey-mac-v1\n"
	// gossipDomain starts gossip envelopes' MACs (envelope.go) as
	// macDomain does the JSON messages': the two never sign the same input.
	gossipDomain = "hotkey-gossip-mac-v1\n"
	// macLen is the length of a MAC in unpadded base64url.
	macLen = 43
	// sealOverhead bounds what seal adds to a message: `,"ts":` and 16
	// digits, and the MAC field.
	sealOverhead = len(`,"ts":`) + 20 + len(macHead) + macLen + len(`"}`)
	macHead      = `,"mac":"`
)

// signer signs and checks messages with a shared secret. Its methods are
// safe for concurrent use.
type signer struct {
	secret []byte
	scope  string        // <prefix>.<namespace>[.<region>]
	window time.Duration // MaxClockSkew; zero keeps stamps increasing whatever the clock does
	last   atomic.Int64
}

// macOf returns the MAC of a JSON message's body published on subject.
func (s *signer) macOf(subject string, body []byte) []byte {
	return s.sum(macDomain, subject, body)
}

// sum returns the HMAC of domain, the scope, subject and body, each of
// the middle two followed by a newline (domain ends in one).
func (s *signer) sum(domain, subject string, body []byte) []byte {
	h := hmac.New(sha256.New, s.secret)
	h.Write([]byte(domain))
	h.Write([]byte(s.scope))
	h.Write([]byte{'\n'})
	h.Write([]byte(subject))
	h.Write([]byte{'\n'})
	h.Write(body)
	return h.Sum(nil)
}

// stamp returns a stamp for a message sent at now: now in microseconds, or
// one more than the last stamp when the clock has not passed it, unless
// that is more than the window ahead of now.
func (s *signer) stamp(now time.Time) int64 {
	t := now.UnixMicro()
	for {
		last := s.last.Load()
		n := max(t, last+1)
		if s.window > 0 && n-t > s.window.Microseconds() {
			n = t
		}
		if s.last.CompareAndSwap(last, n) {
			return n
		}
	}
}

// seal returns msg, a JSON object, with a stamp for now and the MAC of it
// for subject added. msg is not modified.
func (s *signer) seal(subject string, msg []byte, now time.Time) []byte {
	b := make([]byte, 0, len(msg)+sealOverhead)
	b = append(b, msg[:len(msg)-1]...) // drop the closing '}'
	b = append(b, `,"ts":`...)
	b = strconv.AppendInt(b, s.stamp(now), 10)
	mac := s.macOf(subject, b)
	b = append(b, macHead...)
	b = base64.RawURLEncoding.AppendEncode(b, mac)
	return append(b, `"}`...)
}

// verify reports whether data, received on subject, ends in a MAC field
// (reasonUnsigned if not) and that MAC is right (reasonSignature if not).
// It checks the bytes only: the stamp is checked once data is decoded.
func (s *signer) verify(subject string, data []byte) reason {
	n := len(data) - macLen - len(`"}`)
	if n < len(macHead)+1 || !bytes.HasSuffix(data, []byte(`"}`)) || string(data[n-len(macHead):n]) != macHead {
		return reasonUnsigned
	}
	var got [sha256.Size]byte
	if k, err := base64.RawURLEncoding.Decode(got[:], data[n:n+macLen]); err != nil || k != len(got) {
		return reasonSignature
	}
	if !hmac.Equal(got[:], s.macOf(subject, data[:n-len(macHead)])) {
		return reasonSignature
	}
	return reasonNone
}

// sealBinary returns body, a gossip envelope up to its MAC, with the MAC
// of it for subject appended (in body's spare capacity if it has some).
func (s *signer) sealBinary(subject string, body []byte) []byte {
	return append(body, s.sum(gossipDomain, subject, body)...)
}

// verifyBinary reports whether mac is the MAC of body, a gossip
// envelope's signed bytes, received on subject (reasonSignature if not).
func (s *signer) verifyBinary(subject string, body, mac []byte) reason {
	if !hmac.Equal(mac, s.sum(gossipDomain, subject, body)) {
		return reasonSignature
	}
	return reasonNone
}

// replayGuard remembers, for each origin, the last stamp accepted from it,
// so that a signed message replayed within the clock window is refused. An
// origin is forgotten once nothing came from it for twice the window: any
// message it sent before then is outside the window and refused as stale.
// It holds at most max origins; only validly signed messages add one.
// Stamps below its floor (set by since) are refused as stale: what it
// remembers starts there, so it cannot tell an earlier message from a
// replay.
type replayGuard struct {
	window time.Duration
	max    int

	mu    sync.Mutex // guards last and floor
	last  map[string]seen
	floor int64 // lowest stamp accepted; 0 for any
}

type seen struct {
	stamp int64
	at    time.Time // receiver's clock when stamp was accepted
}

func newReplayGuard(window time.Duration, max int) *replayGuard {
	return &replayGuard{window: window, max: max, last: make(map[string]seen)}
}

// since sets the floor to t: stamps before t are refused from then on.
func (g *replayGuard) since(t time.Time) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.floor = t.UnixMicro()
}

// accept records stamp from origin, received at now. It returns
// reasonStale if stamp is below the floor, and reasonReplay if stamp is not
// above the last stamp accepted from origin. When max origins are
// remembered, it refuses a new one (full) until some are forgotten.
func (g *replayGuard) accept(origin string, stamp int64, now time.Time) (r reason, full bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if stamp < g.floor {
		return reasonStale, false
	}
	s, ok := g.last[origin]
	if ok && stamp <= s.stamp {
		return reasonReplay, false
	}
	if !ok && len(g.last) >= g.max {
		g.sweepLocked(now)
		if len(g.last) >= g.max {
			return reasonNone, true
		}
	}
	g.last[origin] = seen{stamp: stamp, at: now}
	return reasonNone, false
}

// sweep forgets the origins nothing came from for twice the window.
func (g *replayGuard) sweep(now time.Time) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.sweepLocked(now)
}

func (g *replayGuard) sweepLocked(now time.Time) {
	old := now.Add(-2 * g.window)
	for o, s := range g.last {
		if s.at.Before(old) {
			delete(g.last, o)
		}
	}
}

// fresh reports whether a stamp (microseconds since the Unix epoch) is
// within window of now, either way.
func fresh(stamp int64, now time.Time, window time.Duration) bool {
	d := now.Sub(time.UnixMicro(stamp))
	return stamp > 0 && d <= window && d >= -window
}
