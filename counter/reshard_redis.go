package counter

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
)

// The Redis store's Reshard (the semantics are described in
// reshard_memory.go) works key by key, since on a Cluster or Ring the
// counters of one Reshard live on different nodes and no script may span
// them:
//
//  1. one pipeline reads every counter of from with its own command (GET, or
//     ZRANGE for a log); a counter holding another algorithm's state reads
//     as absent, as the take scripts read it;
//  2. for the window algorithms and the log, one TIME (from any node) fixes
//     the window or the log entries that count; the token bucket needs none;
//  3. one pipeline runs a small seed script per counter of to, which takes
//     its own TIME and raises the counter to its seed.
//
// Client clocks decide nothing. A seed script re-checks what time may have
// changed since the read: the token-bucket script receives the raw TATs of
// from and computes the seed at its own instant; the window scripts receive
// the window the counts were read in and shift them if TIME is one window
// later (and do nothing if later still); the log script drops the entries
// that have left the window by its instant.
//
// The seed scripts are sent as EVALSHA, and again as EVAL where a node does
// not hold them (NOSCRIPT): Reshard is rare, so they are not loaded up front.
var reshardScripts = [numAlgorithms]*redis.Script{
	TokenBucket:   redis.NewScript(gcraSeedScript),
	SlidingWindow: redis.NewScript(slidingWindowSeedScript),
	FixedWindow:   redis.NewScript(fixedWindowSeedScript),
	SlidingLog:    redis.NewScript(slidingLogSeedScript),
}

// gcraSeedScript raises KEYS[1]'s TAT to its seed. ARGV: the tol·64 + k
// and I arguments of a take of 1 on the counter (call.setArgs), total (Σ
// rate over to), the period in µs, then one (TAT, rate) pair per counter of
// from that holds a value: the value as GET read it, read here with
// gcraOffset on the counter's grid (a value no take writes counts as
// unused). A counter's usage is its debt in units, q for a state that notes
// its interval, else (TAT - now)·rate/period. The seed is now + Σ usage ·
// period / total, rounded to the nearest grid unit; it is written as
// gcraScript writes a state, with the expiry a write that moves it sets.
// Replies 1 if it wrote, else 0.
const gcraSeedScript = `
local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
local O, offset = 2e15, ` + gcraOffset + `
local k = tonumber(ARGV[1]) % 64` + gcraGrid + `
local P = tonumber(ARGV[4]) * U -- the period in grid units
local d = 0
for i = 5, #ARGV - 1, 2 do
	local x, q = offset(ARGV[i], now, U)
	if q then
		d = d + q * P
	elseif x and x > 0 then
		d = d + x * tonumber(ARGV[i + 1])
	end
end
local new = math.min(math.floor(d / tonumber(ARGV[3]) + 0.5), 2 ^ 50)
if new <= 0 then return 0 end
local v = redis.pcall('GET', KEYS[1])
if type(v) == 'string' then
	local x = offset(v, now, U, tonumber(ARGV[2]))
	if x and x >= new then return 0 end
end
local top = M - base
local s = new < top and O + base + new or O + new - top
local span = 1000 * 2 ^ k
local half = span / 2
local at = now + math.ceil(new / U)
local lo = at - at % half
redis.call('SET', KEYS[1], string.format('%.0f', s) .. ':' .. ARGV[2] .. ':' .. k, 'PX', string.format('%.0f', math.floor((lo + half + span - now) / 1000) + 1))
return 1
`

// slidingWindowSeedScript raises KEYS[1]'s counts to their seeds. ARGV:
// period (µs), the window W the seeds were read in, the seeded current and
// previous counts. If TIME is in window W+1, the seeded current count is
// the previous one; later, there is nothing to seed. The state is read and
// written as slidingWindowScript does. Replies 1 if it wrote, else 0.
const slidingWindowSeedScript = intArg + windowCounts + `
local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
local k = KEYS[1]
local p, sw, scur, sprev = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local w = math.floor(now / p)
if w == sw + 1 then
	scur, sprev = 0, scur
elseif w ~= sw then
	return 0
end
local cur, prev = slidingCounts(redis.pcall('GET', k), w)
if scur <= cur and sprev <= prev then return 0 end
cur, prev = math.max(cur, scur), math.max(prev, sprev)
local left = p - (now - w * p)
redis.call('SET', k, string.format('%.0f %.0f %.0f', w, cur, prev), 'PX', int(math.ceil((left + p) / 1000)))
return 1
`

// fixedWindowSeedScript raises KEYS[1]'s count to its seed. ARGV: period
// (µs), the window W the seed was read in, the seeded count. If TIME is no
// longer in window W, there is nothing to seed. The state is read and
// written as fixedWindowScript does. Replies 1 if it wrote, else 0.
const fixedWindowSeedScript = intArg + windowCounts + `
local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
local k = KEYS[1]
local p, sw, seed = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local w = math.floor(now / p)
if w ~= sw then return 0 end
local cur = fixedCount(redis.pcall('GET', k), w)
if seed <= cur then return 0 end
redis.call('SET', k, string.format('%.0f %.0f', w, seed), 'PX', int(math.ceil(((w + 1) * p - now) / 1000)))
return 1
`

// slidingLogSeedScript raises KEYS[1]'s log to its seed. ARGV: period (µs),
// then the seeded entries, oldest first, as (instant, member) pairs, the
// members unique to the call. Entries no longer inside the window at TIME
// are dropped from both the log and the seed. Then, as logRaise does, the
// log's k-th newest entry is replaced by the seed's k-th newest where that
// is later (or added where the log has no k-th), so that the log holds at
// every later instant as many entries as the larger of the two would. A key
// holding another algorithm's state is replaced, and an entry more than a
// period ahead dropped, as slidingLogScript does. The log expires a period
// after its newest entry, as slidingLogScript has it.
// Replies 1 if it wrote, else 0.
const slidingLogSeedScript = intArg + `
local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
local k = KEYS[1]
local p = tonumber(ARGV[1])
local cut = now - p
if type(redis.pcall('ZREMRANGEBYSCORE', k, '-inf', cut)) == 'table' then
	redis.call('DEL', k) -- another algorithm's state
else
	redis.call('ZREMRANGEBYSCORE', k, '(' .. string.format('%.0f', now + p), '+inf')
end
local live = {} -- ARGV indices of the seeded entries still inside the window
for i = 2, #ARGV - 1, 2 do
	if tonumber(ARGV[i]) > cut then live[#live + 1] = i end
end
if #live == 0 then return 0 end
local own = redis.call('ZRANGE', k, 0, -1, 'WITHSCORES') -- oldest first: member, score, ...
local rem, add = {}, {}
local o = #own - 1 -- the newest entry's member
for m = #live, 1, -1 do -- the seed's newest first, rank by rank
	local i = live[m]
	if o < 1 then
		add[#add + 1] = ARGV[i]
		add[#add + 1] = ARGV[i + 1]
	else
		if tonumber(ARGV[i]) > tonumber(own[o + 1]) then
			rem[#rem + 1] = own[o]
			add[#add + 1] = ARGV[i]
			add[#add + 1] = ARGV[i + 1]
		end
		o = o - 2
	end
end
if #add == 0 then return 0 end
for j = 1, #rem, 512 do
	redis.call('ZREM', k, unpack(rem, j, math.min(j + 511, #rem)))
end
for j = 1, #add, 1024 do
	redis.call('ZADD', k, unpack(add, j, math.min(j + 1023, #add)))
end
local newest = redis.call('ZRANGE', k, -1, -1, 'WITHSCORES')
redis.call('PEXPIRE', k, int(math.ceil((newest[2] + p - now) / 1000)))
return 1
`

var _ Resharder = (*RedisStore)(nil)

// Reshard implements Resharder (see reshard_memory.go for the semantics).
// It runs beside the Take workers, not through them: two pipelined round
// trips (three for the window algorithms and the log), each bounded by
// Timeout, and one more where a node lacks a seed script. Errors come back
// wrapped, as Take's do; after Close it returns ErrStoreClosed (wrapped).
// A Reshard that fails part way may have seeded some counters of to and not
// others; calling it again is safe.
func (s *RedisStore) Reshard(ctx context.Context, from, to []Shard) error {
	plan, err := checkReshard(from, to)
	if err != nil {
		return fmt.Errorf("redis reshard: %w", err)
	}
	select {
	case <-s.done:
		return fmt.Errorf("redis reshard: %w", ErrStoreClosed)
	default:
	}
	if !s.ready.Load() {
		return fmt.Errorf("redis reshard: %w", s.notReady())
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(s.ctx, cancel)() // Close cuts it short
	if err := s.reshard(ctx, plan, from, to); err != nil {
		if s.ctx.Err() != nil {
			err = ErrStoreClosed
		}
		return fmt.Errorf("redis reshard: %w", err)
	}
	return nil
}

// seedCall is one seed script call.
type seedCall struct {
	key  string
	args []any
}

func (s *RedisStore) reshard(ctx context.Context, plan reshardPlan, from, to []Shard) error {
	p := micros(plan.period) // as setArgs rounds it
	vals, logs, err := s.readFrom(ctx, plan.alg, from)
	if err != nil {
		return err
	}
	var seeds []seedCall
	switch plan.alg {
	case TokenBucket:
		var tats []any
		for i, v := range vals {
			if v != nil {
				tats = append(tats, *v, from[i].Limit.Rate)
			}
		}
		if len(tats) == 0 {
			return nil // no usage: nothing to seed
		}
		for _, sh := range to {
			var c call
			c.setArgs(sh.Limit, 1)
			args := append([]any{c.tolArg, c.ivArg, plan.total, p}, tats...)
			seeds = append(seeds, seedCall{s.cfg.Prefix + sh.Name, args})
		}
	case SlidingWindow, FixedWindow:
		now, err := s.serverTime(ctx)
		if err != nil {
			return err
		}
		w := now / p
		var cur, prev int64
		for _, v := range vals {
			if v == nil {
				continue
			}
			if plan.alg == FixedWindow { // as fixedWindowScript reads a state
				if f, ok := parseCounts(*v, 2); ok && f[0] == w {
					cur += f[1]
				}
				continue
			}
			if f, ok := parseCounts(*v, 3); ok { // as slidingWindowScript does
				switch f[0] {
				case w:
					cur, prev = cur+f[1], prev+f[2]
				case w - 1:
					prev += f[1]
				}
			}
		}
		curs, prevs := shares(cur, to, plan.total), shares(prev, to, plan.total)
		for j, sh := range to {
			if curs[j] == 0 && prevs[j] == 0 {
				continue
			}
			args := []any{p, w, curs[j]}
			if plan.alg == SlidingWindow {
				args = append(args, prevs[j])
			}
			seeds = append(seeds, seedCall{s.cfg.Prefix + sh.Name, args})
		}
	case SlidingLog:
		now, err := s.serverTime(ctx)
		if err != nil {
			return err
		}
		var log []int64
		for _, l := range logs {
			for _, z := range l {
				// As slidingLogScript counts entries: those in the window,
				// and none more than a period ahead (+inf, say).
				if z.Score > float64(now-p) && z.Score <= float64(now+p) {
					log = append(log, int64(z.Score))
				}
			}
		}
		slices.Sort(log)
		counts := shares(int64(len(log)), to, plan.total)
		args := make([][]any, len(to))
		nonce := strconv.FormatUint(rand.Uint64(), 36)
		for k, j := range spread(len(log), counts) {
			if args[j] == nil {
				args[j] = append(make([]any, 0, 1+2*counts[j]), p)
			}
			// Members unique to this call, apart from the take path's
			// "instant:seq": a member already in the log is not added again.
			args[j] = append(args[j], log[k], strconv.FormatInt(log[k], 10)+":r"+nonce+"."+strconv.Itoa(k))
		}
		for j, sh := range to {
			if args[j] != nil {
				seeds = append(seeds, seedCall{s.cfg.Prefix + sh.Name, args[j]})
			}
		}
	}
	return s.runSeeds(ctx, reshardScripts[plan.alg], seeds)
}

// readFrom reads from's counters in one pipeline: their string values
// (vals, nil where absent) or, for the log, their entries (logs). A key
// holding another algorithm's state reads as absent (nil, or no entries).
func (s *RedisStore) readFrom(ctx context.Context, alg Algorithm, from []Shard) (vals []*string, logs [][]redis.Z, err error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	pipe := s.client.Pipeline()
	cmds := make([]redis.Cmder, len(from))
	for i, sh := range from {
		key := s.cfg.Prefix + sh.Name
		if alg == SlidingLog {
			cmds[i] = pipe.ZRangeWithScores(ctx, key, 0, -1)
		} else {
			cmds[i] = pipe.Get(ctx, key)
		}
	}
	_, _ = pipe.Exec(ctx) // every command carries its own error
	vals, logs = make([]*string, len(from)), make([][]redis.Z, len(from))
	for i, cmd := range cmds {
		err := cmd.Err()
		switch {
		case err == nil:
		case errors.Is(err, redis.Nil), redis.HasErrorPrefix(err, "WRONGTYPE"):
			continue
		default:
			return nil, nil, fmt.Errorf("read %q: %w", from[i].Name, err)
		}
		switch c := cmd.(type) {
		case *redis.StringCmd:
			v := c.Val()
			vals[i] = &v
		case *redis.ZSliceCmd:
			logs[i] = c.Val()
		}
	}
	return vals, logs, nil
}

// serverTime returns the time of one of the store's servers in µs.
func (s *RedisStore) serverTime(ctx context.Context) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	t, err := s.client.Time(ctx).Result()
	if err != nil {
		return 0, fmt.Errorf("time: %w", err)
	}
	return t.UnixMicro(), nil
}

// runSeeds runs script once per seed call, pipelined (go-redis splits a
// pipeline per node), and again with EVAL for the calls a node answered
// NOSCRIPT.
func (s *RedisStore) runSeeds(ctx context.Context, script *redis.Script, seeds []seedCall) error {
	for eval := false; len(seeds) > 0; eval = true {
		cmds := s.pipeSeeds(ctx, script, seeds, eval)
		var retry []seedCall
		for i, cmd := range cmds {
			switch err := cmd.Err(); {
			case err == nil:
			case !eval && (errors.Is(err, redis.ErrNoScript) || redis.HasErrorPrefix(err, "NOSCRIPT")):
				retry = append(retry, seeds[i])
			default:
				return fmt.Errorf("seed %q: %w", strings.TrimPrefix(seeds[i].key, s.cfg.Prefix), err)
			}
		}
		seeds = retry
	}
	return nil
}

// pipeSeeds sends one pipeline of seed calls, EVAL or EVALSHA.
func (s *RedisStore) pipeSeeds(ctx context.Context, script *redis.Script, seeds []seedCall, eval bool) []*redis.Cmd {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	pipe := s.client.Pipeline()
	cmds := make([]*redis.Cmd, len(seeds))
	for i, sd := range seeds {
		if eval {
			cmds[i] = script.Eval(ctx, pipe, []string{sd.key}, sd.args...)
		} else {
			cmds[i] = script.EvalSha(ctx, pipe, []string{sd.key}, sd.args...)
		}
	}
	_, _ = pipe.Exec(ctx) // every command carries its own error
	return cmds
}

// parseCounts parses a window state "w count [previous]" of n fields as
// the window scripts do: digits only (^(%d+) (%d+)( (%d+))?$), each field
// below 2^53.
func parseCounts(v string, n int) ([]int64, bool) {
	f := strings.Split(v, " ")
	if len(f) != n {
		return nil, false
	}
	out := make([]int64, n)
	for i, s := range f {
		if s == "" || strings.TrimLeft(s, "0123456789") != "" {
			return nil, false
		}
		x, err := strconv.ParseInt(s, 10, 64)
		if err != nil || x >= 1<<53 {
			return nil, false
		}
		out[i] = x
	}
	return out, true
}
