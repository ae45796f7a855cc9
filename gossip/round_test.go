package gossip

import (
	"fmt"
	"math"
	"sync"
	"testing"

	"github.com/hotkeyd/hotkey/counter"
)

func add(r *Round, limit, key string, n int64) bool {
	return r.Add(limit, key, counter.Hash(key), n)
}

// TestRoundFlush: a round sums a key's units per limit, hands them out
// once at Flush and starts empty.
func TestRoundFlush(t *testing.T) {
	r := NewRound(Config{})
	add(r, "api", "a", 2)
	add(r, "api", "a", 3)
	add(r, "login", "a", 1)
	add(r, "api", "b", math.MaxInt64)
	add(r, "api", "b", 5)
	got := map[string]int64{}
	for _, e := range r.Flush() {
		got[e.Limit+"/"+e.Key] = e.Units
	}
	want := map[string]int64{"api/a": 5, "login/a": 1, "api/b": math.MaxInt64}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("Flush = %v, want %v", got, want)
	}
	if n := len(r.Flush()); n != 0 || r.Len() != 0 {
		t.Errorf("second Flush has %d entries (Len %d), want 0", n, r.Len())
	}
}

// TestRoundSharedHash: keys given one hash (the same key under two
// limits, or two keys whose hashes collide) are kept apart, and Flush
// empties them all.
func TestRoundSharedHash(t *testing.T) {
	r := NewRound(Config{})
	for range 2 {
		for _, g := range []struct {
			limit, key string
			n          int64
		}{{"api", "a", 1}, {"api", "b", 2}, {"login", "a", 3}, {"api", "a", 4}, {"login", "a", 5}, {"api", "b", 6}} {
			if !r.Add(g.limit, g.key, 7, g.n) {
				t.Fatalf("add of %+v dropped", g)
			}
		}
		if r.Len() != 3 {
			t.Errorf("Len() = %d, want 3", r.Len())
		}
		got := map[string]int64{}
		for _, e := range r.Flush() {
			got[e.Limit+"/"+e.Key] += e.Units
		}
		want := map[string]int64{"api/a": 5, "api/b": 8, "login/a": 8}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("Flush = %v, want %v", got, want)
		}
	}
}

// TestRoundCap: a round holds at most MaxKeys keys; adds of new keys past
// it are dropped and counted, adds to held keys are not, and Flush makes
// room again. Adds the codec cannot carry are dropped and counted too.
func TestRoundCap(t *testing.T) {
	const maxKeys, give = 1000, 5000
	r := NewRound(Config{MaxKeys: maxKeys})
	held := 0
	for i := range give {
		if add(r, "api", fmt.Sprintf("k%d", i), 1) {
			held++
		}
	}
	if held > maxKeys || held < maxKeys*9/10 || r.Len() != held {
		t.Errorf("held %d keys (Len %d), want at most %d and most of them", held, r.Len(), maxKeys)
	}
	if got := r.Dropped(); got != give-uint64(held) {
		t.Errorf("Dropped() = %d, want %d", got, give-held)
	}
	if !add(r, "api", "k0", 1) {
		t.Error("add to a held key dropped")
	}
	for _, bad := range []struct{ limit, key string }{{"", "k"}, {"api", ""}, {string(make([]byte, MaxLimitLen+1)), "k"}, {"api", string(make([]byte, DefaultMaxKeyLen+1))}} {
		if add(r, bad.limit, bad.key, 1) {
			t.Errorf("add of limit of %d bytes, key of %d held", len(bad.limit), len(bad.key))
		}
	}
	if add(r, "api", "k0", 0) || add(r, "api", "k0", -1) {
		t.Error("add of no units held")
	}
	if got, want := r.Dropped(), give-uint64(held)+6; got != want {
		t.Errorf("Dropped() = %d after 6 adds it cannot carry, want %d", got, want)
	}
	if r.Flush(); !add(r, "api", "new", 1) {
		t.Error("add after Flush dropped")
	}
}

// TestRoundConcurrent: adds racing with flushes lose no unit.
func TestRoundConcurrent(t *testing.T) {
	r := NewRound(Config{})
	const workers, adds = 4, 2000
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := range adds {
				add(r, "api", fmt.Sprintf("k%d", (i+w)%50), 1)
			}
		})
	}
	var total int64
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	for stop := false; !stop; {
		select {
		case <-done:
			stop = true
		default:
		}
		for _, e := range r.Flush() {
			total += e.Units
		}
	}
	if total != workers*adds {
		t.Errorf("flushed %d units, want %d", total, workers*adds)
	}
}

// TestRoundRounds: a round's table, grown by many keys and emptied by
// Flush, hands out each round's units whole, whatever keys the rounds
// share.
func TestRoundRounds(t *testing.T) {
	r := NewRound(Config{})
	for round := range 3 {
		keys := 3000 >> round // fewer keys each round: held rooms are reused
		for i := range keys {
			for range i%3 + 1 {
				add(r, "api", fmt.Sprintf("k%d", i+round*1000), 1)
			}
		}
		if r.Len() != keys {
			t.Fatalf("round %d: Len() = %d, want %d", round, r.Len(), keys)
		}
		got := map[string]int64{}
		for _, e := range r.Flush() {
			got[e.Key] += e.Units
		}
		for i := range keys {
			if k := fmt.Sprintf("k%d", i+round*1000); got[k] != int64(i%3+1) {
				t.Fatalf("round %d: %s has %d units, want %d", round, k, got[k], i%3+1)
			}
		}
		if len(got) != keys {
			t.Errorf("round %d: Flush has %d keys, want %d", round, len(got), keys)
		}
	}
}
