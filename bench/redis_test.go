package bench

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"

	"github.com/hotkeyd/hotkey"
	"github.com/hotkeyd/hotkey/bench/internal/scenario"
	"github.com/hotkeyd/hotkey/counter"
	"github.com/hotkeyd/hotkey/shard"
)

// redisGoroutines is the concurrency of the Redis benchmarks: 64 callers,
// as a gateway with that many requests in flight would make.
const redisGoroutines = 64

// redisKeys is how many distinct keys the Redis benchmarks spread over.
const redisKeys = 10_000

// redisLimit is a realistic per-client limit that the benchmarks' load
// (10,000 keys, some 100k decisions/s) never reaches: they measure
// decisions, and a deny would let the engine's deny cache skip the store.
var redisLimit = hotkey.PerSecond(1000)

// redisPolicy is redisLimit's policy.
var redisPolicy = &hotkey.Policy{Limit: redisLimit}

// hotPolicy is a hot key's, its limit high enough that the benchmark's
// burst of decisions on one key is admitted and every decision reaches the
// store.
var hotPolicy = &hotkey.Policy{Limit: hotkey.PerSecond(10_000_000)}

func runParallel(b *testing.B, decide func(ctx context.Context, key string) error) {
	b.Helper()
	ctx := context.Background()
	b.SetParallelism((redisGoroutines + 1) / max(1, runtimeProcs()))
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		next := keyPicker(redisKeys)
		for pb.Next() {
			if err := decide(ctx, benchKeys()[next()]); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "decisions/s")
}

// BenchmarkAllowRedis is the engine on the Redis store.
func BenchmarkAllowRedis(b *testing.B) {
	client := redis.NewClient(&redis.Options{Addr: env.Server.Addr})
	defer client.Close()
	store, err := counter.NewRedisStore(context.Background(), client, counter.RedisConfig{})
	if err != nil {
		b.Fatal(err)
	}
	defer store.Close()
	e, err := hotkey.New(store)
	if err != nil {
		b.Fatal(err)
	}
	defer e.Close()
	runParallel(b, func(ctx context.Context, key string) error {
		r, err := e.Allow(ctx, key, redisPolicy)
		if err == nil && !r.Allowed {
			err = fmt.Errorf("denied %s", key)
		}
		return err
	})
}

// BenchmarkAllowRedisRate is github.com/go-redis/redis_rate on the same
// server: one EVALSHA per decision.
func BenchmarkAllowRedisRate(b *testing.B) {
	client := redis.NewClient(&redis.Options{Addr: env.Server.Addr})
	defer client.Close()
	limiter := redis_rate.NewLimiter(client)
	lim := redis_rate.PerSecond(int(redisLimit.Rate))
	runParallel(b, func(ctx context.Context, key string) error {
		r, err := limiter.Allow(ctx, key, lim)
		if err == nil && r.Allowed == 0 {
			err = fmt.Errorf("denied %s", key)
		}
		return err
	})
}

// BenchmarkHotKeyCluster sends one key's decisions, at a static split level,
// to the 3-master cluster and reports how unevenly the masters were loaded:
// the busiest master's script calls over the mean, the worst of 20 keys.
func BenchmarkHotKeyCluster(b *testing.B) {
	for _, level := range []shard.Level{1, 16} {
		b.Run("level="+level.String(), func(b *testing.B) { benchHotKeyCluster(b, level) })
	}
}

func benchHotKeyCluster(b *testing.B, level shard.Level) {
	const keys, perKey = 20, 20_000
	ctx := context.Background()
	client := redis.NewClusterClient(&redis.ClusterOptions{Addrs: env.Cluster.Addrs})
	defer client.Close()
	store, err := counter.NewRedisStore(ctx, client, counter.RedisConfig{})
	if err != nil {
		b.Fatal(err)
	}
	defer store.Close()
	worst := 0.0
	for b.Loop() {
		for k := range keys {
			key := fmt.Sprintf("hot:%d:%x", k, rand.Uint64())
			opts := []hotkey.Option{hotkey.WithoutDetector()} // the level is the variable here
			if level > 1 {
				opts = append(opts, hotkey.WithSplitKeys(level, hotPolicy, key))
			}
			e, err := hotkey.New(store, opts...)
			if err != nil {
				b.Fatal(err)
			}
			if err := client.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
				return c.ConfigResetStat(ctx).Err()
			}); err != nil {
				b.Fatal(err)
			}
			var wg sync.WaitGroup
			for g := range redisGoroutines {
				wg.Go(func() {
					for i := g; i < perKey; i += redisGoroutines {
						if _, err := e.Allow(ctx, key, hotPolicy); err != nil {
							b.Error(err)
							return
						}
					}
				})
			}
			wg.Wait()
			e.Close()
			worst = max(worst, maxOverMean(b, ctx, client))
		}
	}
	b.ReportMetric(worst, "max/mean-node-ops")
}

// maxOverMean reads each master's script calls since the last CONFIG
// RESETSTAT and returns the busiest over the mean.
func maxOverMean(b *testing.B, ctx context.Context, client *redis.ClusterClient) float64 {
	var mu sync.Mutex
	var calls []float64
	err := client.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
		n, err := scenario.ScriptCalls(ctx, c)
		if err != nil {
			return err
		}
		mu.Lock()
		calls = append(calls, n)
		mu.Unlock()
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
	sum, top := 0.0, 0.0
	for _, c := range calls {
		sum += c
		top = max(top, c)
	}
	if sum == 0 {
		b.Fatal("no script calls counted")
	}
	return top / (sum / float64(len(calls)))
}
