package hotkey

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/hotkeyd/hotkey/internal/keyhash"
	"github.com/hotkeyd/hotkey/internal/testkit"
)

// TestDenyCacheCraftedCollision: a key crafted to share a denied key's
// xxhash64 (its lanes inverted, as a client can) does not share its deny:
// the store is asked, and admits the crafted key's first request.
func TestDenyCacheCraftedCollision(t *testing.T) {
	if keyhash.Fixed {
		t.Skip("built with hotkey_fixedhash: the engine hashes with xxhash64")
	}
	const crafted = 16
	ctx := context.Background()
	e, store := newMemoryEngine(t, testkit.NewClock())
	p := pol(Limit{Rate: 1, Period: time.Hour})
	victim := strings.Repeat("victim:", 10)
	if r, err := e.Allow(ctx, victim, p); err != nil || !r.Allowed {
		t.Fatalf("victim's first request: %+v, %v", r, err)
	}
	if r, err := e.Allow(ctx, victim, p); err != nil || r.Allowed {
		t.Fatalf("victim's second request: %+v, %v; want denied", r, err)
	}
	admitted, asked := 0, store.Takes.Load()
	for _, k := range testkit.XXHashCollisions(victim, crafted) {
		if xxhash.Sum64String(k) != xxhash.Sum64String(victim) {
			t.Fatalf("crafted key %q: xxhash64 %#x, want the victim's %#x", k, xxhash.Sum64String(k), xxhash.Sum64String(victim))
		}
		r, err := e.Allow(ctx, k, p)
		if err != nil {
			t.Fatal(err)
		}
		if r.Allowed {
			admitted++
		}
	}
	asked = store.Takes.Load() - asked
	t.Logf("admitted %d of %d crafted keys' first requests, %d asked of the store", admitted, crafted, asked)
	if admitted != crafted || asked != crafted {
		t.Errorf("admitted %d of %d crafted keys' first requests, %d asked of the store; want %d and %d", admitted, crafted, asked, crafted, crafted)
	}
}
