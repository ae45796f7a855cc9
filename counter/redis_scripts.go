package counter

import (
	"math/bits"
	"time"
)

// The Lua scripts of the Redis store, one per algorithm, indexed by
// Algorithm. Each mirrors its Go function in algorithm.go, in integer
// microseconds, with time from redis.call('TIME'): client clocks never decide.
//
// A script decides for any number of counters, KEYS[1..K], one after the
// other at the same instant, so a batch of Takes on one standalone server
// costs one EVALSHA, one TIME and one reply (on a Cluster or Ring K is 1: a
// script's keys must live on one node, in one slot). ARGV holds (see
// appendArgs):
//
//   - token bucket: inc, tol and the expiry span's level, once for all its
//     keys: the TAT increment of the cost and the burst tolerance, each as
//     whole µs and a fraction of 2^-32 µs (computed in Go by newGCRA, as the
//     memory store computes them). The store groups Takes by these and never
//     sends a key twice in one script call (worker.group);
//   - window algorithms, per key: rate, period in µs, cost n.
//
// The reply holds replyWidth integers per key: for the token bucket the TAT
// found, d = max(TAT, now) - now, in whole µs w (w when allowed, -1-w when
// denied), followed, for each key whose d has a fraction (only rates that do
// not divide their period make one), by the key's index and that fraction
// (see group.fractions), from which gcra.result derives the Result; for the
// others {allowed (0/1), remaining, retry_after_us, reset_after_us}.
//
// Instants are near 1.7e15 µs: exact in a Lua double. Redis formats number
// arguments of redis.call with %.17g, so they pass exactly; tostring and
// string concatenation print only 14 significant digits, so instants that
// go into strings are formatted with string.format('%.0f', x).
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

// gcraScript mirrors takeGCRA's decision. State: the TAT as whole µs,
// followed, when its fraction is not 0, by a space and the fraction in
// units of 2^-32 µs, then by k+1 spaces, k being the level of the expiry
// span that the key's expiry was set for (a number with blanks after it
// still reads as one with tonumber).
//
// Setting an expiry is the dearest part of a write (the expires table is
// updated twice and the command rewritten for replication), so a write
// keeps the key's expiry while it can. The expiry span is 1 ms·2^k, the
// least of at least the tolerance (the level k comes from Go, spanLevel).
// A write that moves the expiry sets it, from now (so that tests can fake
// TIME), to the end of the TAT's half-span plus a span: at least one span,
// so at least the tolerance, past the TAT, and at most 1.5 spans, so less
// than three tolerances. A write whose TAT stays in the half-span of the
// TAT it replaces, at the same level, keeps that expiry, which still covers
// the TAT plus the tolerance. A value at another level (the limit changed)
// or in another format moves it. A plain write within the half-span only
// overwrites the TAT's digits (SETRANGE), which keeps the expiry and the
// level's blanks without building a string. A burst of writes thus moves
// the expiry once, not once per write.
//
// All reads are one MGET, which answers nil for a key holding another
// algorithm's state, so such a key starts afresh; the keys of one call are
// distinct, so no write needs reading back.
const gcraScript = `
local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
-- Globals are read once, into locals: a global read per key is a table
-- lookup per key.
local floor, format, tonumber, call, keys = math.floor, string.format, tonumber, redis.call, KEYS
local vals = call('MGET', unpack(keys))
local out, m = {}, #keys
local iw, ifr, tw, tfr, k = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local F, MAXT = 4294967296, 9007199254740992
local span = 1000 * 2 ^ k
local half = span / 2
local len = 17 + k
-- text is the value of TAT nw and fraction nf, built only by the writes
-- that need it (most overwrite the digits of the value there).
local function text(nw, nf)
	local s = nf == 0 and format('%.0f', nw) or format('%.0f %.0f', nw, nf)
	return s .. string.rep(' ', k + 1)
end
for i = 1, #keys do
	local v = vals[i]
	local w, f, old, plain = now, 0, false, false
	if v then
		local a = tonumber(v)
		if a then
			if a > now and a < MAXT and a % 1 == 0 then w = a end
			if #v == len then old, plain = a, true end
		else
			local as, fs = string.match(v, '^(%d+) (%d+) +$')
			a, f = tonumber(as), tonumber(fs)
			if a and a < MAXT and f < F then
				if #v == #as + #fs + len - 15 then old = a end
				if a < now then f = 0 else w = a end
			else
				f = 0
			end
		end
	end
	if f > 0 then out[m + 1], out[m + 2], m = i, f, m + 2 end
	local nw, nf = w + iw, f + ifr
	if nf >= F then nw, nf = nw + 1, nf - F end
	local e = nw - tw - now
	if e > 0 or (e == 0 and nf > tfr) then
		out[i] = -1 - (w - now)
	else
		local lo = nw - nw % half -- the start of nw's half-span
		if old and old - old % half == lo then
			if plain and nf == 0 and nw < MAXT then
				call('SETRANGE', keys[i], 0, nw)
			else
				call('SET', keys[i], text(nw, nf), 'KEEPTTL')
			end
		else
			call('SET', keys[i], text(nw, nf), 'PX', math.min(floor((lo + half + span - now) / 1000) + 1, 1e15))
		end
		out[i] = w - now
	end
end
return out
`

// slidingWindowScript mirrors takeSlidingWindow, slidingRetry and
// firstAfter. State: "w cur prev", expiring two periods after window w
// starts. floor(prev·left/p) is exact while rate × period in µs < 2^53.
// The pattern admits digits only; a count of 2^53 or more is read as absent.
const slidingWindowScript = `
local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
local floor, ceil = math.floor, math.ceil
local MAXC = 9007199254740992
local function firstAfter(count, k, p)
	if count <= k then return 0 end
	return floor(p - (k + 1) * p / count) + 1
end
local out = {}
for i = 1, #KEYS do
	local k, j = KEYS[i], 3 * i - 3
	local rate, p, n = tonumber(ARGV[j + 1]), tonumber(ARGV[j + 2]), tonumber(ARGV[j + 3])
	local w = floor(now / p)
	local cur, prev = 0, 0
	local v = redis.pcall('GET', k)
	if type(v) == 'string' then
		local a, b, c = string.match(v, '^(%d+) (%d+) (%d+)$')
		a, b, c = tonumber(a), tonumber(b), tonumber(c)
		if a and b < MAXC and c < MAXC then
			if a == w then
				cur, prev = b, c
			elseif a == w - 1 then
				prev = b
			end
		end
	end
	local elapsed = now - w * p
	local left = p - elapsed
	local est = floor(prev * left / p) + cur
	local ok, rem, retry = 1, 0, 0
	if est + n > rate then
		ok, rem = 0, math.max(0, rate - est)
		if cur + n <= rate then
			retry = math.max(1, firstAfter(prev, rate - cur - n, p) - elapsed)
		else
			retry = left + firstAfter(cur, rate - n, p)
		end
	else
		cur = cur + n
		rem = rate - est - n
		redis.call('SET', k, string.format('%.0f %.0f %.0f', w, cur, prev), 'PX', ceil((left + p) / 1000))
	end
	local reset = 0
	if cur > 0 then reset = left + p elseif prev > 0 then reset = left end
	j = 4 * i - 4
	out[j + 1], out[j + 2], out[j + 3], out[j + 4] = ok, rem, retry, reset
end
return out
`

// fixedWindowScript mirrors takeFixedWindow. State: "w count", expiring at
// the end of window w; a count of 2^53 or more is read as absent.
const fixedWindowScript = `
local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
local out = {}
for i = 1, #KEYS do
	local k, j = KEYS[i], 3 * i - 3
	local rate, p, n = tonumber(ARGV[j + 1]), tonumber(ARGV[j + 2]), tonumber(ARGV[j + 3])
	local w = math.floor(now / p)
	local cur = 0
	local v = redis.pcall('GET', k)
	if type(v) == 'string' then
		local a, b = string.match(v, '^(%d+) (%d+)$')
		b = tonumber(b)
		if tonumber(a) == w and b < 9007199254740992 then cur = b end
	end
	local reset = (w + 1) * p - now
	local ok, retry = 0, reset
	if cur + n <= rate then
		ok, retry, cur = 1, 0, cur + n
		redis.call('SET', k, string.format('%.0f %.0f', w, cur), 'PX', math.ceil(reset / 1000))
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
const slidingLogScript = `
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
		redis.call('PEXPIRE', k, math.ceil(p / 1000))
		out[j + 1], out[j + 2], out[j + 3], out[j + 4] = 1, rate - used - n, 0, p
	end
end
return out
`

// setArgs sets c's algorithm and script arguments for a Take of n units
// under lim. The store resolves time to whole µs: a period is rounded up to
// µs, and a token bucket's interval is kept to 2^-32 µs (see gcra.go).
func (c *call) setArgs(lim Limit, n int64) {
	c.alg, c.frac = lim.Algorithm, 0
	c.rate, c.period, c.n = lim.Rate, micros(lim.Period), n
	c.gcra = gcra{capacity: lim.Capacity()}
	if c.alg == TokenBucket {
		c.gcra = newGCRA(c.period, lim, n)
		c.level = spanLevel(c.tol)
	}
}

// micros is d in whole µs, rounded up (a shorter period would admit more),
// at least 1.
func micros(d time.Duration) int64 {
	return max(1, (d.Nanoseconds()+999)/1000)
}

// maxSpanLevel caps gcraScript's expiry span at 1 ms·2^42, 139 years.
const maxSpanLevel = 42

// spanLevel is the level k of gcraScript's expiry span for a tolerance of
// tol µs: the least k with 1 ms·2^k ≥ tol, at most maxSpanLevel.
func spanLevel(tol fixed) int64 {
	m := (tol.ceil() + 999) / 1000 // ms, rounded up
	return min(maxSpanLevel, int64(bits.Len64(uint64(max(1, m)-1))))
}

// appendArgs appends c's script arguments to args.
func (c *call) appendArgs(args []any) []any {
	if c.alg == TokenBucket {
		return append(args, &c.inc.w, &c.inc.f, &c.tol.w, &c.tol.f, &c.level)
	}
	return append(args, &c.rate, &c.period, &c.n)
}

// decode turns c's part of a script reply (replyWidth[c.alg] integers) into
// a Result.
func (c *call) decode(v []int64) Result {
	if c.alg == TokenBucket { // the TAT found, from now; see gcraScript
		d, allowed := v[0], v[0] >= 0
		if !allowed {
			d = -1 - d
		}
		return c.result(fixed{d, c.frac}, allowed, time.Microsecond)
	}
	return Result{
		Allowed:    v[0] == 1,
		Limit:      c.capacity,
		Remaining:  v[1],
		RetryAfter: time.Duration(v[2]) * time.Microsecond,
		ResetAfter: time.Duration(v[3]) * time.Microsecond,
	}
}
