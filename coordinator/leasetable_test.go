package coordinator

import (
	"cmp"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hotkeyd/hotkey/shard"
)

const ms = time.Millisecond

// t0 is the instant the test tables start at.
var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// tableTTL is the ttl of the own leases of the test tables.
const tableTTL = 300 * ms

func newTestTable(maxKeys int) *leaseTable {
	return newLeaseTable("me", tableTTL, maxKeys, 250*ms, t0)
}

// op is one call on a lease table, at t0+at.
type op struct {
	at    time.Duration
	do    string // "peer": a peer's lease; "own": the own level; "pub": own level published
	key   string
	level shard.Level
	ttl   time.Duration // of a peer's lease
}

func peerAt(at time.Duration, level shard.Level, ttl time.Duration) op {
	return op{at: at, do: "peer", key: "k", level: level, ttl: ttl}
}
func ownAt(at time.Duration, level shard.Level) op {
	return op{at: at, do: "own", key: "k", level: level}
}
func pubAt(at time.Duration, level shard.Level) op {
	return op{at: at, do: "pub", key: "k", level: level}
}

// apply makes op's call on tb and returns what it reported.
func (o op) apply(tb *leaseTable) bool {
	now := t0.Add(o.at)
	switch o.do {
	case "peer":
		return tb.applyLease("peer", o.key, o.level, o.ttl, now)
	case "own":
		_, ok := tb.setOwn(o.key, o.level, now)
		return ok
	case "pub":
		tb.published(map[string]shard.Level{o.key: o.level}, now)
		return true
	}
	panic("unknown op " + o.do)
}

// levelAt returns key's level in force at t0+at (1 if not in the table).
func levelAt(tb *leaseTable, key string, at time.Duration) shard.Level {
	if e := tb.keys[key]; e != nil {
		return e.force(tb.at(t0.Add(at)))
	}
	return 1
}

// TestLeaseTableLevels: the level in force of a key at given instants after
// the leases and own levels given.
func TestLeaseTableLevels(t *testing.T) {
	type levelAtT struct {
		at    time.Duration
		level shard.Level
	}
	tests := []struct {
		name string
		give []op
		want []levelAtT
	}{
		{
			name: "a peer's lease lasts its ttl from receipt",
			give: []op{peerAt(0, 16, time.Second)},
			want: []levelAtT{{0, 16}, {time.Second - 1, 16}, {time.Second, 1}},
		},
		{
			name: "a renewal extends it",
			give: []op{peerAt(0, 16, 300*ms), peerAt(200*ms, 16, 300*ms)},
			want: []levelAtT{{300 * ms, 16}, {500*ms - 1, 16}, {500 * ms, 1}},
		},
		{
			name: "a shorter lease does not cut a longer one",
			give: []op{peerAt(0, 16, time.Second), peerAt(10*ms, 16, 100*ms)},
			want: []levelAtT{{500 * ms, 16}, {time.Second - 1, 16}, {time.Second, 1}},
		},
		{
			name: "the highest unexpired level is in force",
			give: []op{peerAt(0, 16, time.Second), peerAt(0, 64, 300*ms), peerAt(0, 4, 2*time.Second)},
			want: []levelAtT{{0, 64}, {300*ms - 1, 64}, {300 * ms, 16}, {time.Second - 1, 16}, {time.Second, 4}, {2 * time.Second, 1}},
		},
		{
			name: "an own level holds without expiry",
			give: []op{ownAt(0, 16), pubAt(0, 16)},
			want: []levelAtT{{0, 16}, {time.Hour, 16}},
		},
		{
			name: "an own raise is in force at once",
			give: []op{peerAt(0, 16, time.Second), ownAt(10*ms, 64)},
			want: []levelAtT{{10 * ms, 64}, {time.Hour, 64}},
		},
		{
			name: "a peer's higher lease wins over the own level until it lapses",
			give: []op{ownAt(0, 4), peerAt(0, 16, time.Second)},
			want: []levelAtT{{0, 16}, {time.Second - 1, 16}, {time.Second, 4}},
		},
		{
			name: "a lowering waits for the published lease to lapse",
			give: []op{ownAt(0, 64), pubAt(100*ms, 64), ownAt(200*ms, 4)},
			want: []levelAtT{{200 * ms, 64}, {400*ms - 1, 64}, {400 * ms, 4}, {time.Hour, 4}},
		},
		{
			name: "a later publication pushes the lapse back",
			give: []op{ownAt(0, 64), pubAt(0, 64), pubAt(200*ms, 64), ownAt(250*ms, 16)},
			want: []levelAtT{{500*ms - 1, 64}, {500 * ms, 16}},
		},
		{
			name: "a lowering before any publication is at once",
			give: []op{ownAt(0, 64), ownAt(10*ms, 4)},
			want: []levelAtT{{10 * ms, 4}},
		},
		{
			name: "a raise not yet published is lowered at once, the level below still held",
			give: []op{ownAt(0, 4), pubAt(0, 4), ownAt(50*ms, 16), ownAt(60*ms, 4)},
			want: []levelAtT{{60 * ms, 4}, {time.Hour, 4}},
		},
		{
			name: "a drop waits for the published lease to lapse",
			give: []op{ownAt(0, 16), pubAt(0, 16), ownAt(100*ms, 1)},
			want: []levelAtT{{100 * ms, 16}, {300*ms - 1, 16}, {300 * ms, 1}},
		},
		{
			name: "a drop before any publication is at once",
			give: []op{ownAt(0, 16), ownAt(0, 1)},
			want: []levelAtT{{0, 1}},
		},
		{
			name: "publishing the lower level does not extend the old one",
			give: []op{ownAt(0, 64), pubAt(0, 64), ownAt(100*ms, 16), pubAt(150*ms, 16)},
			want: []levelAtT{{300*ms - 1, 64}, {300 * ms, 16}, {time.Hour, 16}},
		},
		{
			name: "a publication of a level no longer own is ignored",
			give: []op{ownAt(0, 64), pubAt(0, 64), ownAt(100*ms, 16), pubAt(150*ms, 64), ownAt(200*ms, 4)},
			want: []levelAtT{{300*ms - 1, 64}, {300 * ms, 4}}, // 16 never went out: nothing to wait for
		},
		{
			name: "a lowering keeps a peer's longer lease at the old level",
			give: []op{ownAt(0, 64), pubAt(0, 64), peerAt(100*ms, 64, 300*ms), ownAt(150*ms, 16)},
			want: []levelAtT{{400*ms - 1, 64}, {400 * ms, 16}},
		},
		{
			name: "a lowered lease does not cut a peer's at the old level",
			give: []op{ownAt(0, 64), pubAt(0, 64), peerAt(0, 64, time.Second), ownAt(10*ms, 1)},
			want: []levelAtT{{time.Second - 1, 64}, {time.Second, 1}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tb := newTestTable(10)
			for _, o := range tt.give {
				if !o.apply(tb) {
					t.Fatalf("%+v refused", o)
				}
			}
			for _, w := range tt.want {
				if got := levelAt(tb, "k", w.at); got != w.level {
					t.Errorf("at %v: level %d, want %d", w.at, got, w.level)
				}
			}
		})
	}
}

// TestLeaseTableSweep: a sweep forgets expired leases and drops keys nothing
// holds, and is due again at the soonest expiry (at most the sweep
// interval); a lease expiring before the sweep due wakes the sweeper. The
// Handler is handed each key's latest level once, and a change that comes
// back to what it was handed is withdrawn.
func TestLeaseTableSweep(t *testing.T) {
	tb := newTestTable(10)
	var woken, sooner int
	tb.onChange = func() { woken++ }
	tb.onSooner = func() { sooner++ }
	peer := func(at time.Duration, key string, level shard.Level, ttl time.Duration) {
		t.Helper()
		if !tb.applyLease("peer", key, level, ttl, t0.Add(at)) {
			t.Fatalf("lease for %q refused", key)
		}
	}
	sweep := func(at, wantDue time.Duration) {
		t.Helper()
		if due := tb.sweep(t0.Add(at)); due != wantDue {
			t.Errorf("sweep at %v: next due in %v, want %v", at, due, wantDue)
		}
	}
	takes := func(want map[string]shard.Level) {
		t.Helper()
		got := tb.changes()
		if !maps.Equal(levelsOf(got), want) {
			t.Errorf("changes %v, want %v", levelsOf(got), want)
		}
		for k, c := range got {
			if c.hash != shard.NameHash(k) {
				t.Errorf("%q: hash %x", k, c.hash)
			}
		}
	}
	keys := func(want ...string) {
		t.Helper()
		if got := slices.Sorted(maps.Keys(tb.keys)); !slices.Equal(got, want) {
			t.Errorf("keys %v, want %v", got, want)
		}
	}

	peer(0, "a", 16, time.Second)
	takes(map[string]shard.Level{"a": 16})
	sweep(0, 250*ms) // nothing expires within the interval
	if sooner != 0 {
		t.Errorf("a lease expiring after the next sweep woke the sweeper")
	}
	peer(10*ms, "a", 64, 90*ms) // expires at 100 ms, before the sweep due at 250 ms
	if sooner != 1 {
		t.Errorf("a lease expiring before the next sweep woke the sweeper %d times", sooner)
	}
	peer(20*ms, "b", 4, 200*ms)
	sweep(20*ms, 80*ms)
	sweep(100*ms-1, 1)
	keys("a", "b")
	sweep(100*ms, 120*ms) // a's 64 lapses: back at 16, where the Handler is
	takes(map[string]shard.Level{"b": 4})
	keys("a", "b")
	sweep(220*ms, 250*ms)
	takes(map[string]shard.Level{"b": 1})
	keys("a")
	sweep(time.Second-1, 1)
	sweep(time.Second, 250*ms)
	takes(map[string]shard.Level{"a": 1})
	keys()
	takes(map[string]shard.Level{})
	// a→16, a→64, b→4, a→16, b→1, a→1
	if woken != 6 || sooner != 1 {
		t.Errorf("onChange called %d times, want 6; onSooner %d, want 1", woken, sooner)
	}
}

// levelsOf returns the levels of changes, or an empty map for none.
func levelsOf(changes map[string]change) map[string]shard.Level {
	m := make(map[string]shard.Level)
	for k, c := range changes {
		m[k] = c.level
	}
	return m
}

// TestLeaseTableFull: with maxKeys keys held, a peer's lease for a new key
// is dropped, one for a held key is applied, and an own level for a new key
// evicts the key held only by peers whose leases expire first, until only
// own keys are left.
func TestLeaseTableFull(t *testing.T) {
	tb := newTestTable(3)
	tests := []struct {
		give     op
		want     bool
		wantKeys []string
	}{
		{op{do: "peer", key: "a", level: 4, ttl: time.Second}, true, []string{"a"}},
		{op{do: "peer", key: "b", level: 16, ttl: 500 * ms}, true, []string{"a", "b"}},
		{op{do: "peer", key: "c", level: 64, ttl: 2 * time.Second}, true, []string{"a", "b", "c"}},
		{op{do: "peer", key: "d", level: 4, ttl: time.Minute}, false, []string{"a", "b", "c"}},
		{op{do: "peer", key: "a", level: 64, ttl: 100 * ms}, true, []string{"a", "b", "c"}},
		{op{do: "own", key: "x", level: 4}, true, []string{"a", "c", "x"}}, // b expires first
		{op{do: "own", key: "y", level: 16}, true, []string{"c", "x", "y"}},
		{op{do: "own", key: "z", level: 64}, true, []string{"x", "y", "z"}},
		{op{do: "own", key: "w", level: 64}, false, []string{"x", "y", "z"}}, // only own keys
		{op{do: "peer", key: "w", level: 4, ttl: time.Second}, false, []string{"x", "y", "z"}},
		{op{do: "own", key: "x", level: 1}, true, []string{"y", "z"}}, // never published: gone at once
		{op{do: "own", key: "w", level: 64}, true, []string{"w", "y", "z"}},
	}
	for i, tt := range tests {
		if got := tt.give.apply(tb); got != tt.want {
			t.Errorf("step %d: %+v: %v, want %v", i, tt.give, got, tt.want)
		}
		if got := slices.Sorted(maps.Keys(tb.keys)); !slices.Equal(got, tt.wantKeys) {
			t.Errorf("step %d: keys %v, want %v", i, got, tt.wantKeys)
		}
	}
	got := tb.changes()
	want := map[string]shard.Level{"w": 64, "y": 16, "z": 64} // a, b, c and x came and went
	if !maps.Equal(levelsOf(got), want) {
		t.Errorf("changes %v, want %v", levelsOf(got), want)
	}
}

// TestLeaseTableLeases: what a status page is shown, and what a join sync
// is answered, at an instant.
func TestLeaseTableLeases(t *testing.T) {
	tb := newTestTable(10)
	for _, o := range []op{
		{at: 0, do: "own", key: "own-pub", level: 16},
		{at: 0, do: "pub", key: "own-pub", level: 16},
		{at: 100 * ms, do: "own", key: "own-new", level: 4},
		{at: 0, do: "peer", key: "peer", level: 64, ttl: time.Second},
		{at: 0, do: "peer", key: "peer", level: 4, ttl: 2 * time.Second},
		{at: 0, do: "own", key: "both", level: 16},
		{at: 0, do: "pub", key: "both", level: 16},
		{at: 0, do: "peer", key: "both", level: 16, ttl: time.Second},
		{at: 0, do: "peer", key: "gone", level: 16, ttl: 50 * ms},
	} {
		if !o.apply(tb) {
			t.Fatalf("%+v refused", o)
		}
	}
	now := t0.Add(100 * ms)
	want := []Lease{
		{Key: "peer", Level: 64, ExpiresIn: 900 * ms, Origin: "peer"},
		{Key: "both", Level: 16, ExpiresIn: 900 * ms, Origin: "peer"},
		{Key: "own-pub", Level: 16, ExpiresIn: 200 * ms, Origin: "me"},
		{Key: "own-new", Level: 4, ExpiresIn: tableTTL, Origin: "me"},
	}
	if got := tb.leases(now); !slices.Equal(got, want) {
		t.Errorf("leases\n got %+v\nwant %+v", got, want)
	}

	type item struct {
		key   string
		level shard.Level
		ttl   time.Duration
		own   bool
	}
	var got []item
	tb.each(now, func(key string, level shard.Level, ttl time.Duration, own bool) {
		got = append(got, item{key, level, ttl, own})
	})
	slices.SortFunc(got, func(a, b item) int {
		return cmp.Or(strings.Compare(a.key, b.key), int(a.level-b.level), cmp.Compare(a.ttl, b.ttl))
	})
	wantItems := []item{
		{"both", 16, tableTTL, true},
		{"both", 16, 900 * ms, false},
		{"own-new", 4, tableTTL, true},
		{"own-pub", 16, tableTTL, true},
		{"peer", 4, 1900 * ms, false},
		{"peer", 64, 900 * ms, false},
	}
	if !slices.Equal(got, wantItems) {
		t.Errorf("each\n got %+v\nwant %+v", got, wantItems)
	}
}

// TestPeerLiveness: an origin becomes a live peer at its second heartbeat
// within peerTimeout heartbeat intervals, never at its first; a peer is live
// until peerTimeout intervals pass without a heartbeat from it; at most
// MaxPeers are live, at most MaxPeers more heard once, and the count handed
// to the Handler is at most MaxInstances.
func TestPeerLiveness(t *testing.T) {
	const hb = 50 * ms
	type beat struct {
		peer string // "" for a sweep
		at   time.Duration
	}
	tests := []struct {
		name         string
		maxInst      int
		give         []beat // then a sweep at the last one's instant
		want         []string
		wantOnce     int // origins heard once
		wantLive     int // count for the Handler
		wantRejected uint64
	}{
		{"heard once: not live", 0, []beat{{"p", 0}}, nil, 1, 1, 0},
		{"twice within the timeout: live", 0, []beat{{"p", 0}, {"p", peerTimeout*hb - 1}}, []string{"p"}, 0, 2, 0},
		{"twice a timeout apart: not live", 0, []beat{{"p", 0}, {"p", peerTimeout * hb}}, nil, 1, 1, 0},
		{"heard once: forgotten at the timeout", 0, []beat{{"p", 0}, {"", peerTimeout * hb}, {"p", peerTimeout*hb + 1}}, nil, 1, 1, 0},
		{"live until the timeout", 0, []beat{{"p", 0}, {"p", 10 * ms}, {"", 10*ms + peerTimeout*hb - 1}}, []string{"p"}, 0, 2, 0},
		{"gone at the timeout", 0, []beat{{"p", 0}, {"p", 10 * ms}, {"", 10*ms + peerTimeout*hb}}, nil, 0, 1, 0},
		{"a heartbeat renews", 0, []beat{{"p", 0}, {"p", 1}, {"q", 0}, {"q", 1}, {"p", 100 * ms}, {"", peerTimeout*hb + 1}}, []string{"p"}, 0, 2, 0},
		{"at most MaxPeers", 0, []beat{{"p", 0}, {"p", 0}, {"q", 0}, {"q", 0}, {"r", 0}, {"r", 10 * ms}}, []string{"p", "q"}, 1, 3, 1},
		{"room again once one is gone", 0, []beat{{"p", 0}, {"p", 1}, {"q", 100 * ms}, {"q", 101 * ms}, {"r", 0}, {"", peerTimeout*hb + 1}, {"r", 160 * ms}, {"r", 170 * ms}}, []string{"q", "r"}, 0, 3, 0},
		{"at most MaxPeers heard once", 0, []beat{{"p", 0}, {"q", 0}, {"r", 0}, {"r", 1}}, []string{"r"}, 1, 2, 1},
		{"count capped at MaxInstances", 2, []beat{{"p", 0}, {"p", 0}, {"q", 0}, {"q", 0}}, []string{"p", "q"}, 0, 2, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := unstarted(t, Config{Heartbeat: hb, MaxPeers: 2, MaxInstances: tt.maxInst})
			c.mu.Lock()
			defer c.mu.Unlock()
			for _, b := range tt.give {
				if b.peer == "" {
					c.sweepLocked(t0.Add(b.at))
				} else {
					c.heardLocked(b.peer, t0.Add(b.at))
				}
			}
			c.sweepLocked(t0.Add(tt.give[len(tt.give)-1].at))
			if got := slices.Sorted(maps.Keys(c.peers)); !slices.Equal(got, tt.want) || c.live != tt.wantLive {
				t.Errorf("live peers %v (count %d), want %v (count %d)", got, c.live, tt.want, tt.wantLive)
			}
			if len(c.once) != tt.wantOnce {
				t.Errorf("%d origins heard once, want %d", len(c.once), tt.wantOnce)
			}
			if n := c.st.peersRejected.Load(); n != tt.wantRejected {
				t.Errorf("%d heartbeats rejected, want %d", n, tt.wantRejected)
			}
		})
	}
}
