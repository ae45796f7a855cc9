package bench

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/hotkeyd/hotkey"
	"github.com/hotkeyd/hotkey/coordinator"
	"github.com/hotkeyd/hotkey/counter"
	"github.com/hotkeyd/hotkey/internal/natsserver"
	"github.com/hotkeyd/hotkey/shard"
)

// applied is one level change an engine applied.
type applied struct {
	engine int
	key    string
	at     time.Time
}

// BenchmarkConvergence measures how long a hot key announced by one
// instance takes to be applied by the others: 3 engines, each with a NATS
// coordinator on its own node of a 3-node cluster on loopback. Each
// operation announces a new key from a random instance and waits until the
// two others have applied it; every (announcement, instance) pair is one
// sample of publish-to-applied latency, reported as p50-ms and p99-ms.
func BenchmarkConvergence(b *testing.B) {
	c, err := natsserver.StartCluster(3, natsserver.Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	events := make(chan applied, 1024)
	coords := make([]*coordinator.NATS, 3)
	for i := range coords {
		co, err := coordinator.NewNATS(coordinator.Config{URLs: []string{c.URL(i)}, MaxHotKeys: 1 << 20})
		if err != nil {
			b.Fatal(err)
		}
		hook := func(key string, level shard.Level) {
			if level > 1 {
				events <- applied{i, key, time.Now()}
			}
		}
		e, err := hotkey.New(counter.NewMemoryStore(counter.MemoryConfig{}),
			hotkey.WithoutDetector(), hotkey.WithCoordinator(co), hotkey.WithLevelHook(hook), hotkey.WithMaxHotKeys(1<<20))
		if err != nil {
			b.Fatal(err)
		}
		defer e.Close()
		coords[i] = co
	}
	// Wait until every node has every subscription: a first key must reach
	// all three engines.
	for try := 0; ; try++ {
		key := fmt.Sprintf("warmup:%d", try)
		coords[try%3].Announce(key, xxhash.Sum64String(key), 4)
		if waitApplied(events, key, 2, time.Second) {
			break
		}
		if try == 20 {
			b.Fatal("the cluster never delivered to every engine")
		}
	}
	var lat []float64 // ms
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		key := fmt.Sprintf("conv:%d:%x", i, rand.Uint64())
		from := rand.IntN(3)
		start := time.Now()
		coords[from].Announce(key, xxhash.Sum64String(key), 4)
		got := 0
		for got < 3 { // the origin applies it too
			select {
			case ev := <-events:
				if ev.key != key {
					continue // a late warm-up event
				}
				got++
				if ev.engine != from {
					lat = append(lat, float64(ev.at.Sub(start))/float64(time.Millisecond))
				}
			case <-time.After(10 * time.Second):
				b.Fatalf("key %s reached %d of 3 engines in 10 s", key, got)
			}
		}
		coords[from].Announce(key, xxhash.Sum64String(key), 1) // lapses on the others
	}
	b.StopTimer()
	slices.Sort(lat)
	b.ReportMetric(quantile(lat, 0.50), "p50-ms")
	b.ReportMetric(quantile(lat, 0.99), "p99-ms")
}

// waitApplied reports whether key was applied by n engines within d.
func waitApplied(events <-chan applied, key string, n int, d time.Duration) bool {
	deadline := time.After(d)
	seen := map[int]bool{}
	for len(seen) < n+1 {
		select {
		case ev := <-events:
			if ev.key == key {
				seen[ev.engine] = true
			}
		case <-deadline:
			return false
		}
	}
	return true
}

// quantile returns the q-quantile of sorted xs (nearest rank).
func quantile(xs []float64, q float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	i := int(q*float64(len(xs))+0.5) - 1
	return xs[min(max(i, 0), len(xs)-1)]
}
