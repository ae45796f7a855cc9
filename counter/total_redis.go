package counter

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// totalScript charges totals (see total.go) on any number of counters one
// after the other at one instant, each under its own algorithm (on a
// Cluster or Ring, counters of one slot: a script's keys must share one).
// It runs the charge of chargeBodies, one copy of each algorithm's. Per
// op, KEYS hold the counter, its watermarks' key (markKey) and its
// generation's key if it has one, and ARGV nine arguments
// (appendTotalArgs): the algorithm, the limit's two charge arguments, the
// most units a charge carries, 1 if a generation's key follows, the
// sender, the total, Keep in µs and Most. A watermark is a field of the
// watermarks' key named by the sender, holding the total and its expiry
// (µs); the key expires no sooner than its fields. A new field first drops
// the expired ones, so that the fields of senders gone stay bounded by
// those that wrote within Keep. The reply holds, per op, the units
// charged.
var totalScript = redis.NewScript(totalSource)

// totalSource is the source of totalScript.
var totalSource = newTotalSource()

func newTotalSource() string {
	var b strings.Builder
	b.WriteString(chargePrelude)
	b.WriteString("local charges = {}\n")
	for alg, body := range chargeBodies {
		fmt.Fprintf(&b, "do\n%s\ncharges[%d] = charge\nend\n", body, alg)
	}
	b.WriteString(`
-- prune drops the expired fields of the watermarks' key mk.
local function prune(mk)
	local all = redis.call('HGETALL', mk)
	for i = 1, #all, 2 do
		local e = tonumber(string.match(all[i + 1], ' (%d+)$'))
		if not e or e <= now then redis.call('HDEL', mk, all[i]) end
	end
end
local out = {}
local j = 1
for i = 1, #ARGV - 8, 9 do
	local key, mk, gen = KEYS[j], KEYS[j + 1], nil
	j = j + 2
	if ARGV[i + 4] == '1' then gen, j = KEYS[j], j + 1 end
	local from, total, keep = ARGV[i + 5], tonumber(ARGV[i + 6]), tonumber(ARGV[i + 7])
	local w, exp, live = 0, 0, false
	local v = redis.call('HGET', mk, from)
	if v then
		local a, e = string.match(v, '^(%d+) (%d+)$')
		a, e = tonumber(a), tonumber(e)
		if a and e and e > now then w, exp, live = a, e, true end
	end
	local charged, most = 0, tonumber(ARGV[i + 8])
	if total > w then
		charged = total - w
		if most > 0 and charged > most then charged = most end
		charges[tonumber(ARGV[i])](key, gen, ARGV[i + 1], ARGV[i + 2], math.min(charged, tonumber(ARGV[i + 3])))
		if not live then prune(mk) end
	end
	if total > w or live then
		local e = math.max(exp, now + keep)
		redis.call('HSET', mk, from, string.format('%.0f %.0f', math.max(total, w), e))
		local ms = math.ceil((e - now) / 1000)
		if redis.call('PTTL', mk) < ms then redis.call('PEXPIRE', mk, string.format('%.0f', ms)) end
	end
	out[#out + 1] = charged
end
return out
`)
	return b.String()
}

// markSuffix ends the name of a counter's watermarks' key, as genSuffix
// its generation's.
const markSuffix = "\x00tot"

// markKey returns the name of the key holding the watermarks of the
// counter k, in k's hash slot as genKey's; "" when there is none.
func markKey(k string) string {
	if g := genKey(k); g != "" {
		return strings.TrimSuffix(g, genSuffix) + markSuffix
	}
	return ""
}

// appendTotalArgs appends op's arguments of totalScript to args, gen
// saying whether a generation's key follows the counter's watermarks' key
// in KEYS.
func appendTotalArgs(args []any, op *TotalOp, gen bool) []any {
	var c call
	c.setArgs(op.Limit, 1)
	g := 0
	if gen {
		g = 1
	}
	keep := op.Keep / time.Microsecond
	if op.Keep%time.Microsecond != 0 {
		keep++
	}
	keep = min(keep, MaxCount)
	args = append(args, int(op.Limit.Algorithm))
	switch op.Limit.Algorithm {
	case TokenBucket:
		args = append(args, c.ivArg, c.level, int64(MaxCount))
	case SlidingLog:
		args = append(args, c.rate, c.period, 2*c.rate)
	default:
		args = append(args, c.rate, c.period, int64(MaxCount))
	}
	return append(args, g, op.From, op.Total, int64(keep), max(op.Most, 0))
}

// totalGroup is one totalScript call: the indexes of its ops, and its
// KEYS and ARGV.
type totalGroup struct {
	ops  []int
	keys []string
	args []any
}

// ChargeTotals implements TotalCharger in one pipeline bounded by the
// store's Timeout, which a Cluster or Ring client splits into one round
// trip per node, sent at once: on a standalone server one script call for
// all ops, on a Cluster one per hash slot, on a Ring one per op. Ops on
// one counter run in their order. On a Cluster or Ring, a counter whose
// name holds a '}' but no hash tag has no key in its slot for its
// watermarks: its op fails. If the server lost the script (NOSCRIPT), it
// is loaded again and the calls that failed so sent again, once.
func (s *RedisStore) ChargeTotals(ctx context.Context, ops []TotalOp) {
	var groups []totalGroup
	_, cluster := s.client.(*redis.ClusterClient)
	bySlot := make(map[int]int) // a Cluster's slot's group
	for i := range ops {
		op := &ops[i]
		op.Charged, op.Err = 0, op.check()
		if op.Err != nil {
			op.Err = fmt.Errorf("redis charge total: %w", op.Err)
			continue
		}
		if unlimited(op.Limit) {
			continue
		}
		if !s.ready.Load() {
			op.Err = fmt.Errorf("redis charge total: %w", s.notReady())
			continue
		}
		k := s.cfg.Prefix + op.Key
		gk, mk := genKey(k), markKey(k)
		if mk == "" {
			if !s.multiKey {
				op.Err = fmt.Errorf("redis charge total: counter %q has no key in its slot for its watermarks", op.Key)
				continue
			}
			mk = k + markSuffix
		}
		var g *totalGroup
		switch {
		case s.multiKey:
			if len(groups) == 0 {
				groups = append(groups, totalGroup{})
			}
			g = &groups[0]
		case cluster:
			slot := keySlot(s.cfg.Prefix, op.Key)
			j, ok := bySlot[slot]
			if !ok {
				j = len(groups)
				bySlot[slot] = j
				groups = append(groups, totalGroup{})
			}
			g = &groups[j]
		default:
			groups = append(groups, totalGroup{})
			g = &groups[len(groups)-1]
		}
		g.ops = append(g.ops, i)
		g.keys = append(g.keys, k, mk)
		if gk != "" {
			g.keys = append(g.keys, gk)
		}
		g.args = appendTotalArgs(g.args, op, gk != "")
	}
	if len(groups) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	calls := make([]scriptCall, len(groups))
	for j, g := range groups {
		calls[j] = scriptCall{totalScript, g.keys, g.args}
	}
	cmds, errs := s.evalAll(ctx, calls)
	for j, g := range groups {
		var v []int64
		err := errs[j]
		if err == nil {
			v, err = cmds[j].Int64Slice()
		}
		if err == nil && len(v) != len(g.ops) {
			err = fmt.Errorf("%w: %d integers for %d ops", errBadReply, len(v), len(g.ops))
		}
		for n, i := range g.ops {
			if err != nil {
				ops[i].Err = fmt.Errorf("redis charge total: %w", err)
			} else {
				ops[i].Charged = v[n]
			}
		}
	}
}
