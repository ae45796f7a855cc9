package coordinator

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

var t0Sign = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// TestSeal: a sealed message verifies on its subject and scope only, with
// every byte covered; it decodes, stamped, for receivers with or without a
// secret; stamps increase while the clock stands still.
func TestSeal(t *testing.T) {
	if sealOverhead != 79 {
		t.Errorf("sealOverhead %d: Config.MaxMessage's doc says 79", sealOverhead)
	}
	s := &signer{secret: testSecret, scope: "hotkey.default"}
	msg := encodeLease("a", "k", 16, 3*time.Second)
	sealed := s.seal("hotkey.default.lease", msg, t0Sign)
	if !bytes.HasPrefix(sealed, msg[:len(msg)-1]) || len(sealed) > len(msg)+sealOverhead {
		t.Fatalf("sealed %s (%d bytes, %d more than %s; at most %d)", sealed, len(sealed), len(sealed)-len(msg), msg, sealOverhead)
	}
	if r := s.verify("hotkey.default.lease", sealed); r != reasonNone {
		t.Fatalf("%s: %v", sealed, r)
	}
	m, r := decode(sealed, testLimits)
	if r != reasonNone || m.TS != t0Sign.UnixMicro() || m.Key != "k" || m.Level != 16 {
		t.Fatalf("decoded %+v, %v", m, r)
	}
	if string(msg) == string(sealed) {
		t.Fatal("seal modified nothing")
	}
	for _, b := range []struct {
		name    string
		signer  *signer
		subject string
		data    []byte
		want    reason
	}{
		{"another subject", s, "hotkey.default.hb", sealed, reasonSignature},
		{"another namespace", &signer{secret: testSecret, scope: "hotkey.other"}, "hotkey.default.lease", sealed, reasonSignature},
		{"another secret", &signer{secret: otherSecret, scope: "hotkey.default"}, "hotkey.default.lease", sealed, reasonSignature},
		{"unsigned", s, "hotkey.default.lease", msg, reasonUnsigned},
		{"empty", s, "hotkey.default.lease", nil, reasonUnsigned},
		{"mac only", s, "hotkey.default.lease", sealed[len(sealed)-macLen-len(macHead)-2:], reasonUnsigned},
		{"mac not base64url", s, "hotkey.default.lease", append(sealed[:len(sealed)-3:len(sealed)-3], `+"}`...), reasonSignature},
		{"mac padded", s, "hotkey.default.lease", append(sealed[:len(sealed)-3:len(sealed)-3], `="}`...), reasonSignature},
		{"trailing space", s, "hotkey.default.lease", append(sealed[:len(sealed):len(sealed)], ' '), reasonUnsigned},
	} {
		if r := b.signer.verify(b.subject, b.data); r != b.want {
			t.Errorf("%s: %v, want %v", b.name, r, b.want)
		}
	}
	// Every byte but the MAC's is signed: changing any one breaks it.
	for i := range len(sealed) - 2 - macLen {
		bad := bytes.Clone(sealed)
		bad[i] ^= 0x20
		if r := s.verify("hotkey.default.lease", bad); r == reasonNone {
			t.Fatalf("byte %d changed (%s): verified", i, bad)
		}
	}
	// Stamps increase while the clock stands still, and follow it when it
	// moves on.
	var last int64
	for i := range 5 {
		m, _ := decode(s.seal("hotkey.default.hb", encodeControl("a", typeHB), t0Sign), testLimits)
		if m.TS <= last {
			t.Fatalf("stamp %d: %d after %d", i, m.TS, last)
		}
		last = m.TS
	}
	if m, _ := decode(s.seal("hotkey.default.hb", encodeControl("a", typeHB), t0Sign.Add(time.Second)), testLimits); m.TS != t0Sign.Add(time.Second).UnixMicro() {
		t.Errorf("stamp %d after the clock moved a second, want %d", m.TS, t0Sign.Add(time.Second).UnixMicro())
	}
}

// TestStampClockStep: a sender's stamps stay increasing across a step
// back of its clock within the window, so that its peers' replay guards
// take them, and follow the clock once it steps back by more, so that
// peers whose clocks agree with it now take them as fresh.
func TestStampClockStep(t *testing.T) {
	const w = 10 * time.Second
	s := &signer{secret: testSecret, scope: "hotkey.default", window: w}
	ts := func(d time.Duration) int64 { return t0Sign.Add(d).UnixMicro() }
	for i, c := range []struct {
		give time.Duration // the sender's clock, from t0Sign
		want int64
	}{
		{0, ts(0)},
		{0, ts(0) + 1},
		{w / 2, ts(w / 2)},
		{0, ts(w/2) + 1}, // stepped back within the window: still increasing
		{6 * w, ts(6 * w)},
		{time.Second, ts(time.Second)}, // stepped back beyond it: the clock's
		{time.Second, ts(time.Second) + 1},
	} {
		got := s.stamp(t0Sign.Add(c.give))
		if got != c.want {
			t.Errorf("step %d, clock at +%v: stamp +%v, want +%v", i, c.give, time.Duration(got-ts(0))*time.Microsecond, time.Duration(c.want-ts(0))*time.Microsecond)
		}
		if !fresh(got, t0Sign.Add(c.give), w) {
			t.Errorf("step %d, clock at +%v: stamp +%v is stale to a peer whose clock agrees", i, c.give, time.Duration(got-ts(0))*time.Microsecond)
		}
	}
}

func TestFresh(t *testing.T) {
	const w = 30 * time.Second
	ts := t0Sign.UnixMicro()
	tests := []struct {
		give int64
		now  time.Time
		want bool
	}{
		{ts, t0Sign, true},
		{ts, t0Sign.Add(w), true},
		{ts, t0Sign.Add(w + time.Microsecond), false},
		{ts, t0Sign.Add(-w), true},
		{ts, t0Sign.Add(-w - time.Microsecond), false},
		{0, t0Sign, false},
		{-1, t0Sign, false},
		{1<<63 - 1, t0Sign, false},
	}
	for _, tt := range tests {
		if got := fresh(tt.give, tt.now, w); got != tt.want {
			t.Errorf("fresh(%d, %v) = %v, want %v", tt.give, tt.now, got, tt.want)
		}
	}
}

// TestReplayGuard: a stamp is accepted once per origin, only above the last;
// an origin is forgotten after twice the window, and a full guard refuses new
// origins until then.
func TestReplayGuard(t *testing.T) {
	g := newReplayGuard(time.Second, 2)
	steps := []struct {
		origin   string
		stamp    int64
		at       time.Duration
		want     reason
		wantFull bool
	}{
		{"a", 10, 0, reasonNone, false},
		{"a", 10, 0, reasonReplay, false},
		{"a", 9, 0, reasonReplay, false},
		{"a", 11, 0, reasonNone, false},
		{"b", 5, 0, reasonNone, false},
		{"b", 5, 0, reasonReplay, false},
		{"c", 1, time.Second, reasonNone, true},        // full
		{"b", 6, time.Second, reasonNone, false},       // b renewed
		{"c", 1, 2*time.Second + 1, reasonNone, false}, // a forgotten: room
		{"a", 1, 2*time.Second + 1, reasonNone, true},  // full again
	}
	for i, s := range steps {
		r, full := g.accept(s.origin, s.stamp, t0Sign.Add(s.at))
		if r != s.want || full != s.wantFull {
			t.Errorf("step %d (%s %d at %v): %v, full %v; want %v, %v", i, s.origin, s.stamp, s.at, r, full, s.want, s.wantFull)
		}
	}
	g.sweep(t0Sign.Add(10 * time.Second))
	if len(g.last) != 0 {
		t.Errorf("%d origins left after the sweep", len(g.last))
	}
	// Below the floor: stale, for an origin never seen too; at it: accepted.
	g.since(t0Sign)
	floor := t0Sign.UnixMicro()
	if r, _ := g.accept("new", floor-1, t0Sign); r != reasonStale {
		t.Errorf("a stamp below the floor: %v, want stale", r)
	}
	if r, _ := g.accept("new", floor, t0Sign); r != reasonNone {
		t.Errorf("a stamp at the floor: %v, want accepted", r)
	}
}

// signedSeeds are signed messages for FuzzDecode, on the subjects their types
// go on.
func signedSeeds() (s *signer, subjects []string, msgs [][]byte) {
	s = &signer{secret: testSecret, scope: "hotkey.default"}
	add := func(subject string, m []byte) {
		subjects = append(subjects, subject)
		msgs = append(msgs, s.seal(subject, m, t0Sign))
	}
	add("hotkey.default.lease", encodeLease("o", "k", 64, time.Second))
	add("hotkey.default.lease", encodeLease("o", strings.Repeat("\u2028", 10), 4, time.Minute))
	add("hotkey.default.hb", encodeControl("o", typeHB))
	add("hotkey.default.sync", encodeControl("o", typeSyncReq))
	ch := newSyncChunker("o", 4096-sealOverhead)
	ch.add("k1", 16, time.Second)
	ch.add("k2", 64, 2*time.Second)
	for _, c := range ch.done() {
		add("_INBOX.x", c)
	}
	return s, subjects, msgs
}
