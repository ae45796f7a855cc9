package main

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hotkeyd/hotkey"
	"github.com/hotkeyd/hotkey/bench/internal/scenario"
	"github.com/hotkeyd/hotkey/counter"
	"github.com/hotkeyd/hotkey/internal/testkit"
	"github.com/hotkeyd/hotkey/loadgen"
	"github.com/hotkeyd/hotkey/loadgen/embedded"
)

// runDenyCache sends one key at 10 times its limit to an engine on a
// redis-server, as an attacker or a retry loop does, and counts the store
// calls its denials cost.
func runDenyCache(ctx context.Context, s *setup) (*scenario.Section, error) {
	const rate = 2000.0
	lim := hotkey.PerSecond(200)
	d := s.scale(20*time.Second, 4*time.Second)
	client := redis.NewClient(&redis.Options{Addr: s.env.Server.Addr})
	defer client.Close()
	rs, err := counter.NewRedisStore(ctx, client, counter.RedisConfig{})
	if err != nil {
		return nil, err
	}
	defer rs.Close()
	store := &testkit.Store{Store: rs} // counts the Takes that reach Redis
	e, err := hotkey.New(store, hotkey.WithoutDetector())
	if err != nil {
		return nil, err
	}
	defer e.Close()
	target, err := embedded.Target(&hotkey.Policy{Name: "api", Limit: lim}, e)
	if err != nil {
		return nil, err
	}
	key := fmt.Sprintf("attacker:%d", time.Now().UnixNano())
	res, err := loadgen.Run(ctx, loadgen.Config{
		Target: target, Workload: loadgen.Hotspot(key, rate, loadgen.Uniform("unused", 1, 1)),
		Rate: rate, Duration: d, Watch: key, Period: d,
	}, nil, 0)
	if err != nil {
		return nil, err
	}
	if res.Errors > 0 {
		return nil, fmt.Errorf("%d errors, first %v", res.Errors, res.FirstError)
	}
	takes := store.Takes.Load()
	// A store call decides each admission; the rest were for denials.
	perDenied := float64(takes-res.Allowed) / float64(max(res.Denied, 1))
	ideal := float64(lim.Capacity()) + float64(lim.Rate)*res.Elapsed.Seconds()
	sec := &scenario.Section{Setup: fmt.Sprintf("one engine on a redis-server; one key with a token-bucket limit of %d/s sent %.0f requests/s (10×) for %v, from 64 senders.", lim.Rate, rate, d)}
	sec.Printf("| decisions | denied | store calls | store calls per denied decision | admitted ÷ limit |\n|---|---|---|---|---|\n")
	sec.Printf("| %d | %d | %d | %.3f | %.3f |\n\n", res.Allowed+res.Denied, res.Denied, takes, perDenied, float64(res.Allowed)/ideal)
	sec.Printf("Without the deny cache every denied decision is a store call (1.0). With it, a denial, or an admission that empties the bucket, is remembered until the next unit is due as the store reckons it, and for a key asked at least twice as fast as its limit, held while up to 1/8 of the period's units more come due; until then the key is denied without a store call. The denials that still cost one are those asked between the bucket emptying and the store's answer saying so.\n")
	return sec, nil
}
