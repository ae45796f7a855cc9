package counter_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/hotkeyd/hotkey/counter"
	"github.com/hotkeyd/hotkey/internal/keyhash"
	"github.com/hotkeyd/hotkey/internal/testkit"
)

// TestMemoryCraftedCollisions: keys crafted to share one xxhash64 (its
// lanes inverted, as a client can) spread over the memory store's stripes
// like other keys, given the Hash a caller gives: a store of 128 counters
// a stripe holds 4,096 of them, as it holds 4,096 keys of a counter, where
// on one stripe it would refuse all but 128.
func TestMemoryCraftedCollisions(t *testing.T) {
	if keyhash.Fixed {
		t.Skip("built with hotkey_fixedhash: counter.Hash is xxhash64")
	}
	const keys, stripes = 4096, 64
	target := strings.Repeat("victim:", 10)
	crafted := testkit.XXHashCollisions(target, keys)
	for _, k := range crafted {
		if xxhash.Sum64String(k) != xxhash.Sum64String(target) {
			t.Fatalf("crafted key %q: xxhash64 %#x, want the target's %#x", k, xxhash.Sum64String(k), xxhash.Sum64String(target))
		}
	}
	plain := make([]string, keys)
	for i := range plain {
		plain[i] = fmt.Sprintf("plain-%d", i)
	}
	lim := counter.Limit{Rate: 1, Period: time.Hour}
	t0 := time.Unix(1_700_000_000, 0)
	for _, tt := range []struct {
		name string
		keys []string
	}{{"crafted", crafted}, {"plain", plain}} {
		s := counter.NewMemoryStore(counter.MemoryConfig{MaxKeys: 2 * keys, Stripes: stripes})
		admitted := 0
		for _, k := range tt.keys {
			if s.TakeAt(t0, k, counter.Hash(k), lim, 1).Allowed {
				admitted++
			}
		}
		t.Logf("%s keys: admitted %d of %d, refused %d", tt.name, admitted, keys, s.Full())
		if admitted != keys || s.Full() != 0 {
			t.Errorf("%s keys: admitted %d of %d, refused %d; want all admitted in a store of %d counters over %d stripes", tt.name, admitted, keys, s.Full(), 2*keys, stripes)
		}
	}
}
