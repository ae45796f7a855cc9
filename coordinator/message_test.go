package coordinator

import (
	"bytes"
	"errors"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/hotkeyd/hotkey/internal/natsserver"
	"github.com/hotkeyd/hotkey/internal/testkit"
	"github.com/hotkeyd/hotkey/shard"
)

var testLimits = limits{maxMessage: DefaultMaxMessage, maxKeyLen: DefaultMaxKeyLen, maxTTL: DefaultMaxTTL}

// badMessages are invalid messages and the reason each must be dropped for.
var badMessages = []struct {
	data string
	want reason
}{
	{`{"v":1,"t":"lease"`, reasonJSON},
	{`not json`, reasonJSON},
	{`null`, reasonJSON},
	{`[]`, reasonJSON},
	{``, reasonJSON},
	{`{"v":1,"t":"lease","origin":"o","key":"k","level":"16","ttl_ms":1000}`, reasonJSON},
	{`{"v":1,"t":"lease","origin":"o","key":"k","level":16.5,"ttl_ms":1000}`, reasonJSON},
	{`{"v":1,"t":"lease","origin":"o","key":"k","level":16,"ttl_ms":1e30}`, reasonJSON},
	{`{"v":2,"t":"lease","origin":"o","key":"k","level":16,"ttl_ms":1000}`, reasonVersion},
	{`{"t":"lease","origin":"o","key":"k","level":16,"ttl_ms":1000}`, reasonVersion},
	{`{"v":1,"t":"bogus","origin":"o"}`, reasonType},
	{`{"v":1,"origin":"o"}`, reasonType},
	{`{"v":1,"t":"hb"}`, reasonOrigin},
	{`{"v":1,"t":"hb","origin":""}`, reasonOrigin},
	{`{"v":1,"t":"hb","origin":"` + strings.Repeat("o", 65) + `"}`, reasonOrigin},
	{`{"v":1,"t":"lease","origin":"o","level":16,"ttl_ms":1000}`, reasonKey},
	{`{"v":1,"t":"lease","origin":"o","key":"` + strings.Repeat("k", 513) + `","level":16,"ttl_ms":1000}`, reasonKey},
	{`{"v":1,"t":"lease","origin":"o","key":"k","level":3,"ttl_ms":1000}`, reasonLevel},
	{`{"v":1,"t":"lease","origin":"o","key":"k","level":1,"ttl_ms":1000}`, reasonLevel},
	{`{"v":1,"t":"lease","origin":"o","key":"k","ttl_ms":1000}`, reasonLevel},
	{`{"v":1,"t":"lease","origin":"o","key":"k","level":-64,"ttl_ms":1000}`, reasonLevel},
	{`{"v":1,"t":"lease","origin":"o","key":"k","level":16,"ttl_ms":31536000000}`, reasonTTL},
	{`{"v":1,"t":"lease","origin":"o","key":"k","level":16,"ttl_ms":0}`, reasonTTL},
	{`{"v":1,"t":"lease","origin":"o","key":"k","level":16,"ttl_ms":-5}`, reasonTTL},
	{`{"v":1,"t":"lease","origin":"o","key":"k","level":16}`, reasonTTL},
	{`{"v":1,"t":"sync","origin":"o","leases":[{"key":"k","level":16,"ttl_ms":1000},{"key":"k","level":5,"ttl_ms":1000}]}`, reasonLevel},
	{`{"v":1,"t":"sync","origin":"o","leases":[{"key":"","level":16,"ttl_ms":1000}]}`, reasonKey},
	{`{"v":1,"t":"sync","origin":"o","leases":{}}`, reasonJSON},
	{`{"v":1,"t":"lease","origin":"o","key":"` + strings.Repeat("k", DefaultMaxMessage) + `","level":16,"ttl_ms":1000}`, reasonSize},
	{`{"v":1,"t":"hb","origin":"o","ts":-1}`, reasonTS},
	{`{"v":1,"t":"hb","origin":"o","ts":"1"}`, reasonJSON},
	{`{"v":1,"t":"hb","origin":"o","ts":1.5}`, reasonJSON},
}

var goodMessages = []string{
	`{"v":1,"t":"lease","origin":"o","key":"k","level":16,"ttl_ms":3000}`,
	` {"v":1,"t":"lease","origin":"o","key":"k","level":4,"ttl_ms":60000,"extra":[1,2]}`,
	`{"v":1,"t":"hb","origin":"a1b2c3d4e5f60718"}`,
	`{"v":1,"t":"sync_req","origin":"o"}`,
	`{"v":1,"t":"sync","origin":"o","leases":[]}`,
	`{"v":1,"t":"sync","origin":"o","leases":[{"key":"k","level":64,"ttl_ms":1},{"key":"\u00e9\u2028","level":4,"ttl_ms":10}]}`,
	// Signed: without a secret, ts and mac are ignored (any mac).
	`{"v":1,"t":"hb","origin":"o","ts":1772366400000000,"mac":"WCMjIZcZ3aKZgpLEQV88hP-F57UY_3GSxnywrtIMM4A"}`,
	`{"v":1,"t":"hb","origin":"o","ts":0,"mac":"x"}`,
}

func TestDecode(t *testing.T) {
	for _, b := range badMessages {
		if _, r := decode([]byte(b.data), testLimits); r != b.want {
			t.Errorf("%.80s: reason %v, want %v", b.data, r, b.want)
		}
	}
	for _, g := range goodMessages {
		if _, r := decode([]byte(g), testLimits); r != reasonNone {
			t.Errorf("%s: rejected (%v)", g, r)
		}
	}
	m, r := decode(encodeLease("me", "k\x00<&>\u2028", 64, 1500*time.Microsecond), testLimits)
	if r != reasonNone || m.Key != "k\x00<&>\u2028" || m.Level != 64 || m.TTLms != 2 || m.Origin != "me" {
		t.Errorf("round trip: %+v, %v", m, r)
	}
}

// FuzzDecode: the decoder never panics, and whatever it accepts is within
// the limits and survives re-encoding. The signature check never panics
// either, and accepts a signed seed unchanged only: no change to a signed
// message verifies.
func FuzzDecode(f *testing.F) {
	for _, b := range badMessages {
		f.Add([]byte(b.data))
	}
	for _, g := range goodMessages {
		f.Add([]byte(g))
	}
	f.Add(encodeLease("o", "\xff", 16, time.Second))
	f.Add(encodeControl("o", typeHB))
	sig, subjects, signed := signedSeeds()
	for _, m := range signed {
		f.Add(m)
	}
	lim := limits{maxMessage: 4096, maxKeyLen: 64, maxTTL: time.Minute}
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, subj := range subjects {
			if sig.verify(subj, data) == reasonNone && !slices.ContainsFunc(signed, func(m []byte) bool { return bytes.Equal(m, data) }) {
				t.Fatalf("%q verified on %s, and is no signed seed", data, subj)
			}
		}
		m, r := decode(data, lim)
		if r != reasonNone {
			return
		}
		if len(data) > lim.maxMessage || m.V != 1 || m.Origin == "" || len(m.Origin) > maxOriginLen || m.TS < 0 {
			t.Fatalf("accepted %q: %+v", data, m)
		}
		check := func(key string, level shard.Level, ttlMs int64) {
			if key == "" || len(key) > lim.maxKeyLen || !level.Valid() || level == 1 ||
				ttlMs <= 0 || ttlMs > lim.maxTTL.Milliseconds() {
				t.Fatalf("accepted lease %q %d %d in %q", key, level, ttlMs, data)
			}
		}
		switch m.T {
		case typeLease:
			check(m.Key, m.Level, m.TTLms)
			m2, r := decode(encodeLease(m.Origin, m.Key, m.Level, time.Duration(m.TTLms)*time.Millisecond), lim)
			if r != reasonNone || m2.Key != m.Key || m2.Level != m.Level || m2.TTLms != m.TTLms {
				t.Fatalf("re-encoded %+v: %+v, %v", m, m2, r)
			}
		case typeSync:
			for _, l := range m.Leases {
				check(l.Key, l.Level, l.TTLms)
			}
		case typeHB, typeSyncReq:
		default:
			t.Fatalf("accepted type %q", m.T)
		}
	})
}

// TestSyncChunks: a sync reply too large for one message is split into
// valid messages of at most the limit, carrying every lease.
func TestSyncChunks(t *testing.T) {
	const max = 1024
	ch := newSyncChunker("origin", max)
	want := make(map[string]shard.Level)
	for i := range 300 {
		k := "chunk-" + strconv.Itoa(i) + strings.Repeat("\u2028", i%7)
		want[k] = levels[i%3]
		ch.add(k, want[k], 2*time.Second)
	}
	chunks := ch.done()
	if len(chunks) < 10 {
		t.Fatalf("%d chunks", len(chunks))
	}
	got := make(map[string]shard.Level)
	for _, c := range chunks {
		m, r := decode(c, limits{maxMessage: max, maxKeyLen: 512, maxTTL: time.Minute})
		if r != reasonNone || m.T != typeSync || m.Origin != "origin" {
			t.Fatalf("chunk of %d bytes: %v %+v", len(c), r, m)
		}
		for _, l := range m.Leases {
			got[l.Key] = l.Level
			if l.TTLms != 2000 {
				t.Fatalf("ttl %d", l.TTLms)
			}
		}
	}
	if !maps.Equal(got, want) {
		t.Fatalf("%d leases back of %d", len(got), len(want))
	}
	if n := len(newSyncChunker("o", max).done()); n != 0 {
		t.Fatalf("%d chunks of nothing", n)
	}
}

// TestBadMessages publishes invalid and hostile messages on the
// coordination subjects: each is counted by reason and none is applied, a
// sync reply after SyncWait is not applied, and a flood of forged keys
// cannot grow the table past MaxHotKeys.
func TestBadMessages(t *testing.T) {
	s := startServer(t, natsserver.Options{MaxPayload: 2 << 20})
	clk := testkit.NewClock()
	cfg := testConfig("victim", s.URL())
	cfg.MaxHotKeys = 1000
	cfg.SyncWait = 500 * time.Millisecond
	cfg.Now = clk.Now
	c, r := startCoord(t, cfg)
	nc, err := nats.Connect(s.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()

	const lease, hb, syncSubj = "hotkey.default.lease", "hotkey.default.hb", "hotkey.default.sync"
	sent := 0
	pub := func(subject, data string) {
		t.Helper()
		if err := nc.Publish(subject, []byte(data)); err != nil {
			t.Fatal(err)
		}
		sent++
	}
	for _, b := range badMessages {
		pub(lease, b.data)
	}
	big := `{"v":1,"t":"lease","origin":"o","key":"` + strings.Repeat("k", 1<<20) + `","level":16,"ttl_ms":1000}`
	pub(lease, big)                                                                          // 1 MiB key: size
	pub(hb, `{"v":1,"t":"lease","origin":"o","key":"k","level":16,"ttl_ms":1000}`)           // lease on hb: type
	pub(syncSubj, `{"v":1,"t":"hb","origin":"o"}`)                                           // hb on sync: type
	pub(syncSubj, `{"v":1,"t":"sync_req","origin":"o"}`)                                     // no reply subject: reply
	pub(c.inbox, `{"v":1,"t":"lease","origin":"o","key":"k","level":16,"ttl_ms":1}`)         // lease to the inbox: type
	pub(lease, `{"v":1,"t":"lease","origin":"victim","key":"own","level":64,"ttl_ms":1000}`) // own origin: ignored
	wantInvalid := map[string]uint64{}
	for _, b := range badMessages {
		wantInvalid[b.want.String()]++
	}
	wantInvalid["size"]++
	wantInvalid["type"] += 3
	wantInvalid["reply"]++

	// Sync replies are applied until SyncWait after the request (sent by
	// Start, when the clock read what it reads now) or after the last reply
	// applied, not after. The clock stands still between the steps, so
	// each reply is judged at a known instant, however long it takes to
	// arrive.
	replies := func(what string, want func(Stats) bool) {
		t.Helper()
		testkit.For(t, patience, what, func() bool { return want(c.Stats()) })
	}
	pub(c.inbox, `{"v":1,"t":"sync","origin":"o","leases":[{"key":"synced","level":16,"ttl_ms":60000}]}`)
	replies("a sync reply at once applied", func(st Stats) bool { return st.SyncReplies == 1 })
	clk.Advance(cfg.SyncWait)
	pub(c.inbox, `{"v":1,"t":"sync","origin":"o","leases":[]}`)
	replies("a sync reply at SyncWait applied", func(st Stats) bool { return st.SyncReplies == 2 })
	clk.Advance(cfg.SyncWait + time.Nanosecond)
	pub(c.inbox, `{"v":1,"t":"sync","origin":"o","leases":[{"key":"late","level":16,"ttl_ms":60000}]}`)
	replies("a sync reply after SyncWait counted late", func(st Stats) bool { return st.LateReplies == 1 })

	// The flood: 20 times MaxHotKeys well-formed leases for distinct keys.
	var maxKeys atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			maxKeys.Store(max(maxKeys.Load(), int64(c.Stats().Keys)))
			select {
			case <-stop:
				return
			case <-time.After(time.Millisecond):
			}
		}
	})
	const flood = 20000
	start := time.Now()
	for i := range flood {
		pub(lease, `{"v":1,"t":"lease","origin":"forger","key":"forged-`+strconv.Itoa(i)+`","level":64,"ttl_ms":60000}`)
	}
	if err := nc.FlushTimeout(patience); err != nil {
		t.Fatal(err)
	}
	d := testkit.For(t, patience, "all received", func() bool {
		st := c.Stats()
		return st.Received+st.Dropped >= uint64(sent)
	})
	// A message is counted as received before it is handled: let the last
	// ones be handled.
	// "synced" holds one key of the table.
	testkit.For(t, patience, "the flood handled", func() bool {
		st := c.Stats()
		return uint64(st.Keys)-1+st.Rejected >= flood
	})
	close(stop)
	wg.Wait()
	t.Logf("%d messages received and handled %v after the flood started (%v after the last was flushed)", sent, time.Since(start), d)

	st := c.Stats()
	if st.Received != uint64(sent) || st.Dropped != 0 {
		t.Errorf("received %d, dropped %d, sent %d", st.Received, st.Dropped, sent)
	}
	if !maps.Equal(st.InvalidBy, wantInvalid) {
		t.Errorf("invalid by reason %v, want %v", st.InvalidBy, wantInvalid)
	}
	if st.Own != 1 || st.SyncReplies != 2 || st.LateReplies != 1 {
		t.Errorf("own %d, sync replies %d, late %d", st.Own, st.SyncReplies, st.LateReplies)
	}
	if st.Keys != cfg.MaxHotKeys || st.Rejected != flood-uint64(cfg.MaxHotKeys-1) {
		t.Errorf("keys %d, rejected %d", st.Keys, st.Rejected)
	}
	if m := maxKeys.Load(); m > int64(cfg.MaxHotKeys) {
		t.Errorf("table grew to %d keys, cap %d", m, cfg.MaxHotKeys)
	}
	testkit.For(t, patience, "handler told of the accepted keys", func() bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		return len(r.levels) == cfg.MaxHotKeys
	})
	r.mu.Lock()
	if r.maxKeys > cfg.MaxHotKeys {
		t.Errorf("handler held %d keys at once, cap %d", r.maxKeys, cfg.MaxHotKeys)
	}
	for _, k := range []string{"k", "own", "late"} {
		if _, ok := r.levels[k]; ok {
			t.Errorf("invalid or ignored lease for %q applied", k)
		}
	}
	if r.levels["synced"] != 16 {
		t.Errorf("lease of a sync reply within SyncWait at level %d, want 16", r.levels["synced"])
	}
	r.mu.Unlock()
	t.Logf("stats: %+v", st)
}

// TestConfig: defaults and validation.
func TestConfig(t *testing.T) {
	c := unstarted(t, Config{})
	got := c.cfg
	if got.Prefix != "hotkey" || got.Namespace != "default" || len(got.ID) != 16 || got.TTL != 3*time.Second ||
		got.MaxTTL != time.Minute || got.Heartbeat != time.Second || got.MaxHotKeys != 10000 || got.MaxKeyLen != 512 ||
		got.MaxPeers != 1024 || got.MaxInstances != 64 || got.MaxClockSkew != 30*time.Second || got.Secret != nil || got.MaxMessage != 64<<10 || got.SyncWait != 500*time.Millisecond || got.Logger == nil || got.Now == nil {
		t.Errorf("defaults: %+v", got)
	}
	if c.subjLease != "hotkey.default.lease" || c.subjHB != "hotkey.default.hb" || c.subjSync != "hotkey.default.sync" {
		t.Errorf("subjects %s %s %s", c.subjLease, c.subjHB, c.subjSync)
	}
	nc := new(nats.Conn) // never used: these coordinators are not started
	if _, err := NewNATS(nil, Config{}); err == nil || !strings.Contains(err.Error(), "needs a connection") || !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("no connection: error %v, want ErrInvalidConfig", err)
	}
	bad := []struct {
		cfg  Config
		want string
	}{
		{Config{Prefix: "a.b"}, "Prefix"},
		{Config{Prefix: "a*"}, "Prefix"},
		{Config{Namespace: "x>"}, "Namespace"},
		{Config{Namespace: "a b"}, "Namespace"},
		{Config{Namespace: strings.Repeat("n", 65)}, "Namespace"},
		{Config{Region: "eu.west"}, "Region"},
		{Config{Region: "eu west"}, "Region"},
		{Config{Region: strings.Repeat("r", 65)}, "Region"},
		{Config{ID: strings.Repeat("i", 65)}, "ID"},
		{Config{ID: "\xff"}, "ID"},
		{Config{TTL: -time.Second}, "TTL -1s is negative"},
		{Config{TTL: time.Millisecond}, "at least"},
		{Config{Heartbeat: time.Millisecond}, "at least"},
		{Config{TTL: 2 * time.Minute}, "over MaxTTL"},
		{Config{SyncWait: -1}, "SyncWait"},
		{Config{MaxHotKeys: -1}, "MaxHotKeys"},
		{Config{MaxMessage: 1000}, "MaxMessage 1000 is too small"},
		{Config{MaxKeyLen: 20000}, "MaxMessage 65536 is too small"},
		{Config{MaxInstances: -1}, "MaxInstances -1 is negative"},
		{Config{MaxPeers: 10, MaxInstances: 12}, "MaxInstances 12 is over MaxPeers+1 (11)"},
		{Config{MaxClockSkew: -1}, "MaxClockSkew"},
		{Config{MaxClockSkew: time.Millisecond}, "at least"},
		{Config{Secret: []byte("short")}, "Secret is 5 bytes: want at least 16"},
		{Config{Secret: []byte{}}, "Secret is 0 bytes"},
		{Config{Secret: testSecret, MaxKeyLen: 100, MaxMessage: 1150}, "MaxMessage 1150 is too small"},
	}
	for _, b := range bad {
		_, err := NewNATS(nc, b.cfg)
		if err == nil || !strings.Contains(err.Error(), b.want) || !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("%+v: error %v, want %q and ErrInvalidConfig", b.cfg, err, b.want)
		}
	}
	if _, err := NewNATS(nc, Config{Prefix: "acme-prod_1", Namespace: "eu", ID: "pod-7", MaxKeyLen: 100, MaxMessage: 1200}); err != nil {
		t.Error(err)
	}
	if c := unstarted(t, Config{Region: "eu-west_1"}); c.subjLease != "hotkey.default.eu-west_1.lease" || c.subjGossip != "hotkey.default.eu-west_1.gossip" {
		t.Errorf("subjects in region eu-west_1: %s %s", c.subjLease, c.subjGossip)
	}
	// MaxInstances defaults to MaxPeers+1 when that is smaller; the secret
	// is copied.
	secret := bytes.Clone(testSecret)
	c = unstarted(t, Config{MaxPeers: 10, Secret: secret})
	secret[0] ^= 1
	if c.cfg.MaxInstances != 11 || !bytes.Equal(c.cfg.Secret, testSecret) {
		t.Errorf("MaxInstances %d, secret %q", c.cfg.MaxInstances, c.cfg.Secret)
	}
	// Validate defaults: the default lease message limit fits the default key.
	if minMessage(DefaultMaxKeyLen, true) > DefaultMaxMessage {
		t.Error("defaults inconsistent")
	}
}
