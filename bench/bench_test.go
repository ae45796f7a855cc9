package bench

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"sync"
	"testing"
	"time"

	"golang.org/x/time/rate"

	"github.com/hotkeyd/hotkey"
	"github.com/hotkeyd/hotkey/coordinator"
	"github.com/hotkeyd/hotkey/counter"
	"github.com/hotkeyd/hotkey/internal/natsserver"
	"github.com/hotkeyd/hotkey/internal/redistest"
)

var env *redistest.Env

func TestMain(m *testing.M) { os.Exit(redistest.Main(m, 3, &env)) }

const memoryKeys = 1 << 20

var (
	keysOnce sync.Once
	keys     []string
)

// benchKeys returns 1M distinct keys, made once per binary.
func benchKeys() []string {
	keysOnce.Do(func() {
		keys = make([]string, memoryKeys)
		for i := range keys {
			keys[i] = fmt.Sprintf("user:%d:api", i)
		}
	})
	return keys
}

// keyPicker returns a per-goroutine source of random key indexes below n.
func keyPicker(n int) func() int {
	r := rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64()))
	return func() int { return r.IntN(n) }
}

// BenchmarkAllowMemory is the engine on the memory store, every key already
// present, all decisions admitted: with the hot-key detector in the path
// (the default, with the Local coordinator) and without it, and with a NATS
// coordinator attached to an in-process server instead of the Local one.
func BenchmarkAllowMemory(b *testing.B) {
	for _, detect := range []bool{true, false} {
		b.Run(fmt.Sprintf("detector=%v", detect), func(b *testing.B) {
			var opts []hotkey.Option
			if !detect {
				opts = append(opts, hotkey.WithoutDetector())
			}
			benchAllowMemory(b, opts...)
		})
	}
	b.Run("coordinator=nats", func(b *testing.B) {
		s, err := natsserver.Start(natsserver.Options{DontListen: true})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(s.Shutdown) // after the connection's Close, registered later
		benchAllowMemory(b, hotkey.WithCoordinator(natsCoordinator(b, s)))
	})
}

func benchAllowMemory(b *testing.B, opts ...hotkey.Option) {
	ks := benchKeys()
	store := counter.NewMemoryStore(counter.MemoryConfig{MaxKeys: 2 * memoryKeys})
	e, err := hotkey.New(store, opts...)
	if err != nil {
		b.Fatal(err)
	}
	defer e.Close()
	p := &hotkey.Policy{Limit: hotkey.PerSecond(1000)}
	ctx := context.Background()
	for _, k := range ks {
		e.Allow(ctx, k, p)
	}
	// The sub-benchmarks before this one left hundreds of MiB of counters
	// behind: collect them now, not while this one is timed.
	runtime.GC()
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		next := keyPicker(len(ks))
		for pb.Next() {
			if r, err := e.Allow(ctx, ks[next()], p); err != nil || !r.Allowed {
				b.Fatalf("denied: %+v %v", r, err)
			}
		}
	})
}

// natsCoordinator returns a NATS coordinator on a connection of its own to
// s, the connection closed when b ends.
func natsCoordinator(b *testing.B, s *natsserver.Server) *coordinator.NATS {
	b.Helper()
	nc, err := s.Connect()
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(nc.Close)
	co, err := coordinator.NewNATS(nc, coordinator.Config{})
	if err != nil {
		b.Fatal(err)
	}
	return co
}

// BenchmarkGossipDecision is the decision under sync: gossip beside sync:
// store on the memory store, on one engine with a NATS coordinator on an
// in-process server (so that its rounds are kept, flushed and published
// every interval, with no peer to charge them), the same 10,000 keys,
// never denied.
func BenchmarkGossipDecision(b *testing.B) {
	const keys = 10_000
	ks := benchKeys()[:keys]
	s, err := natsserver.Start(natsserver.Options{DontListen: true})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Shutdown()
	for _, mode := range []hotkey.Sync{hotkey.SyncStore, hotkey.SyncGossip} {
		b.Run("sync="+mode.String(), func(b *testing.B) {
			e, err := hotkey.New(counter.NewMemoryStore(counter.MemoryConfig{}), hotkey.WithCoordinator(natsCoordinator(b, s)))
			if err != nil {
				b.Fatal(err)
			}
			defer e.Close()
			p := &hotkey.Policy{Name: "api", Limit: hotkey.Limit{Rate: 1_000_000_000, Period: time.Second}, Sync: mode}
			ctx := context.Background()
			for _, k := range ks {
				e.Allow(ctx, k, p)
			}
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				next := keyPicker(len(ks))
				for pb.Next() {
					if r, err := e.Allow(ctx, ks[next()], p); err != nil || !r.Allowed {
						b.Fatalf("denied: %+v %v", r, err)
					}
				}
			})
		})
	}
}

// BenchmarkAllowXTimeRate is the common hand-rolled limiter: a map of
// x/time/rate limiters under one mutex.
func BenchmarkAllowXTimeRate(b *testing.B) {
	ks := benchKeys()
	var mu sync.Mutex // guards limiters
	limiters := make(map[string]*rate.Limiter, len(ks))
	allow := func(key string) bool {
		mu.Lock()
		l := limiters[key]
		if l == nil {
			l = rate.NewLimiter(1000, 1000)
			limiters[key] = l
		}
		mu.Unlock()
		return l.Allow()
	}
	for _, k := range ks {
		allow(k)
	}
	runtime.GC() // as benchAllowMemory does
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		next := keyPicker(len(ks))
		for pb.Next() {
			if !allow(ks[next()]) {
				b.Fatal("denied")
			}
		}
	})
}

func runtimeProcs() int { return runtime.GOMAXPROCS(0) }
