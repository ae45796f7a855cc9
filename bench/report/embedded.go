package main

import (
	"context"
	"fmt"
	"hash/maphash"
	"math/rand/v2"
	"runtime"
	"strconv"
	"sync"
	"testing"

	"golang.org/x/time/rate"

	"github.com/hotkeyd/hotkey"
	"github.com/hotkeyd/hotkey/bench/internal/scenario"
	"github.com/hotkeyd/hotkey/counter"
)

// limiterForm is one way to rate-limit many keys in process: build returns
// its decision function, and what releases it.
type limiterForm struct {
	name  string
	build func() (allow func(key string) bool, close func())
}

// runEmbedded measures the cost of one decision in process over 1M keys,
// all present and admitted: the engine on its memory store, against the
// forms a careful Go programmer writes with golang.org/x/time/rate: one map
// behind one mutex, a sync.Map, and 256 map+mutex stripes. Each form is
// built, filled and measured alone, so that one's heap does not slow
// another's collections.
func runEmbedded(ctx context.Context, s *setup) (*scenario.Section, error) {
	const keys = 1 << 20
	names := make([]string, keys)
	for i := range names {
		names[i] = "user:" + strconv.Itoa(i) + ":api"
	}
	k := s.rounds(3, 1)
	forms := []limiterForm{
		{"hotkey engine (memory store, detector on)", func() (func(string) bool, func()) {
			e, err := hotkey.New(counter.NewMemoryStore(counter.MemoryConfig{MaxKeys: 2 * keys}))
			if err != nil {
				panic(err) // the defaults are valid
			}
			p := &hotkey.Policy{Limit: hotkey.PerSecond(1000)}
			return func(key string) bool {
				r, err := e.Allow(ctx, key, p)
				return err == nil && r.Allowed
			}, func() { e.Close() }
		}},
		{"the engine's memory store alone (Take, no engine)", func() (func(string) bool, func()) {
			st := counter.NewMemoryStore(counter.MemoryConfig{MaxKeys: 2 * keys})
			lim := hotkey.PerSecond(1000)
			return func(key string) bool {
				r, err := st.Take(ctx, key, counter.Hash(key), lim, 1)
				return err == nil && r.Allowed
			}, func() { st.Close() }
		}},
		{"x/time/rate, one map behind one mutex", func() (func(string) bool, func()) {
			var mu sync.Mutex
			m := make(map[string]*rate.Limiter, keys)
			return func(key string) bool {
				mu.Lock()
				l := m[key]
				if l == nil {
					l = rate.NewLimiter(1000, 1000)
					m[key] = l
				}
				mu.Unlock()
				return l.Allow()
			}, func() {}
		}},
		{"x/time/rate in a sync.Map", func() (func(string) bool, func()) {
			var m sync.Map
			return func(key string) bool {
				v, ok := m.Load(key)
				if !ok {
					v, _ = m.LoadOrStore(key, rate.NewLimiter(1000, 1000))
				}
				return v.(*rate.Limiter).Allow()
			}, func() {}
		}},
		{"x/time/rate in 256 map+mutex stripes", func() (func(string) bool, func()) {
			seed := maphash.MakeSeed()
			stripes := make([]struct {
				sync.Mutex
				m map[string]*rate.Limiter
			}, 256)
			for i := range stripes {
				stripes[i].m = make(map[string]*rate.Limiter, keys/256)
			}
			return func(key string) bool {
				st := &stripes[maphash.String(seed, key)%256]
				st.Lock()
				l := st.m[key]
				if l == nil {
					l = rate.NewLimiter(1000, 1000)
					st.m[key] = l
				}
				st.Unlock()
				return l.Allow()
			}, func() {}
		}},
	}
	ns := make([][]float64, len(forms))
	allocs := make([]int64, len(forms))
	for range k {
		for i, f := range forms {
			allow, closeForm := f.build()
			for _, n := range names {
				allow(n)
			}
			runtime.GC()
			var failed bool
			res := testing.Benchmark(func(b *testing.B) {
				b.ReportAllocs()
				b.RunParallel(func(pb *testing.PB) {
					r := rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64()))
					for pb.Next() {
						if !allow(names[r.IntN(keys)]) {
							failed = true
						}
					}
				})
			})
			closeForm()
			allow = nil
			runtime.GC()
			if failed {
				return nil, fmt.Errorf("%s denied a decision", f.name)
			}
			ns[i] = append(ns[i], float64(res.NsPerOp()))
			allocs[i] = res.AllocsPerOp()
		}
	}
	sec := &scenario.Section{Setup: fmt.Sprintf("2^20 (%d) keys, every one present and admitted; random keys from GOMAXPROCS goroutines (testing.Benchmark's RunParallel); each form built, filled and measured alone, %d round(s), medians.", keys, k)}
	sec.Printf("| form | ns/op | allocs/op | engine ÷ it |\n|---|---|---|---|\n")
	engine := median(ns[0])
	for i, f := range forms {
		sec.Printf("| %s | %.0f | %d | %.2f |\n", f.name, median(ns[i]), allocs[i], engine/median(ns[i]))
	}
	sec.Printf("\nThe target is the engine at no more than 0.70 of the striped form's cost, with 0 allocations. The store alone is the engine's floor: every decision reads the clock and takes from its counter there. A decision here waits on memory: the key's string header and bytes, then its counter's cell (the engine starts the cell's miss once the key is hashed, and reads the detector's block while it is under way); the map waits on the same key, then its group's slot and the limiter it points to.\n")
	return sec, nil
}
