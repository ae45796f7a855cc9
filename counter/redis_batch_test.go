package counter

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// TestRedisTakeBatch checks that TakeBatch decides as Take does, in one
// round trip per MaxBatch takes, keeping the order of takes on one key, on
// one server and on a Cluster, with every algorithm and mixed costs.
func TestRedisTakeBatch(t *testing.T) {
	checkLeaks(t)
	for _, tt := range deployments {
		t.Run(tt.name, func(t *testing.T) {
			s := newTestStore(t, tt.client(t), RedisConfig{MaxBatch: 64})
			ctx := context.Background()
			base := testKey(t)
			// 150 takes: 3 round trips of at most 64. Keys k0..k9 each get
			// 15 takes of costs 1, 2, 3, ... under a limit of 20 that does
			// not refill within the test, so each key admits a prefix
			// whose costs sum to at most 20, then one more that fits, and
			// so on: the same decisions a loop of Takes makes.
			for alg := range numAlgorithms {
				lim := Limit{Algorithm: alg, Rate: 20, Period: longPeriod}
				ops := make([]Op, 150)
				for i := range ops {
					ops[i] = Op{Key: fmt.Sprintf("%s:%v:k%d", base, alg, i%10), Limit: lim, N: int64(1 + (i/10)%5)}
				}
				p0 := s.pipelines.Load()
				s.TakeBatch(ctx, ops)
				if got := s.pipelines.Load() - p0; got != 3 {
					t.Errorf("%v: %d round trips for 150 takes in batches of 64, want 3", alg, got)
				}
				used := map[string]int64{}
				for i, op := range ops {
					if op.Err != nil {
						t.Fatalf("%v: take %d: %v", alg, i, op.Err)
					}
					want := used[op.Key]+op.N <= 20
					if op.Result.Allowed != want {
						t.Errorf("%v: take %d (%s, cost %d, %d used): allowed %v, want %v", alg, i, op.Key, op.N, used[op.Key], op.Result.Allowed, want)
					}
					if want {
						used[op.Key] += op.N
					}
				}
			}
		})
	}
}

// TestRedisTakeBatchErrors checks the takes TakeBatch cannot send: an
// unknown algorithm fails alone, a done context and a closed store fail
// them all, and nothing blocks.
func TestRedisTakeBatchErrors(t *testing.T) {
	checkLeaks(t)
	s := newTestStore(t, newTestClient(t, testRedisAddr), RedisConfig{})
	key := testKey(t)
	lim := Limit{Rate: 10, Period: longPeriod}
	ops := []Op{{Key: key, Limit: lim, N: 1}, {Key: key, Limit: Limit{Algorithm: numAlgorithms, Rate: 10, Period: time.Second}, N: 1}, {Key: key, Limit: lim, N: 1}}
	s.TakeBatch(context.Background(), ops)
	if ops[0].Err != nil || ops[2].Err != nil || !ops[0].Result.Allowed || !ops[2].Result.Allowed || ops[2].Result.Remaining != 8 {
		t.Errorf("good takes beside a bad one: %+v, %+v", ops[0], ops[2])
	}
	if ops[1].Err == nil {
		t.Error("unknown algorithm: no error")
	}

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	ops = []Op{{Key: key, Limit: lim, N: 1}, {Key: key + "x", Limit: lim, N: 1}}
	s.TakeBatch(ctx, ops)
	for i, op := range ops {
		if op.Err == nil || op.Result.Allowed {
			t.Errorf("cancelled context, take %d: %+v", i, op)
		}
	}

	s.Close()
	ops = []Op{{Key: key, Limit: lim, N: 1}}
	s.TakeBatch(context.Background(), ops)
	if ops[0].Err == nil {
		t.Error("closed store: no error")
	}
}
