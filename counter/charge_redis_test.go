package counter

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// chargeAt runs lim's charge script on keys (the counter, and its
// generation's key if given) at the instant now (µs), TIME replaced by
// arguments as scriptAt does.
func chargeAt(t *testing.T, client redis.UniversalClient, keys []string, lim Limit, n, now int64) {
	t.Helper()
	src := strings.Replace(chargeSources[lim.Algorithm], "redis.call('TIME')", "{ARGV[#ARGV - 1], ARGV[#ARGV]}", 1)
	args := append(appendChargeArgs(nil, lim, n, len(keys) > 1), now/1e6, now%1e6)
	if err := redis.NewScript(src).Run(context.Background(), client, keys, args...).Err(); err != nil {
		t.Fatalf("charge script: %v", err)
	}
}

// sameResult reports whether a Redis Result (µs) matches a memory one (ns).
func sameResult(got, want Result) bool {
	return got.Allowed == want.Allowed && got.Remaining == want.Remaining && got.Limit == want.Limit &&
		nearMicro(got.RetryAfter, want.RetryAfter) && nearMicro(got.ResetAfter, want.ResetAfter) &&
		nearMicro(got.NextAfter, want.NextAfter)
}

// TestRedisChargeMatchesMemory runs seeded sequences of Charges, Takes,
// Peeks, Leases and Returns on two counters, on fixed instants, through the
// scripts (TIME replaced by arguments) and the memory store: each must
// answer the same on both, but that a log's Return may give back fewer
// (a charge keeps a log's newest 2·rate units only: the units it dropped
// count in no decision, whatever goes back later). Charges go up to three capacities, so that token
// buckets owe units and windows and logs go past their rate. Token
// intervals are exact on both stores' grids: a rounded one drifts apart
// by a grid step per unit, on Take and Charge alike, and charges carry
// many more units than takes.
func TestRedisChargeMatchesMemory(t *testing.T) {
	checkLeaks(t)
	client := newTestClient(t, testRedisAddr)
	ctx := context.Background()
	for _, lim := range []Limit{
		{Algorithm: TokenBucket, Rate: 10, Period: time.Hour},
		{Algorithm: TokenBucket, Rate: 6, Period: time.Minute, Burst: 3},
		{Algorithm: TokenBucket, Rate: 1000, Period: time.Second, Burst: 50},
		{Algorithm: TokenBucket, Rate: 7, Period: time.Minute, Burst: 5},
		{Algorithm: TokenBucket, Rate: 1 << 20, Period: time.Second, Burst: 2 << 20},
		{Algorithm: SlidingWindow, Rate: 10, Period: time.Hour},
		{Algorithm: SlidingWindow, Rate: 7, Period: 3 * time.Hour},
		{Algorithm: FixedWindow, Rate: 10, Period: time.Hour},
		{Algorithm: FixedWindow, Rate: 7, Period: 3 * time.Hour},
		{Algorithm: SlidingLog, Rate: 10, Period: time.Hour},
		{Algorithm: SlidingLog, Rate: 7, Period: 3 * time.Hour},
		{Algorithm: SlidingLog, Rate: 600, Period: time.Minute},
	} {
		t.Run(fmt.Sprintf("%v/%d/%v/%d", lim.Algorithm, lim.Rate, lim.Period, lim.Burst), func(t *testing.T) {
			peek := scriptSrcAt(peekSources[lim.Algorithm])
			lease := scriptSrcAt(leaseSources[lim.Algorithm])
			ret := scriptSrcAt(returnSources[lim.Algorithm])
			mem := NewMemoryStore(MemoryConfig{})
			counters := []string{testKey(t), testKey(t)}
			open := make(map[string][]openLease)
			rng := rand.New(rand.NewPCG(41, uint64(lim.Algorithm)<<32|uint64(lim.Rate)))
			now := t0.UnixMicro()
			span := lim.Period.Microseconds() / 4
			if lim.Algorithm == TokenBucket {
				span = lim.Period.Microseconds() * lim.Capacity() / lim.Rate / 4
			}
			allowed, takes, charges, returns, granted, returned := 0, 0, 0, 0, int64(0), int64(0)
			for i := range 400 {
				now += rng.Int64N(span + 1)
				key := counters[rng.IntN(len(counters))]
				keys := []string{key, genKey(key)}
				at := time.UnixMicro(now)
				tm := []any{now / 1e6, now % 1e6}
				var c call
				c.setArgs(lim, 1)
				switch rng.IntN(5) {
				case 0:
					n := []int64{1, 1, 1 + rng.Int64N(lim.Capacity()), 1 + rng.Int64N(3*lim.Capacity())}[rng.IntN(4)]
					chargeAt(t, client, keys, lim, n, now)
					if !mem.ChargeAt(at, key, 0, lim, n) {
						t.Fatalf("step %d: memory dropped a charge", i)
					}
					charges++
				case 1:
					v, err := peek.Run(ctx, client, []string{key}, append(c.appendArgs(nil), tm...)...).Int64Slice()
					if err != nil {
						t.Fatalf("peek script: %v", err)
					}
					got := c.decode(v)
					ns := at.UnixNano()
					c0 := mem.peek(Shard{Name: key, Limit: lim}, ns, lim.Algorithm == SlidingLog)
					if want := c0.take(ns, lim, 1); !sameResult(got, want) {
						t.Fatalf("step %d: peek: redis %+v, memory %+v", i, got, want)
					}
				case 2:
					n := 1 + rng.Int64N(lim.Capacity())
					v, err := lease.Run(ctx, client, keys, append(append(c.appendArgs(nil), n), tm...)...).Int64Slice()
					if err != nil {
						t.Fatalf("lease script: %v", err)
					}
					got, err := decodeLease(lim, v)
					if err != nil {
						t.Fatal(err)
					}
					want := mem.LeaseAt(at, key, lim, n)
					if got.Granted != want.Granted || !sameResult(got.Result, want.Result) {
						t.Fatalf("step %d: lease of %d: redis %+v, memory %+v", i, n, got, want)
					}
					if got.Granted > 0 {
						granted += got.Granted
						open[key] = append(open[key], openLease{want.Token, got.Token, got.Granted - rng.Int64N(got.Granted+1)})
					}
				case 3:
					ls := open[key]
					if len(ls) == 0 {
						continue
					}
					j := rng.IntN(len(ls))
					l := ls[j]
					open[key] = append(ls[:j], ls[j+1:]...)
					if l.left == 0 {
						continue
					}
					r := 1 + rng.Int64N(l.left)
					got, err := ret.Run(ctx, client, keys, append(append(c.appendArgs(nil), r, l.redisTok.at, l.redisTok.gen), tm...)...).Int64()
					if err != nil {
						t.Fatalf("return script: %v", err)
					}
					want := mem.ReturnAt(at, key, lim, r, l.memTok)
					if got != want && (lim.Algorithm != SlidingLog || got > want) {
						t.Fatalf("step %d: return of %d: redis %d went back, memory %d", i, r, got, want)
					}
					returns++
					returned += got
				default:
					n := []int64{1, 1 + rng.Int64N(lim.Capacity())}[rng.IntN(2)]
					got := scriptAt(t, client, []string{key}, lim, n, now)[0]
					want := mem.TakeAt(at, key, 0, lim, n)
					if !sameResult(got, want) {
						t.Fatalf("step %d: take of %d: redis %+v, memory %+v", i, n, got, want)
					}
					if takes++; want.Allowed {
						allowed++
					}
				}
			}
			// A bucket's lease gives back nothing once held for the
			// intervals it would return: most steps are longer.
			mix := fmt.Sprintf("%d of %d takes allowed, %d charges, %d units leased, %d returned in %d returns", allowed, takes, charges, granted, returned, returns)
			t.Log(mix)
			if allowed < takes/10 || allowed > takes*9/10 || charges < 50 || granted == 0 || returns == 0 || returned == 0 && lim.Algorithm != TokenBucket {
				t.Errorf("%s: want a mix", mix)
			}
		})
	}
}

// TestRedisChargeDebt charges a token bucket of 10/s, burst 10, twice
// 1,000 units: 200 s of debt, past the 32 spans its own level's state
// holds, so written on a coarser level (320 units: once on its own level,
// then on a coarser one; MaxInt64: maxDebt). Takes at instants before and
// after the debt is paid must decide as the memory store's, and report
// the same waits while they are below a minute (a Take reads a debt at
// most 64 spans of its level ahead: see gcraOffset). Instants past the
// key's expiry on the server's clock are probed only when the state
// written is maxDebt ahead.
func TestRedisChargeDebt(t *testing.T) {
	checkLeaks(t)
	client := newTestClient(t, testRedisAddr)
	lim := Limit{Rate: 10, Period: time.Second}
	for _, give := range []int64{1000, 320, math.MaxInt64} {
		t.Run(fmt.Sprint(give), func(t *testing.T) {
			mem := NewMemoryStore(MemoryConfig{})
			key := testKey(t)
			start := t0.UnixMicro()
			if r := scriptAt(t, client, []string{key}, lim, 4, start)[0]; !r.Allowed {
				t.Fatalf("a fresh bucket denied 4: %+v", r)
			}
			mem.TakeAt(time.UnixMicro(start), key, 0, lim, 4)
			chargeAt(t, client, []string{key}, lim, give, start)
			mem.ChargeAt(time.UnixMicro(start), key, 0, lim, give)
			chargeAt(t, client, []string{key}, lim, give, start+1)
			mem.ChargeAt(time.UnixMicro(start+1), key, 0, lim, give)
			var admitted []time.Duration
			for _, after := range []time.Duration{
				time.Second, 20 * time.Second, 33 * time.Second, 63 * time.Second, 150 * time.Second,
				199 * time.Second, 200 * time.Second, 200*time.Second + 400*time.Millisecond, 201 * time.Second,
				maxDebt - time.Hour, maxDebt + time.Minute,
			} {
				if after > time.Hour && give != math.MaxInt64 {
					continue
				}
				at := start + after.Microseconds()
				got := scriptAt(t, client, []string{key}, lim, 1, at)[0]
				want := mem.TakeAt(time.UnixMicro(at), key, 0, lim, 1)
				if msg := sane(got, lim); got.Allowed != want.Allowed || msg != "" ||
					want.RetryAfter < time.Minute && !sameResult(got, want) {
					t.Fatalf("take %v after: redis %+v, memory %+v %s", after, got, want, msg)
				}
				if got.Allowed {
					admitted = append(admitted, after)
				}
			}
			t.Logf("admitted at %v", admitted)
			if len(admitted) == 0 {
				t.Error("never admitted again")
			}
		})
	}
}

// TestRedisChargeSaturates charges counters of every algorithm MaxInt64
// units twice, through a store on a standalone server and on a Cluster:
// every Take then denies with sane figures, the state stays one a Take
// reads (nothing overflowed to a value read as absent, which would admit),
// and the key expires, no later than maxDebt and a few spans from now.
func TestRedisChargeSaturates(t *testing.T) {
	checkLeaks(t)
	for _, d := range deployments {
		t.Run(d.name, func(t *testing.T) {
			client := d.client(t)
			s := newTestStore(t, client, patient)
			ctx := context.Background()
			for _, lim := range append(chargeLimits,
				Limit{Algorithm: TokenBucket, Rate: 700_000, Period: time.Second},
				Limit{Algorithm: TokenBucket, Rate: 1, Period: MaxTolerance},
				// A log's charge adds up to 2·rate entries, one per unit as a
				// take's: at MaxLogRate a script of seconds on a loaded machine.
				Limit{Algorithm: SlidingLog, Rate: 10_000, Period: time.Hour},
			) {
				key := testKey(t)
				var ops []ChargeOp
				for range 2 {
					ops = append(ops, ChargeOp{Key: key, Limit: lim, N: math.MaxInt64})
				}
				s.ChargeBatch(ctx, ops)
				for i, op := range ops {
					if op.Err != nil || !op.Charged {
						t.Fatalf("%s: charge %d: %v, charged %v", limitName(lim), i, op.Err, op.Charged)
					}
				}
				for _, n := range []int64{1, lim.Capacity()} {
					r := mustTake(t, s, key, lim, n)
					if msg := sane(r, lim); r.Allowed || msg != "" || r.RetryAfter <= 0 {
						t.Errorf("%s: take of %d after saturating charges: %+v %s", limitName(lim), n, r, msg)
					}
				}
				ttl, err := client.PTTL(ctx, s.cfg.Prefix+key).Result()
				if err != nil {
					t.Fatal(err)
				}
				var c call
				c.setArgs(lim, 1)
				if most := maxDebt + 2*(time.Millisecond<<c.level) + lim.Period; ttl <= 0 || ttl > most {
					t.Errorf("%s: TTL %v after saturating charges, want in (0, %v]", limitName(lim), ttl, most)
				}
				if lim.Algorithm == SlidingLog {
					if units, _ := client.ZCard(ctx, s.cfg.Prefix+key).Result(); units != 2*lim.Rate {
						t.Errorf("%s: %d entries after saturating charges, want twice the rate %d", limitName(lim), units, lim.Rate)
					}
				}
			}
		})
	}
}

// TestRedisChargeTTL: a charged key expires as a taken one would: Takes
// and Charges of the same units at the same instants, on two fresh keys,
// leave the same TTL after each step (a token bucket's kept while its TAT
// stays in its half-span, set anew past it), within the real time
// between a take and its charge and the two reads.
func TestRedisChargeTTL(t *testing.T) {
	checkLeaks(t)
	client := newTestClient(t, testRedisAddr)
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(5, 6))
	for _, lim := range append(chargeLimits,
		Limit{Algorithm: TokenBucket, Rate: 1000, Period: time.Second, Burst: 1000},
		Limit{Algorithm: FixedWindow, Rate: 10, Period: time.Hour},
		Limit{Algorithm: SlidingWindow, Rate: 10, Period: time.Hour},
	) {
		steps := 0
		for range 5 {
			took, charged := testKey(t), testKey(t)
			now := time.Now().UnixMicro() + rng.Int64N(lim.Period.Microseconds())
			var apart time.Duration // the most real time between a step's take and charge: a kept expiry is one set steps ago
			for range 10 {
				now += lim.Period.Microseconds() / lim.Rate / 2 * (1 + rng.Int64N(2)) // a unit's refill, or half of it
				n := 1 + rng.Int64N(lim.Capacity()/8+1)
				start := time.Now()
				if r := scriptAt(t, client, []string{took}, lim, n, now)[0]; !r.Allowed {
					break
				}
				chargeAt(t, client, []string{charged}, lim, n, now)
				apart = max(apart, time.Since(start))
				read := time.Now()
				a, err := client.PTTL(ctx, took).Result()
				if err != nil {
					t.Fatal(err)
				}
				b, err := client.PTTL(ctx, charged).Result()
				if err != nil {
					t.Fatal(err)
				}
				if gap := apart + time.Since(read) + 2*time.Millisecond; a <= 0 || a-b > gap || b-a > gap {
					t.Fatalf("%s, %d units: TTL %v after a take, %v after a charge", limitName(lim), n, a, b)
				}
				steps++
			}
		}
		if steps < 20 {
			t.Errorf("%s: %d steps compared", limitName(lim), steps)
		}
	}
}

// TestRedisChargeKeepsGeneration: a charge makes no generation's key and
// changes none, but one that pushes a leased counter's expiry pushes its
// generation's with it, so that the lease's units can still go back.
func TestRedisChargeKeepsGeneration(t *testing.T) {
	checkLeaks(t)
	for _, d := range deployments {
		t.Run(d.name, func(t *testing.T) {
			client := d.client(t)
			s := newTestStore(t, client, patient)
			ctx := context.Background()
			for _, lim := range []Limit{
				{Algorithm: TokenBucket, Rate: 10, Period: time.Second},
				{Algorithm: SlidingWindow, Rate: 10, Period: time.Hour},
				{Algorithm: FixedWindow, Rate: 10, Period: time.Hour},
				{Algorithm: SlidingLog, Rate: 10, Period: time.Hour},
			} {
				fresh, leased := testKey(t), testKey(t)
				if ok, err := s.Charge(ctx, fresh, Hash(fresh), lim, 3); err != nil || !ok {
					t.Fatalf("%v: charge: %v, %v", lim.Algorithm, ok, err)
				}
				if n, _ := client.Exists(ctx, genKey(s.cfg.Prefix+fresh)).Result(); n != 0 {
					t.Errorf("%v: a charge made a generation's key", lim.Algorithm)
				}
				l, err := s.Lease(ctx, leased, Hash(leased), lim, 5)
				if err != nil || l.Granted != 5 {
					t.Fatalf("%v: lease: %+v, %v", lim.Algorithm, l, err)
				}
				g := genKey(s.cfg.Prefix + leased)
				before, _ := client.Get(ctx, g).Result()
				if window := lim.Algorithm != TokenBucket; window {
					// A log's expiry moves with time: charge once it has.
					time.Sleep(100 * time.Millisecond)
				}
				if _, err := s.Charge(ctx, leased, Hash(leased), lim, 1000); err != nil {
					t.Fatal(err)
				}
				after, _ := client.Get(ctx, g).Result()
				gttl, _ := client.PTTL(ctx, g).Result() // first: then it runs down first
				cttl, _ := client.PTTL(ctx, s.cfg.Prefix+leased).Result()
				if after != before || gttl < cttl-2*time.Millisecond {
					t.Errorf("%v: generation %q → %q, TTL %v with the counter's %v", lim.Algorithm, before, after, gttl, cttl)
				}
				// The charge leaves a log its newest units only, and a bucket
				// a state under another interval: those give back less.
				if back, err := s.Return(ctx, leased, Hash(leased), lim, 2, l.Token); err != nil || back > 2 ||
					back != 2 && (lim.Algorithm == SlidingWindow || lim.Algorithm == FixedWindow) {
					t.Errorf("%v: return after a charge: %d, %v", lim.Algorithm, back, err)
				}
			}
		})
	}
}

// TestRedisChargeBatchCluster charges many keys, spread over a Cluster's
// slots, in one ChargeBatch, as a memory store is charged, and then takes
// from each on both: the decisions and Remaining agree, on a key charged
// under two algorithms in turn too. Limits are per
// hour, so that the milliseconds between the two stores' instants change
// nothing.
func TestRedisChargeBatchCluster(t *testing.T) {
	checkLeaks(t)
	for _, d := range deployments {
		t.Run(d.name, func(t *testing.T) {
			client := d.client(t)
			s := newTestStore(t, client, patient)
			now := serverNow(d.name, client)
			ctx := context.Background()
			mem := NewMemoryStore(MemoryConfig{})
			rng := rand.New(rand.NewPCG(8, 9))
			var ops []ChargeOp
			base := testKey(t)
			for i := range 200 {
				k := i % 70 // most keys charged more than once
				lim := Limit{Algorithm: Algorithm(k % int(numAlgorithms)), Rate: 20, Period: time.Hour}
				key := fmt.Sprintf("%s:%d", base, k)
				ops = append(ops, ChargeOp{Key: key, Hash: Hash(key), Limit: lim, N: 1 + rng.Int64N(25)})
			}
			// A key charged under two algorithms: each reads the other's
			// state as no usage, so the order of its charges decides.
			mixed := base + ":mixed"
			fixed := Limit{Algorithm: FixedWindow, Rate: 20, Period: time.Hour}
			ops = append(ops, ChargeOp{Key: mixed, Limit: fixed, N: 3}, ChargeOp{Key: mixed, Limit: Limit{Rate: 20, Period: time.Hour}, N: 2},
				ChargeOp{Key: mixed, Limit: fixed, N: 4})
			ops = append(ops, ChargeOp{Key: "none", Limit: ops[0].Limit, N: 0}, ChargeOp{Key: "none", Limit: Limit{Period: time.Hour}, N: 5},
				ChargeOp{Key: "bad", Limit: Limit{Algorithm: numAlgorithms, Rate: 1, Period: time.Second}, N: 1})
			at := now(t)
			s.ChargeBatch(ctx, ops)
			for i, op := range ops[:len(ops)-1] {
				if op.Err != nil || !op.Charged {
					t.Fatalf("op %d: charged %v, %v", i, op.Charged, op.Err)
				}
				mem.ChargeAt(at, op.Key, 0, op.Limit, op.N)
			}
			if ops[len(ops)-1].Err == nil {
				t.Error("a charge under an unknown algorithm did not fail")
			}
			if n, _ := client.Exists(ctx, s.cfg.Prefix+"none").Result(); n != 0 {
				t.Error("a charge of 0, or under a limit of no rate, wrote a counter")
			}
			at = now(t)
			denied := 0
			for _, op := range ops[:len(ops)-3] {
				got := mustTake(t, s, op.Key, op.Limit, 2)
				want := mem.TakeAt(at, op.Key, 0, op.Limit, 2)
				if got.Allowed != want.Allowed || got.Remaining != want.Remaining {
					t.Fatalf("%s (%v): take after charges: redis %+v, memory %+v", op.Key, op.Limit.Algorithm, got, want)
				}
				if !got.Allowed {
					denied++
				}
			}
			if denied == 0 || denied == len(ops)-3 {
				t.Errorf("%d of %d takes denied: want a mix", denied, len(ops)-3)
			}
		})
	}
}

// TestRedisChargeBatchNoScript: after the server lost its scripts,
// ChargeBatch loads them again and charges, in a round trip more, and a
// server that cannot be reached fails every op.
func TestRedisChargeBatchNoScript(t *testing.T) {
	checkLeaks(t)
	ctx := context.Background()
	srv := startOwnServer(t)
	client := newTestClient(t, srv.Addr)
	s := newTestStore(t, client, RedisConfig{})
	sent := &cmdRecorder{}
	client.AddHook(sent)
	ops := make([]ChargeOp, 8)
	for i := range ops {
		ops[i] = ChargeOp{Key: testKey(t), Limit: Limit{Algorithm: Algorithm(i) % numAlgorithms, Rate: 3, Period: longPeriod}, N: 1}
	}
	if err := newTestClient(t, srv.Addr).ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	s.ChargeBatch(ctx, ops)
	for i, op := range ops {
		if op.Err != nil || !op.Charged {
			t.Errorf("op %d after SCRIPT FLUSH: %v, %v; want charged", i, op.Charged, op.Err)
		} else if r := mustTake(t, s, op.Key, op.Limit, 1); !r.Allowed || r.Remaining != 1 {
			t.Errorf("op %d: a take after the charge: %+v, want 1 left", i, r)
		}
	}
	sent.mu.Lock()
	names := slices.Clone(sent.names)
	sent.mu.Unlock()
	if want := []string{"pipeline evalsha", "pipeline script", "pipeline evalsha"}; len(names) < 3 || !slices.Equal(names[:3], want) {
		t.Errorf("round trips %q, want %q first", names, want)
	}
	if err := srv.Kill(); err != nil {
		t.Fatal(err)
	}
	s.ChargeBatch(ctx, ops)
	for i, op := range ops {
		if op.Err == nil || op.Charged {
			t.Errorf("op %d, server down: %v, %v; want an error", i, op.Charged, op.Err)
		}
	}
}
