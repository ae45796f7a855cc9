package coordinator

import (
	"bytes"
	"strings"
	"testing"
)

// sealedEnvelope returns payload from origin in an envelope signed by s
// for subject with stamp.
func sealedEnvelope(s *signer, subject, origin string, stamp int64, payload []byte) []byte {
	return s.sealBinary(subject, appendEnvelope(nil, origin, true, stamp, payload))
}

var t0Stamp = t0Sign.UnixMicro()

// TestEnvelope: envelopes decode to what was encoded, signed or not; a
// malformed one is refused with its reason.
func TestEnvelope(t *testing.T) {
	s := &signer{secret: testSecret, scope: "hotkey.default"}
	const subj = "hotkey.default.gossip"
	signed := sealedEnvelope(s, subj, "a", t0Stamp, []byte("payload"))
	plain := appendEnvelope(nil, "a", false, 0, []byte("payload"))
	long := strings.Repeat("o", maxOriginLen)
	if n := len(sealedEnvelope(s, subj, long, t0Stamp, []byte("p"))) - 1; n != GossipOverhead {
		t.Errorf("the longest envelope adds %d bytes, GossipOverhead is %d", n, GossipOverhead)
	}
	for _, g := range []struct {
		name string
		give []byte
		want reason
	}{
		{"signed", signed, reasonNone},
		{"plain", plain, reasonNone},
		{"longest origin", appendEnvelope(nil, long, false, 0, []byte("p")), reasonNone},
		{"empty", nil, reasonEnvelope},
		{"version only", []byte{1}, reasonEnvelope},
		{"json", []byte(`{"v":1}`), reasonEnvelope},
		{"version 2", append([]byte{2}, plain[1:]...), reasonEnvelope},
		{"unknown flag", append([]byte{1, 3}, plain[2:]...), reasonEnvelope},
		{"no origin", []byte{1, 0, 0, 'p'}, reasonOrigin},
		{"origin too long", appendEnvelope(nil, long+"o", false, 0, []byte("p")), reasonOrigin},
		{"origin past the end", []byte{1, 0, 9, 'a'}, reasonOrigin},
		{"origin not UTF-8", []byte{1, 0, 1, 0xff, 'p'}, reasonOrigin},
		{"no payload", appendEnvelope(nil, "a", false, 0, nil), reasonEnvelope},
		{"signed, no payload", sealedEnvelope(s, subj, "a", t0Stamp, nil), reasonEnvelope},
		{"signed, cut", signed[:len(signed)-len("payload")-1], reasonEnvelope},
		{"stamp 0", sealedEnvelope(s, subj, "a", 0, []byte("p")), reasonTS},
		{"stamp negative", sealedEnvelope(s, subj, "a", -1, []byte("p")), reasonTS},
		{"too large", appendEnvelope(nil, "a", false, 0, make([]byte, 100)), reasonSize},
	} {
		e, r := decodeEnvelope(g.give, 100)
		if r != g.want {
			t.Errorf("%s: reason %v, want %v", g.name, r, g.want)
		}
		if r == reasonNone && !bytes.Equal(e.payload, []byte("payload")) && !bytes.Equal(e.payload, []byte("p")) {
			t.Errorf("%s: payload %q", g.name, e.payload)
		}
	}
	e, _ := decodeEnvelope(signed, 100)
	if e.origin != "a" || !e.signed || e.stamp != t0Stamp || len(e.mac) != macSize {
		t.Errorf("signed: %+v", e)
	}
	if r := s.verifyBinary(subj, e.body, e.mac); r != reasonNone {
		t.Errorf("signed: %v", r)
	}
	if e, _ := decodeEnvelope(plain, 100); e.origin != "a" || e.signed || e.stamp != 0 || e.mac != nil {
		t.Errorf("plain: %+v", e)
	}
	// A MAC verifies for its subject, scope and secret only; a JSON
	// message's MAC over the same bytes does not verify as a gossip one.
	for _, b := range []struct {
		name    string
		s       *signer
		subject string
		mac     []byte
	}{
		{"another subject", s, "hotkey.default.lease", e.mac},
		{"another namespace", &signer{secret: testSecret, scope: "hotkey.other"}, subj, e.mac},
		{"another secret", &signer{secret: otherSecret, scope: "hotkey.default"}, subj, e.mac},
		{"a JSON message's MAC", s, subj, s.macOf(subj, e.body)},
		{"short", s, subj, e.mac[:31]},
	} {
		if r := b.s.verifyBinary(b.subject, e.body, b.mac); r != reasonSignature {
			t.Errorf("%s: %v, want signature", b.name, r)
		}
	}
	// Every byte is signed: changing any one breaks the MAC, or the
	// envelope.
	for i := range signed {
		bad := bytes.Clone(signed)
		bad[i] ^= 0x01
		if e, r := decodeEnvelope(bad, 100); r == reasonNone && s.verifyBinary(subj, e.body, e.mac) == reasonNone {
			t.Fatalf("byte %d changed: verified", i)
		}
	}
}

// FuzzEnvelope: the envelope decoder never panics; what it accepts is
// within bounds and encodes back to the same bytes; and no change to a
// signed seed verifies.
func FuzzEnvelope(f *testing.F) {
	s := &signer{secret: testSecret, scope: "hotkey.default"}
	const subj = "hotkey.default.gossip"
	signed := [][]byte{
		sealedEnvelope(s, subj, "a", t0Stamp, []byte("payload")),
		sealedEnvelope(s, subj, strings.Repeat("é", 32), t0Stamp, []byte{1, 2, 3}),
	}
	for _, m := range signed {
		f.Add(m)
	}
	f.Add(appendEnvelope(nil, "a", false, 0, []byte("p")))
	f.Add([]byte{1, 1, 1, 'a', 0, 0, 0, 0, 0, 0, 0, 1})
	f.Add([]byte(`{"v":1,"t":"hb","origin":"o"}`))
	const max = 4096
	f.Fuzz(func(t *testing.T, data []byte) {
		e, r := decodeEnvelope(data, max)
		if r != reasonNone {
			return
		}
		if len(data) > max || e.origin == "" || len(e.origin) > maxOriginLen || len(e.payload) == 0 ||
			e.signed != (e.mac != nil) || e.signed && (e.stamp <= 0 || len(e.mac) != macSize) {
			t.Fatalf("accepted %q: %+v", data, e)
		}
		again := appendEnvelope(nil, e.origin, e.signed, e.stamp, e.payload)
		if !bytes.Equal(again, e.body) || !bytes.Equal(append(again, e.mac...), data) {
			t.Fatalf("%q re-encoded as %q", data, again)
		}
		if e.signed && s.verifyBinary(subj, e.body, e.mac) == reasonNone &&
			!bytes.Equal(data, signed[0]) && !bytes.Equal(data, signed[1]) {
			t.Fatalf("%q verified, and is no signed seed", data)
		}
	})
}
