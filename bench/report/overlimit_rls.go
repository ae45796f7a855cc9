package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hotkeyd/hotkey"
	"github.com/hotkeyd/hotkey/internal/redistest"
	"github.com/hotkeyd/hotkey/loadgen"
)

// overLimitRLS runs the overlimit scenario's loads against
// envoyproxy/ratelimit with its over-limit cache on
// (LOCAL_CACHE_SIZE_IN_BYTES), on a redis-server of its own, given a fixed
// 1 s window of olLimit: one row per load, and how long its build took.
func overLimitRLS(ctx context.Context, s *setup, loads []float64, d time.Duration) ([]olRow, time.Duration, error) {
	dir, err := os.MkdirTemp("", "hotkey-report-overlimit-")
	if err != nil {
		return nil, 0, err
	}
	defer os.RemoveAll(dir)
	built := time.Now()
	bin, err := buildRatelimit(ctx, dir)
	if err != nil {
		return nil, 0, err
	}
	took := time.Since(built)
	if _, err := writeRules(dir, rulesOf(olLimit)); err != nil {
		return nil, 0, err
	}
	srv, err := redistest.Start(s.env.Dir)
	if err != nil {
		return nil, 0, err
	}
	defer srv.Close()
	admin := redis.NewClient(&redis.Options{Addr: srv.Addr})
	defer admin.Close()
	rl, err := startRatelimit(ctx, bin, filepath.Join(dir, "runtime"), "rls", srv.Addr, "LOCAL_CACHE_SIZE_IN_BYTES="+strconv.Itoa(rlsCacheBytes))
	if err != nil {
		return nil, 0, err
	}
	defer rl.stop()
	conn, err := loadgen.DialGRPC(ctx, rl.grpcAddr, nil)
	if err != nil {
		return nil, 0, err
	}
	defer conn.Close()
	envoy := loadgen.Envoy(conn, rlsDomain, [][]loadgen.Entry{{{Key: "user", Value: loadgen.KeyPlaceholder}}})
	lim := hotkey.Limit{Algorithm: hotkey.FixedWindow, Rate: olLimit, Period: time.Second}
	var rows []olRow
	for i, load := range loads {
		key := fmt.Sprintf("ol-rls-%d-%d", time.Now().UnixNano(), i)
		t := &recordTarget{decide: func(ctx context.Context, _ uint64) (bool, error) {
			out, err := envoy.Decide(ctx, key, 1)
			return out.Allowed, err
		}}
		calls0, err := commandCalls(ctx, admin, "incrby")
		if err != nil {
			return nil, 0, err
		}
		res, err := t.run(ctx, key, load*olLimit, d)
		if err != nil {
			return nil, 0, fmt.Errorf("envoyproxy/ratelimit, %.1f×: %w", load, err)
		}
		calls1, err := commandCalls(ctx, admin, "incrby")
		if err != nil {
			return nil, 0, err
		}
		row := t.row(res, lim)
		row.system, row.load, row.calls = "envoyproxy/ratelimit, local cache", load, calls1-calls0
		// Each admission is an INCRBY; the rest were for denials.
		row.deniedCalls = float64(row.calls-row.admitted) / float64(max(row.denied, 1))
		rows = append(rows, row)
	}
	return rows, took, nil
}

// commandCalls returns how many times the server c talks to has run the
// command name (INFO commandstats), 0 if never.
func commandCalls(ctx context.Context, c *redis.Client, name string) (int64, error) {
	info, err := c.Info(ctx, "commandstats").Result()
	if err != nil {
		return 0, err
	}
	for line := range strings.Lines(info) {
		stat, stats, _ := strings.Cut(strings.TrimSpace(line), ":")
		if stat != "cmdstat_"+name {
			continue
		}
		for field := range strings.SplitSeq(stats, ",") {
			if v, ok := strings.CutPrefix(field, "calls="); ok {
				n, err := strconv.ParseInt(v, 10, 64)
				if err != nil {
					return 0, fmt.Errorf("commandstats %q: %w", line, err)
				}
				return n, nil
			}
		}
	}
	return 0, nil
}
