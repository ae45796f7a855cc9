package hotkey

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/hotkeyd/hotkey/counter"
	"github.com/hotkeyd/hotkey/internal/testkit"
)

// memFullKeys is the key table of the tests below: small, for a flood that
// overfills it to be quick under -race.
const memFullKeys = 256

// flood decides 20 × memFullKeys one-off keys under a limit that keeps each
// counter a day, and returns how many were admitted.
func flood(ctx context.Context, e *Engine, prefix string, p *Policy) int {
	admitted := 0
	for i := range 20 * memFullKeys {
		if r, err := e.Allow(ctx, fmt.Sprint(prefix, i), p); err == nil && r.Allowed {
			admitted++
		}
	}
	return admitted
}

// TestMemoryFullEngine: on an engine whose store is a small memory store, a
// flood of one-off keys overfills it. A key that used its 5 an hour before
// the flood admits no more within the hour; the flood's keys the store had
// no room for are denied, counted in hotkey_memory_store_full_total, and
// are not the store's failure: no store error, the breaker stays closed.
// The same holds on the local fallback's store while the store is down.
func TestMemoryFullEngine(t *testing.T) {
	checkLeaks(t)
	for _, down := range []bool{false, true} {
		for _, alg := range []Algorithm{TokenBucket, SlidingWindow, FixedWindow, SlidingLog} {
			t.Run(fmt.Sprintf("%v/down=%v", alg, down), func(t *testing.T) {
				clock := testkit.NewClock()
				clock.Set(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
				mem := counter.NewMemoryStore(counter.MemoryConfig{MaxKeys: memFullKeys, Stripes: 4, Clock: clock.Now})
				// Down, the store fails every take; up, it is the memory
				// store itself, as hotkeyd's without Redis.
				var store counter.Store = mem
				if down {
					store = &testkit.Store{Store: mem}
					store.(*testkit.Store).Down.Store(true)
				}
				reg := prometheus.NewRegistry()
				e, err := New(store, withClock(clock.Now), WithoutDetector(), WithMetrics(reg), WithLocalKeys(memFullKeys))
				if err != nil {
					t.Fatal(err)
				}
				defer e.Close()
				ctx := context.Background()
				user := &Policy{Name: "login", Limit: Limit{Algorithm: alg, Rate: 5, Period: time.Hour}, OnStoreFailure: FallbackLocal}
				day := &Policy{Name: "flood", Limit: Limit{Algorithm: alg, Rate: 1, Period: 24 * time.Hour}, OnStoreFailure: FallbackLocal}
				admitted := 0
				take := func() {
					for range 10 {
						r, err := e.Allow(ctx, "user", user)
						if err != nil {
							t.Fatal(err)
						}
						if r.Allowed {
							admitted++
						}
					}
				}
				take()
				clock.Advance(time.Minute)
				floodAdmitted := flood(ctx, e, "flood:", day)
				clock.Advance(time.Minute)
				take()
				if admitted != 5 {
					t.Errorf("user admitted %d of 20 within the hour, want 5", admitted)
				}
				full, refusedStore := mem.Full(), e.local.Full()
				if !down {
					full, refusedStore = refusedStore, full
				}
				got := gather(t, reg)
				t.Logf("flood admitted %d of %d; refused %d", floodAdmitted, 20*memFullKeys, refusedStore)
				if want := float64(20*memFullKeys - floodAdmitted); refusedStore == 0 || float64(refusedStore) != want {
					t.Errorf("store refused %d, want the %v flood keys denied", refusedStore, want)
				}
				if full != 0 {
					t.Errorf("the store not deciding refused %d", full)
				}
				for _, name := range []string{"store", "local"} {
					want := float64(e.local.Full())
					if name == "store" {
						want = float64(mem.Full())
					}
					if m := fmt.Sprintf(`hotkey_memory_store_full_total{store=%q}`, name); got[m] != want {
						t.Errorf("%s = %v, want %v", m, got[m], want)
					}
				}
				if !down && (got["hotkey_store_errors_total"] != 0 || got["hotkey_breaker_open"] != 0) {
					t.Errorf("a full store counted as failing: %v store errors, breaker open %v",
						got["hotkey_store_errors_total"], got["hotkey_breaker_open"])
				}
			})
		}
	}
}

// TestMemoryFullSplit: a key goes hot while its memory store is full of
// live counters. Its usage cannot move to subcounters, so it stays on the
// unsplit counter, which keeps deciding: the key admits its limit in all,
// no decision fails, the breaker stays closed, and the flood's counters
// keep their usage. Once room comes, the move is made; a merge back
// without room leaves the key on its subcounters.
func TestMemoryFullSplit(t *testing.T) {
	checkLeaks(t)
	for _, alg := range []Algorithm{TokenBucket, SlidingWindow, FixedWindow, SlidingLog} {
		t.Run(alg.String(), func(t *testing.T) {
			clock := testkit.NewClock()
			clock.Set(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
			mem := counter.NewMemoryStore(counter.MemoryConfig{MaxKeys: memFullKeys, Stripes: 4, Clock: clock.Now})
			reg := prometheus.NewRegistry()
			e, err := New(mem, withClock(clock.Now), WithoutDetector(), WithMetrics(reg))
			if err != nil {
				t.Fatal(err)
			}
			defer e.Close()
			ctx := context.Background()
			hot := &Policy{Name: "hot", Limit: Limit{Algorithm: alg, Rate: 40, Period: time.Hour}}
			day := &Policy{Name: "flood", Limit: Limit{Algorithm: alg, Rate: 1, Period: 24 * time.Hour}}
			admitted := 0
			allow := func(k int) {
				for range k {
					r, err := e.Allow(ctx, "k", hot)
					if err != nil {
						t.Fatal(err)
					}
					if r.Allowed {
						admitted++
					}
				}
			}
			allow(30)
			clock.Advance(time.Minute)
			flood(ctx, e, "flood:", day)
			refusals := mem.Full()
			handler{e}.SetLevel(nameOf(hot.Name, "k"), hashKey(nameOf(hot.Name, "k")), 16)
			allow(30)
			if admitted != 40 {
				t.Errorf("hot key admitted %d, want its limit of 40", admitted)
			}
			if mem.Full() == refusals {
				t.Error("no move was refused: the test misses its case")
			}
			again := flood(ctx, e, "flood:", day)
			if again != 0 {
				t.Errorf("the flood's keys admitted %d again within their day", again)
			}
			got := gather(t, reg)
			if got["hotkey_store_errors_total"] != 0 || got["hotkey_breaker_open"] != 0 {
				t.Errorf("a full store counted as failing: %v store errors, breaker open %v",
					got["hotkey_store_errors_total"], got["hotkey_breaker_open"])
			}
			// A day on, the flood's counters have expired: the move is made,
			// and the key decides on its subcounters.
			clock.Advance(48 * time.Hour)
			r, err := e.Allow(ctx, "k", hot)
			if err != nil || !r.Allowed || r.Shards == 1 {
				t.Fatalf("once room came: %+v, %v; want admitted on subcounters", r, err)
			}
			// Full again, the key cools: its usage cannot move back to the
			// unsplit counter (dropped, expired, for the flood), so the
			// subcounters keep deciding.
			flood(ctx, e, "flood2:", day)
			refusals = mem.Full()
			handler{e}.SetLevel(nameOf(hot.Name, "k"), hashKey(nameOf(hot.Name, "k")), 1)
			admitted = 1
			allow(60)
			if admitted > 40 {
				t.Errorf("after a merge without room, the key admitted %d, want at most its limit of 40", admitted)
			}
			if mem.Full() == refusals {
				t.Error("no merge was refused: the test misses its case")
			}
			got = gather(t, reg)
			if got["hotkey_store_errors_total"] != 0 || got["hotkey_breaker_open"] != 0 {
				t.Errorf("a full store counted as failing: %v store errors, breaker open %v",
					got["hotkey_store_errors_total"], got["hotkey_breaker_open"])
			}
		})
	}
}
