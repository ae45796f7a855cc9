package counter

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// TestDelete: on every store and algorithm, Delete empties the counters it
// names, and leaves the others as they were; on Redis, none of the deleted
// names is left.
func TestDelete(t *testing.T) {
	for _, h := range harnesses(t) {
		t.Run(h.name, func(t *testing.T) {
			d, ok := h.store.(Deleter)
			if !ok {
				t.Fatalf("%T is no Deleter", h.store)
			}
			for _, alg := range []Algorithm{TokenBucket, SlidingWindow, FixedWindow, SlidingLog} {
				t.Run(alg.String(), func(t *testing.T) {
					lim := Limit{Algorithm: alg, Rate: 3, Period: 1000 * time.Hour}
					base := uniqueKey(t)
					var gone []Shard
					for _, name := range []string{base, base + "|4|0", base + "|4|3", base + "|16|7|2"} {
						gone = append(gone, Shard{Name: name, Hash: Hash(name)})
					}
					kept := base + ":other"
					for _, name := range append(names(gone), kept) {
						if got := h.takeAll(t, name, lim, 5); got != 3 {
							t.Fatalf("%s: admitted %d of 5, want 3", name, got)
						}
					}
					// Twice the same name, and one never written: no error.
					del := append(gone, gone[0], Shard{Name: base + "|64|9"})
					if err := d.Delete(context.Background(), del); err != nil {
						t.Fatal(err)
					}
					for _, name := range names(gone) {
						if got := h.takeAll(t, name, lim, 5); got != 3 {
							t.Errorf("%s after Delete: admitted %d of 5, want 3", name, got)
						}
					}
					if got := h.takeAll(t, kept, lim, 5); got != 0 {
						t.Errorf("a counter not deleted: admitted %d of 5, want 0", got)
					}
					if err := d.Delete(context.Background(), nil); err != nil {
						t.Errorf("Delete of none: %v", err)
					}
				})
			}
		})
	}
}

func names(shards []Shard) []string {
	out := make([]string, len(shards))
	for i, s := range shards {
		out[i] = s.Name
	}
	return out
}

// TestDeleteRedisKeys: after Delete, none of the names is a key on the
// server, on a standalone server and on a Cluster, whose names lie on
// several nodes.
func TestDeleteRedisKeys(t *testing.T) {
	for _, tc := range []struct {
		name   string
		client redis.UniversalClient
	}{
		{"redis", redis.NewClient(&redis.Options{Addr: testRedisAddr})},
		{"cluster", redis.NewClusterClient(&redis.ClusterOptions{Addrs: testClusterAddrs})},
	} {
		t.Run(tc.name, func(t *testing.T) {
			defer tc.client.Close()
			ctx := context.Background()
			prefix := "del" + uniqueKey(t)[len(t.Name()):] + ":"
			s, err := NewRedisStore(ctx, tc.client, RedisConfig{Prefix: prefix, Timeout: testTimeout})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			lim := Limit{Algorithm: FixedWindow, Rate: 10, Period: time.Hour}
			var all []Shard
			for i := range 40 {
				name := "k|16|" + string(rune('a'+i%26)) + string(rune('a'+i/26))
				all = append(all, Shard{Name: name, Hash: Hash(name)})
				if _, err := s.Take(ctx, name, all[i].Hash, lim, 1); err != nil {
					t.Fatal(err)
				}
			}
			if n := countKeys(t, tc.client, prefix); n != 40 {
				t.Fatalf("%d keys under %q before Delete, want 40", n, prefix)
			}
			if err := s.Delete(ctx, all[:30]); err != nil {
				t.Fatal(err)
			}
			if n := countKeys(t, tc.client, prefix); n != 10 {
				t.Errorf("%d keys under %q after deleting 30 of 40, want 10", n, prefix)
			}
		})
	}
}

// countKeys counts the keys under prefix on every node of client.
func countKeys(t *testing.T, client redis.UniversalClient, prefix string) int {
	t.Helper()
	ctx := context.Background()
	count := func(c *redis.Client) (int, error) {
		keys, err := c.Keys(ctx, prefix+"*").Result()
		return len(keys), err
	}
	var n int
	var err error
	switch c := client.(type) {
	case *redis.ClusterClient:
		var total atomic.Int64
		err = c.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
			k, err := count(m)
			total.Add(int64(k))
			return err
		})
		n = int(total.Load())
	case *redis.Client:
		n, err = count(c)
	}
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestReserveDelete: a Delete drops the blocks of the counters it deletes,
// so that the key admits its limit again and not a unit more.
func TestReserveDelete(t *testing.T) {
	s, l, clock := newReserveTest(t, 1)
	ctx := context.Background()
	lim := Limit{Algorithm: FixedWindow, Rate: 100, Period: time.Hour}
	key, hash := "hot", uint64(7)
	take := func(n int) (admitted int) {
		for range n {
			r, err := s.Take(ctx, key, hash, lim, 1)
			if err != nil {
				t.Fatal(err)
			}
			if r.Allowed {
				admitted++
			}
			clock.Advance(time.Millisecond)
		}
		return admitted
	}
	if got := take(30); got != 30 {
		t.Fatalf("admitted %d of 30 before Delete", got)
	}
	if len(l.leased) == 0 {
		t.Fatal("no block was leased: the test needs one")
	}
	if err := s.Delete(ctx, []Shard{{Name: key, Hash: hash}}); err != nil {
		t.Fatal(err)
	}
	if got := take(150); got != 100 {
		t.Errorf("admitted %d of 150 after Delete, want the limit, 100", got)
	}
}
