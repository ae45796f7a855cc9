package gossip

import (
	"fmt"
	"slices"
	"sync"
	"testing"
)

// BenchmarkCodec encodes and decodes a round of 100,000 keys ("user:N",
// 1 to 300 units) per op, and reports the cost and the bytes per key.
func BenchmarkCodec(b *testing.B) {
	const keys = 100_000
	c := NewCodec(Config{})
	give := make([]Entry, keys)
	for i := range give {
		give[i] = Entry{Limit: "api", Key: fmt.Sprintf("user:%d", i), Units: int64(1 + i%300)}
	}
	entries := slices.Clone(give)
	b.ReportAllocs()
	var size int
	for b.Loop() {
		copy(entries, give)
		msgs, err := c.Encode(testHeader, entries)
		if err != nil {
			b.Fatal(err)
		}
		size = 0
		for _, m := range msgs {
			size += len(m)
			if _, err := c.Decode(m); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/keys, "ns/key")
	b.ReportMetric(float64(size)/keys, "bytes/key")
}

// BenchmarkRoundAdd adds units to 10,000 keys from parallel goroutines,
// beside a map of keys under one mutex, the baseline the stripes must
// beat.
func BenchmarkRoundAdd(b *testing.B) {
	keys := make([]string, 10_000)
	hashes := make([]uint64, len(keys))
	for i := range keys {
		keys[i] = fmt.Sprintf("user:%d", i)
		hashes[i] = uint64(i) * 0x9e3779b97f4a7c15
	}
	b.Run("round", func(b *testing.B) {
		r := NewRound(Config{})
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for i := 0; pb.Next(); i++ {
				k := i % len(keys)
				r.Add("api", keys[k], hashes[k], 1)
			}
		})
	})
	b.Run("map+mutex", func(b *testing.B) {
		var mu sync.Mutex // guards units
		units := make(map[roundKey]int64)
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for i := 0; pb.Next(); i++ {
				k := i % len(keys)
				mu.Lock()
				units[roundKey{"api", keys[k]}]++
				mu.Unlock()
			}
		})
	})
}
