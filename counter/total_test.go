package counter

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// totalRunner charges totals and takes at given instants: the memory store,
// or totalScript on a standalone server with TIME replaced by arguments.
type totalRunner struct {
	name   string
	charge func(t *testing.T, at time.Time, ops []TotalOp)
	take   func(t *testing.T, at time.Time, key string, lim Limit, n int64) Result
}

func memoryTotalRunner() totalRunner {
	s := NewMemoryStore(MemoryConfig{})
	return totalRunner{
		name:   "memory",
		charge: func(_ *testing.T, at time.Time, ops []TotalOp) { s.ChargeTotalsAt(at, ops) },
		take: func(_ *testing.T, at time.Time, key string, lim Limit, n int64) Result {
			return s.TakeAt(at, key, 0, lim, n)
		},
	}
}

// scriptTotalRunner runs totalScript, one call per op, as ChargeTotals
// builds it on a standalone server; at is in whole µs.
func scriptTotalRunner(client redis.UniversalClient) totalRunner {
	script := scriptSrcAt(totalSource)
	return totalRunner{
		name: "redis",
		charge: func(t *testing.T, at time.Time, ops []TotalOp) {
			t.Helper()
			now := at.UnixMicro()
			for i := range ops {
				op := &ops[i]
				if op.Charged, op.Err = 0, op.check(); op.Err != nil || unlimited(op.Limit) {
					continue
				}
				args := append(appendTotalArgs(nil, op, true), now/1e6, now%1e6)
				v, err := script.Run(context.Background(), client, []string{op.Key, markKey(op.Key), genKey(op.Key)}, args...).Int64Slice()
				if err != nil || len(v) != 1 {
					t.Fatalf("total script: %v, %v", v, err)
				}
				op.Charged = v[0]
			}
		},
		take: func(t *testing.T, at time.Time, key string, lim Limit, n int64) Result {
			return scriptAt(t, client, []string{key}, lim, n, at.UnixMicro())[0]
		},
	}
}

// totalStep is one op of a scenario: after a wait, From's Total, at most
// Most units, and the units it should charge.
type totalStep struct {
	wait  time.Duration
	from  string
	total int64
	want  int64
	most  int64
}

// TestChargeTotals runs scenarios of totals on one counter under every
// algorithm, on the memory store and the total script at fixed instants:
// each op charges what the scenario wants, and takes after it decide as
// on a counter charged those units by ChargeAt.
func TestChargeTotals(t *testing.T) {
	checkLeaks(t)
	const keep = 10 * time.Second
	client := newTestClient(t, testRedisAddr)
	for _, tt := range []struct {
		name  string
		steps []totalStep
	}{
		{"same op twice charges once", []totalStep{{0, "a", 5, 5, 0}, {0, "a", 5, 0, 0}, {time.Second, "a", 5, 0, 0}}},
		{"lower after higher charges nothing", []totalStep{{0, "a", 6, 6, 0}, {0, "a", 2, 0, 0}, {0, "a", 6, 0, 0}, {0, "a", 8, 2, 0}}},
		{"two senders charge their own", []totalStep{{0, "a", 5, 5, 0}, {0, "b", 3, 3, 0}, {0, "a", 6, 1, 0}, {0, "b", 3, 0, 0}, {0, "b", 7, 4, 0}}},
		{"resent after keep charges again", []totalStep{{0, "a", 4, 4, 0}, {keep, "a", 4, 4, 0}, {keep - time.Microsecond, "a", 4, 0, 0}}},
		{"a resend keeps it", []totalStep{{0, "a", 4, 4, 0}, {keep / 2, "a", 4, 0, 0}, {keep / 2, "a", 4, 0, 0}, {keep/2 + time.Microsecond, "a", 4, 0, 0}}},
		{"zero charges nothing", []totalStep{{0, "a", 0, 0, 0}, {0, "a", 3, 3, 0}}},
		{"most caps, the watermark rises", []totalStep{{0, "a", 9, 4, 4}, {0, "a", 9, 0, 4}, {0, "a", 11, 2, 4}, {0, "a", 20, 1, 1}}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			for _, run := range []totalRunner{memoryTotalRunner(), scriptTotalRunner(client)} {
				for _, lim := range chargeLimits {
					ref := NewMemoryStore(MemoryConfig{})
					key := testKey(t)
					at := t0
					for i, st := range tt.steps {
						at = at.Add(st.wait)
						ops := []TotalOp{{Key: key, Limit: lim, From: st.from, Total: st.total, Keep: keep, Most: st.most}}
						run.charge(t, at, ops)
						if ops[0].Err != nil || ops[0].Charged != st.want {
							t.Fatalf("%s %s: step %d (%s %d): charged %d, %v; want %d", run.name, limitName(lim), i, st.from, st.total, ops[0].Charged, ops[0].Err, st.want)
						}
						ref.ChargeAt(at, key, 0, lim, st.want)
					}
					for range 3 {
						at = at.Add((lim.Period / 7).Truncate(time.Microsecond))
						if got, want := run.take(t, at, key, lim, 1), ref.TakeAt(at, key, 0, lim, 1); !sameResult(got, want) {
							t.Fatalf("%s %s: take: %+v, want %+v", run.name, limitName(lim), got, want)
						}
					}
				}
			}
		})
	}
}

// TestRedisChargeTotalsMatchesMemory runs one seeded sequence of totals
// (from three senders, rising, resent and fallen back, under a Keep some
// waits outlive) and takes on two counters, at fixed instants, through the
// total script and the memory store: every op charges the same and every
// take decides the same, for every algorithm, with the same waits while
// they are below a minute (a bucket's take on Redis reads a larger debt as
// 64 spans of its level: see TestRedisChargeDebt).
func TestRedisChargeTotalsMatchesMemory(t *testing.T) {
	checkLeaks(t)
	client := newTestClient(t, testRedisAddr)
	for _, lim := range append(chargeLimits,
		Limit{Algorithm: TokenBucket, Rate: 1000, Period: time.Second, Burst: 50},
		Limit{Algorithm: SlidingLog, Rate: 7, Period: 3 * time.Second},
		Limit{Algorithm: SlidingWindow, Rate: 7, Period: 3 * time.Second},
	) {
		t.Run(limitName(lim)+fmt.Sprint(lim.Rate), func(t *testing.T) {
			mem, red := memoryTotalRunner(), scriptTotalRunner(client)
			rng := rand.New(rand.NewPCG(77, uint64(lim.Algorithm)<<32|uint64(lim.Rate)))
			keys := []string{testKey(t), testKey(t)}
			senders := []string{"a:1", "b:1", "b:2"}
			totals := map[string]int64{}
			keep := lim.Period / 2
			at := t0
			charged, resent, allowed, takes := int64(0), 0, 0, 0
			for i := range 300 {
				at = at.Add(time.Duration(rng.Int64N(int64(lim.Period/3))) / time.Microsecond * time.Microsecond)
				key := keys[rng.IntN(len(keys))]
				if rng.IntN(3) == 0 {
					got, want := red.take(t, at, key, lim, 1), mem.take(t, at, key, lim, 1)
					if got.Allowed != want.Allowed || got.Remaining != want.Remaining || want.RetryAfter < time.Minute && !sameResult(got, want) {
						t.Fatalf("step %d: take: redis %+v, memory %+v", i, got, want)
					}
					if takes++; want.Allowed {
						allowed++
					}
					continue
				}
				var ops []TotalOp
				for range 1 + rng.IntN(3) {
					from := senders[rng.IntN(len(senders))]
					tk := key + "/" + from
					switch rng.IntN(3) {
					case 0: // resent
						resent++
					case 1: // risen
						totals[tk] += 1 + rng.Int64N(lim.Capacity())
					}
					total := totals[tk]
					if rng.IntN(8) == 0 { // fallen back: late
						total = rng.Int64N(total + 1)
					}
					most := []int64{0, 0, 1 + rng.Int64N(lim.Capacity())}[rng.IntN(3)]
					ops = append(ops, TotalOp{Key: key, Limit: lim, From: from, Total: total, Keep: keep, Most: most})
				}
				want := append([]TotalOp(nil), ops...)
				red.charge(t, at, ops)
				mem.charge(t, at, want)
				for j := range ops {
					if ops[j].Err != nil || ops[j].Charged != want[j].Charged || want[j].Err != nil {
						t.Fatalf("step %d, op %+v: redis charged %d, %v; memory %d, %v", i, ops[j], ops[j].Charged, ops[j].Err, want[j].Charged, want[j].Err)
					}
					charged += want[j].Charged
				}
			}
			mix := fmt.Sprintf("%d of %d takes allowed, %d units charged, %d resends", allowed, takes, charged, resent)
			t.Log(mix)
			if allowed == 0 || allowed == takes || charged == 0 || resent == 0 {
				t.Errorf("%s: want a mix", mix)
			}
		})
	}
}

// TestChargeTotalsInvalid: an invalid op sets Err and charges nothing, on
// every store; a limit of no rate charges nothing and is no error.
func TestChargeTotalsInvalid(t *testing.T) {
	checkLeaks(t)
	lim := Limit{Rate: 10, Period: time.Second}
	type store struct {
		name string
		s    TotalCharger
	}
	mem := NewMemoryStore(MemoryConfig{})
	stores := []store{{"memory", mem}}
	for _, d := range deployments {
		stores = append(stores, store{d.name, newTestStore(t, d.client(t), RedisConfig{})})
	}
	for _, tt := range []struct {
		name string
		give TotalOp
		want error
	}{
		{"empty from", TotalOp{Limit: lim, Total: 1, Keep: time.Second}, ErrInvalidTotal},
		{"long from", TotalOp{Limit: lim, From: strings.Repeat("x", MaxFromLen+1), Total: 1, Keep: time.Second}, ErrInvalidTotal},
		{"negative total", TotalOp{Limit: lim, From: "a", Total: -1, Keep: time.Second}, ErrInvalidTotal},
		{"total past MaxCount", TotalOp{Limit: lim, From: "a", Total: MaxCount + 1, Keep: time.Second}, ErrInvalidTotal},
		{"zero keep", TotalOp{Limit: lim, From: "a", Total: 1}, ErrInvalidTotal},
		{"negative keep", TotalOp{Limit: lim, From: "a", Total: 1, Keep: -time.Second}, ErrInvalidTotal},
		{"unknown algorithm", TotalOp{Limit: Limit{Algorithm: numAlgorithms, Rate: 1, Period: time.Second}, From: "a", Total: 1, Keep: time.Second}, ErrUnknownAlgorithm},
		{"no rate", TotalOp{Limit: Limit{Period: time.Second}, From: "a", Total: 1, Keep: time.Second}, nil},
		{"no period", TotalOp{Limit: Limit{Rate: 1}, From: "a", Total: 1, Keep: time.Second}, nil},
	} {
		for _, st := range stores {
			key := testKey(t)
			ops := []TotalOp{tt.give, {Key: key, Limit: lim, From: "a", Total: 3, Keep: time.Hour}}
			ops[0].Key = key
			st.s.ChargeTotals(context.Background(), ops)
			if !errors.Is(ops[0].Err, tt.want) || tt.want == nil && ops[0].Err != nil || ops[0].Charged != 0 {
				t.Errorf("%s %s: charged %d, %v; want nothing, %v", st.name, tt.name, ops[0].Charged, ops[0].Err, tt.want)
			}
			if ops[1].Err != nil || ops[1].Charged != 3 {
				t.Errorf("%s %s: the valid op after it: charged %d, %v; want 3", st.name, tt.name, ops[1].Charged, ops[1].Err)
			}
		}
	}
	if n := mem.Watermarks(); n != 9 {
		t.Errorf("memory holds %d watermarks, want the valid ops' 9", n)
	}
}

// TestChargeTotalsStripeFull: a total the counter's full stripe cannot
// hold is an Err (ErrFull, counted by Full) and leaves no watermark, so
// that its resend, once there is room, charges it.
func TestChargeTotalsStripeFull(t *testing.T) {
	now := t0
	s := NewMemoryStore(MemoryConfig{MaxKeys: 1, Stripes: 1, Clock: func() time.Time { return now }})
	lim := Limit{Rate: 10, Period: time.Hour}
	s.TakeAt(now, "other", 0, lim, 1)
	op := []TotalOp{{Key: "k", Limit: lim, From: "a", Total: 5, Keep: time.Hour}}
	s.ChargeTotals(context.Background(), op)
	if !errors.Is(op[0].Err, ErrFull) || op[0].Charged != 0 || s.Full() != 1 || s.Watermarks() != 0 {
		t.Fatalf("charge in a full stripe: charged %d, %v, full %d, %d watermarks; want ErrFull, 1, 0", op[0].Charged, op[0].Err, s.Full(), s.Watermarks())
	}
	if err := s.Delete(context.Background(), []Shard{{Name: "other"}}); err != nil {
		t.Fatal(err)
	}
	s.ChargeTotals(context.Background(), op)
	if op[0].Err != nil || op[0].Charged != 5 {
		t.Fatalf("resend with room: charged %d, %v; want 5", op[0].Charged, op[0].Err)
	}
	if r := s.TakeAt(now, "k", 0, lim, 6); r.Allowed || r.Remaining != 5 {
		t.Errorf("take of 6 after 5 charged of 10: %+v", r)
	}
}

// TestChargeTotalsCap: past MaxWatermarks a new watermark is refused
// (ErrWatermarksFull, counted), while those held go on charging and are
// never dropped before their expiry; once they expire, a sweep makes room.
func TestChargeTotalsCap(t *testing.T) {
	const keep = time.Minute
	s := NewMemoryStore(MemoryConfig{MaxWatermarks: 2, Stripes: 4})
	lim := Limit{Rate: 100, Period: time.Hour}
	at := t0
	charge := func(key, from string, total int64) TotalOp {
		ops := []TotalOp{{Key: key, Limit: lim, From: from, Total: total, Keep: keep}}
		s.ChargeTotalsAt(at, ops)
		return ops[0]
	}
	for _, tt := range []struct {
		wait      time.Duration
		key, from string
		total     int64
		want      int64
		wantErr   error
	}{
		{0, "k1", "a", 3, 3, nil},
		{0, "k2", "a", 4, 4, nil},
		{0, "k1", "b", 5, 0, ErrWatermarksFull},
		{0, "k1", "a", 6, 3, nil},        // held: needs no room
		{keep / 2, "k1", "a", 6, 0, nil}, // kept a while more
		{keep/2 - 1, "k3", "c", 1, 0, ErrWatermarksFull},
		{1, "k3", "c", 2, 2, nil}, // k2's has expired: swept
		{0, "k1", "a", 6, 0, nil}, // k1's is kept
		{0, "k2", "a", 4, 0, ErrWatermarksFull},
	} {
		at = at.Add(tt.wait)
		op := charge(tt.key, tt.from, tt.total)
		if op.Charged != tt.want || !errors.Is(op.Err, tt.wantErr) || tt.wantErr == nil && op.Err != nil {
			t.Fatalf("%s %s %d after %v: charged %d, %v; want %d, %v", tt.key, tt.from, tt.total, tt.wait, op.Charged, op.Err, tt.want, tt.wantErr)
		}
	}
	if n, r := s.Watermarks(), s.WatermarksRefused(); n != 2 || r != 3 {
		t.Errorf("%d watermarks, %d refused; want 2, 3", n, r)
	}
}
