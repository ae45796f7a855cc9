package hotkey

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/hotkeyd/hotkey/counter"
	"github.com/hotkeyd/hotkey/internal/testkit"
	"github.com/hotkeyd/hotkey/shard"
)

// TestReset: a key filled at levels 4, 16 and 1 in turn (its usage left
// on the counters of each), then reset, admits its whole limit again on
// every algorithm and store, while another key stays full; on Redis no
// counter of the key is left.
func TestReset(t *testing.T) {
	clock := testkit.NewClock()
	client := redis.NewClient(&redis.Options{Addr: env.Server.Addr})
	defer client.Close()
	for _, st := range peekStores(t, clock) {
		for _, alg := range allAlgorithms {
			t.Run(fmt.Sprintf("%s/%v", st.name, alg), func(t *testing.T) {
				p := &Policy{Name: fmt.Sprintf("p%x", rand.Uint64()), Limit: Limit{Algorithm: alg, Rate: 160, Period: longPeriod}}
				e := newSplitEngine(t, st.store, clock, "", shard.Level1)
				ctx := context.Background()
				name := CounterName(p.Name, "k")
				decide := func(key string, n int) (admitted int) {
					t.Helper()
					for range n {
						r, err := e.Allow(ctx, key, p)
						if err != nil {
							t.Fatal(err)
						}
						if r.Allowed {
							admitted++
						}
					}
					return admitted
				}
				for _, level := range []shard.Level{shard.Level4, shard.Level16, shard.Level1} {
					handler{e}.SetLevel(name, hashKey(name), level)
					decide("k", 60)
				}
				handler{e}.SetLevel(name, hashKey(name), shard.Level4)
				if got := decide("k", 320); got != 0 {
					t.Fatalf("filled: admitted %d of 320, want 0", got)
				}
				if got := decide("other", 320); got != 160 {
					t.Fatalf("other key: admitted %d of 320, want 160", got)
				}
				if st.name == "redis" {
					if n := redisKeys(t, client, name); n < 1+4+16 {
						t.Fatalf("%d counters of the key on Redis before the reset, want those of levels 1, 4 and 16", n)
					}
				}
				if err := e.Reset(ctx, "k", p); err != nil {
					t.Fatal(err)
				}
				if st.name == "redis" {
					if n := redisKeys(t, client, name); n != 0 {
						t.Errorf("%d counters of the key on Redis after the reset, want 0", n)
					}
				}
				if got := decide("k", 320); got != 160 {
					t.Errorf("after the reset: admitted %d of 320, want the limit, 160", got)
				}
				if got := decide("other", 320); got != 0 {
					t.Errorf("other key after the reset: admitted %d of 320, want 0", got)
				}
			})
		}
	}
}

// redisKeys counts the keys on client's server that are counters of the
// counter name, unsplit or split.
func redisKeys(t *testing.T, client *redis.Client, name string) int {
	t.Helper()
	var n int
	iter := client.Scan(context.Background(), 0, "*", 1000).Iterator()
	for iter.Next(context.Background()) {
		k := iter.Val()
		if i := strings.IndexByte(k, ':'); i >= 0 && (k[i+1:] == name || strings.HasPrefix(k[i+1:], name+"|")) {
			n++
		}
	}
	if err := iter.Err(); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestResetInput: Reset refuses bad input as a decision does, and a store
// that cannot delete says so.
func TestResetInput(t *testing.T) {
	clock := testkit.NewClock()
	e := newEngineOn(t, counter.NewMemoryStore(counter.MemoryConfig{Clock: clock.Now}), clock)
	ctx := context.Background()
	p := &Policy{Name: "p", Limit: PerSecond(10)}
	for _, c := range []struct {
		key  string
		p    *Policy
		want error
	}{
		{"", p, ErrEmptyKey},
		{strings.Repeat("x", DefaultMaxKeyLen+1), p, ErrKeyTooLong},
		{"k", nil, ErrNilPolicy},
		{"k", &Policy{Name: "a|b", Limit: PerSecond(1)}, ErrInvalidPolicyName},
	} {
		if err := e.Reset(ctx, c.key, c.p); !errors.Is(err, c.want) {
			t.Errorf("Reset(%.10q, %v): %v, want %v", c.key, c.p, err, c.want)
		}
	}
	e = newEngineOn(t, &testkit.Store{Store: counter.NewMemoryStore(counter.MemoryConfig{})}, clock)
	if err := e.Reset(ctx, "k", p); !errors.Is(err, ErrNoReset) {
		t.Errorf("reset on a store that cannot: %v, want ErrNoReset", err)
	}
}
