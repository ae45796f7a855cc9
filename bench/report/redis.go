package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"

	"github.com/hotkeyd/hotkey"
	"github.com/hotkeyd/hotkey/bench/internal/scenario"
	"github.com/hotkeyd/hotkey/counter"
)

// naiveBucket is the token bucket most services write first: one script per
// request that reads the tokens and the last refill with HMGET, refills,
// takes, and writes both back with HMSET.
var naiveBucket = redis.NewScript(`
local rate, burst, now = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local v = redis.call('HMGET', KEYS[1], 'tokens', 'ts')
local tokens, ts = tonumber(v[1]), tonumber(v[2])
if tokens == nil then tokens, ts = burst, now end
tokens = math.min(burst, tokens + (now - ts) * rate / 1000000)
local ok = 0
if tokens >= 1 then tokens, ok = tokens - 1, 1 end
redis.call('HMSET', KEYS[1], 'tokens', tokens, 'ts', now)
redis.call('PEXPIRE', KEYS[1], math.ceil(burst / rate * 1000))
return ok
`)

// runRedis measures decisions/s on one redis-server from 64 goroutines over
// 10,000 keys: the engine, go-redis/redis_rate, and the naive script.
func runRedis(ctx context.Context, s *setup) (*scenario.Section, error) {
	const goroutines, keys = 64, 10_000
	d := s.scale(5*time.Second, 2*time.Second)
	k := s.rounds(3, 1)
	client := redis.NewClient(&redis.Options{Addr: s.env.Server.Addr, PoolSize: goroutines})
	defer client.Close()
	store, err := counter.NewRedisStore(ctx, client, counter.RedisConfig{})
	if err != nil {
		return nil, err
	}
	defer store.Close()
	e, err := hotkey.New(store, hotkey.WithoutDetector())
	if err != nil {
		return nil, err
	}
	defer e.Close()
	names := make([]string, keys)
	for i := range names {
		names[i] = "rd:" + strconv.Itoa(i)
	}
	p := &hotkey.Policy{Limit: hotkey.PerSecond(1_000_000)}
	limiter := redis_rate.NewLimiter(client)
	rrLimit := redis_rate.PerSecond(1_000_000)
	got, err := scenario.Rounds(k, []func() (float64, error){
		func() (float64, error) {
			return scenario.Throughput(goroutines, d, func(r *rand.Rand) error {
				_, err := e.Allow(ctx, names[r.IntN(keys)], p)
				return err
			})
		},
		func() (float64, error) {
			return scenario.Throughput(goroutines, d, func(r *rand.Rand) error {
				_, err := limiter.Allow(ctx, "rr:"+names[r.IntN(keys)], rrLimit)
				return err
			})
		},
		func() (float64, error) {
			return scenario.Throughput(goroutines, d, func(r *rand.Rand) error {
				now := time.Now().UnixMicro()
				return naiveBucket.Run(ctx, client, []string{"nv:" + names[r.IntN(keys)]}, 1_000_000, 1_000_000, now).Err()
			})
		},
	})
	if err != nil {
		return nil, err
	}
	sec := &scenario.Section{Setup: fmt.Sprintf("one redis-server; %d goroutines deciding on %d keys with limits high enough that all are admitted, %v per round, %d round(s), medians.", goroutines, keys, d, k)}
	sec.Printf("| limiter | decisions/s | hotkey ÷ it |\n|---|---|---|\n")
	sec.Printf("| hotkey (engine on the Redis store) | %.0f | 1 |\n", got[0])
	sec.Printf("| go-redis/redis_rate v10 (GCRA, one EVALSHA per call) | %.0f | %.2f |\n", got[1], got[0]/got[1])
	sec.Printf("| the naive Lua token bucket (HMGET, HMSET, PEXPIRE per request) | %.0f | %.2f |\n\n", got[2], got[0]/got[2])
	sec.Printf("The engine batches: the decisions that meet in one round trip go to Redis in one script call, so it makes fewer calls than decisions.\n")
	return sec, nil
}
