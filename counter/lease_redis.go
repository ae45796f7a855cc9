package counter

import (
	"context"
	"fmt"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/hotkeyd/hotkey/shard"
)

// leaseScripts run an algorithm's Take script twice at one instant, as a
// function of (KEYS, ARGV) called with ARGV of its own: a Take of one unit,
// then, if it was admitted, of m-1 more, m = min(n, its Remaining + 1).
// KEYS: the counter, and its generation's key (genKey) if it has one.
// ARGV: the Take script's arguments for one unit, then n. The reply is m,
// then the reply of the Take that decides the Result (for the token bucket
// the first one's, decoded as a Take of m), the instant in µs, and the
// counter's generation (0: none).
var leaseScripts = newScripts(leaseSources)

// leaseSources are the sources of leaseScripts.
var leaseSources = [numAlgorithms]string{
	TokenBucket: leaseScript(gcraScript, `
local tolv, I = tonumber(ARGV[2]), tonumber(ARGV[3])
local tol = (tolv - tolv % 64) / 64
local d = take(K1, {ARGV[1], ARGV[2], ARGV[3]})[1]
if d < 0 then return {0, d, now, 0} end
local m = math.min(tonumber(ARGV[4]), math.floor((tol - d) / I))
if m > 1 then take(K1, {string.format('%.0f', (m - 1) * I), ARGV[2], ARGV[3]}) end
return {m, d, now, gen()}
`),
	SlidingWindow: leaseScript(slidingWindowScript, leaseWindow),
	FixedWindow:   leaseScript(fixedWindowScript, leaseWindow),
	SlidingLog:    leaseScript(slidingLogScript, leaseWindow),
}

// leaseWindow is the lease of the window algorithms and the log, whose
// Take replies {allowed, remaining, retry, reset}.
const leaseWindow = `
local v = take(K1, {ARGV[1], ARGV[2], 1})
local m, g = 0, 0
if v[1] == 1 then
	m = math.min(tonumber(ARGV[4]), v[2] + 1)
	if m > 1 then v = take(K1, {ARGV[1], ARGV[2], m - 1}) end
	g = gen()
end
return {m, v[1], v[2], v[3], v[4], now, g}
`

// leaseScript wraps the Take script src as the function take, reading
// TIME once for both of its calls, and appends body, which takes from K1
// (the counter alone) and calls gen once it charged.
func leaseScript(src, body string) string {
	const tm = "redis.call('TIME')"
	if strings.Count(src, tm) != 1 {
		panic("counter: lease script: the Take script does not read TIME once")
	}
	return "local T = " + tm + "\nlocal now = T[1] * 1000000 + T[2]\nlocal K1 = {KEYS[1]}\nlocal take = function(KEYS, ARGV)\n" +
		strings.Replace(src, tm, "T", 1) + "\nend\n" + leaseGen + body
}

// leaseGen defines gen, which returns the counter's generation: the
// instant its generation's key was written first, made now if the key is
// missing (the counter is new, or was lost with it), and kept as long as
// the counter at least. 0: the counter has no generation's key.
const leaseGen = `
local gen = function()
	if not KEYS[2] then return 0 end
	local ttl = redis.call('PTTL', KEYS[1])
	if ttl <= 0 then return 0 end
	local g = redis.call('GET', KEYS[2])
	if not g then g = string.format('%.0f', now) end
	redis.call('SET', KEYS[2], g, 'PX', math.max(ttl, redis.call('PTTL', KEYS[2])))
	return tonumber(g)
end
`

// newScripts returns the scripts of srcs.
func newScripts(srcs [numAlgorithms]string) [numAlgorithms]*redis.Script {
	var out [numAlgorithms]*redis.Script
	for i, src := range srcs {
		out[i] = redis.NewScript(src)
	}
	return out
}

// returnScripts take back units of a lease (see lease.go). KEYS: the
// counter and its generation's key. ARGV: the Take script's arguments for
// one unit, r, the lease's instant (µs) and the counter's generation. The
// reply is the number of units that went back: none unless the generation's
// key holds the lease's. A write keeps the key's expiry: the state holds
// less usage, never more.
var returnScripts = newScripts(returnSources)

// returnGen is the opening of every return script: nothing goes back to a
// counter of another generation than the lease's.
const returnGen = `
if not KEYS[2] or redis.call('GET', KEYS[2]) ~= ARGV[6] then return 0 end`

// returnSources are the sources of returnScripts.
var returnSources = [numAlgorithms]string{
	TokenBucket: returnGen + `
local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
local key, tolv, I = KEYS[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local r, t0 = tonumber(ARGV[4]), tonumber(ARGV[5])
local k = tolv % 64
local v = redis.pcall('GET', key)
local tail = ':' .. ARGV[3] .. ':' .. k
if type(v) ~= 'string' or #v ~= 16 + #tail or string.sub(v, 17) ~= tail then return 0 end
local a = tonumber(string.sub(v, 1, 16))` + gcraGrid + `
local O = 2e15
if not (a and a >= O and a - O < M and a % 1 == 0) then return 0 end
local x = a - O - base
if x >= M / 2 then x = x - M elseif x < -M / 2 then x = x + M end
local give, e = r * I, math.max(0, now - t0) * U
if x <= 0 or e >= give then return 0 end
give = math.min(give - e, x)
x = x - give
local s = x < M - base and O + base + x or O + x - (M - base)
redis.call('SET', key, string.format('%.0f', s) .. tail, 'KEEPTTL')
local tol = (tolv - k) / 64
local function room(d)
	if d > tol then return 0 end
	return math.floor((tol - d) / I)
end
return room(x) - room(x + give)
`,
	SlidingWindow: returnGen + `
local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
local key, p, r, t0 = KEYS[1], tonumber(ARGV[2]), tonumber(ARGV[4]), tonumber(ARGV[5])
local w, w0 = math.floor(now / p), math.floor(t0 / p)
local v = redis.pcall('GET', key)
if w0 < w - 1 or type(v) ~= 'string' then return 0 end
local a, b, c = string.match(v, '^(%d+) (%d+) (%d+)$')
a, b, c = tonumber(a), tonumber(b), tonumber(c)
if not (a and b < 9007199254740992 and c < 9007199254740992) then return 0 end
local back = 0
if a == w0 then
	back = math.min(r, b)
	b = b - back
elseif a == w0 + 1 then
	back = math.min(r, c)
	c = c - back
end
if back > 0 then redis.call('SET', key, string.format('%.0f %.0f %.0f', a, b, c), 'KEEPTTL') end
return back
`,
	FixedWindow: returnGen + `
local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
local key, p, r, t0 = KEYS[1], tonumber(ARGV[2]), tonumber(ARGV[4]), tonumber(ARGV[5])
local w = math.floor(now / p)
local v = redis.pcall('GET', key)
if math.floor(t0 / p) ~= w or type(v) ~= 'string' then return 0 end
local a, b = string.match(v, '^(%d+) (%d+)$')
a, b = tonumber(a), tonumber(b)
if a ~= w or not (b < 9007199254740992) then return 0 end
local back = math.min(r, b)
if back > 0 then redis.call('SET', key, string.format('%.0f %.0f', a, b - back), 'KEEPTTL') end
return back
`,
	SlidingLog: returnGen + `
local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
local key, p, r, t0 = KEYS[1], tonumber(ARGV[2]), tonumber(ARGV[4]), tonumber(ARGV[5])
if t0 <= now - p then return 0 end
local ts = string.format('%.0f', t0)
local m = redis.pcall('ZRANGEBYSCORE', key, ts, ts, 'LIMIT', 0, r)
if type(m) ~= 'table' or #m == 0 then return 0 end
for i = 1, #m, 512 do
	redis.call('ZREM', key, unpack(m, i, math.min(i + 511, #m)))
end
return #m
`,
}

// Lease implements Leaser: one script run, in a round trip of its own
// (leases are not batched), bounded by the store's Timeout.
func (s *RedisStore) Lease(ctx context.Context, key string, _ uint64, lim Limit, n int64) (Lease, error) {
	if lim.Algorithm >= numAlgorithms {
		return Lease{}, fmt.Errorf("redis lease: %w: %d", ErrUnknownAlgorithm, lim.Algorithm)
	}
	if !s.ready.Load() {
		return Lease{}, fmt.Errorf("redis lease: %w", s.notReady())
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	var c call
	c.setArgs(lim, 1)
	args := append(c.appendArgs(nil), n)
	v, err := leaseScripts[lim.Algorithm].Run(ctx, s.client, s.leaseKeys(key), args...).Int64Slice()
	if err != nil {
		return Lease{}, fmt.Errorf("redis lease: %w", err)
	}
	return decodeLease(lim, v)
}

// decodeLease turns a lease script's reply into a Lease.
func decodeLease(lim Limit, v []int64) (Lease, error) {
	w := replyWidth[lim.Algorithm]
	if len(v) != w+3 {
		return Lease{}, fmt.Errorf("redis lease: %d integers in the reply, want %d", len(v), w+3)
	}
	var c call
	c.setArgs(lim, max(1, v[0]))
	return Lease{Granted: v[0], Result: c.decode(v[1 : 1+w]), Token: Token{v[1+w], v[2+w]}}, nil
}

// leaseKeys returns the keys of key's lease and return scripts: its
// counter, and its generation's key if it has one.
func (s *RedisStore) leaseKeys(key string) []string {
	k := s.cfg.Prefix + key
	if g := genKey(k); g != "" {
		return []string{k, g}
	}
	return []string{k}
}

// genKey returns the name of the key holding the generation of the counter
// k, in k's hash slot: k's hash tag, or k itself as the tag; "" when
// neither can be (k holds a '}' but no tag), and the counter has no
// generation, so no return gives it anything.
func genKey(k string) string {
	if _, ok := shard.HashTag(k); ok {
		return k + genSuffix
	}
	if strings.IndexByte(k, '}') >= 0 {
		return ""
	}
	return "{" + k + "}" + genSuffix
}

// genSuffix ends the name of a generation's key: a NUL byte, which keys of
// counters do not hold.
const genSuffix = "\x00gen"

// Return implements Leaser: one script run, in a round trip of its own,
// bounded by the store's Timeout.
func (s *RedisStore) Return(ctx context.Context, key string, _ uint64, lim Limit, r int64, token Token) (int64, error) {
	if lim.Algorithm >= numAlgorithms {
		return 0, fmt.Errorf("redis return: %w: %d", ErrUnknownAlgorithm, lim.Algorithm)
	}
	if r <= 0 {
		return 0, nil
	}
	if !s.ready.Load() {
		return 0, fmt.Errorf("redis return: %w", s.notReady())
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	var c call
	c.setArgs(lim, 1)
	if token.gen == 0 {
		return 0, nil // the counter has no generation: see genKey
	}
	args := append(c.appendArgs(nil), r, token.at, token.gen)
	back, err := returnScripts[lim.Algorithm].Run(ctx, s.client, s.leaseKeys(key), args...).Int64()
	if err != nil {
		return 0, fmt.Errorf("redis return: %w", err)
	}
	return back, nil
}
