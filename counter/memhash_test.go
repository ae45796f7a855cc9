package counter

import (
	"fmt"
	"testing"
	"time"
)

// TestMemoryPlacesByHash: the store places a key by the hash it is given,
// not by a hash of its own: keys given one hash share a stripe, so in a
// store of one counter per stripe all but the first are refused.
func TestMemoryPlacesByHash(t *testing.T) {
	const keys = 64
	s := NewMemoryStore(MemoryConfig{MaxKeys: keys, Stripes: keys})
	lim := Limit{Rate: 1, Period: time.Hour}
	admitted := 0
	for i := range keys {
		if s.TakeAt(t0, fmt.Sprintf("k%d", i), 42, lim, 1).Allowed {
			admitted++
		}
	}
	if admitted != 1 || s.Full() != keys-1 {
		t.Errorf("admitted %d of %d keys given one hash, refused %d; want 1 admitted, %d refused", admitted, keys, s.Full(), keys-1)
	}
}

// TestMemoryHashCollision: keys given one hash keep a counter each, give
// or take the hash of the key the store compares: under a limit of 1 each
// key is admitted once and denied after.
func TestMemoryHashCollision(t *testing.T) {
	const keys = 200
	s := NewMemoryStore(MemoryConfig{MaxKeys: 1 << 12, Stripes: 2})
	lim := Limit{Rate: 1, Period: time.Hour}
	for _, h := range []uint64{1, 1 << 63, ^uint64(0)} {
		admitted := 0
		for round := range 2 {
			for i := range keys {
				if s.TakeAt(t0, fmt.Sprintf("h%x-%d", h, i), h, lim, 1).Allowed {
					admitted++
				} else if round == 0 {
					t.Fatalf("hash %#x: key %d denied on its first take", h, i)
				}
			}
		}
		if admitted != keys {
			t.Errorf("hash %#x: admitted %d of %d takes of %d keys, want %d", h, admitted, 2*keys, keys, keys)
		}
	}
	if got := s.Len(); got != 3*keys {
		t.Errorf("Len %d, want %d", got, 3*keys)
	}
}

// TestMemoryHashZero: a hash of 0 is computed by the store, so a key taken
// with 0 and with its Hash is one counter.
func TestMemoryHashZero(t *testing.T) {
	s := NewMemoryStore(MemoryConfig{})
	lim := Limit{Rate: 1, Period: time.Hour}
	if !s.TakeAt(t0, "k", 0, lim, 1).Allowed {
		t.Fatal("first take denied")
	}
	if s.TakeAt(t0, "k", Hash("k"), lim, 1).Allowed {
		t.Error("take given Hash(k) admitted after one given 0: two counters")
	}
}
