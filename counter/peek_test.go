package counter

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"
)

// TestPeek: on every store and algorithm, Peek answers what a take of one
// unit would, and charges nothing. The period is one no test outlives, so
// that nothing refills.
func TestPeek(t *testing.T) {
	for _, h := range harnesses(t) {
		t.Run(h.name, func(t *testing.T) {
			p, ok := h.store.(Peeker)
			if !ok {
				t.Fatalf("%T is no Peeker", h.store)
			}
			for _, alg := range []Algorithm{TokenBucket, SlidingWindow, FixedWindow, SlidingLog} {
				t.Run(alg.String(), func(t *testing.T) {
					key := uniqueKey(t)
					lim := Limit{Algorithm: alg, Rate: 3, Period: 1000 * time.Hour}
					peek := func() Result {
						t.Helper()
						r, err := p.Peek(context.Background(), key, Hash(key), lim)
						if err != nil {
							t.Fatal(err)
						}
						return r
					}
					for range 5 {
						if r := peek(); !r.Allowed || r.Remaining != 2 || r.Limit != 3 {
							t.Fatalf("peek of a fresh counter of 3: %+v, want allowed with 2 left", r)
						}
					}
					if got := h.takeAll(t, key, lim, 1); got != 1 {
						t.Fatalf("take after peeks: admitted %d of 1", got)
					}
					if r := peek(); !r.Allowed || r.Remaining != 1 {
						t.Fatalf("peek with 2 left: %+v, want allowed with 1 left", r)
					}
					if got := h.takeAll(t, key, lim, 5); got != 2 {
						t.Fatalf("takes after peeks: admitted %d of 5, want 2", got)
					}
					for range 3 {
						if r := peek(); r.Allowed || r.Remaining != 0 || r.RetryAfter <= 0 {
							t.Fatalf("peek of a full counter: %+v, want denied with a retry", r)
						}
					}
				})
			}
		})
	}
}

// TestPeekBatch: on every store, PeekBatch answers for each op what Peek
// does, an op of an unknown algorithm fails alone, and nothing is charged.
func TestPeekBatch(t *testing.T) {
	ctx := context.Background()
	for _, h := range harnesses(t) {
		t.Run(h.name, func(t *testing.T) {
			bp, ok := h.store.(BatchPeeker)
			if !ok {
				t.Fatalf("%T is no BatchPeeker", h.store)
			}
			var ops []PeekOp
			for _, alg := range []Algorithm{TokenBucket, SlidingWindow, FixedWindow, SlidingLog} {
				// Counters of 3 with 0 to 3 units spent: allowed with 2
				// to 0 left, then denied.
				for spent := range 4 {
					key := uniqueKey(t)
					lim := Limit{Algorithm: alg, Rate: 3, Period: 1000 * time.Hour}
					if spent > 0 {
						if got := h.takeAll(t, key, lim, spent); got != spent {
							t.Fatalf("%v: admitted %d of %d", alg, got, spent)
						}
					}
					ops = append(ops, PeekOp{Key: key, Hash: Hash(key), Limit: lim})
				}
			}
			ops = append(ops, PeekOp{Key: uniqueKey(t), Limit: Limit{Algorithm: numAlgorithms, Rate: 3, Period: time.Hour}})
			start := time.Now()
			want := make([]Result, len(ops))
			for i, op := range ops[:len(ops)-1] {
				r, err := bp.Peek(ctx, op.Key, op.Hash, op.Limit)
				if err != nil {
					t.Fatal(err)
				}
				want[i] = r
			}
			for range 2 {
				bp.PeekBatch(ctx, ops)
				elapsed := time.Since(start)
				for i, op := range ops[:len(ops)-1] {
					got, w := op.Result, want[i]
					if op.Err != nil || got.Allowed != w.Allowed || got.Remaining != w.Remaining || got.Limit != w.Limit ||
						got.RetryAfter > w.RetryAfter || w.RetryAfter-got.RetryAfter > elapsed ||
						got.ResetAfter > w.ResetAfter || w.ResetAfter-got.ResetAfter > elapsed {
						t.Errorf("op %d (%v): %+v, %v; want %+v (Peek up to %v before)", i, op.Limit.Algorithm, got, op.Err, w, elapsed)
					}
					if spent := int64(i % 4); got.Allowed != (spent < 3) || got.Remaining != max(0, 2-spent) {
						t.Errorf("op %d (%v), %d of 3 spent: %+v", i, op.Limit.Algorithm, spent, got)
					}
				}
				// The memory store validates nothing, as its Take.
				last := ops[len(ops)-1]
				if _, err := bp.Peek(ctx, last.Key, last.Hash, last.Limit); errors.Is(err, ErrUnknownAlgorithm) != errors.Is(last.Err, ErrUnknownAlgorithm) {
					t.Errorf("op of an unknown algorithm: %+v, %v; Peek's error %v", last.Result, last.Err, err)
				}
			}
			for i, op := range ops[:len(ops)-1] {
				if spent := i % 4; spent < 3 {
					if got := h.takeAll(t, op.Key, op.Limit, 3); got != 3-spent {
						t.Errorf("op %d (%v): takes after peeks admitted %d of 3, want %d", i, op.Limit.Algorithm, got, 3-spent)
					}
				}
			}
		})
	}
}

// TestPeekBatchNoScript: after the server lost its scripts, PeekBatch
// loads them again and answers, in a round trip more, and a server that
// cannot be reached fails every op.
func TestPeekBatchNoScript(t *testing.T) {
	checkLeaks(t)
	ctx := context.Background()
	srv := startOwnServer(t)
	client := newTestClient(t, srv.Addr)
	s := newTestStore(t, client, RedisConfig{})
	sent := &cmdRecorder{}
	client.AddHook(sent)
	ops := make([]PeekOp, 8)
	for i := range ops {
		ops[i] = PeekOp{Key: testKey(t), Limit: Limit{Algorithm: Algorithm(i) % numAlgorithms, Rate: 3, Period: longPeriod}}
	}
	if err := newTestClient(t, srv.Addr).ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	s.PeekBatch(ctx, ops)
	for i, op := range ops {
		if op.Err != nil || !op.Result.Allowed || op.Result.Remaining != 2 {
			t.Errorf("op %d after SCRIPT FLUSH: %+v, %v; want allowed, 2 left", i, op.Result, op.Err)
		}
	}
	sent.mu.Lock()
	names := slices.Clone(sent.names)
	sent.mu.Unlock()
	if want := []string{"pipeline evalsha", "pipeline script", "pipeline evalsha"}; !slices.Equal(names, want) {
		t.Errorf("round trips %q, want %q", names, want)
	}
	if err := srv.Kill(); err != nil {
		t.Fatal(err)
	}
	s.PeekBatch(ctx, ops)
	for i, op := range ops {
		if op.Err == nil || op.Result != (Result{}) {
			t.Errorf("op %d, server down: %+v, %v; want an error", i, op.Result, op.Err)
		}
	}
}
