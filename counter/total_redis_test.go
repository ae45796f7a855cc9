package counter

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// TestRedisChargeTotalsStore charges totals of two senders on many keys,
// spread over a Cluster's slots, some twice in one batch, through
// RedisStore.ChargeTotals and a memory store: every op charges the same on
// both, a resend of the whole batch charges nothing, and takes after it
// decide the same. The watermarks' key expires no sooner than Keep and is
// not longer. Limits are per hour, so that the milliseconds between the two
// stores' instants change nothing.
func TestRedisChargeTotalsStore(t *testing.T) {
	checkLeaks(t)
	const keep = time.Hour
	for _, d := range deployments {
		t.Run(d.name, func(t *testing.T) {
			client := d.client(t)
			s := newTestStore(t, client, patient)
			now := serverNow(d.name, client)
			ctx := context.Background()
			mem := NewMemoryStore(MemoryConfig{})
			rng := rand.New(rand.NewPCG(12, 13))
			base := testKey(t)
			var ops []TotalOp
			for i := range 300 {
				k := i % 60
				lim := Limit{Algorithm: Algorithm(k % int(numAlgorithms)), Rate: 20, Period: time.Hour}
				key := fmt.Sprintf("%s:%d", base, k)
				ops = append(ops, TotalOp{Key: key, Hash: Hash(key), Limit: lim, From: []string{"a:1", "b:1"}[rng.IntN(2)], Total: rng.Int64N(30), Keep: keep})
			}
			for round := range 2 {
				got, want := slices.Clone(ops), slices.Clone(ops)
				mem.ChargeTotalsAt(now(t), want)
				s.ChargeTotals(ctx, got)
				var charged int64
				for i := range got {
					if got[i].Err != nil || want[i].Err != nil || got[i].Charged != want[i].Charged {
						t.Fatalf("round %d, op %d %+v: redis charged %d, %v; memory %d, %v", round, i, ops[i], got[i].Charged, got[i].Err, want[i].Charged, want[i].Err)
					}
					charged += got[i].Charged
				}
				if round == 0 && charged == 0 || round == 1 && charged != 0 {
					t.Errorf("round %d charged %d units", round, charged)
				}
			}
			at := now(t)
			denied := 0
			for _, op := range ops[:60] {
				got := mustTake(t, s, op.Key, op.Limit, 2)
				want := mem.TakeAt(at, op.Key, 0, op.Limit, 2)
				if got.Allowed != want.Allowed || got.Remaining != want.Remaining {
					t.Fatalf("%s (%v): take after totals: redis %+v, memory %+v", op.Key, op.Limit.Algorithm, got, want)
				}
				if !got.Allowed {
					denied++
				}
			}
			if denied == 0 || denied == 60 {
				t.Errorf("%d of 60 takes denied: want a mix", denied)
			}
			ttl, err := client.PTTL(ctx, markKey(s.cfg.Prefix+ops[0].Key)).Result()
			if err != nil || ttl < keep-time.Minute || ttl > keep {
				t.Errorf("watermarks' TTL %v, %v; want about %v", ttl, err, keep)
			}
		})
	}
}

// TestRedisChargeTotalsNoSlot: a counter whose name holds a '}' but no hash
// tag is charged on a standalone server, and refused on a Cluster, where
// no key of its slot can be named for its watermarks.
func TestRedisChargeTotalsNoSlot(t *testing.T) {
	checkLeaks(t)
	for _, d := range deployments {
		t.Run(d.name, func(t *testing.T) {
			s := newTestStore(t, d.client(t), RedisConfig{})
			lim := Limit{Rate: 10, Period: time.Hour}
			ops := []TotalOp{{Key: testKey(t) + "}", Limit: lim, From: "a", Total: 3, Keep: time.Hour}}
			ops = append(ops, ops[0])
			s.ChargeTotals(context.Background(), ops)
			if d.name == "cluster" {
				if ops[0].Err == nil || ops[1].Err == nil {
					t.Errorf("cluster: %+v; want errors", ops)
				}
				return
			}
			if ops[0].Err != nil || ops[0].Charged != 3 || ops[1].Err != nil || ops[1].Charged != 0 {
				t.Errorf("standalone: %+v; want 3 charged once", ops)
			}
		})
	}
}

// TestRedisChargeTotalsNoScript: after the server lost its scripts,
// ChargeTotals loads them again and charges.
func TestRedisChargeTotalsNoScript(t *testing.T) {
	checkLeaks(t)
	ctx := context.Background()
	srv := startOwnServer(t)
	client := newTestClient(t, srv.Addr)
	s := newTestStore(t, client, RedisConfig{})
	if err := client.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	ops := []TotalOp{{Key: testKey(t), Limit: Limit{Rate: 3, Period: longPeriod}, From: "a", Total: 2, Keep: time.Hour}}
	s.ChargeTotals(ctx, ops)
	if ops[0].Err != nil || ops[0].Charged != 2 {
		t.Fatalf("after SCRIPT FLUSH: charged %d, %v; want 2", ops[0].Charged, ops[0].Err)
	}
	if r := mustTake(t, s, ops[0].Key, ops[0].Limit, 1); !r.Allowed || r.Remaining != 0 {
		t.Errorf("take after 2 of 3 charged: %+v", r)
	}
}

// TestRedisChargeTotalsPrune: a new sender's watermark drops the expired
// fields of the counter's watermarks' key, and keeps the live ones, so
// that the senders of past lives do not pile up on a counter charged all
// along.
func TestRedisChargeTotalsPrune(t *testing.T) {
	checkLeaks(t)
	const keep = time.Minute
	client := newTestClient(t, testRedisAddr)
	run := scriptTotalRunner(client)
	key := testKey(t)
	lim := Limit{Rate: 10, Period: time.Second}
	at := t0
	for _, tt := range []struct {
		wait time.Duration
		from string
		want int64 // fields after the op
	}{
		{0, "a:1", 1},
		{keep / 2, "b:1", 2},
		{keep / 2, "c:1", 2}, // a:1's has expired
		{keep / 2, "c:1", 2}, // not new: drops nothing
		{keep, "d:1", 1},     // b:1's and c:1's have expired
	} {
		at = at.Add(tt.wait)
		ops := []TotalOp{{Key: key, Limit: lim, From: tt.from, Total: 1 + int64(at.Sub(t0)/time.Second), Keep: keep}}
		run.charge(t, at, ops)
		if ops[0].Err != nil || ops[0].Charged == 0 {
			t.Fatalf("%s after %v: charged %d, %v", tt.from, tt.wait, ops[0].Charged, ops[0].Err)
		}
		if n, err := client.HLen(context.Background(), markKey(key)).Result(); err != nil || n != tt.want {
			t.Errorf("%s after %v: %d fields, %v; want %d", tt.from, tt.wait, n, err, tt.want)
		}
	}
}
