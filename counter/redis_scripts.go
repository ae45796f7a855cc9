package counter

import (
	"math/bits"
	"time"
)

// The Lua scripts of the Redis store, one per algorithm, indexed by
// Algorithm. Each mirrors its Go function in algorithm.go, in integer
// microseconds, with time from redis.call('TIME'): client clocks never decide.
//
// A script decides for any number of Takes, on KEYS[1..K], one after the
// other at the same instant, so a batch of Takes on one standalone server
// costs one EVALSHA, one TIME and one reply (on a Cluster or Ring the keys
// of a script call are one key: they must live on one node, in one slot).
// A key's Takes in a batch come next to each other, and each sees the
// state the one before left. ARGV holds (see appendArgs):
//
//   - token bucket: inc, tol·64 + k and I, once for all its keys: the TAT
//     increment of the cost and the burst tolerance, in the units of the
//     limit's grid, the level k of its expiry span, and the emission
//     interval (computed in Go by redisGCRA, with the memory store's
//     arithmetic; see the token bucket's state below). The store groups
//     Takes by these (worker.group);
//   - window algorithms, per key: rate, period in µs, cost n.
//
// The reply holds replyWidth integers per key: for the token bucket the TAT
// found, d = max(TAT, now) - now, in grid units (d when allowed, -1-d when
// denied), from which gcra.result derives the Result; for the others
// {allowed (0/1), remaining, retry_after_us, reset_after_us}.
//
// Instants are near 1.8e15 µs, and grid units below 2^53: exact in a Lua
// double. Redis formats number arguments of redis.call in full, but 7.2.0
// to 7.2.4 in exponent form from 8 trailing zeros (intArg); tostring and
// string concatenation print only 14 significant digits; so numbers that go
// into strings are formatted with string.format('%.0f', x).
//
// A key holding another algorithm's state (the limit changed algorithm), or
// a value no script writes (not a number, not finite, not whole, negative,
// or beyond 2^53, where a double stops being exact), is read as absent and
// overwritten: the counter starts afresh, and one such key can fail neither
// the other decisions of its batch (a script error would fail them all) nor,
// through a non-finite expiry, its own.
//
// Server CPU per decision bounds the store's throughput, so the scripts do
// as little as they can: few redis.call's (a denied take writes nothing;
// the window algorithms keep their state in one string "window count
// [previous]" set with its expiry in one SET), no per-key reply tables, and
// arithmetic that does not depend on the state done in Go.
var scripts = [numAlgorithms]string{
	TokenBucket:   gcraScript,
	SlidingWindow: slidingWindowScript,
	FixedWindow:   fixedWindowScript,
	SlidingLog:    slidingLogScript,
}

// replyWidth is the number of reply integers per key of each script.
var replyWidth = [numAlgorithms]int{TokenBucket: 1, SlidingWindow: 4, FixedWindow: 4, SlidingLog: 4}

// intArg defines int(x), the integer x as an argument of redis.call: from
// 1e8 up it is formatted here, since Redis 7.2.0 to 7.2.4 pass a number
// with 8 trailing zeros or more in exponent form ("1e+08", which no integer
// argument accepts; redis/redis#13113).
const intArg = `
local function int(x)
	if x < 1e8 then return x end
	return string.format('%.0f', x)
end
`

// The token bucket's state on Redis, read and written by gcraScript and
// gcraSeedScript.
//
// A limit's Takes run on a grid of U = 2^b units per µs (redisGCRA): b = 36
// - k, at most 32 and at least 0, k being the level of the limit's expiry
// span (1 ms·2^k, at least the tolerance). Grid units keep the fraction
// of a TAT whose interval does not divide the period, and keep the TAT one
// number: the tolerance is below 2^47 units (2^46 up to level 36), and inc
// and tol·64 + k pass exactly as Lua doubles.
//
// A state is "P:I:k": P a number of 16 digits, O = 2e15 plus the TAT's place
// in a cycle of M = floor(7e15/U)·U units; I the emission interval the TAT
// was written under, in those units; k the level. While its key lives, a
// TAT is within a few spans of now (the expiry ends at most 1.5 spans past
// it), and M/2 is at least 25 spans, so its place in the cycle and now give
// it back exactly. A take under the limit that wrote the state finds its
// own ":I:k" after the digits and reads P alone. One under another limit
// reads the debt in units, (TAT - now)/I, and carries that many of its own
// intervals, so that a change of limit neither forgets usage nor hands it
// out again (the memory store does the same; see takeGCRA). The fixed width
// of P lets a write overwrite the digits alone (SETRANGE).
//
// States written before the interval was noted, P with k-3 blanks after it
// (the blanks tell the level), are still read, as are the older forms
// below (gcraOffset); they carry their debt as time. A version before this
// one reads a "P:I:k" state as absent.

// gcraGrid sets U, C (the cycle in µs), M and base (now's place in the
// cycle, in units) for the level k at the instant now.
const gcraGrid = `
local U = k < 36 and 2 ^ (36 - k) or 1
local C = 7e15 / U
C = C - C % 1
local M, base = C * U, (now % C) * U
`

// gcraOffset is a Lua function, offset(v, now, unit, iv): the TAT that the
// value v holds, less now, in units of unit per µs, rounded up (capped at
// ±2^52, far beyond any tolerance); nil if v holds none. For a "P:I:k"
// state ahead of now it also returns the debt in units of the limit that
// wrote it, q = (TAT - now)/I, unrounded; and given iv, the interval of the
// limit reading in units of unit per µs, the TAT it returns is q·iv ahead,
// exactly rounded up, so that the debt carries in units. A state of any
// level is read on its own grid; a number below O as whole µs, a number
// with blanks after it as a state of the level its length tells, and a
// pair "w f  " as whole µs and 2^-32 µs: the forms written before.
// gcraScript calls it for a value it does not read itself, which is rare,
// so the function is made only then (making it costs as much as a few
// keys).
const gcraOffset = `function(v, now, unit, iv)
	local O, a, x, q = 2e15, tonumber(v), nil, nil
	local p, i, kk = string.match(v, '^(%d+):(%d+):(%d+)$')
	if p then
		a, i = tonumber(p), tonumber(i)
		local k = tonumber(kk)
		if not (#p == 16 and a >= O and i > 0 and i < 9007199254740992 and k >= 4 and k <= 37) then return nil end` + gcraGrid + `
		if a - O >= M then return nil end
		local y = a - O - base
		if y >= M / 2 then y = y - M elseif y < -M / 2 then y = y + M end
		x = math.ceil(y * (unit / U))
		if y > 0 then
			q = y / i
			if iv then
				-- ceil(y·iv/i) exactly: y = w·i + r, and r·iv/i by long
				-- multiplication over iv's bits, every figure below 2^53.
				local w = math.floor(y / i)
				local r = y - w * i
				if r < 0 then w, r = w - 1, r + i elseif r >= i then w, r = w + 1, r - i end
				local hi, lo, b, rest = 0, 0, 2 ^ 52, iv
				while b >= 1 do
					hi, lo = 2 * hi, 2 * lo
					if lo >= i then hi, lo = hi + 1, lo - i end
					if rest >= b then
						rest = rest - b
						lo = lo + r
						if lo >= i then hi, lo = hi + 1, lo - i end
					end
					b = b / 2
				end
				if lo > 0 then hi = hi + 1 end
				x = math.min(w * iv + hi, 4503599627370496)
			end
		end
	elseif a then
		if a < 0 or a >= 9e15 or a % 1 ~= 0 then return nil end
		if a < O then
			x = (a - now) * unit
		else
			local k = #v - 13
			if k < 4 or k > 37 then return nil end` + gcraGrid + `
			if a - O >= M then return nil end
			local y = a - O - base
			if y >= M / 2 then y = y - M elseif y < -M / 2 then y = y + M end
			x = math.ceil(y * (unit / U))
		end
	else
		local w, f = string.match(v, '^(%d+) (%d+) +$')
		w, f = tonumber(w), tonumber(f)
		if not (w and w < O and f < 4294967296) then return nil end
		x = (w - now) * unit + math.ceil(f * unit / 4294967296)
	end
	return math.max(-4503599627370496, math.min(x, 4503599627370496)), q
end`

// gcraScript mirrors takeGCRA's decision, in grid units.
// ARGV: inc, the TAT increment of the cost; tol·64 + k, tol being the
// burst tolerance; and I, the limit's interval (see call.setArgs). The
// reply per key is the TAT found, d = max(TAT, now) - now in grid units: d
// when allowed, -1-d when denied.
//
// The common read is a comparison of the state's tail with this limit's
// ":I:k" and one tonumber of its digits: a state this limit wrote whose
// number is in the cycle. Anything else goes through gcraOffset, and a
// value no take writes reads as absent. A debt noted under another
// interval is carried in units: q of them are q·I ahead, rounded up.
//
// Setting an expiry is the dearest part of a write (the expires table is
// updated twice and the command rewritten for replication), so a write
// keeps the key's expiry while it can. A write that moves the expiry sets
// it, from now (so that tests can fake TIME), to the end of the TAT's
// half-span plus a span: at least one span, so at least the tolerance, past
// the TAT, and at most 1.5 spans. A write whose TAT stays in the half-span
// of the TAT it replaces, under the same limit, keeps that expiry, which
// still covers the TAT plus the tolerance, and overwrites the state's
// digits alone (SETRANGE), keeping its tail. A burst of writes thus moves
// the expiry once, not once per write. Only an admitted take writes, so a
// written TAT is within the tolerance, and a debt carried from another
// limit drains at the rate it was written under until one is.
//
// All reads are one MGET, which answers nil for a key holding another
// algorithm's state, so such a key starts afresh. A key may come several
// times, its takes next to each other: they decide one after the other, as
// separate calls at the same instant would, and write once.
const gcraScript = `
local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
-- The globals a key reads are read once, into locals: a global read per key
-- is a table lookup per key.
local tonumber, call, keys, sub, find = tonumber, redis.call, KEYS, string.sub, string.find
local vals = call('MGET', unpack(keys))
local inc, tol, iv = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local k = tol % 64
tol = (tol - k) / 64` + gcraGrid + `
local O, H, top = 2e15, M / 2, M - base
local half = 500 * 2 ^ k -- µs, half the span
-- Half-spans in units: a TAT x units from now is r + x units into now's.
local halfU, r = half * U, (now % half) * U
local tail = ':' .. ARGV[3] .. ':' .. k
local len = 16 + #tail
local out = {}
-- The takes on one key come one after the other (worker.group): each decides
-- on the TAT x that the one before left, and the last TAT is written once.
local i, n = 1, #keys
while i <= n do
	local key, v, x, same, moved = keys[i], vals[i], nil, false, false
	if v then
		if #v == len and find(v, tail, 17, true) == 17 then
			local a = tonumber(sub(v, 1, 16))
			if a and a >= O and a - O < M and a % 1 == 0 then
				x, same = a - O - base, true
				if x >= H then x = x - M elseif x < -H then x = x + M end
			end
		end
		if not same then x = (` + gcraOffset + `)(v, now, U, iv) end
	end
	local x0 = x
	repeat
		local d = 0
		if x and x > 0 then d = x end
		local new = d + inc
		if new > tol then
			out[i] = -1 - d
		else
			x, moved, out[i] = new, true, d
		end
		i = i + 1
	until keys[i] ~= key
	if moved then
		local s = x < top and O + base + x or O + x - top
		-- Keep the expiry if x is in x0's half-span (x > x0). A number with
		-- 8 trailing zeros or more may reach SETRANGE in exponent form
		-- (intArg): such a one is written whole.
		same = same and x - x0 < halfU - (r + x0) % halfU and s % 100000000 ~= 0
		if same then
			call('SETRANGE', key, 0, s)
		else
			local at = now + math.ceil(x / U) -- whole µs, at or after the TAT
			local lo = at - at % half -- the start of its half-span
			call('SET', key, string.format('%.0f', s) .. tail, 'PX', string.format('%.0f', math.floor((lo + 3 * half - now) / 1000) + 1))
		end
	end
end
return out
`

// windowCounts defines the readers of the window algorithms' states, as
// GET returned them (false for none), in window w (floor(now/p)). A state
// of another window, another algorithm's or a count of 2^53 or more (past
// exact arithmetic) reads as no usage. slidingCounts(v, w) returns the
// current and previous windows' counts of a "w cur prev" state;
// fixedCount(v, w) the count of a "w count" state.
const windowCounts = `
local function slidingCounts(v, w)
	if type(v) ~= 'string' then return 0, 0 end
	local a, b, c = string.match(v, '^(%d+) (%d+) (%d+)$')
	a, b, c = tonumber(a), tonumber(b), tonumber(c)
	if not (a and b < 9007199254740992 and c < 9007199254740992) then return 0, 0 end
	if a == w then return b, c end
	if a == w - 1 then return 0, b end
	return 0, 0
end
local function fixedCount(v, w)
	if type(v) ~= 'string' then return 0 end
	local a, b = string.match(v, '^(%d+) (%d+)$')
	b = tonumber(b)
	if tonumber(a) == w and b < 9007199254740992 then return b end
	return 0
end
`

// slidingWindowScript mirrors takeSlidingWindow, slidingRetry and
// firstAfter. State: "w cur prev", expiring two periods after window w
// starts. floor(prev·left/p) is exact: prev·left directly below 2^53, by
// long multiplication above. Counts, rate and period are at most MaxCount,
// and comparisons subtract (n > rate - est), so no sum passes 2^53. The
// pattern admits digits only; a count of 2^53 or more is read as absent.
const slidingWindowScript = intArg + windowCounts + `
local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
local floor, ceil = math.floor, math.ceil
-- weighted(c, l, p) is floor(c·l/p) for 0 ≤ l ≤ p, exact: above 2^53 it is
-- q·l + floor(r·l/p) with c = q·p + r, the second by long multiplication
-- over l's bits, keeping r·(l's bits so far) as hr·p + m, every figure
-- below p.
local function weighted(c, l, p)
	local x = c * l
	if x < 9007199254740992 then return floor(x / p) end
	if l >= p then return c end
	local q = floor(c / p)
	local r = c - q * p
	if r < 0 then q, r = q - 1, r + p elseif r >= p then q, r = q + 1, r - p end
	local h, hr, m, b = q * l, 0, 0, 2 ^ 52 -- q·l ≤ c: exact
	while b >= 1 do
		hr = 2 * hr
		if m >= p - m then hr, m = hr + 1, m - (p - m) else m = 2 * m end
		if l >= b then
			l = l - b
			if m >= p - r then hr, m = hr + 1, m - (p - r) else m = m + r end
		end
		b = b / 2
	end
	return h + hr
end
local function firstAfter(count, k, p)
	if count <= k then return 0 end
	return floor(p - (k + 1) * p / count) + 1
end
local out = {}
for i = 1, #KEYS do
	local k, j = KEYS[i], 3 * i - 3
	local rate, p, n = tonumber(ARGV[j + 1]), tonumber(ARGV[j + 2]), tonumber(ARGV[j + 3])
	local w = floor(now / p)
	local cur, prev = slidingCounts(redis.pcall('GET', k), w)
	local elapsed = now - w * p
	local left = p - elapsed
	local est = weighted(prev, left, p) + cur
	local ok, rem, retry = 1, 0, 0
	if n > rate - est then
		ok, rem = 0, math.max(0, rate - est)
		if n <= rate - cur then
			retry = math.max(1, firstAfter(prev, rate - cur - n, p) - elapsed)
		else
			retry = left + firstAfter(cur, rate - n, p)
		end
	else
		cur = cur + n
		rem = rate - est - n
		redis.call('SET', k, string.format('%.0f %.0f %.0f', w, cur, prev), 'PX', int(ceil((left + p) / 1000)))
	end
	local reset = 0
	if cur > 0 then reset = left + p elseif prev > 0 then reset = left end
	j = 4 * i - 4
	out[j + 1], out[j + 2], out[j + 3], out[j + 4] = ok, rem, retry, reset
end
return out
`

// fixedWindowScript mirrors takeFixedWindow. State: "w count", expiring at
// the end of window w; a count of 2^53 or more is read as absent. Counts
// and rate are at most MaxCount, and the comparison subtracts, so no sum
// passes 2^53.
const fixedWindowScript = intArg + windowCounts + `
local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
local out = {}
for i = 1, #KEYS do
	local k, j = KEYS[i], 3 * i - 3
	local rate, p, n = tonumber(ARGV[j + 1]), tonumber(ARGV[j + 2]), tonumber(ARGV[j + 3])
	local w = math.floor(now / p)
	local cur = fixedCount(redis.pcall('GET', k), w)
	local reset = (w + 1) * p - now
	local ok, retry = 0, reset
	if n <= rate - cur then
		ok, retry, cur = 1, 0, cur + n
		redis.call('SET', k, string.format('%.0f %.0f', w, cur), 'PX', int(math.ceil(reset / 1000)))
	end
	j = 4 * i - 4
	out[j + 1], out[j + 2], out[j + 3], out[j + 4] = ok, math.max(0, rate - cur), retry, reset
end
return out
`

// slidingLogScript mirrors takeSlidingLog. State: a sorted set of admitted
// instants (members made unique with a sequence number), expiring one
// period after the newest. An entry more than a period ahead of now is no
// instant a take wrote (+inf, say, whose waits would not be finite): it is
// dropped with the entries that left the window.
const slidingLogScript = intArg + `
local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
local ts = string.format('%.0f', now)
local out = {}
for i = 1, #KEYS do
	local k, j = KEYS[i], 3 * i - 3
	local rate, p, n = tonumber(ARGV[j + 1]), tonumber(ARGV[j + 2]), tonumber(ARGV[j + 3])
	if type(redis.pcall('ZREMRANGEBYSCORE', k, '-inf', now - p)) == 'table' then
		redis.call('DEL', k) -- another algorithm's state
	else
		redis.call('ZREMRANGEBYSCORE', k, '(' .. string.format('%.0f', now + p), '+inf')
	end
	local used = redis.call('ZCARD', k)
	j = 4 * i - 4
	if used + n > rate then
		local x = used + n - rate - 1
		local oldest = redis.call('ZRANGE', k, x, x, 'WITHSCORES')
		local newest = redis.call('ZRANGE', k, -1, -1, 'WITHSCORES')
		out[j + 1], out[j + 2], out[j + 3], out[j + 4] = 0, math.max(0, rate - used), oldest[2] + p - now, newest[2] + p - now
	else
		local added = 0
		while added < n do
			local args = {}
			for m = 1, math.min(n - added, 512) do
				added = added + 1
				args[2 * m - 1] = now
				args[2 * m] = ts .. ':' .. (used + added)
			end
			redis.call('ZADD', k, unpack(args))
		end
		redis.call('PEXPIRE', k, int(math.ceil(p / 1000)))
		out[j + 1], out[j + 2], out[j + 3], out[j + 4] = 1, rate - used - n, 0, p
	end
end
return out
`

// setArgs sets c's algorithm and script arguments for a Take of n units
// under lim. The store resolves time to whole µs: a period is rounded up to
// µs, and a token bucket's interval is kept to 2^-32 µs (see gcra.go).
func (c *call) setArgs(lim Limit, n int64) {
	c.alg = lim.Algorithm
	c.rate, c.period, c.n = lim.Rate, micros(lim.Period), n
	c.gcra = gcra{capacity: lim.Capacity()}
	if c.alg == TokenBucket {
		c.gcra, c.level = redisGCRA(c.period, lim, n)
		b := gridBits(c.level)
		tol := c.tol.units(b)
		c.incArg = tol + 1 // any inc beyond the tolerance is denied alike
		if !c.tol.less(c.inc) {
			c.incArg = c.inc.units(b)
		}
		c.tolArg = tol<<6 | c.level
		c.ivArg = c.unit.units(b)
	}
}

// micros is d in whole µs, rounded up (a shorter period would admit more),
// at least 1.
func micros(d time.Duration) int64 {
	return max(1, (d.Nanoseconds()+999)/1000)
}

// The levels of gcraScript's expiry span, 1 ms·2^k: at least 16 ms, which
// keeps the grid at most 2^32 units per µs, and at most 2^37 ms (4.4
// years), which keeps tol·64 + k below 2^53.
const (
	minSpanLevel = 4
	maxSpanLevel = 37
)

// gridBits is b, the grid of a limit whose span level is k having 2^b units
// per µs (see gcraGrid).
func gridBits(k int64) int { return int(max(0, 36-k)) }

// spanLevel is the level k of gcraScript's expiry span for a tolerance of
// tol µs: the least k with 1 ms·2^k ≥ tol, within the levels above.
func spanLevel(tol fixed) int64 {
	m := (tol.ceil() + 999) / 1000 // ms, rounded up
	return min(maxSpanLevel, max(minSpanLevel, int64(bits.Len64(uint64(max(1, m)-1)))))
}

// redisGCRA returns the figures of a Redis Take of n under lim, period being
// lim.Period in µs, and the level of its expiry span. The interval is
// rounded up to the grid of that level, which may lengthen the tolerance
// into the next level, whose grid is then used. A tolerance beyond the
// highest level's span (4.4 years) is cut to the whole intervals that fit
// it: the capacity is lowered, never raised. Validate refuses a limit it
// would cut; a split key's share may pass it by its rounding.
func redisGCRA(period int64, lim Limit, n int64) (gcra, int64) {
	k := spanLevel(newGCRA(period, lim, n, fracBits).tol)
	for {
		g := newGCRA(period, lim, n, gridBits(k))
		if l := spanLevel(g.tol); l > k {
			k = l
			continue
		}
		if span := (fixed{1000 << k, 0}); span.less(g.tol) { // k is the highest level
			g.capacity = span.per(g.unit)
			g.tol = g.unit.mul(g.capacity)
		}
		return g, k
	}
}

// appendArgs appends c's script arguments to args.
func (c *call) appendArgs(args []any) []any {
	if c.alg == TokenBucket {
		return append(args, &c.incArg, &c.tolArg, &c.ivArg)
	}
	return append(args, &c.rate, &c.period, &c.n)
}

// decode turns c's part of a script reply (replyWidth[c.alg] integers) into
// a Result.
func (c *call) decode(v []int64) Result {
	if c.alg == TokenBucket { // the TAT found, from now, in grid units; see gcraScript
		d, allowed := v[0], v[0] >= 0
		if !allowed {
			d = -1 - d
		}
		b := gridBits(c.level)
		return c.result(fixed{d >> b, (d & (1<<b - 1)) << (fracBits - b)}, allowed, time.Microsecond)
	}
	return Result{
		Allowed:    v[0] == 1,
		Limit:      c.capacity,
		Remaining:  v[1],
		RetryAfter: time.Duration(v[2]) * time.Microsecond,
		ResetAfter: time.Duration(v[3]) * time.Microsecond,
	}
}
