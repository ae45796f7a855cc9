package counter

import (
	"context"
	"fmt"

	"github.com/redis/go-redis/v9"
)

// chargeScripts charge counters on Redis (see charge.go), one script per
// algorithm, each on any number of counters one after the other at one
// instant (on a Cluster or Ring, one: a script's keys must share a slot).
// Per counter, KEYS hold the counter and its generation's key if it has
// one (genKey), and ARGV four arguments (appendChargeArgs): the limit's two, n,
// and 1 if a generation's key follows. The reply is 1. A charge reads a
// counter's state as the Take script does (a value no take writes, or
// another algorithm's, is no usage), and a charge of n that a Take could
// admit writes what that Take writes, with its expiry. The generation's
// key is neither made nor changed: if it exists, its expiry is only pushed
// to the counter's, so that it lives as long as the counter, as Lease
// keeps it.
var chargeScripts = newScripts(chargeSources)

// chargeSources are the sources of chargeScripts.
var chargeSources = [numAlgorithms]string{
	TokenBucket:   chargeSource(chargeBodies[TokenBucket]),
	SlidingWindow: chargeSource(chargeBodies[SlidingWindow]),
	FixedWindow:   chargeSource(chargeBodies[FixedWindow]),
	SlidingLog:    chargeSource(chargeBodies[SlidingLog]),
}

// chargeBodies define, each for its algorithm, charge(key, gen, A1, A2, n)
// (A1 and A2 the limit's arguments as given, strings; gen the generation's
// key or nil), which charges n units to key at the instant now, calling
// keepGen (chargePrelude defines both).
var chargeBodies = [numAlgorithms]string{
	TokenBucket:   gcraChargeScript,
	SlidingWindow: windowCounts + slidingWindowChargeScript,
	FixedWindow:   windowCounts + fixedWindowChargeScript,
	SlidingLog:    intArg + slidingLogChargeScript,
}

// chargeSource returns the script that runs body (see chargeBodies) on
// each counter of KEYS and ARGV, at one instant now.
func chargeSource(body string) string {
	return chargePrelude + body + `
local j = 1
for i = 1, #ARGV - 3, 4 do
	local key, gen = KEYS[j], nil
	j = j + 1
	if ARGV[i + 3] == '1' then gen, j = KEYS[j], j + 1 end
	charge(key, gen, ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 2]))
end
return 1
`
}

// chargePrelude opens a charge script: it reads the instant now, once, and
// defines keepGen.
const chargePrelude = `
local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
-- keepGen pushes the expiry of gen, the generation's key, if it exists,
-- to key's (formatted: see intArg).
local function keepGen(key, gen)
	if not gen then return end
	local g = redis.call('PTTL', gen)
	if g <= 0 then return end
	local c = redis.call('PTTL', key)
	if c > g then redis.call('PEXPIRE', gen, string.format('%.0f', c)) end
end
`

// gcraChargeScript charges a token bucket, in the grid units of its
// limit's level k (see gcraGrid). Its arguments: I, the limit's interval
// in those units, and k. The TAT found (d = max(TAT, now) - now, read as
// gcraScript reads it) moves to d + n·I, written as gcraScript writes it,
// while that is at most L = 2^41 ms ahead: 32 expiry spans at any level up
// to 36 (within the half-cycle a state is read in), and maxDebt, where a
// debt stops, at 36 and 37. Below level 36 a debt past L goes to the least
// level up to 36 whose L holds it, under the limit's interval rounded up
// to that level's grid, so that a take reads it in units of the limit
// (gcraOffset), never fewer; a debt already at maxDebt is left as it is.
// The expiry is the one a take writing the TAT sets, from the spans of the
// limit's level, and kept as a take keeps it (SETRANGE) while the TAT
// stays in the half-span of the one it replaces.
const gcraChargeScript = `
local O, L = 2e15, 2199023255552000
-- put sets key's TAT y units of level kk ahead of now, under interval ivs,
-- expiring as a take's of a limit whose half-span is half.
local function put(key, gen, half, y, kk, ivs)
	local U = kk < 36 and 2 ^ (36 - kk) or 1
	local C = 7e15 / U
	C = C - C % 1
	local M, base = C * U, (now % C) * U
	local s = y < M - base and O + base + y or O + y - (M - base)
	local at = now + math.ceil(y / U)
	local lo = at - at % half
	redis.call('SET', key, string.format('%.0f', s) .. ':' .. ivs .. ':' .. kk, 'PX', string.format('%.0f', math.floor((lo + 3 * half - now) / 1000) + 1))
	keepGen(key, gen)
end
local function charge(key, gen, A1, A2, n)
	local iv, k = tonumber(A1), tonumber(A2)` + gcraGrid + `
	local half = 500 * 2 ^ k
	local tail = ':' .. A1 .. ':' .. k
	local v = redis.pcall('GET', key)
	local x, q, same = nil, nil, false
	if type(v) == 'string' then
		if #v == 16 + #tail and string.sub(v, 17) == tail then
			local a = tonumber(string.sub(v, 1, 16))
			if a and a >= O and a - O < M and a % 1 == 0 then
				x, same = a - O - base, true
				if x >= M / 2 then x = x - M elseif x < -M / 2 then x = x + M end
			end
		end
		if not x then x, q = (` + gcraOffset + `)(v, now, U, iv) end
	end
	local d = 0
	if x and x > 0 then d = x end
	local function write(y, kk, ivs) put(key, gen, half, y, kk, ivs) end
	if d < L and n <= (L - d) / iv then
		local y = d + n * iv
		-- As gcraScript: a TAT in the half-span of the one it replaces,
		-- under this limit, keeps its expiry and tail.
		local s = y < M - base and O + base + y or O + y - (M - base)
		local halfU = half * U
		if same and y - x < halfU - ((now % half) * U + x) % halfU and s % 100000000 ~= 0 then
			redis.call('SETRANGE', key, 0, s)
		else
			write(y, k, A1)
		end
		return
	end
	if k >= 36 then
		if d < L then write(L, k, A1) end
		return
	end
	-- The debt in level kk's units of its interval I: exact when I is
	-- iv's exactly; from the debt in units that gcraOffset reads when it
	-- capped x.
	local function debt(I, j)
		if q and d >= 4503599627370496 then return math.ceil(q * I) end
		if I * j == iv then return math.ceil(d / j) end
		return math.ceil(d / iv * I)
	end
	for kk = k + 1, 36 do
		local j = 2 ^ (kk - k)
		local I = math.ceil(iv / j)
		local y = debt(I, j)
		if kk == 36 then
			if y < L then write(math.min(L, y + n * I), kk, string.format('%.0f', I)) end
			return
		end
		if y <= L and n <= (L - y) / I then
			write(y + n * I, kk, string.format('%.0f', I))
			return
		end
	end
end
`

// slidingWindowChargeScript charges a sliding window: n (at most MaxCount)
// is added to the current window's count, at most MaxCount, and the state
// written as slidingWindowScript writes it. Arguments: rate, period in µs.
const slidingWindowChargeScript = `
local function charge(key, gen, A1, A2, n)
	local p = tonumber(A2)
	local w = math.floor(now / p)
	local cur, prev = slidingCounts(redis.pcall('GET', key), w)
	local top = 9007199254740991
	if n > top - cur then cur = top else cur = cur + n end
	redis.call('SET', key, string.format('%.0f %.0f %.0f', w, cur, prev), 'PX', string.format('%.0f', math.ceil((w * p + 2 * p - now) / 1000)))
	keepGen(key, gen)
end
`

// fixedWindowChargeScript charges a fixed window: n (at most MaxCount) is
// added to the current window's count, at most MaxCount, and the state
// written as fixedWindowScript writes it. Arguments: rate, period in µs.
const fixedWindowChargeScript = `
local function charge(key, gen, A1, A2, n)
	local p = tonumber(A2)
	local w = math.floor(now / p)
	local cur = fixedCount(redis.pcall('GET', key), w)
	local top = 9007199254740991
	if n > top - cur then cur = top else cur = cur + n end
	redis.call('SET', key, string.format('%.0f %.0f', w, cur), 'PX', string.format('%.0f', math.ceil(((w + 1) * p - now) / 1000)))
	keepGen(key, gen)
end
`

// slidingLogChargeScript charges a sliding log: n units stamped now, as
// slidingLogScript adds a take's, but one instant's units stop at twice
// the limit's rate, and units older than the newest 2·rate ones are
// dropped, so that a log holds at most 2·rate entries. Neither cut changes
// a decision: a log's Results under its limit depend only on its newest
// rate units (whether there are rate of them, and which instant holds the
// one a take's retry waits for), and the returns of the leases still open
// in its window can take back at most rate units (each lease was admitted
// within the rate). Members are named apart from a take's ("ts:c<j>").
// Arguments: rate, period in µs; n is at most 2·rate.
const slidingLogChargeScript = `
local ts = string.format('%.0f', now)
local function charge(key, gen, A1, A2, n)
	local rate, p = tonumber(A1), tonumber(A2)
	if type(redis.pcall('ZREMRANGEBYSCORE', key, '-inf', now - p)) == 'table' then
		redis.call('DEL', key) -- another algorithm's state
	else
		redis.call('ZREMRANGEBYSCORE', key, '(' .. string.format('%.0f', now + p), '+inf')
	end
	local here = redis.call('ZCOUNT', key, ts, ts)
	local c = math.min(n, math.max(0, 2 * rate - here))
	local added = 0
	while added < c do
		local args = {}
		for m = 1, math.min(c - added, 512) do
			added = added + 1
			args[2 * m - 1] = now
			args[2 * m] = ts .. ':c' .. (here + added)
		end
		redis.call('ZADD', key, unpack(args))
	end
	local extra = math.min(redis.call('ZCARD', key) - 2 * rate, redis.call('ZCOUNT', key, '-inf', '(' .. ts))
	if extra > 0 then redis.call('ZREMRANGEBYRANK', key, 0, extra - 1) end
	redis.call('PEXPIRE', key, int(math.ceil(p / 1000)))
	keepGen(key, gen)
end
`

// appendChargeArgs appends the arguments of lim's charge script for n > 0
// units to args, gen saying whether a generation's key follows the
// counter's in KEYS.
func appendChargeArgs(args []any, lim Limit, n int64, gen bool) []any {
	var c call
	c.setArgs(lim, 1)
	g := 0
	if gen {
		g = 1
	}
	switch lim.Algorithm {
	case TokenBucket:
		return append(args, c.ivArg, c.level, n, g)
	case SlidingLog:
		return append(args, c.rate, c.period, min(n, 2*c.rate), g)
	}
	return append(args, c.rate, c.period, min(n, MaxCount), g)
}

// Charge implements Charger: one script run, in a round trip of its own,
// bounded by the store's Timeout. An unknown algorithm is an error.
func (s *RedisStore) Charge(ctx context.Context, key string, hash uint64, lim Limit, n int64) (bool, error) {
	ops := []ChargeOp{{Key: key, Hash: hash, Limit: lim, N: n}}
	s.ChargeBatch(ctx, ops)
	return ops[0].Charged, ops[0].Err
}

// ChargeBatch implements BatchCharger in one pipeline bounded by the
// store's Timeout, which a Cluster or Ring client splits into one round
// trip per node, sent at once: on a standalone server one script call per
// algorithm for all its ops, on a Cluster or Ring one per op. Ops on one
// key are run in their order. If the server lost the charge scripts
// (NOSCRIPT), they are loaded again and the script calls that failed so
// sent again, once.
func (s *RedisStore) ChargeBatch(ctx context.Context, ops []ChargeOp) {
	var groups []chargeGroup
	byAlg := [numAlgorithms]int{}
	algOf := make(map[string]Algorithm) // a key's algorithm in this wave
	newWave := func() {
		clear(algOf)
		for i := range byAlg {
			byAlg[i] = -1
		}
	}
	newWave()
	for i := range ops {
		op := &ops[i]
		op.Charged, op.Err = false, nil
		alg := op.Limit.Algorithm
		switch {
		case alg >= numAlgorithms:
			op.Err = fmt.Errorf("redis charge: %w: %d", ErrUnknownAlgorithm, alg)
			continue
		case op.N <= 0 || op.Limit.Rate <= 0 || op.Limit.Period <= 0:
			op.Charged = true
			continue
		case !s.ready.Load():
			op.Err = fmt.Errorf("redis charge: %w", s.notReady())
			continue
		}
		if !s.multiKey {
			groups = append(groups, chargeGroup{alg: alg})
		} else {
			// Script calls of one wave may run in any order of algorithms:
			// a key charged under two puts the second in a later wave.
			if a, seen := algOf[op.Key]; seen && a != alg {
				newWave()
			}
			algOf[op.Key] = alg
			if byAlg[alg] < 0 {
				byAlg[alg] = len(groups)
				groups = append(groups, chargeGroup{alg: alg})
			}
		}
		g := &groups[len(groups)-1]
		if s.multiKey {
			g = &groups[byAlg[alg]]
		}
		g.ops = append(g.ops, i)
		k := s.cfg.Prefix + op.Key
		gk := genKey(k)
		g.keys = append(g.keys, k)
		if gk != "" {
			g.keys = append(g.keys, gk)
		}
		g.args = appendChargeArgs(g.args, op.Limit, op.N, gk != "")
	}
	if len(groups) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	calls := make([]scriptCall, len(groups))
	for j, g := range groups {
		calls[j] = scriptCall{chargeScripts[g.alg], g.keys, g.args}
	}
	cmds, errs := s.evalAll(ctx, calls)
	for j, g := range groups {
		err := errs[j]
		if err == nil {
			err = cmds[j].Err()
		}
		for _, i := range g.ops {
			if err != nil {
				ops[i].Err = fmt.Errorf("redis charge: %w", err)
			} else {
				ops[i].Charged = true
			}
		}
	}
}

// chargeGroup is one charge script call: the indexes of its ops, and its
// KEYS and ARGV.
type chargeGroup struct {
	alg  Algorithm
	ops  []int
	keys []string
	args []any
}

// scriptCall is one script call of a pipeline: the script, its KEYS
// and ARGV.
type scriptCall struct {
	script *redis.Script
	keys   []string
	args   []any
}

// evalAll runs calls in one pipeline, and once more, after loading the
// scripts, those the server did not know (NOSCRIPT). It returns each
// call's command, or for a call that went unrun because the scripts could
// not be loaded, the error that kept them (its command is then nil).
func (s *RedisStore) evalAll(ctx context.Context, calls []scriptCall) ([]*redis.Cmd, []error) {
	cmds := make([]*redis.Cmd, len(calls))
	errs := make([]error, len(calls))
	run := func(idx []int) {
		pipe := s.client.Pipeline()
		for _, j := range idx {
			c := calls[j]
			cmds[j] = pipe.EvalSha(ctx, c.script.Hash(), c.keys, c.args...)
		}
		_, _ = pipe.Exec(ctx) // every command carries its own error
	}
	all := make([]int, len(calls))
	for j := range all {
		all[j] = j
	}
	run(all)
	var lost []int
	for j, cmd := range cmds {
		if redis.HasErrorPrefix(cmd.Err(), "NOSCRIPT") {
			lost = append(lost, j)
		}
	}
	if len(lost) == 0 {
		return cmds, errs
	}
	if err := s.loadScripts(ctx); err != nil {
		for _, j := range lost {
			cmds[j], errs[j] = nil, err
		}
		return cmds, errs
	}
	run(lost)
	return cmds, errs
}
