package gossip

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/hotkeyd/hotkey/counter"
	"github.com/hotkeyd/hotkey/internal/testkit"
)

func newTestStore(t *testing.T, id string, clock *testkit.Clock, cfg StoreConfig) *Store {
	t.Helper()
	cfg.ID = id
	cfg.Memory.Clock = clock.Now
	s := NewStore(cfg)
	t.Cleanup(func() { s.Close() })
	return s
}

func take(s *Store, key string, lim counter.Limit, n int64) bool {
	r, _ := s.Take(context.Background(), key, counter.Hash(key), lim, n)
	return r.Allowed
}

// remaining is what a take of one unit of key would leave in s's view.
func remaining(s *Store, key string, lim counter.Limit) int64 {
	return lim.Capacity() - used(s.Memory(), key, counter.Hash(key), lim)
}

// deliver flushes from and applies its messages to each of to.
func deliver(t *testing.T, now time.Time, from *Store, to ...*Store) [][]byte {
	t.Helper()
	msgs, err := from.Flush(now)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range msgs {
		for _, s := range to {
			if err := s.Apply(m); err != nil {
				t.Fatal(err)
			}
		}
	}
	return msgs
}

// TestStoreExchange: two stores on one key, each trying 10 units a round,
// exchanging their rounds' messages by hand, admit at most the limit plus
// one round of the other's units; not exchanging, they admit twice the
// limit.
func TestStoreExchange(t *testing.T) {
	lim := counter.Limit{Algorithm: counter.FixedWindow, Rate: 100, Period: time.Hour}
	const perRound, rounds = 10, 30
	for _, c := range []struct {
		name     string
		exchange bool
		min, max int
	}{
		{"exchanged", true, 100, 100 + perRound},
		{"alone", false, 200, 200},
	} {
		t.Run(c.name, func(t *testing.T) {
			clock := testkit.NewClock()
			a := newTestStore(t, "a", clock, StoreConfig{})
			b := newTestStore(t, "b", clock, StoreConfig{})
			admitted := 0
			for range rounds {
				for range perRound {
					for _, s := range []*Store{a, b} {
						if take(s, "k", lim, 1) {
							admitted++
						}
					}
				}
				clock.Advance(100 * time.Millisecond)
				ma, _ := a.Flush(clock.Now())
				mb, _ := b.Flush(clock.Now())
				if c.exchange {
					for _, m := range ma {
						b.Apply(m)
					}
					for _, m := range mb {
						a.Apply(m)
					}
				}
			}
			t.Logf("admitted %d of %d tried, limit %d", admitted, 2*perRound*rounds, lim.Rate)
			if admitted < c.min || admitted > c.max {
				t.Errorf("admitted %d, want %d to %d", admitted, c.min, c.max)
			}
			if st := a.Stats(); c.exchange && (st.Applied == 0 || st.Rounds == 0 || st.Messages == 0 || st.Bytes == 0 || st.EntriesSent == 0) {
				t.Errorf("stats %+v: want rounds, messages, bytes and entries sent and applied", st)
			}
		})
	}
}

// TestStoreDuplicate: a message delivered twice, or replayed after later
// rounds, is charged once; a message of another life of the sender is
// refused once the receiver has heard a later one.
func TestStoreDuplicate(t *testing.T) {
	clock := testkit.NewClock()
	lim := counter.Limit{Algorithm: counter.FixedWindow, Rate: 1000, Period: time.Hour}
	a := newTestStore(t, "a", clock, StoreConfig{})
	b := newTestStore(t, "b", clock, StoreConfig{})
	take(a, "k", lim, 7)
	first := deliver(t, clock.Now(), a, b)
	if got := remaining(b, "k", lim); got != 993 {
		t.Fatalf("after one delivery b has %d left, want 993", got)
	}
	for range 3 {
		take(a, "k", lim, 1)
		deliver(t, clock.Now(), a, b)
	}
	for _, m := range append(first, first...) { // replayed, twice
		if err := b.Apply(m); err != nil {
			t.Fatal(err)
		}
	}
	if got := remaining(b, "k", lim); got != 990 {
		t.Errorf("after replays b has %d left, want 990", got)
	}
	if st := b.Stats(); st.Duplicates != 2 || st.Applied != 4 {
		t.Errorf("stats %+v: want 2 duplicates, 4 applied", st)
	}
}

// TestStoreClockStep: a store's messages carry its start and round
// numbers, not its clock: after its clock steps a day back, then two
// forward, a peer applies each round once, as before the steps.
func TestStoreClockStep(t *testing.T) {
	clockA, clockB := testkit.NewClock(), testkit.NewClock()
	lim := counter.Limit{Algorithm: counter.FixedWindow, Rate: 1000, Period: time.Hour}
	a := newTestStore(t, "a", clockA, StoreConfig{})
	b := newTestStore(t, "b", clockB, StoreConfig{})
	var sent [][]byte
	for i, step := range []time.Duration{0, -24 * time.Hour, 48 * time.Hour} {
		clockA.Advance(step)
		take(a, "k", lim, 5)
		sent = append(sent, deliver(t, clockA.Now(), a, b)...)
		if got, want := remaining(b, "k", lim), int64(1000-5*(i+1)); got != want {
			t.Errorf("a's clock stepped %v: b has %d left, want %d", step, got, want)
		}
	}
	for _, m := range sent { // replayed
		if err := b.Apply(m); err != nil {
			t.Fatal(err)
		}
	}
	if st := b.Stats(); st.Applied != 3 || st.Duplicates != 3 {
		t.Errorf("stats %+v: want 3 applied, 3 duplicates", st)
	}
}

// TestStoreSnapshotJoin: a store joining two peers that both saw a key's
// 30 units takes 30 from their snapshots, not 60, and its own usage above
// a peer's is not charged again.
func TestStoreSnapshotJoin(t *testing.T) {
	clock := testkit.NewClock()
	lim := counter.Limit{Algorithm: counter.FixedWindow, Rate: 100, Period: time.Hour}
	tb := counter.Limit{Rate: 10, Period: time.Hour, Burst: 50}
	a := newTestStore(t, "a", clock, StoreConfig{})
	b := newTestStore(t, "b", clock, StoreConfig{})
	take(a, "k", lim, 30)
	take(a, "t", tb, 20)
	deliver(t, clock.Now(), a, b)
	j := newTestStore(t, "j", clock, StoreConfig{})
	take(j, "t", tb, 25) // more than its peers saw
	for _, peer := range []*Store{a, b} {
		msgs := peer.Snapshot(DefaultMaxBytes)
		if len(msgs) == 0 {
			t.Fatalf("%s: empty snapshot", peer.id)
		}
		for _, m := range msgs {
			if err := j.ApplySnapshot(m); err != nil {
				t.Fatal(err)
			}
		}
	}
	if got := remaining(j, "k", lim); got != 70 {
		t.Errorf("joined: %d of k left, want 70", got)
	}
	if got := remaining(j, "t", tb); got != 25 {
		t.Errorf("joined: %d of t left, want 25 (its own 25 used, above the peers' 20)", got)
	}
	admitted := 0
	for take(j, "k", lim, 1) {
		admitted++
	}
	if admitted != 70 {
		t.Errorf("joined store admitted %d, want 70", admitted)
	}
	if msgs := a.Snapshot(MinBytes(DefaultMaxKeyLen) - 1); msgs != nil {
		t.Errorf("snapshot into %d bytes: %d messages, want none", MinBytes(DefaultMaxKeyLen)-1, len(msgs))
	}
}

// TestStoreRoundCap: the round holds at most MaxKeys keys between flushes;
// the rest are decided, not sent, and counted.
func TestStoreRoundCap(t *testing.T) {
	clock := testkit.NewClock()
	lim := counter.PerSecond(10)
	const maxKeys, snapKeys, keys = 64, 16, 500
	s := newTestStore(t, "a", clock, StoreConfig{Gossip: Config{MaxKeys: maxKeys}, SnapshotKeys: snapKeys})
	for i := range keys {
		if !take(s, fmt.Sprintf("k%d", i), lim, 1) {
			t.Fatalf("take %d denied", i)
		}
	}
	msgs, err := s.Flush(clock.Now())
	if err != nil {
		t.Fatal(err)
	}
	st := s.Stats()
	if st.EntriesSent > maxKeys || st.EntriesSent+st.RoundDropped != keys {
		t.Errorf("sent %d, dropped %d of %d keys: want at most %d sent, the rest dropped", st.EntriesSent, st.RoundDropped, keys, maxKeys)
	}
	if len(msgs) != 1 {
		t.Errorf("%d messages, want 1", len(msgs))
	}
	// The keys kept for snapshots are capped too: all are in use.
	if n := s.keys.len(); n != snapKeys || st.SnapshotDropped != st.EntriesSent-snapKeys {
		t.Errorf("%d snapshot keys, %d dropped of %d: want %d kept, the rest dropped", n, st.SnapshotDropped, st.EntriesSent, snapKeys)
	}
}

// TestStoreSplit: a round too large for one message goes out in several,
// and too large for MaxParts messages, in several rounds: every key
// arrives.
func TestStoreSplit(t *testing.T) {
	clock := testkit.NewClock()
	lim := counter.PerSecond(10)
	cfg := Config{MaxKeyLen: 16, MaxBytes: MinBytes(16)}
	const keys = 40_000 // past MaxParts messages of the ~25 entries each holds
	a := newTestStore(t, "a", clock, StoreConfig{Gossip: cfg})
	b := newTestStore(t, "b", clock, StoreConfig{Gossip: cfg})
	for i := range keys {
		take(a, fmt.Sprintf("key-%08d", i), lim, 2)
	}
	msgs := deliver(t, clock.Now(), a, b)
	st := a.Stats()
	if st.Rounds < 2 || len(msgs) <= MaxParts {
		t.Errorf("%d messages in %d rounds: want more than %d, in more than one round", len(msgs), st.Rounds, MaxParts)
	}
	if got := b.Stats().Applied; got != keys {
		t.Errorf("applied %d entries, want %d", got, keys)
	}
	for _, m := range msgs {
		if len(m) > cfg.MaxBytes {
			t.Fatalf("message of %d bytes, over %d", len(m), cfg.MaxBytes)
		}
	}
}

// TestStoreRefuses: a malformed message and an entry under an invalid
// limit change nothing, and are counted.
func TestStoreRefuses(t *testing.T) {
	clock := testkit.NewClock()
	s := newTestStore(t, "a", clock, StoreConfig{})
	codec := NewCodec(Config{})
	bad := EncodeLimit(counter.Limit{Rate: 0, Period: time.Second})
	good := EncodeLimit(counter.PerSecond(10))
	msgs, err := codec.Encode(Header{Sender: "p", Start: 1, Round: 1}, []Entry{{Limit: bad, Key: "k", Units: 5}, {Limit: good, Key: "k", Units: 5}})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Apply(msgs[0]); err != nil {
		t.Fatal(err)
	}
	if err := s.Apply([]byte{1, 2, 3}); !errors.Is(err, ErrMalformed) {
		t.Errorf("Apply of 3 bytes: %v, want ErrMalformed", err)
	}
	if err := s.ApplySnapshot(nil); !errors.Is(err, ErrMalformed) {
		t.Errorf("ApplySnapshot of nothing: %v, want ErrMalformed", err)
	}
	if st := s.Stats(); st.Invalid != 1 || st.Applied != 1 || st.Malformed != 2 {
		t.Errorf("stats %+v: want 1 invalid, 1 applied, 2 malformed", st)
	}
	if got := remaining(s, "k", counter.PerSecond(10)); got != 5 {
		t.Errorf("%d left, want 5", got)
	}
}

// TestStoreChargesDropped: a charge the memory store has no room for is
// counted.
func TestStoreChargesDropped(t *testing.T) {
	clock := testkit.NewClock()
	lim := counter.Limit{Algorithm: counter.FixedWindow, Rate: 100, Period: time.Hour}
	a := newTestStore(t, "a", clock, StoreConfig{})
	b := newTestStore(t, "b", clock, StoreConfig{Memory: counter.MemoryConfig{MaxKeys: 1, Stripes: 1}})
	take(b, "mine", lim, 1)
	take(a, "other", lim, 1)
	deliver(t, clock.Now(), a, b)
	if st := b.Stats(); st.ChargesDropped != 1 || st.Applied != 0 {
		t.Errorf("stats %+v: want 1 charge dropped", st)
	}
}

func TestParseLimit(t *testing.T) {
	for _, give := range []counter.Limit{
		counter.PerSecond(1),
		{Algorithm: counter.SlidingWindow, Rate: 1000, Period: time.Minute},
		{Algorithm: counter.FixedWindow, Rate: counter.MaxCount, Period: time.Hour},
		{Algorithm: counter.SlidingLog, Rate: 5, Period: 15 * time.Minute},
		{Rate: 10, Period: time.Second, Burst: 500},
	} {
		s := EncodeLimit(give)
		got, err := ParseLimit(s)
		if err != nil || got != give || len(s) > MaxLimitLen {
			t.Errorf("ParseLimit(EncodeLimit(%+v)) = %+v, %v (%d bytes)", give, got, err, len(s))
		}
	}
	for _, give := range []string{
		"",
		EncodeLimit(counter.Limit{Rate: 0, Period: time.Second}),
		EncodeLimit(counter.Limit{Rate: 1, Period: 0}),
		EncodeLimit(counter.Limit{Algorithm: 9, Rate: 1, Period: time.Second}),
		EncodeLimit(counter.Limit{Rate: -1, Period: time.Second}),
		EncodeLimit(counter.PerSecond(1)) + "x",
		EncodeLimit(counter.PerSecond(1))[:3],
	} {
		if got, err := ParseLimit(give); !errors.Is(err, ErrInvalid) {
			t.Errorf("ParseLimit(%q) = %+v, %v: want ErrInvalid", give, got, err)
		}
	}
}

func FuzzParseLimit(f *testing.F) {
	f.Add(EncodeLimit(counter.PerSecond(10)))
	f.Add("")
	f.Fuzz(func(t *testing.T, s string) {
		lim, err := ParseLimit(s)
		if err != nil {
			return
		}
		if lim.Validate() != nil {
			t.Fatalf("ParseLimit(%q) = %+v, which does not Validate", s, lim)
		}
		if got, err := ParseLimit(EncodeLimit(lim)); err != nil || got != lim {
			t.Fatalf("round trip of %+v: %+v, %v", lim, got, err)
		}
	})
}

// flushed flushes s and returns the units of its messages by key, and the
// number of entries.
func flushed(t *testing.T, s *Store, now time.Time) (map[string]int64, int) {
	t.Helper()
	msgs, err := s.Flush(now)
	if err != nil {
		t.Fatal(err)
	}
	codec := NewCodec(s.cfg)
	units, entries := map[string]int64{}, 0
	for _, m := range msgs {
		d, err := codec.Decode(m)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range d.Entries {
			units[e.Key] += e.Units
			entries++
		}
	}
	return units, entries
}

// TestStoreFlushCarriesUnits: a flush carries every unit admitted since
// the last, key by key, whether the memory store's tally held it or, past
// its room, the round; the next flush carries only what came after.
func TestStoreFlushCarriesUnits(t *testing.T) {
	clock := testkit.NewClock()
	lim := counter.Limit{Algorithm: counter.FixedWindow, Rate: 1 << 20, Period: time.Hour}
	// 1,000 keys over 64 stripes, about 16 a stripe, against a tally of 16
	// keys a stripe: the keys past it, about 100 wherever the seeded hash
	// puts the keys, go to the round, whose 16 stripes hold 64 keys each.
	// That every stripe's keys fit its tally, or that 64 land on one round
	// stripe, is less likely than one time in 10^13.
	s := newTestStore(t, "a", clock, StoreConfig{Gossip: Config{MaxKeys: 1024}, Memory: counter.MemoryConfig{MaxKeys: 4096, Stripes: 64}})
	r := rand.New(rand.NewPCG(1, 2))
	for round := range 3 {
		want, total := map[string]int64{}, int64(0)
		for range 20_000 {
			k := fmt.Sprintf("key-%d", r.IntN(1000))
			n := 1 + r.Int64N(4)
			if !take(s, k, lim, n) {
				t.Fatalf("take of %d on %s denied", n, k)
			}
			want[k] += n
			total += n
		}
		got, _ := flushed(t, s, clock.Now())
		var sum int64
		wrong := 0
		for k, n := range want {
			if got[k] != n {
				wrong++
			}
			sum += got[k]
		}
		if sum != total || wrong > 0 || len(got) != len(want) {
			t.Errorf("round %d: flushed %d units on %d keys, %d keys wrong; admitted %d on %d", round, sum, len(got), wrong, total, len(want))
		}
	}
	if st := s.Stats(); st.TallyFull == 0 || st.RoundDropped != 0 {
		t.Errorf("stats %+v: want some units past the tally's room, none dropped", st)
	}
	if got, _ := flushed(t, s, clock.Now()); len(got) != 0 {
		t.Errorf("flush after a flush: %v, want nothing", got)
	}
}

// TestStoreTwoEntriesOneKey: units of a key past its tally's room go out
// in the round's entry beside the tally's, and a peer charges both.
func TestStoreTwoEntriesOneKey(t *testing.T) {
	clock := testkit.NewClock()
	lim := counter.Limit{Algorithm: counter.FixedWindow, Rate: 1 << 40, Period: time.Hour}
	a := newTestStore(t, "a", clock, StoreConfig{})
	b := newTestStore(t, "b", clock, StoreConfig{})
	for _, n := range []int64{math.MaxUint32, 5} { // the tally's cell holds 2^32-1
		if !take(a, "k", lim, n) {
			t.Fatalf("take of %d denied", n)
		}
	}
	msgs := deliver(t, clock.Now(), a, b)
	d, err := NewCodec(Config{}).Decode(msgs[0])
	if err != nil {
		t.Fatal(err)
	}
	if len(msgs) != 1 || len(d.Entries) != 2 {
		t.Fatalf("%d messages, the first of %d entries; want 1 of 2", len(msgs), len(d.Entries))
	}
	if st := b.Stats(); st.Applied != 2 {
		t.Errorf("peer applied %d entries, want 2", st.Applied)
	}
	if got, want := lim.Capacity()-remaining(b, "k", lim), int64(math.MaxUint32+5); got != want {
		t.Errorf("peer used %d, want %d", got, want)
	}
}

// TestStoreCapsCharge: a peer's entry charges at most what the key's limit
// admits over the round's span (the interval, plus the time since the
// sender's last message), however many units it carries; a snapshot's
// entry at most the limit's capacity. Each capped entry is counted.
func TestStoreCapsCharge(t *testing.T) {
	const interval = 100 * time.Millisecond
	for _, lim := range []counter.Limit{
		counter.PerSecond(10),
		{Algorithm: counter.TokenBucket, Rate: 7, Period: time.Second, Burst: 20},
		{Algorithm: counter.SlidingWindow, Rate: 10, Period: time.Second},
		{Algorithm: counter.FixedWindow, Rate: 10, Period: time.Second},
		{Algorithm: counter.SlidingLog, Rate: 10, Period: time.Second},
	} {
		t.Run(lim.Algorithm.String(), func(t *testing.T) {
			clock := testkit.NewClock()
			codec := NewCodec(Config{})
			apply := func(s *Store, round uint64, units int64, snapshot bool) {
				t.Helper()
				msgs, err := codec.Encode(Header{Sender: "p", Start: 1, Round: round}, []Entry{{Limit: EncodeLimit(lim), Key: "k", Units: units}})
				if err != nil {
					t.Fatal(err)
				}
				if snapshot {
					err = s.ApplySnapshot(msgs[0])
				} else {
					err = s.Apply(msgs[0])
				}
				if err != nil {
					t.Fatal(err)
				}
			}
			s := newTestStore(t, "a", clock, StoreConfig{Interval: interval})
			apply(s, 1, math.MaxInt64, false)
			// The entry charged at most MaxAdmitted(interval): once that
			// many units' time has passed, the key admits again.
			wait := time.Duration(lim.MaxAdmitted(interval)+lim.Capacity()) * lim.Period / time.Duration(lim.Rate)
			clock.Advance(wait)
			if !take(s, "k", lim, 1) {
				t.Errorf("a peer's entry of 2^63-1 units still denies after %v", wait)
			}
			// A minute later the sender's next round spans the minute too:
			// a token bucket owes a minute's rate, more than the wait.
			clock.Advance(time.Minute)
			apply(s, 2, math.MaxInt64, false)
			clock.Advance(wait)
			if r, _ := s.Peek(context.Background(), "k", counter.Hash("k"), lim); lim.Algorithm == counter.TokenBucket && r.Allowed {
				t.Errorf("a round spanning a minute charged less than its span admits: admits again after %v", wait)
			}
			apply(s, 0, math.MaxInt64, true)
			if st := s.Stats(); st.Capped != 3 {
				t.Errorf("stats %+v: want 3 entries capped", st)
			}
			// An entry within the bound is charged whole, and not counted.
			whole := newTestStore(t, "b", clock, StoreConfig{Interval: interval})
			apply(whole, 1, lim.MaxAdmitted(interval), false)
			if st := whole.Stats(); st.Capped != 0 || st.Applied != 1 {
				t.Errorf("stats %+v: want 1 applied, none capped", st)
			}
		})
	}
}

// TestStoreSnapshotParts: a snapshot goes out at most snapshotPart keys a
// message, every key with units used in one of them once; a key with
// nothing used is left out and forgotten.
func TestStoreSnapshotParts(t *testing.T) {
	clock := testkit.NewClock()
	lim := counter.Limit{Algorithm: counter.FixedWindow, Rate: 100, Period: time.Second}
	s := newTestStore(t, "a", clock, StoreConfig{})
	const keys = 3*snapshotPart + 10
	for i := range keys {
		take(s, fmt.Sprint("k", i), lim, 1)
	}
	s.Flush(clock.Now())
	clock.Advance(time.Second) // their windows end: nothing used
	for i := range keys - 1 {
		take(s, fmt.Sprint("k", i), lim, 2)
	}
	codec := NewCodec(Config{})
	seen := map[string]int64{}
	msgs := 0
	s.SnapshotTo(DefaultMaxBytes, func(p []byte) {
		msgs++
		m, err := codec.Decode(p)
		if err != nil {
			t.Fatal(err)
		}
		if len(m.Entries) > snapshotPart {
			t.Errorf("message %d: %d entries, want at most %d", msgs, len(m.Entries), snapshotPart)
		}
		for _, e := range m.Entries {
			if _, dup := seen[e.Key]; dup {
				t.Errorf("%s sent twice", e.Key)
			}
			seen[e.Key] = e.Units
		}
	})
	if len(seen) != keys-1 || msgs != (keys-1+snapshotPart-1)/snapshotPart {
		t.Errorf("%d keys in %d messages, want %d in %d", len(seen), msgs, keys-1, (keys-1+snapshotPart-1)/snapshotPart)
	}
	for k, u := range seen {
		if u != 2 {
			t.Errorf("%s: %d units, want 2", k, u)
		}
	}
	if n := s.keys.len(); n != keys-1 {
		t.Errorf("%d keys remembered, want %d: the one with nothing used forgotten", n, keys-1)
	}
}

// TestStoreChargeTotals: totals charge the store's view once per (key,
// sender) total, and go to no peer: a Flush after them sends nothing.
func TestStoreChargeTotals(t *testing.T) {
	clock := testkit.NewClock()
	s := newTestStore(t, "a", clock, StoreConfig{})
	lim := counter.Limit{Algorithm: counter.FixedWindow, Rate: 10, Period: time.Hour}
	ops := []counter.TotalOp{
		{Key: "k", Limit: lim, From: "r2:1", Total: 4, Keep: time.Minute},
		{Key: "k", Limit: lim, From: "r2:1", Total: 4, Keep: time.Minute},
		{Key: "k", Limit: lim, From: "r2:1", Total: 6, Keep: time.Minute},
	}
	s.ChargeTotals(context.Background(), ops)
	for i, want := range []int64{4, 0, 2} {
		if ops[i].Err != nil || ops[i].Charged != want {
			t.Errorf("op %d: charged %d, %v; want %d", i, ops[i].Charged, ops[i].Err, want)
		}
	}
	if got := remaining(s, "k", lim); got != 4 {
		t.Errorf("%d left after 6 of 10 charged, want 4", got)
	}
	if msgs := deliver(t, clock.Now(), s); len(msgs) != 0 {
		t.Errorf("a flush after totals sent %d messages, want none", len(msgs))
	}
}
