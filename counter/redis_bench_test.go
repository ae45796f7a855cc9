package counter

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"
)

// serverCPU returns the CPU time the server at client has used so far.
func serverCPU(b *testing.B, client *redis.Client) time.Duration {
	info, err := client.Info(context.Background(), "cpu").Result()
	if err != nil {
		b.Fatal(err)
	}
	var total float64
	for line := range strings.SplitSeq(info, "\r\n") {
		if name, v, ok := strings.Cut(line, ":"); ok && (name == "used_cpu_sys" || name == "used_cpu_user") {
			f, _ := strconv.ParseFloat(v, 64)
			total += f
		}
	}
	return time.Duration(total * float64(time.Second))
}

// reportRate reports decisions/s and the server's CPU time per decision
// since cpu0, the figure batching and script design try to cut.
func reportRate(b *testing.B, client *redis.Client, cpu0 time.Duration) {
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "decisions/s")
	b.ReportMetric(float64(serverCPU(b, client)-cpu0)/float64(time.Microsecond)/float64(b.N), "server-µs/op")
}

// benchLimit admits everything the benchmarks send.
var benchLimit = Limit{Rate: 1_000_000, Period: time.Second, Burst: 1 << 30}

// benchKeys are distinct counter names, so the benchmarks measure the store
// rather than one hot key.
var benchKeys = func() []string {
	keys := make([]string, 1<<14)
	for i := range keys {
		keys[i] = "bench:" + strconv.Itoa(i)
	}
	return keys
}()

// runDecisions runs decide over benchKeys from 32×GOMAXPROCS goroutines and
// reports decisions/s and the server's CPU time per decision.
func runDecisions(b *testing.B, client *redis.Client, decide func(key string) error) {
	var seq atomic.Uint64
	b.ReportAllocs()
	b.SetParallelism(32)
	cpu0 := serverCPU(b, client)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		i := seq.Add(1) * 7919
		for pb.Next() {
			i++
			if err := decide(benchKeys[i%uint64(len(benchKeys))]); err != nil {
				b.Error(err)
				return
			}
		}
	})
	reportRate(b, client, cpu0)
}

// BenchmarkRedisTake measures the store's decisions/s with 32×GOMAXPROCS
// goroutines on one local server. BenchmarkRedisRateBaseline is the same
// load through go-redis/redis_rate (one EVALSHA per call).
func BenchmarkRedisTake(b *testing.B) {
	client := redis.NewClient(&redis.Options{Addr: testRedisAddr})
	defer client.Close()
	s, err := NewRedisStore(context.Background(), client, RedisConfig{})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	runDecisions(b, client, func(key string) error {
		if r, err := s.Take(context.Background(), key, 0, benchLimit, 1); err != nil || !r.Allowed {
			return fmt.Errorf("Take = %+v, %v", r, err)
		}
		return nil
	})
	if p := s.pipelines.Load(); p > 0 {
		b.ReportMetric(float64(s.calls.Load())/float64(p), "calls/batch")
	}
}

func BenchmarkRedisRateBaseline(b *testing.B) {
	client := redis.NewClient(&redis.Options{Addr: testRedisAddr})
	defer client.Close()
	limiter := redis_rate.NewLimiter(client)
	limit := redis_rate.PerSecond(1 << 30)
	runDecisions(b, client, func(key string) error {
		if r, err := limiter.Allow(context.Background(), key, limit); err != nil || r.Allowed == 0 {
			return fmt.Errorf("Allow = %+v, %v", r, err)
		}
		return nil
	})
}

// BenchmarkRedisHotTake and BenchmarkRedisHotReserve decide one key, as a
// hot key is decided, from 32×GOMAXPROCS goroutines: every decision a
// store call, or through three instances' ReserveStores (sync: reserve)
// that lease blocks of it from the same server. storecalls/op is the
// server's share of the work.
func BenchmarkRedisHotTake(b *testing.B) {
	client := redis.NewClient(&redis.Options{Addr: testRedisAddr})
	defer client.Close()
	s, err := NewRedisStore(context.Background(), client, RedisConfig{Prefix: "bench-hot:"})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	key := fmt.Sprintf("take-%d", time.Now().UnixNano())
	runHot(b, client, func(int) (Result, error) { return s.Take(context.Background(), key, 0, benchLimit, 1) })
	b.ReportMetric(1, "storecalls/op")
}

func BenchmarkRedisHotReserve(b *testing.B) {
	client := redis.NewClient(&redis.Options{Addr: testRedisAddr})
	defer client.Close()
	s, err := NewRedisStore(context.Background(), client, RedisConfig{Prefix: "bench-hot:"})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	var instances [3]*ReserveStore
	for i := range instances {
		instances[i] = NewReserveStore(s, ReserveConfig{Instances: func() int { return len(instances) }})
	}
	key := fmt.Sprintf("reserve-%d", time.Now().UnixNano())
	runHot(b, client, func(i int) (Result, error) {
		return instances[i%len(instances)].Take(context.Background(), key, 0, benchLimit, 1)
	})
	var calls uint64
	for _, r := range instances {
		r.Close()
		st := r.Stats()
		calls += st.Leases + st.Takes + st.Returns
	}
	b.ReportMetric(float64(calls)/float64(b.N), "storecalls/op")
}

// runHot runs decide from 32×GOMAXPROCS goroutines, each with a number of
// its own, and reports decisions/s and the server's CPU time per decision.
func runHot(b *testing.B, client *redis.Client, decide func(goroutine int) (Result, error)) {
	var seq atomic.Int64
	b.ReportAllocs()
	b.SetParallelism(32)
	cpu0 := serverCPU(b, client)
	b.RunParallel(func(pb *testing.PB) {
		g := int(seq.Add(1))
		for pb.Next() {
			if r, err := decide(g); err != nil || !r.Allowed {
				b.Errorf("decide = %+v, %v", r, err)
				return
			}
		}
	})
	reportRate(b, client, cpu0)
}

// BenchmarkRedisChargeBatch charges batches of 256 distinct keys, as a
// round of charges from other regions does, on one goroutine: one pipeline
// a batch. BenchmarkRedisTakeBatch is the same batches taken (one script
// call for the batch's keys on one server), its baseline. An op is one
// key.
func BenchmarkRedisChargeBatch(b *testing.B) {
	client, s := benchStore(b)
	ops := make([]ChargeOp, 256)
	runBatches(b, client, len(ops), func(start int) error {
		for i := range ops {
			ops[i] = ChargeOp{Key: benchKeys[(start+i)%len(benchKeys)], Limit: benchLimit, N: 1}
		}
		s.ChargeBatch(context.Background(), ops)
		for _, op := range ops {
			if op.Err != nil || !op.Charged {
				return fmt.Errorf("charge = %v, %v", op.Charged, op.Err)
			}
		}
		return nil
	})
}

func BenchmarkRedisTakeBatch(b *testing.B) {
	client, s := benchStore(b)
	ops := make([]Op, 256)
	runBatches(b, client, len(ops), func(start int) error {
		for i := range ops {
			ops[i] = Op{Key: benchKeys[(start+i)%len(benchKeys)], Limit: benchLimit, N: 1}
		}
		s.TakeBatch(context.Background(), ops)
		for _, op := range ops {
			if op.Err != nil || !op.Result.Allowed {
				return fmt.Errorf("take = %+v, %v", op.Result, op.Err)
			}
		}
		return nil
	})
}

// benchStore returns a client of the test server and a store over it,
// closed when b ends.
func benchStore(b *testing.B) (*redis.Client, *RedisStore) {
	client := redis.NewClient(&redis.Options{Addr: testRedisAddr})
	b.Cleanup(func() { client.Close() })
	s, err := NewRedisStore(context.Background(), client, RedisConfig{Prefix: "bench-batch:"})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Close() })
	return client, s
}

// runBatches runs batch, of size keys each, until b.N keys are done, and
// reports keys/s and the server's CPU time per key.
func runBatches(b *testing.B, client *redis.Client, size int, batch func(start int) error) {
	b.ReportAllocs()
	cpu0 := serverCPU(b, client)
	b.ResetTimer()
	for done := 0; done < b.N; done += size {
		if err := batch(done); err != nil {
			b.Fatal(err)
		}
	}
	reportRate(b, client, cpu0)
}
