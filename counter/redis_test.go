package counter

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/hotkeyd/hotkey/internal/redistest"
)

// checkLeaks fails t if goroutines started during t outlive it. Call it
// first: cleanups run last-registered first, so it runs after the stores
// and clients registered later are closed.
func checkLeaks(t *testing.T) {
	t.Helper()
	opt := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, opt) })
}

// newTestClient returns a client of addr, closed when t ends.
func newTestClient(t *testing.T, addr string) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { c.Close() })
	return c
}

// testTimeout is the store's round-trip deadline in tests that are not
// about it: long enough for any loaded machine.
const testTimeout = 30 * time.Second

// newTestStore returns a store over client, closed when t ends. A zero
// cfg.Timeout is testTimeout.
func newTestStore(t *testing.T, client redis.UniversalClient, cfg RedisConfig) *RedisStore {
	t.Helper()
	if cfg.Timeout == 0 {
		cfg.Timeout = testTimeout
	}
	s, err := NewRedisStore(context.Background(), client, cfg)
	if err != nil {
		t.Fatalf("NewRedisStore: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// startOwnServer starts a standalone server of t's own, for tests that kill or
// pause it.
func startOwnServer(t *testing.T) *redistest.Server {
	t.Helper()
	srv, err := redistest.Start(testDir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	return srv
}

// testKey returns a counter name no other test uses.
func testKey(t *testing.T) string {
	return fmt.Sprintf("%s:%x", t.Name(), rand.Uint64())
}

func mustTake(t *testing.T, s Store, key string, lim Limit, n int64) Result {
	t.Helper()
	r, err := s.Take(context.Background(), key, Hash(key), lim, n)
	if err != nil {
		t.Fatalf("Take(%q, %+v, %d): %v", key, lim, n, err)
	}
	return r
}

// longPeriod is a period no test outlives, so window boundaries (aligned to the
// Unix epoch) practically never fall inside a test.
const longPeriod = 1000 * time.Hour

func TestRedisTakeBasic(t *testing.T) {
	checkLeaks(t)
	s := newTestStore(t, newTestClient(t, testRedisAddr), RedisConfig{})
	for _, tt := range []struct {
		give Limit
		want int64 // admitted before the first denial
	}{
		{Limit{Algorithm: TokenBucket, Rate: 3, Period: longPeriod}, 3},
		{Limit{Algorithm: TokenBucket, Rate: 1, Period: longPeriod, Burst: 5}, 5},
		{Limit{Algorithm: SlidingWindow, Rate: 3, Period: longPeriod}, 3},
		{Limit{Algorithm: FixedWindow, Rate: 3, Period: longPeriod}, 3},
		{Limit{Algorithm: SlidingLog, Rate: 3, Period: longPeriod}, 3},
	} {
		t.Run(fmt.Sprintf("%v/burst%d", tt.give.Algorithm, tt.give.Burst), func(t *testing.T) {
			key := testKey(t)
			for i := range tt.want {
				r := mustTake(t, s, key, tt.give, 1)
				if !r.Allowed || r.Remaining != tt.want-i-1 || r.Limit != tt.want || r.RetryAfter != 0 {
					t.Fatalf("take %d = %+v, want allowed with %d remaining of %d", i, r, tt.want-i-1, tt.want)
				}
				if maxReset := time.Duration(tt.want) * longPeriod; r.ResetAfter <= 0 || r.ResetAfter > maxReset {
					t.Errorf("take %d: ResetAfter = %v, want in (0, %v]", i, r.ResetAfter, maxReset)
				}
			}
			r := mustTake(t, s, key, tt.give, 1)
			if r.Allowed || r.Remaining != 0 {
				t.Fatalf("take %d = %+v, want denied with 0 remaining", tt.want, r)
			}
			if r.RetryAfter <= 0 || r.RetryAfter > longPeriod {
				t.Errorf("RetryAfter = %v, want in (0, %v]", r.RetryAfter, longPeriod)
			}

			// A cost: 2 of 3 on a fresh counter leaves 1; 2 more is denied.
			key = testKey(t)
			if r := mustTake(t, s, key, tt.give, 2); !r.Allowed || r.Remaining != tt.want-2 {
				t.Fatalf("cost 2 = %+v, want allowed with %d remaining", r, tt.want-2)
			}
			if tt.want == 3 {
				if r := mustTake(t, s, key, tt.give, 2); r.Allowed || r.Remaining != 1 {
					t.Fatalf("cost 2 again = %+v, want denied with 1 remaining", r)
				}
			}
		})
	}
}

// TestRedisForeignState checks that a key holding another algorithm's state
// starts afresh and does not fail the other decisions of its batch.
func TestRedisForeignState(t *testing.T) {
	checkLeaks(t)
	client := newTestClient(t, testRedisAddr)
	s := newTestStore(t, client, RedisConfig{})
	ctx := context.Background()
	for _, alg := range []Algorithm{TokenBucket, SlidingWindow, FixedWindow, SlidingLog} {
		lim := Limit{Algorithm: alg, Rate: 5, Period: longPeriod}
		for _, foreign := range []func(key string) error{
			func(key string) error { return client.ZAdd(ctx, key, redis.Z{Score: 1, Member: "x"}).Err() },
			func(key string) error { return client.Set(ctx, key, "not a counter", 0).Err() },
			func(key string) error { return client.HSet(ctx, key, "f", "v").Err() },
		} {
			key := testKey(t)
			if err := foreign("hk:" + key); err != nil {
				t.Fatal(err)
			}
			var wg sync.WaitGroup
			for i := range 20 { // batched with the foreign key
				wg.Go(func() { mustTake(t, s, fmt.Sprintf("%s:%d", key, i), lim, 1) })
			}
			if r := mustTake(t, s, key, lim, 1); !r.Allowed || r.Remaining != 4 {
				t.Errorf("%v over foreign state: %+v, want a fresh counter", alg, r)
			}
			wg.Wait()
		}
	}
}

func TestRedisUnknownAlgorithm(t *testing.T) {
	checkLeaks(t)
	s := newTestStore(t, newTestClient(t, testRedisAddr), RedisConfig{})
	_, err := s.Take(context.Background(), testKey(t), 0, Limit{Algorithm: numAlgorithms, Rate: 1, Period: time.Second}, 1)
	if !errors.Is(err, ErrUnknownAlgorithm) {
		t.Fatalf("err = %v, want ErrUnknownAlgorithm", err)
	}
}

func TestRedisInvalidPrefix(t *testing.T) {
	checkLeaks(t)
	_, err := NewRedisStore(context.Background(), newTestClient(t, testRedisAddr), RedisConfig{Prefix: "a{b}:"})
	if !errors.Is(err, ErrInvalidPrefix) || !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("err = %v, want ErrInvalidPrefix and ErrInvalidConfig", err)
	}
}

// TestRedisScriptsMatchMemory runs every script on fixed instants (TIME
// replaced by arguments) and checks each decision against the memory store's
// at the same instant: the scripts mirror algorithm.go. Each script call
// carries 1 to 3 Takes on two counters, as a batch does. Token intervals are
// whole µs, so that rounding to µs loses nothing.
func TestRedisScriptsMatchMemory(t *testing.T) {
	checkLeaks(t)
	client := newTestClient(t, testRedisAddr)
	ctx := context.Background()
	for _, lim := range []Limit{
		{Algorithm: TokenBucket, Rate: 10, Period: time.Hour},
		{Algorithm: TokenBucket, Rate: 6, Period: time.Minute, Burst: 3},
		{Algorithm: TokenBucket, Rate: 1000, Period: time.Second, Burst: 50},
		{Algorithm: TokenBucket, Rate: 4, Period: 10 * time.Second, Burst: 20},
		{Algorithm: SlidingWindow, Rate: 10, Period: time.Hour},
		{Algorithm: SlidingWindow, Rate: 7, Period: 3 * time.Hour},
		{Algorithm: SlidingWindow, Rate: 1000, Period: time.Second},
		{Algorithm: FixedWindow, Rate: 10, Period: time.Hour},
		{Algorithm: FixedWindow, Rate: 7, Period: 3 * time.Hour},
		{Algorithm: FixedWindow, Rate: 1000, Period: time.Second},
		{Algorithm: SlidingLog, Rate: 10, Period: time.Hour},
		{Algorithm: SlidingLog, Rate: 7, Period: 3 * time.Hour},
		{Algorithm: SlidingLog, Rate: 600, Period: time.Minute},
	} {
		t.Run(fmt.Sprintf("%v/%d/%v/%d", lim.Algorithm, lim.Rate, lim.Period, lim.Burst), func(t *testing.T) {
			src := strings.Replace(scripts[lim.Algorithm], "redis.call('TIME')", "{ARGV[#ARGV - 1], ARGV[#ARGV]}", 1)
			script := redis.NewScript(src)
			mem := NewMemoryStore(MemoryConfig{})
			counters := []string{testKey(t), testKey(t)}
			rng := rand.New(rand.NewPCG(1, uint64(lim.Algorithm)))
			now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixMicro()
			span := lim.Period.Microseconds() / 4 // most steps refill part of the limit
			if lim.Algorithm == TokenBucket {
				span = lim.Period.Microseconds() * lim.Capacity() / lim.Rate / 4
			}
			allowed, takes := 0, 0
			for i := range 200 {
				now += rng.Int64N(span)
				batch := make([]call, 1+rng.IntN(5))
				var keys []string
				var args []any
				tb := lim.Algorithm == TokenBucket
				first := rng.IntN(len(counters)) // a token bucket's keys: this one's takes, then the other's
				n := int64(1)
				for j := range batch {
					if !tb || j == 0 {
						n = 1
						if rng.IntN(2) == 0 {
							n = 1 + rng.Int64N(lim.Capacity())
						}
					}
					batch[j].setArgs(lim, n)
					if tb { // one cost per call, a key's takes next to each other, as worker.group sends them
						keys = append(keys, counters[(first+j*len(counters)/len(batch))%len(counters)])
						if j == 0 {
							args = batch[j].appendArgs(args)
						}
					} else {
						keys = append(keys, counters[rng.IntN(len(counters))])
						args = batch[j].appendArgs(args)
					}
				}
				v, err := script.Run(ctx, client, keys, append(args, now/1e6, now%1e6)...).Int64Slice()
				if err != nil {
					t.Fatalf("script: %v", err)
				}
				width := replyWidth[lim.Algorithm]
				if len(v) != width*len(batch) {
					t.Fatalf("reply %v: want %d integers", v, width*len(batch))
				}
				for j := range batch {
					got := batch[j].decode(v[j*width : (j+1)*width])
					want := mem.TakeAt(time.UnixMicro(now), keys[j], 0, lim, batch[j].n)
					if got.Allowed != want.Allowed || got.Remaining != want.Remaining ||
						!nearMicro(got.RetryAfter, want.RetryAfter) || !nearMicro(got.ResetAfter, want.ResetAfter) {
						t.Fatalf("step %d, take %d of %d (n=%d): redis %+v, memory %+v", i, j, len(batch), batch[j].n, got, want)
					}
					if takes++; got.Allowed {
						allowed++
					}
				}
			}
			if allowed < takes/10 || allowed > takes*9/10 {
				t.Errorf("%d of %d allowed: want a mix of decisions", allowed, takes)
			}
		})
	}
}

// nearMicro reports whether a script's µs duration matches the memory store's
// ns one: they differ by rounding to µs.
func nearMicro(us, ns time.Duration) bool {
	return us-ns < time.Microsecond && ns-us < time.Microsecond
}

// deployments are the two Redis deployments a store runs on: one server,
// and a 3-master Cluster; client opens a client to it, closed at cleanup.
var deployments = []struct {
	name   string
	client func(t *testing.T) redis.UniversalClient
}{
	{"standalone", func(t *testing.T) redis.UniversalClient { return newTestClient(t, testRedisAddr) }},
	{"cluster", func(t *testing.T) redis.UniversalClient {
		c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: testClusterAddrs})
		t.Cleanup(func() { c.Close() })
		return c
	}},
}

// TestRedisConcurrentTakes proves the scripts atomic under batching: 64
// goroutines race for 1000 units and exactly 1000 pass.
func TestRedisConcurrentTakes(t *testing.T) {
	checkLeaks(t)
	for _, tt := range deployments {
		t.Run(tt.name, func(t *testing.T) {
			s := newTestStore(t, tt.client(t), RedisConfig{})
			for alg := range numAlgorithms {
				lim := Limit{Algorithm: alg, Rate: 1000, Period: longPeriod}
				key := testKey(t)
				var admitted atomic.Int64
				var wg sync.WaitGroup
				for range 64 {
					wg.Go(func() {
						for range 200 {
							r, err := s.Take(context.Background(), key, 0, lim, 1)
							if err != nil {
								t.Error(err)
								return
							}
							if r.Allowed {
								admitted.Add(1)
							}
						}
					})
				}
				wg.Wait()
				if got := admitted.Load(); got != 1000 {
					t.Errorf("%v: admitted %d, want 1000", alg, got)
				}
			}
			calls, pipes := s.calls.Load(), s.pipelines.Load()
			t.Logf("%d calls in %d round trips", calls, pipes)
			if calls < 2*pipes {
				t.Errorf("%d calls in %d round trips: want batches of 2 or more on average", calls, pipes)
			}
		})
	}
}

// TestRedisNoScript checks that lost scripts (SCRIPT FLUSH, or a restart)
// are reloaded and the calls retried.
func TestRedisNoScript(t *testing.T) {
	checkLeaks(t)
	ctx := context.Background()
	t.Run("standalone", func(t *testing.T) {
		client := newTestClient(t, testRedisAddr)
		s := newTestStore(t, client, RedisConfig{})
		lim := Limit{Rate: 1000, Period: longPeriod}
		mustTake(t, s, testKey(t), lim, 1)
		if err := client.ScriptFlush(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		key := testKey(t)
		var wg sync.WaitGroup
		for range 50 {
			wg.Go(func() { mustTake(t, s, key, lim, 1) })
		}
		wg.Wait()
		if r := mustTake(t, s, key, lim, 1); r.Remaining != 1000-51 {
			t.Errorf("remaining %d, want %d", r.Remaining, 1000-51)
		}
	})
	t.Run("cluster", func(t *testing.T) {
		client := redis.NewClusterClient(&redis.ClusterOptions{Addrs: testClusterAddrs})
		t.Cleanup(func() { client.Close() })
		s := newTestStore(t, client, RedisConfig{})
		for _, addr := range testClusterAddrs {
			if err := newTestClient(t, addr).ScriptFlush(ctx).Err(); err != nil {
				t.Fatal(err)
			}
		}
		var wg sync.WaitGroup
		for i := range 100 {
			key := testKey(t) + strconv.Itoa(i)
			wg.Go(func() {
				mustTake(t, s, key, Limit{Algorithm: Algorithm(i) % numAlgorithms, Rate: 10, Period: longPeriod}, 1)
			})
		}
		wg.Wait()
	})
}

// TestRedisNoScriptDeadlines checks that each round trip of a NOSCRIPT
// recovery (the call, the reload, the retry) gets a Timeout of its own, so
// that a slow server does not leave the retry without time.
func TestRedisNoScriptDeadlines(t *testing.T) {
	checkLeaks(t)
	client := newTestClient(t, testRedisAddr)
	h := &cmdRecorder{}
	client.AddHook(h)
	const timeout = time.Hour
	s := newTestStore(t, client, RedisConfig{Timeout: timeout})
	lim := Limit{Rate: 10, Period: longPeriod}
	mustTake(t, s, testKey(t), lim, 1)
	if err := newTestClient(t, testRedisAddr).ScriptFlush(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	h.reset()
	mustTake(t, s, testKey(t), lim, 1)
	h.mu.Lock()
	defer h.mu.Unlock()
	if want := []string{"evalsha", "pipeline script", "evalsha"}; !slices.Equal(h.names, want) {
		t.Fatalf("round trips %q, want %q", h.names, want)
	}
	for i := 1; i < len(h.names); i++ {
		// Round trip i's deadline was set after round trip i-1 started.
		if earliest := h.at[i-1].Add(timeout); h.deadlines[i].Before(earliest) {
			t.Errorf("%s after %s: deadline %v before %v, Timeout after the previous round trip started",
				h.names[i], h.names[i-1], h.deadlines[i], earliest)
		}
	}
}

// cmdRecorder records each command or pipeline a client sends, when, and
// the deadline of its ctx.
type cmdRecorder struct {
	mu        sync.Mutex
	names     []string
	at        []time.Time
	deadlines []time.Time
}

func (h *cmdRecorder) record(ctx context.Context, name string) {
	d, _ := ctx.Deadline()
	h.mu.Lock()
	defer h.mu.Unlock()
	h.names = append(h.names, name)
	h.at = append(h.at, time.Now())
	h.deadlines = append(h.deadlines, d)
}

// count returns how many commands named name were sent.
func (h *cmdRecorder) count(name string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, got := range h.names {
		if got == name {
			n++
		}
	}
	return n
}

func (h *cmdRecorder) reset() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.names, h.at, h.deadlines = nil, nil, nil
}

func (h *cmdRecorder) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *cmdRecorder) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.record(ctx, cmd.Name())
		return next(ctx, cmd)
	}
}

func (h *cmdRecorder) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.record(ctx, "pipeline "+cmds[0].Name())
		return next(ctx, cmds)
	}
}

func TestRedisContextDone(t *testing.T) {
	checkLeaks(t)
	srv := startOwnServer(t)
	admin := newTestClient(t, srv.Addr)
	s := newTestStore(t, newTestClient(t, srv.Addr), RedisConfig{})
	lim := Limit{Rate: 10, Period: longPeriod}

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := s.Take(ctx, testKey(t), 0, lim, 1); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled ctx: err = %v, want context.Canceled", err)
	}

	// While the server holds scripts back (a pause far longer than the
	// test), the call is in flight; its ctx ends first and Take returns,
	// without an answer from the server. CLIENT UNPAUSE (not paused by
	// WRITE) ends the pause.
	const pause = 5 * time.Minute
	if err := admin.Do(context.Background(), "CLIENT", "PAUSE", pause.Milliseconds(), "WRITE").Err(); err != nil {
		t.Fatal(err)
	}
	defer admin.Do(context.Background(), "CLIENT", "UNPAUSE")
	ctx, cancel = context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := s.Take(ctx, testKey(t), 0, lim, 1)
	took := time.Since(start)
	t.Logf("Take returned %v after it started, its ctx ending after 20ms", took)
	if !errors.Is(err, context.DeadlineExceeded) || !strings.HasPrefix(err.Error(), "redis take: ") {
		t.Errorf("paused server: err = %v, want wrapped context.DeadlineExceeded", err)
	}
	if took >= pause {
		t.Errorf("Take returned after %v, when the pause of %v ended, not when its ctx did", took, pause)
	}
	if err := admin.Do(context.Background(), "CLIENT", "UNPAUSE").Err(); err != nil {
		t.Fatal(err)
	}
	mustTake(t, s, testKey(t), lim, 1)
}

func TestRedisServerKilled(t *testing.T) {
	checkLeaks(t)
	srv := startOwnServer(t)
	// The client alone would retry a refused connection for 100 s or more;
	// the store's Timeout must end a Take long before.
	const retries, backoff = 100, time.Second
	client := redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: retries, MinRetryBackoff: backoff, MaxRetryBackoff: backoff})
	t.Cleanup(func() { client.Close() })
	const timeout = 200 * time.Millisecond
	s := newTestStore(t, client, RedisConfig{Timeout: timeout})
	lim := Limit{Rate: 10, Period: longPeriod}
	mustTake(t, s, testKey(t), lim, 1)
	if err := srv.Kill(); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		start := time.Now()
		_, err := s.Take(context.Background(), testKey(t), 0, lim, 1)
		took := time.Since(start)
		t.Logf("Take failed after %v with Timeout %v: %v", took, timeout, err)
		if err == nil || !strings.HasPrefix(err.Error(), "redis take: ") {
			t.Fatalf("err = %v, want a redis take error", err)
		}
		if took >= retries*backoff/2 {
			t.Errorf("Take failed after %v: the client's retries, not the store's Timeout %v, ended it", took, timeout)
		}
	}
	// Back up with no scripts: the store reloads them.
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	var err error
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if _, err = s.Take(context.Background(), testKey(t), 0, lim, 1); err == nil {
			return
		}
	}
	t.Fatalf("a minute after the restart: %v", err)
}

func TestRedisClosePending(t *testing.T) {
	checkLeaks(t)
	srv := startOwnServer(t)
	admin := newTestClient(t, srv.Addr)
	s, err := NewRedisStore(context.Background(), newTestClient(t, srv.Addr), RedisConfig{Timeout: testTimeout})
	if err != nil {
		t.Fatal(err)
	}
	// Scripts are held back until CLIENT UNPAUSE, after Close.
	if err := admin.Do(context.Background(), "CLIENT", "PAUSE", time.Hour.Milliseconds(), "WRITE").Err(); err != nil {
		t.Fatal(err)
	}
	defer admin.Do(context.Background(), "CLIENT", "UNPAUSE")
	const pending = 20
	errs := make(chan error, pending)
	for range pending {
		go func() {
			_, err := s.Take(context.Background(), testKey(t), 0, Limit{Rate: 10, Period: longPeriod}, 1)
			errs <- err
		}()
	}
	for s.calls.Load()+uint64(len(s.queue)) < pending { // all queued or in flight
		time.Sleep(time.Millisecond)
	}
	closed := make(chan struct{})
	go func() { s.Close(); close(closed) }()
	for range pending {
		select {
		case err := <-errs:
			if !errors.Is(err, ErrStoreClosed) {
				t.Errorf("pending Take: err = %v, want ErrStoreClosed", err)
			}
		case <-time.After(time.Minute):
			t.Fatal("pending Take did not return on Close (waited a minute)")
		}
	}
	// The workers wait for the answers to their round trips.
	if err := admin.Do(context.Background(), "CLIENT", "UNPAUSE").Err(); err != nil {
		t.Fatal(err)
	}
	<-closed
	if _, err := s.Take(context.Background(), testKey(t), 0, Limit{Rate: 10, Period: longPeriod}, 1); !errors.Is(err, ErrStoreClosed) {
		t.Errorf("Take after Close: err = %v, want ErrStoreClosed", err)
	}
	if err := s.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

// TestRedisTokenBucketExpiry checks the token bucket's lazy expiry: however
// the writes fall, the key outlives its TAT, and by at most two bursts.
func TestRedisTokenBucketExpiry(t *testing.T) {
	checkLeaks(t)
	client := newTestClient(t, testRedisAddr)
	s, err := NewRedisStore(context.Background(), client, RedisConfig{Timeout: testTimeout})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	lim := Limit{Rate: 100, Period: 10 * time.Second, Burst: 20} // 100 ms interval, 2 s burst
	tol := 2 * time.Second
	key := testKey(t)
	for i := range 60 {
		n := int64(1 + i%5)
		start := time.Now()
		r, err := s.Take(ctx, key, 0, lim, n)
		if err != nil {
			t.Fatal(err)
		}
		ttl, err := client.PTTL(ctx, s.cfg.Prefix+key).Result()
		if err != nil {
			t.Fatal(err)
		}
		// ResetAfter is from the take, ttl from the read: the key outlives
		// the TAT if ttl ≥ ResetAfter less the time between the two, which
		// is at most elapsed (plus PTTL's rounding to ms).
		elapsed := time.Since(start)
		if r.Allowed && (ttl < r.ResetAfter-elapsed-time.Millisecond || ttl > r.ResetAfter+2*tol+time.Millisecond) {
			t.Fatalf("take %d: ttl %v, TAT %v from the take, %v between them: want TAT ≤ expiry ≤ TAT+%v", i, ttl, r.ResetAfter, elapsed, 2*tol)
		}
		if i%10 == 9 {
			time.Sleep(150 * time.Millisecond)
		}
	}
}

// TestGroup checks how a batch is cut into script calls: every Take is sent
// exactly once; the Takes on one key (with one algorithm and token-bucket
// arguments) are next to each other in one script call, in their order;
// a token-bucket call carries one pair of arguments; a script call on a Cluster or
// Ring carries one key.
func TestGroup(t *testing.T) {
	for _, multiKey := range []bool{true, false} {
		w := (&RedisStore{cfg: DefaultRedisConfig(), multiKey: multiKey}).newWorker()
		var calls []*call
		add := func(key string, lim Limit, n int64) {
			c := &call{key: key}
			c.setArgs(lim, n)
			calls = append(calls, c)
		}
		a, b := PerSecond(100), PerMinute(100)
		sw := Limit{Algorithm: SlidingWindow, Rate: 5, Period: time.Second}
		for _, k := range []string{"x", "y", "x", "x", "z"} {
			add(k, a, 1)
		}
		add("x", a, 2) // another cost: another class
		add("x", b, 1)
		add("w", sw, 1)
		add("v", sw, 1)
		add("w", sw, 1)
		groups := w.group(calls)
		sent := map[*call]int{}
		for _, g := range groups {
			keys := map[string]bool{}
			for i, c := range g.calls {
				sent[c]++
				if c.alg != g.alg || g.alg == TokenBucket && (c.incArg != g.calls[0].incArg || c.tolArg != g.calls[0].tolArg) {
					t.Errorf("multiKey=%v: script call mixes algorithms or token-bucket arguments", multiKey)
				}
				if i > 0 && c.key != g.calls[i-1].key {
					if keys[c.key] {
						t.Errorf("multiKey=%v: the calls on %q are not next to each other", multiKey, c.key)
					}
					if !multiKey {
						t.Errorf("multiKey=%v: keys %q and %q in one script call", multiKey, g.calls[i-1].key, c.key)
					}
				}
				keys[c.key] = true
			}
			for i := 1; i < len(g.calls); i++ { // in their order
				if g.calls[i].key == g.calls[i-1].key && slices.Index(calls, g.calls[i]) < slices.Index(calls, g.calls[i-1]) {
					t.Errorf("multiKey=%v: calls on %q out of order", multiKey, g.calls[i].key)
				}
			}
		}
		for _, c := range calls {
			if sent[c] != 1 {
				t.Errorf("multiKey=%v: call on %q sent %d times", multiKey, c.key, sent[c])
			}
		}
		// x at a, cost 1 (3 calls); y; z; x at a, cost 2; x at b; w (2); v.
		want := 4 // token bucket: (a, 1), (a, 2), (b, 1); and the window
		if !multiKey {
			want = 7
		}
		if len(groups) != want {
			t.Errorf("multiKey=%v: %d script calls, want %d", multiKey, len(groups), want)
		}
	}
}
