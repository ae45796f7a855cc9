package counter

import (
	"context"
	"fmt"

	"github.com/redis/go-redis/v9"
)

// chargeScripts charge a counter on Redis (see charge.go), one per
// algorithm, each on one counter: KEYS are the counter and its generation's
// key if it has one (genKey), ARGV the charge's arguments (chargeArgs). The
// reply is 1. A charge reads a counter's state as the Take script does (a
// value no take writes, or another algorithm's, is no usage), and a charge
// of n that a Take could admit writes what that Take writes, with its
// expiry. The generation's key is neither made nor changed: if it exists,
// its expiry is only pushed to the counter's, so that it lives as long as
// the counter, as Lease keeps it.
var chargeScripts = newScripts(chargeSources)

// chargeSources are the sources of chargeScripts.
var chargeSources = [numAlgorithms]string{
	TokenBucket:   chargeKeepGen + gcraChargeScript,
	SlidingWindow: chargeKeepGen + windowCounts + slidingWindowChargeScript,
	FixedWindow:   chargeKeepGen + windowCounts + fixedWindowChargeScript,
	SlidingLog:    chargeKeepGen + intArg + slidingLogChargeScript,
}

// chargeKeepGen defines keepGen, which pushes the expiry of the
// generation's key, if there is one, to the counter's (formatted: see
// intArg).
const chargeKeepGen = `
local function keepGen()
	if not KEYS[2] then return end
	local g = redis.call('PTTL', KEYS[2])
	if g <= 0 then return end
	local c = redis.call('PTTL', KEYS[1])
	if c > g then redis.call('PEXPIRE', KEYS[2], string.format('%.0f', c)) end
end
`

// gcraChargeScript charges a token bucket, in the grid units of its
// limit's level k (see gcraGrid). ARGV: I, the limit's interval in those
// units; k; n. The TAT found (d = max(TAT, now) - now, read as gcraScript
// reads it) moves to d + n·I, written as gcraScript writes it, while that
// is within L = 2^41 ms of units: 32 spans of any level up to 36, and
// maxDebt at 36 and 37, where the debt stops. Below level 36 a debt past
// L goes to the least level up to 36 whose L holds it, written under the
// limit's interval rounded up to that level's grid, so that a take reads
// it in units of the limit (gcraOffset) and never less; at level 36 L is
// maxDebt. A debt already at maxDebt is left as it is. The expiry is the
// one a take writing the TAT sets, from the spans of the limit's level.
const gcraChargeScript = `
local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
local key, iv, k, n = KEYS[1], tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])` + gcraGrid + `
local O, L = 2e15, 2199023255552000
local half = 500 * 2 ^ k
local tail = ':' .. ARGV[1] .. ':' .. k
local v = redis.pcall('GET', key)
local x, q = nil, nil
if type(v) == 'string' then
	if #v == 16 + #tail and string.sub(v, 17) == tail then
		local a = tonumber(string.sub(v, 1, 16))
		if a and a >= O and a - O < M and a % 1 == 0 then
			x = a - O - base
			if x >= M / 2 then x = x - M elseif x < -M / 2 then x = x + M end
		end
	end
	if not x then x, q = (` + gcraOffset + `)(v, now, U, iv) end
end
local d = 0
if x and x > 0 then d = x end
-- write sets the TAT y units of level kk ahead of now, under interval ivs.
local function write(y, kk, ivs)
	local U2 = kk < 36 and 2 ^ (36 - kk) or 1
	local C2 = 7e15 / U2
	C2 = C2 - C2 % 1
	local M2, base2 = C2 * U2, (now % C2) * U2
	local s = y < M2 - base2 and O + base2 + y or O + y - (M2 - base2)
	local at = now + math.ceil(y / U2)
	local lo = at - at % half
	redis.call('SET', key, string.format('%.0f', s) .. ':' .. ivs .. ':' .. kk, 'PX', string.format('%.0f', math.floor((lo + 3 * half - now) / 1000) + 1))
	keepGen()
end
if d < L and n <= (L - d) / iv then
	write(d + n * iv, k, ARGV[1])
	return 1
end
if k >= 36 then
	if d < L then write(L, k, ARGV[1]) end
	return 1
end
-- The debt in level kk's units of its interval I: exact when I is iv's
-- exactly; from the debt in units that gcraOffset reads when it capped x.
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
		return 1
	end
	if y <= L and n <= (L - y) / I then
		write(y + n * I, kk, string.format('%.0f', I))
		return 1
	end
end
return 1
`

// slidingWindowChargeScript charges a sliding window: n (at most MaxCount)
// is added to the current window's count, at most MaxCount, and the state
// written as slidingWindowScript writes it. ARGV: rate, period in µs, n.
const slidingWindowChargeScript = `
local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
local key, p, n = KEYS[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local w = math.floor(now / p)
local cur, prev = slidingCounts(redis.pcall('GET', key), w)
local top = 9007199254740991
if n > top - cur then cur = top else cur = cur + n end
redis.call('SET', key, string.format('%.0f %.0f %.0f', w, cur, prev), 'PX', string.format('%.0f', math.ceil((w * p + 2 * p - now) / 1000)))
keepGen()
return 1
`

// fixedWindowChargeScript charges a fixed window: n (at most MaxCount) is
// added to the current window's count, at most MaxCount, and the state
// written as fixedWindowScript writes it. ARGV: rate, period in µs, n.
const fixedWindowChargeScript = `
local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
local key, p, n = KEYS[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local w = math.floor(now / p)
local cur = fixedCount(redis.pcall('GET', key), w)
local top = 9007199254740991
if n > top - cur then cur = top else cur = cur + n end
redis.call('SET', key, string.format('%.0f %.0f', w, cur), 'PX', string.format('%.0f', math.ceil(((w + 1) * p - now) / 1000)))
keepGen()
return 1
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
// ARGV: rate, period in µs, n (at most 2·rate).
const slidingLogChargeScript = `
local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
local ts = string.format('%.0f', now)
local key, rate, p, n = KEYS[1], tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
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
keepGen()
return 1
`

// chargeArgs returns the arguments of lim's charge script for n > 0 units.
func chargeArgs(lim Limit, n int64) []any {
	var c call
	c.setArgs(lim, 1)
	switch lim.Algorithm {
	case TokenBucket:
		return []any{c.ivArg, c.level, n}
	case SlidingLog:
		return []any{c.rate, c.period, min(n, 2*c.rate)}
	}
	return []any{c.rate, c.period, min(n, MaxCount)}
}

// ChargeOp is one charge of a ChargeBatch: its arguments, and once the
// batch is done, whether the counter holds it (Charged) or Err.
type ChargeOp struct {
	Key   string
	Hash  uint64
	Limit Limit
	N     int64

	Charged bool
	Err     error
}

// Charger is implemented by stores that take charges: usage added to a
// counter without a decision (see charge.go).
type Charger interface {
	// Charge adds n units of usage to key's counter under lim now, leaving
	// it as an admitted Take of n would, for every n a Take could admit,
	// and saturating beyond (see charge.go). It reports whether the counter
	// holds the charge (a memory store whose stripe is full drops it). A
	// charge of n ≤ 0, or under a limit without a positive Rate and Period,
	// changes nothing and reports true. It may block on I/O.
	Charge(ctx context.Context, key string, hash uint64, lim Limit, n int64) (bool, error)
}

// BatchCharger is implemented by Chargers that charge many counters in
// fewer calls than one each.
type BatchCharger interface {
	Charger
	// ChargeBatch charges each of ops as Charge would, one after the other,
	// and sets its Charged or Err. It returns when all are done. It may
	// block on I/O.
	ChargeBatch(ctx context.Context, ops []ChargeOp)
}

var (
	_ BatchCharger = (*MemoryStore)(nil)
	_ BatchCharger = (*RedisStore)(nil)
)

// Charge implements Charger: one script run, in a round trip of its own,
// bounded by the store's Timeout. An unknown algorithm is an error.
func (s *RedisStore) Charge(ctx context.Context, key string, hash uint64, lim Limit, n int64) (bool, error) {
	ops := []ChargeOp{{Key: key, Hash: hash, Limit: lim, N: n}}
	s.ChargeBatch(ctx, ops)
	return ops[0].Charged, ops[0].Err
}

// ChargeBatch implements BatchCharger: one script call per op, all in one
// pipeline bounded by the store's Timeout, which a Cluster or Ring client
// splits into one round trip per node, sent at once. Ops on one key are
// run in their order. If the server lost the charge scripts (NOSCRIPT),
// they are loaded again and the ops that failed so sent again, once.
func (s *RedisStore) ChargeBatch(ctx context.Context, ops []ChargeOp) {
	send := make([]int, 0, len(ops))
	for i := range ops {
		op := &ops[i]
		op.Charged, op.Err = false, nil
		switch {
		case op.Limit.Algorithm >= numAlgorithms:
			op.Err = fmt.Errorf("redis charge: %w: %d", ErrUnknownAlgorithm, op.Limit.Algorithm)
		case op.N <= 0 || op.Limit.Rate <= 0 || op.Limit.Period <= 0:
			op.Charged = true
		case !s.ready.Load():
			op.Err = fmt.Errorf("redis charge: %w", s.notReady())
		default:
			send = append(send, i)
		}
	}
	if len(send) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	lost := s.chargePipeline(ctx, ops, send, true)
	if len(lost) == 0 {
		return
	}
	if err := s.loadScripts(ctx); err != nil {
		for _, i := range lost {
			ops[i].Err = fmt.Errorf("redis charge: %w", err)
		}
		return
	}
	s.chargePipeline(ctx, ops, lost, false)
}

// chargePipeline sends the charges of ops[i] for each i in send in one
// pipeline, and sets their outcomes. With keepLost, it leaves the ops that
// failed with NOSCRIPT unset and returns their indexes (in send's array).
func (s *RedisStore) chargePipeline(ctx context.Context, ops []ChargeOp, send []int, keepLost bool) []int {
	cmds := make([]*redis.Cmd, len(send))
	pipe := s.client.Pipeline()
	for j, i := range send {
		op := &ops[i]
		cmds[j] = pipe.EvalSha(ctx, chargeScripts[op.Limit.Algorithm].Hash(), s.leaseKeys(op.Key), chargeArgs(op.Limit, op.N)...)
	}
	_, _ = pipe.Exec(ctx) // every command carries its own error
	lost := send[:0]
	for j, i := range send {
		err := cmds[j].Err()
		switch {
		case keepLost && redis.HasErrorPrefix(err, "NOSCRIPT"):
			lost = append(lost, i)
		case err != nil:
			ops[i].Err = fmt.Errorf("redis charge: %w", err)
		default:
			ops[i].Charged = true
		}
	}
	return lost
}
