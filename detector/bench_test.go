package detector

import (
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cespare/xxhash/v2"
)

// The benchmarks run over the same 1M distinct keys, each goroutine walking
// them from its own random start; each operation hashes one key. Run them
// together and read the ratios off one run: BenchmarkObserveHashOnly is the
// floor (the hash alone, which the engine pays anyway), and
// BenchmarkObserveMapMutex is the naive detector, a map[string]int under a
// mutex.
const benchKeys = 1 << 20

var (
	benchOnce sync.Once
	benchSet  []string
)

func benchmarkKeys() []string {
	benchOnce.Do(func() {
		benchSet = make([]string, benchKeys)
		for i := range benchSet {
			benchSet[i] = "user:" + strconv.Itoa(i)
		}
	})
	return benchSet
}

// walk runs op over the keys on every goroutine of b.RunParallel.
func walk(b *testing.B, op func(key string)) {
	keys := benchmarkKeys()
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		i := rand.IntN(len(keys))
		for pb.Next() {
			op(keys[i])
			if i++; i == len(keys) {
				i = 0
			}
		}
	})
}

// BenchmarkObserve measures Observe on the wall clock, with Start ticking
// as in production: at ~100M observations/s each key is seen ~10 times per
// sub-window, 100 times per second, too cold to enter the exact table.
func BenchmarkObserve(b *testing.B) {
	d, err := New(DefaultConfig(), time.Now())
	if err != nil {
		b.Fatal(err)
	}
	d.Start()
	defer d.Close()
	walk(b, func(key string) { d.Observe(key, xxhash.Sum64String(key)) })
}

// BenchmarkObserveHashOnly is the floor: hashing the key, as the engine
// does once per decision before it calls Observe.
func BenchmarkObserveHashOnly(b *testing.B) {
	var sink atomic.Uint64
	walk(b, func(key string) {
		if xxhash.Sum64String(key) == 0 { // keep the hash alive
			sink.Add(1)
		}
	})
}

// BenchmarkObserveMapMutex is the naive way: an exact count per key in a
// map under one mutex, with every key already in the map.
func BenchmarkObserveMapMutex(b *testing.B) {
	var mu sync.Mutex // guards m
	m := make(map[string]int, benchKeys)
	for _, k := range benchmarkKeys() {
		m[k] = 0
	}
	walk(b, func(key string) {
		_ = xxhash.Sum64String(key) // the engine's hash, paid by every variant
		mu.Lock()
		m[key]++
		mu.Unlock()
	})
}

// BenchmarkObserveHot is one key observed on every goroutine: it lives in
// the exact table, and every core adds to its one counter.
func BenchmarkObserveHot(b *testing.B) {
	d, err := New(DefaultConfig(), time.Now())
	if err != nil {
		b.Fatal(err)
	}
	d.Start()
	defer d.Close()
	const key = "hot"
	h := xxhash.Sum64String(key)
	for range 1000 {
		d.Observe(key, h)
	}
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			d.Observe(key, xxhash.Sum64String(key))
		}
	})
}
