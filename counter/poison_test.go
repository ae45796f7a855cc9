package counter

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/redis/go-redis/v9"
)

// Tests that a value no take script writes costs only its own key.

// poisons are stored values no take script writes, per algorithm; w is the
// current window of a period of longPeriod, so that window states look
// current.
func poisons(alg Algorithm, w int64) []string {
	switch alg {
	case TokenBucket:
		return []string{"nan", "inf", "-inf", "1e400", "-1e400", "1e300", "99999999999999999999",
			"-5", "1.5", "0x7fffffffffffffff", " nan ", "9007199254740993",
			// "P:I:k" states out of their ranges: an interval of 0 or
			// past 2^53, a level off the scale, P short of O or too long.
			"5000000000000000:0:10", "5000000000000000:9007199254740993:10", "5000000000000000:" + strings.Repeat("9", 400) + ":10",
			"5000000000000000:1000:99", "1999999999999999:1000:10", "50000000000000000:1000:10"}
	case SlidingWindow:
		return []string{
			fmt.Sprintf("%d 99999999999999999999 0", w), fmt.Sprintf("%d 0 99999999999999999999", w),
			fmt.Sprintf("%d %s 0", w, strings.Repeat("9", 400)), fmt.Sprintf("%d 0 %s", w, strings.Repeat("9", 400)),
			fmt.Sprintf("%d 9007199254740993 0", w),
		}
	case FixedWindow:
		return []string{
			fmt.Sprintf("%d 99999999999999999999", w), fmt.Sprintf("%d %s", w, strings.Repeat("9", 400)),
			fmt.Sprintf("%d 9007199254740993", w),
		}
	}
	return []string{"+inf", "1e300", "9007199254740993"} // log scores
}

// poison writes v to key as alg's foreign state: a string, or for the log a
// sorted set holding one entry of score v.
func poison(ctx context.Context, client redis.UniversalClient, alg Algorithm, key, v string) error {
	if alg != SlidingLog {
		return client.Set(ctx, key, v, 0).Err()
	}
	if err := client.Del(ctx, key).Err(); err != nil {
		return err
	}
	return client.Do(ctx, "zadd", key, v, "x").Err()
}

// newPoisonTest returns a client of the test server, a store on it, and
// the window of longPeriod the server's clock is in.
func newPoisonTest(t *testing.T) (*redis.Client, *RedisStore, int64) {
	client := newTestClient(t, testRedisAddr)
	s := newTestStore(t, client, patient)
	tm, err := client.Time(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	return client, s, tm.UnixMicro() / longPeriod.Microseconds()
}

// TestRedisPoisonedState writes values no script writes (non-finite,
// unparsable, out of range) to counters and takes from them while 16
// goroutines take from other counters, batched with them. A poisoned
// counter must start afresh, and cost nothing to the Takes on other keys.
func TestRedisPoisonedState(t *testing.T) {
	checkLeaks(t)
	client, s, w := newPoisonTest(t)
	ctx := context.Background()
	total, failed := 0, 0
	for _, alg := range []Algorithm{TokenBucket, SlidingWindow, FixedWindow, SlidingLog} {
		t.Run(alg.String(), func(t *testing.T) {
			lim := Limit{Algorithm: alg, Rate: MaxLogRate, Period: longPeriod}
			base := testKey(t)
			var otherErrs, poisonedBad atomic.Int64
			var firstErr atomic.Value
			stop := make(chan struct{})
			var wg sync.WaitGroup
			for g := range 16 {
				wg.Go(func() {
					for i := range 200 {
						r, err := s.Take(ctx, fmt.Sprintf("%s:other:%d:%d", base, g, i%50), 0, lim, 1)
						if err != nil {
							otherErrs.Add(1)
							firstErr.CompareAndSwap(nil, err.Error())
						} else if msg := sane(r, lim); msg != "" {
							t.Errorf("other key: %s", msg)
						}
					}
				})
			}
			var pg sync.WaitGroup
			for p := range 4 {
				pg.Go(func() {
					vals := poisons(alg, w)
					for i := 0; ; i++ {
						select {
						case <-stop:
							return
						default:
						}
						v := vals[i%len(vals)]
						key := fmt.Sprintf("%s:poisoned:%d", base, p)
						if err := poison(ctx, client, alg, s.cfg.Prefix+key, v); err != nil {
							t.Error(err)
							return
						}
						r, err := s.Take(ctx, key, 0, lim, 1)
						if err != nil || !r.Allowed || r.Remaining != lim.Rate-1 || sane(r, lim) != "" {
							if poisonedBad.Add(1) <= 3 {
								t.Logf("poisoned with %q: %+v, %v; want a fresh counter", v, r, err)
							}
						}
					}
				})
			}
			wg.Wait()
			close(stop)
			pg.Wait()
			total += 16 * 200
			failed += int(otherErrs.Load())
			if n := otherErrs.Load(); n > 0 {
				t.Errorf("%d of %d Takes on other keys failed, first: %v", n, 16*200, firstErr.Load())
			}
			if n := poisonedBad.Load(); n > 0 {
				t.Errorf("%d Takes on poisoned keys did not start afresh", n)
			}
		})
	}
	t.Logf("%d of %d Takes on other keys failed", failed, total)
}

// TestRedisReshardPoisonedState reshards from and onto counters holding
// poisoned values: they count as unused, as Take reads them, and the
// Reshard neither fails nor writes an expiry that is not a positive number.
func TestRedisReshardPoisonedState(t *testing.T) {
	checkLeaks(t)
	client, s, w := newPoisonTest(t)
	ctx := context.Background()
	errs, runs := 0, 0
	for _, alg := range []Algorithm{TokenBucket, SlidingWindow, FixedWindow, SlidingLog} {
		lim := Limit{Algorithm: alg, Rate: 100, Period: longPeriod, Burst: 100}
		for _, v := range poisons(alg, w) {
			for _, side := range []string{"from", "to"} {
				base := testKey(t)
				used, bad := shardOf(base+":used", lim), shardOf(base+":bad", lim)
				if got := countAdmitted(t, s, used.Name, lim, 60); got != 60 {
					t.Fatalf("%v: drain admitted %d of 60", alg, got)
				}
				kids := children(base, Limit{Algorithm: alg, Rate: 200, Period: longPeriod, Burst: 200}, 4)
				from := []Shard{used, bad}
				poisoned := bad
				if side == "to" {
					from = []Shard{used, shardOf(base+":unused", lim)}
					poisoned = kids[0]
				}
				if err := poison(ctx, client, alg, s.cfg.Prefix+poisoned.Name, v); err != nil {
					t.Fatal(err)
				}
				runs++
				if err := s.Reshard(ctx, from, kids); err != nil {
					errs++
					t.Errorf("%v: %s holding %q: Reshard: %v", alg, side, v, err)
					continue
				}
				// 60 used of the pair's 200, split over four of 50: 15 each.
				for _, c := range kids {
					if got := countAdmitted(t, s, c.Name, c.Limit, 50); got != 35 {
						t.Errorf("%v: %s holding %q: %s admitted %d, want 35", alg, side, v, c.Name, got)
					}
				}
			}
		}
	}
	t.Logf("%d of %d Reshards failed", errs, runs)
}

// countAdmitted takes 1 from key k times and returns how many passed.
func countAdmitted(t *testing.T, s Store, key string, lim Limit, k int) int {
	t.Helper()
	n := 0
	for range k {
		if mustTake(t, s, key, lim, 1).Allowed {
			n++
		}
	}
	return n
}
