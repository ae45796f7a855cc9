package counter

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// reshardHarness is a harness (store_test.go) whose store reshards, with a
// way to read a counter's raw state.
type reshardHarness struct {
	*harness
	rs   Resharder
	dump func(t *testing.T, key string) string
	// ttl is a Redis key's PTTL; nil for the memory store.
	ttl func(t *testing.T, key string) time.Duration
}

func memoryReshardHarness() *reshardHarness {
	h := memoryHarness()
	s := h.store.(*MemoryStore)
	return &reshardHarness{harness: h, rs: s, dump: func(t *testing.T, key string) string {
		id := s.fingerprint(key)
		st := s.stripe(id)
		st.mu.Lock()
		defer st.mu.Unlock()
		if i := st.t.find(id); i >= 0 {
			return fmt.Sprintf("%+v", st.t.state(i))
		}
		return ""
	}}
}

// redisReshardHarness runs on Redis with a period no test outlives, so no
// window boundary falls inside a test and no token refills.
func redisReshardHarness(t *testing.T, name string, client redis.UniversalClient) *reshardHarness {
	h := redisHarness(t, name, client)
	h.period = longPeriod
	ctx := context.Background()
	return &reshardHarness{
		harness: h,
		rs:      h.store.(*RedisStore),
		dump: func(t *testing.T, key string) string {
			t.Helper()
			key = "hk:" + key
			typ, err := client.Type(ctx, key).Result()
			if err != nil {
				t.Fatal(err)
			}
			switch typ {
			case "string":
				return client.Get(ctx, key).Val()
			case "zset":
				return fmt.Sprint(client.ZRangeWithScores(ctx, key, 0, -1).Val())
			}
			return typ
		},
		ttl: func(t *testing.T, key string) time.Duration {
			t.Helper()
			d, err := client.PTTL(ctx, "hk:"+key).Result()
			if err != nil {
				t.Fatal(err)
			}
			return d
		},
	}
}

// reshardHarnesses returns the memory store and Redis standalone, Cluster
// and Ring (over the shared server and one of t's own).
func reshardHarnesses(t *testing.T) []*reshardHarness {
	other := startOwnServer(t)
	ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": testRedisAddr, "b": other.Addr}})
	return []*reshardHarness{
		memoryReshardHarness(),
		redisReshardHarness(t, "redis", redis.NewClient(&redis.Options{Addr: testRedisAddr})),
		redisReshardHarness(t, "cluster", redis.NewClusterClient(&redis.ClusterOptions{Addrs: testClusterAddrs})),
		redisReshardHarness(t, "ring", ring),
	}
}

// splitLimit splits lim into n shares: rate and burst divided by n, the
// remainder to the first shares (as package shard does; counter must not
// import it).
func splitLimit(lim Limit, n int) []Limit {
	out := make([]Limit, n)
	for i := range out {
		out[i] = lim
		out[i].Rate = lim.Rate / int64(n)
		if int64(i) < lim.Rate%int64(n) {
			out[i].Rate++
		}
		out[i].Burst = lim.Burst / int64(n)
		if int64(i) < lim.Burst%int64(n) {
			out[i].Burst++
		}
	}
	return out
}

func shardOf(name string, lim Limit) Shard {
	return Shard{Name: name, Hash: Hash(name), Limit: lim}
}

// children returns base's n subcounters, splitting lim.
func children(base string, lim Limit, n int) []Shard {
	var out []Shard
	for i, l := range splitLimit(lim, n) {
		out = append(out, shardOf(base+":c"+strconv.Itoa(i), l))
	}
	return out
}

func reshardLimit(alg Algorithm, period time.Duration) Limit {
	lim := Limit{Algorithm: alg, Rate: 100, Period: period}
	if alg == TokenBucket {
		lim.Burst = 100
	}
	return lim
}

// takeUntilDeny takes 1 from sh until denied (at most 1000 times) and
// returns how many were admitted.
func (h *reshardHarness) takeUntilDeny(t *testing.T, sh Shard) int {
	t.Helper()
	for n := range 1000 {
		if !h.take(t, sh.Name, sh.Limit, 1).Allowed {
			return n
		}
	}
	t.Fatalf("%s: %q admitted 1000 in a row", h.name, sh.Name)
	return 0
}

func (h *reshardHarness) reshard(t *testing.T, from, to []Shard) {
	t.Helper()
	if err := h.rs.Reshard(context.Background(), from, to); err != nil {
		t.Fatalf("%s: Reshard: %v", h.name, err)
	}
}

// checkAdmitted asserts got = want, give or take tol on Redis, whose clock
// runs and whose token buckets round to µs.
func (h *reshardHarness) checkAdmitted(t *testing.T, what string, got, want, tol int) {
	t.Helper()
	if h.exact {
		tol = 0
	}
	if got < want-tol || got > want+tol {
		t.Errorf("%s: %s admitted %d, want %d±%d", h.name, what, got, want, tol)
	}
}

// checkExpiry asserts that every seeded Redis key expires, and not before
// the usage it holds would have.
func (h *reshardHarness) checkExpiry(t *testing.T, shards []Shard) {
	t.Helper()
	if h.ttl == nil {
		return
	}
	for _, sh := range shards {
		if d := h.ttl(t, sh.Name); d <= 0 {
			t.Errorf("%s: seeded %q has PTTL %v, want an expiry", h.name, sh.Name, d)
		}
	}
}

// TestReshard runs the transfer suite on every (store, algorithm) pair:
// a split carries the parent's usage, a merge carries the children's, and
// reseeding is idempotent and never lowers a counter.
func TestReshard(t *testing.T) {
	for _, h := range reshardHarnesses(t) {
		t.Run(h.name, func(t *testing.T) {
			if !h.exact {
				t.Parallel()
			}
			for _, alg := range []Algorithm{TokenBucket, SlidingWindow, FixedWindow, SlidingLog} {
				for _, tc := range []struct {
					name string
					run  func(t *testing.T, h *reshardHarness, alg Algorithm)
				}{
					{"Split", testReshardSplit},
					{"Merge", testReshardMerge},
					{"Idempotent", testReshardIdempotent},
					{"Foreign", testReshardForeign},
				} {
					t.Run(alg.String()+"/"+tc.name, func(t *testing.T) {
						if !h.exact {
							t.Parallel()
						}
						tc.run(t, h, alg)
					})
				}
			}
		})
	}
}

// testReshardSplit drains a parent by 60 of 100, splits it 1→4, and checks
// that the children admit together what the parent (a twin of it) still
// admits: 40.
func testReshardSplit(t *testing.T, h *reshardHarness, alg Algorithm) {
	base := uniqueKey(t)
	lim := reshardLimit(alg, h.period)
	parent, twin := shardOf(base+":p", lim), shardOf(base+":twin", lim)
	kids := children(base, lim, 4)
	for _, sh := range []Shard{parent, twin} {
		if got := h.takeAll(t, sh.Name, lim, 60); got != 60 {
			t.Fatalf("%s: drain %q: admitted %d of 60", h.name, sh.Name, got)
		}
	}
	h.reshard(t, []Shard{parent}, kids)
	h.checkExpiry(t, kids)
	want := h.takeUntilDeny(t, twin)
	if want != 40 {
		t.Fatalf("%s: the twin parent admitted %d after 60 of 100, want 40", h.name, want)
	}
	got := 0
	for _, c := range kids {
		got += h.takeUntilDeny(t, c)
	}
	h.checkAdmitted(t, "children after the split", got, want, len(kids))
}

// drained returns a parent counter with 60 taken from its limit, and 4
// children of the same limit, untouched.
func (h *reshardHarness) drained(t *testing.T, alg Algorithm) (Shard, []Shard) {
	t.Helper()
	base := uniqueKey(t)
	lim := reshardLimit(alg, h.period)
	parent := shardOf(base+":p", lim)
	if got := h.takeAll(t, parent.Name, lim, 60); got != 60 {
		t.Fatalf("%s: drain: admitted %d of 60", h.name, got)
	}
	return parent, children(base, lim, 4)
}

// testReshardMerge splits as testReshardSplit does, takes 1, 2, 3 and 4 from
// the children, merges them 4→1 into the parent and checks that the parent
// admits what the children had left (their last Remaining): 30.
func testReshardMerge(t *testing.T, h *reshardHarness, alg Algorithm) {
	parent, kids := h.drained(t, alg)
	h.reshard(t, []Shard{parent}, kids)
	left := 0
	for i, c := range kids {
		var r Result
		for range i + 1 {
			if r = h.take(t, c.Name, c.Limit, 1); !r.Allowed {
				t.Fatalf("%s: %q denied after the split: %+v", h.name, c.Name, r)
			}
		}
		left += int(r.Remaining)
	}
	if h.exact && left != 30 {
		t.Errorf("%s: children have %d left, want 30", h.name, left)
	}
	h.reshard(t, kids, []Shard{parent})
	h.checkExpiry(t, []Shard{parent})
	h.checkAdmitted(t, "parent after the merge", h.takeUntilDeny(t, parent), left, len(kids))
}

// testReshardIdempotent checks that a second identical Reshard changes
// nothing, and that a child used past its seed keeps its usage.
func testReshardIdempotent(t *testing.T, h *reshardHarness, alg Algorithm) {
	parent, kids := h.drained(t, alg)
	dumps := func() []string {
		var out []string
		for _, c := range append([]Shard{parent}, kids...) {
			out = append(out, h.dump(t, c.Name))
		}
		return out
	}
	h.reshard(t, []Shard{parent}, kids)
	once := dumps()
	for i, d := range once {
		if d == "" || d == "none" {
			t.Fatalf("%s: counter %d holds nothing after the split", h.name, i)
		}
	}
	h.reshard(t, []Shard{parent}, kids)
	if twice := dumps(); !slices.Equal(once, twice) {
		t.Errorf("%s: a second Reshard changed the state:\n once %q\ntwice %q", h.name, once, twice)
	}
	// Child 0 takes 5 more than its seed; reseeding leaves it as it is.
	if got := h.takeAll(t, kids[0].Name, kids[0].Limit, 5); got != 5 {
		t.Fatalf("%s: child 0 admitted %d of 5 after the split", h.name, got)
	}
	used := dumps()
	h.reshard(t, []Shard{parent}, kids)
	if again := dumps(); !slices.Equal(used, again) {
		t.Errorf("%s: reseeding lowered or changed a counter:\nbefore %q\n after %q", h.name, used, again)
	}
	h.checkAdmitted(t, "child 0 after reseeding", h.takeUntilDeny(t, kids[0]), 5, 1)
}

// testReshardForeign checks that a counter of from holding another
// algorithm's state counts as unused, and that a counter of to holding one
// is seeded as if it were absent, as Take treats them.
func testReshardForeign(t *testing.T, h *reshardHarness, alg Algorithm) {
	if h.ttl == nil {
		t.Skip("the memory store has no foreign state: a take reads any state as its own algorithm's")
	}
	base := uniqueKey(t)
	lim := reshardLimit(alg, h.period)
	other := reshardLimit((alg+1)%numAlgorithms, h.period)
	used, foreign := shardOf(base+":used", lim), shardOf(base+":foreign", lim)
	if got := h.takeAll(t, used.Name, lim, 60); got != 60 {
		t.Fatalf("%s: drain: admitted %d of 60", h.name, got)
	}
	// foreign holds other's state, 90 taken; so does the first child.
	kids := children(base, Limit{Algorithm: alg, Rate: 200, Period: h.period, Burst: 200}, 4)
	for _, sh := range []Shard{foreign, kids[0]} {
		if got := h.takeAll(t, sh.Name, other, 90); got != 90 {
			t.Fatalf("%s: foreign drain: admitted %d of 90", h.name, got)
		}
	}
	// 60 used of the pair's 200, split over four of 50: 15 each, so 35 left.
	h.reshard(t, []Shard{used, foreign}, kids)
	for _, c := range kids {
		h.checkAdmitted(t, c.Name, h.takeUntilDeny(t, c), 35, 1)
	}
}

// TestReshardInvalid checks that bad shards are an error, never a panic,
// on every store.
func TestReshardInvalid(t *testing.T) {
	lim := Limit{Algorithm: SlidingWindow, Rate: 10, Period: time.Second}
	a, b := uniqueKey(t), uniqueKey(t)
	one := []Shard{shardOf(a, lim)}
	with := func(f func(l *Limit)) []Shard {
		l := lim
		f(&l)
		return []Shard{shardOf(a, lim), shardOf(b, l)}
	}
	cases := []struct {
		name     string
		from, to []Shard
		also     error
	}{
		{"no from", nil, one, nil},
		{"no to", one, []Shard{}, nil},
		{"neither", nil, nil, nil},
		{"mixed algorithms", one, with(func(l *Limit) { l.Algorithm = FixedWindow }), nil},
		{"mixed periods", with(func(l *Limit) { l.Period = time.Minute }), one, nil},
		{"from and to differ", one, []Shard{shardOf(b, Limit{Rate: 10, Period: time.Second})}, nil},
		{"zero rate", one, with(func(l *Limit) { l.Rate = 0 }), ErrInvalidRate},
		{"zero period", []Shard{shardOf(a, Limit{Rate: 1})}, one, ErrInvalidPeriod},
		{"unknown algorithm", with(func(l *Limit) { l.Algorithm = numAlgorithms }), one, ErrUnknownAlgorithm},
		{"rates overflow", one, []Shard{
			shardOf(a, Limit{Algorithm: SlidingWindow, Rate: math.MaxInt64, Period: time.Second}),
			shardOf(b, lim),
		}, ErrLimitTooLarge},
	}
	for _, h := range reshardHarnesses(t) {
		t.Run(h.name, func(t *testing.T) {
			for _, tc := range cases {
				err := h.rs.Reshard(context.Background(), tc.from, tc.to)
				if !errors.Is(err, ErrInvalidReshard) {
					t.Errorf("%s: err = %v, want ErrInvalidReshard", tc.name, err)
				}
				if tc.also != nil && !errors.Is(err, tc.also) {
					t.Errorf("%s: err = %v, want it to wrap %v too", tc.name, err, tc.also)
				}
			}
			if absent := h.dump(t, uniqueKey(t)); h.dump(t, a) != absent || h.dump(t, b) != absent {
				t.Error("an invalid Reshard wrote a counter")
			}
		})
	}
}

func TestRedisReshardClosed(t *testing.T) {
	checkLeaks(t)
	s := newTestStore(t, newTestClient(t, testRedisAddr), RedisConfig{})
	s.Close()
	lim := Limit{Rate: 10, Period: time.Second}
	err := s.Reshard(context.Background(), []Shard{shardOf(testKey(t), lim)}, []Shard{shardOf(testKey(t), lim)})
	if !errors.Is(err, ErrStoreClosed) {
		t.Fatalf("err = %v, want ErrStoreClosed", err)
	}
}

// TestMemoryReshardLater reshards at an instant later than the drain (a
// quarter of a period, and one and a quarter): the children admit what the
// parent's twin admits then, give or take one each for rounding. A window
// state of the previous window counts as the take path ages it, an older
// one not at all.
func TestMemoryReshardLater(t *testing.T) {
	for _, alg := range []Algorithm{TokenBucket, SlidingWindow, FixedWindow, SlidingLog} {
		for _, later := range []time.Duration{time.Second / 4, 5 * time.Second / 4, 3 * time.Second} {
			s := NewMemoryStore(MemoryConfig{})
			lim := reshardLimit(alg, time.Second)
			parent, twin := shardOf("p", lim), shardOf("twin", lim)
			kids := children("k", lim, 4)
			for _, sh := range []Shard{parent, twin} {
				for range 60 {
					s.TakeAt(t0, sh.Name, sh.Hash, lim, 1)
				}
			}
			at := t0.Add(later)
			if err := s.ReshardAt(at, []Shard{parent}, kids); err != nil {
				t.Fatal(err)
			}
			count := func(sh Shard) int {
				n := 0
				for s.TakeAt(at, sh.Name, sh.Hash, sh.Limit, 1).Allowed {
					n++
				}
				return n
			}
			want, got := count(twin), 0
			for _, c := range kids {
				got += count(c)
			}
			if got < want-len(kids) || got > want+len(kids) {
				t.Errorf("%v %v later: children admitted %d, the parent %d", alg, later, got, want)
			}
		}
	}
}

// TestReshardLogStale seeds a log that still holds entries of its own, older
// than the seed's (a key back at a level it left within the period): the
// counter must hold the seed's usage for as long as the seed would, not
// free units when its own older entries expire. Against a twin of the
// counter read, it admits no more at any later instant.
func TestReshardLogStale(t *testing.T) {
	lim := Limit{Algorithm: SlidingLog, Rate: 4, Period: time.Second}
	ms := func(d int64) time.Time { return t0.Add(time.Duration(d) * time.Millisecond) }
	s := NewMemoryStore(MemoryConfig{})
	from, twin, to := shardOf("from", lim), shardOf("twin", lim), shardOf("to", lim)
	for _, at := range []int64{100, 150, 300} { // to's own: older
		s.TakeAt(ms(at), to.Name, to.Hash, lim, 1)
	}
	for _, at := range []int64{300, 450, 500, 550} { // the usage carried
		s.TakeAt(ms(at), from.Name, from.Hash, lim, 1)
		s.TakeAt(ms(at), twin.Name, twin.Hash, lim, 1)
	}
	if err := s.ReshardAt(ms(600), []Shard{from}, []Shard{to}); err != nil {
		t.Fatal(err)
	}
	for at := int64(600); at <= 1700; at += 25 {
		took := func(sh Shard) (n int) {
			for s.TakeAt(ms(at), sh.Name, sh.Hash, lim, 1).Allowed {
				n++
			}
			return n
		}
		if got, want := took(to), took(twin); got > want {
			t.Errorf("at %d ms the seeded counter admitted %d, the counter read %d", at, got, want)
		}
	}
}

// TestMemoryReshardUneven merges three counters of uneven usage and rates
// into two of uneven rates, and checks each gets its share of the sum.
func TestMemoryReshardUneven(t *testing.T) {
	for _, alg := range []Algorithm{TokenBucket, SlidingWindow, FixedWindow, SlidingLog} {
		s := NewMemoryStore(MemoryConfig{})
		lim := func(rate int64) Limit {
			l := Limit{Algorithm: alg, Rate: rate, Period: time.Second}
			if alg == TokenBucket {
				l.Burst = rate
			}
			return l
		}
		from := []Shard{shardOf("f0", lim(50)), shardOf("f1", lim(30)), shardOf("f2", lim(20))}
		for i, n := range []int{10, 30, 5} { // 45 used of 100
			for range n {
				s.TakeAt(t0, from[i].Name, from[i].Hash, from[i].Limit, 1)
			}
		}
		to := []Shard{shardOf("t0", lim(70)), shardOf("t1", lim(30))}
		if err := s.ReshardAt(t0, from, to); err != nil {
			t.Fatal(err)
		}
		// 45·0.7 = 31.5 and 45·0.3 = 13.5: the windows round the first up
		// and the second down; the token bucket gives both 31.5 and 13.5.
		want := []int64{70 - 32, 30 - 13}
		if alg == TokenBucket {
			want = []int64{38, 16}
		}
		for j, sh := range to {
			r := s.TakeAt(t0, sh.Name, sh.Hash, sh.Limit, 1)
			if !r.Allowed || r.Remaining+1 != want[j] {
				t.Errorf("%v: %s after the merge: %+v, want %d left before the take", alg, sh.Name, r, want[j])
			}
		}
	}
}

// fakeTime makes a seed script read TIME from its last two arguments,
// seconds and µs, as TestRedisScriptsMatchMemory does. The token-bucket and
// log scripts read those as one more (TAT, rate) or (instant, member) pair,
// an instant of long ago, which they skip.
func fakeTime(alg Algorithm) *redis.Script {
	src := map[Algorithm]string{
		TokenBucket:   gcraSeedScript,
		SlidingWindow: slidingWindowSeedScript,
		FixedWindow:   fixedWindowSeedScript,
		SlidingLog:    slidingLogSeedScript,
	}[alg]
	return redis.NewScript(strings.Replace(src, "redis.call('TIME')", "{ARGV[#ARGV - 1], ARGV[#ARGV]}", 1))
}

// TestRedisReshardSeedScripts runs the seed scripts on fixed instants: the
// window scripts shift or drop a seed read in an earlier window, every
// script raises and never lowers, and sets an expiry a take would set.
func TestRedisReshardSeedScripts(t *testing.T) {
	checkLeaks(t)
	client := newTestClient(t, testRedisAddr)
	ctx := context.Background()
	const p = int64(10_000_000) // 10 s in µs
	now := t0.UnixMicro() + 2_500_000
	w := now / p
	type step struct {
		name  string
		alg   Algorithm
		old   func(key string) // the key's state before, if any
		args  []any
		at    int64 // µs
		state string
		ttl   time.Duration // -1: none; a PTTL read later is less by the time between
	}
	set := func(v string) func(string) {
		return func(key string) { client.Set(ctx, key, v, 0) }
	}
	zset := func(key string) { client.ZAdd(ctx, key, redis.Z{Score: 1, Member: "x"}) }
	ws := func(f ...int64) string {
		var s []string
		for _, x := range f {
			s = append(s, strconv.FormatInt(x, 10))
		}
		return strings.Join(s, " ")
	}
	left := (w+1)*p - now
	var c call
	c.setArgs(Limit{Rate: 1, Period: time.Second}, 1) // tol 1 s
	tb := c.tolArg
	if c.level != 10 {
		t.Fatalf("level %d for a tolerance of 1 s, want 10", c.level)
	}
	// States are written noting tb's interval, iv; those given as input
	// are of the form written before intervals were noted (tbOld), whose
	// debt counts as time.
	iv, period := c.ivArg, int64(1_000_000)
	tbState := func(ahead, k int64) string { s, _ := gcraStateAt(now, ahead<<gridBits(k), k, iv); return s }
	tbOld := func(ahead, k int64) string { s, _ := gcraStateAt(now, ahead<<gridBits(k), k, 0); return s }
	tbTwice := func(ahead, k int64) string { s, _ := gcraStateAt(now, ahead<<gridBits(k), k, 2*iv); return s } // written at an interval of 2 s
	tbTTL := func(ahead, k int64) time.Duration { _, ttl := gcraStateAt(now, ahead<<gridBits(k), k, iv); return ttl }
	steps := []step{
		{"sw in W", SlidingWindow, nil, []any{p, w, 15, 5}, now, ws(w, 15, 5), time.Duration(left+p) * time.Microsecond},
		{"sw in W+1 shifts", SlidingWindow, nil, []any{p, w, 15, 5}, now + p, ws(w+1, 0, 15), time.Duration(left+p) * time.Microsecond},
		{"sw in W+2 drops", SlidingWindow, nil, []any{p, w, 15, 5}, now + 2*p, "", 0},
		{"sw raises per count", SlidingWindow, set(ws(w, 20, 3)), []any{p, w, 15, 5}, now, ws(w, 20, 5), time.Duration(left+p) * time.Microsecond},
		{"sw ages an older state", SlidingWindow, set(ws(w-1, 7, 2)), []any{p, w, 15, 5}, now, ws(w, 15, 7), time.Duration(left+p) * time.Microsecond},
		{"sw replaces foreign state", SlidingWindow, zset, []any{p, w, 15, 5}, now, ws(w, 15, 5), time.Duration(left+p) * time.Microsecond},
		{"sw never lowers", SlidingWindow, set(ws(w, 20, 6)), []any{p, w, 15, 5}, now, ws(w, 20, 6), -1},
		{"fw in W", FixedWindow, nil, []any{p, w, 15}, now, ws(w, 15), time.Duration(left) * time.Microsecond},
		{"fw in W+1 drops", FixedWindow, nil, []any{p, w, 15}, now + p, "", 0},
		{"fw never lowers", FixedWindow, set(ws(w, 20)), []any{p, w, 15}, now, ws(w, 20), -1},
		{"fw replaces an older window", FixedWindow, set(ws(w-1, 20)), []any{p, w, 15}, now, ws(w, 15), time.Duration(left) * time.Microsecond},
		// Token bucket: tol 1 s (level 10); TATs 4 s ahead (rate 3) and 1 s
		// behind (rate 1), total 4: the seed is 3 s ahead, written with the
		// expiry a take's write sets. TATs are given in the whole µs of
		// states written before the grid, and as states of another level
		// and of this one.
		{"tb seeds", TokenBucket, nil, []any{tb, iv, 4, period, now + 4_000_000, 3, now - 1_000_000, 1}, now, tbState(3_000_000, 10), tbTTL(3_000_000, 10)},
		{"tb seeds from grid states", TokenBucket, nil, []any{tb, iv, 4, period, tbOld(4_000_000, 20), 3, tbOld(-1_000_000, 10), 1}, now, tbState(3_000_000, 10), tbTTL(3_000_000, 10)},
		{"tb raises", TokenBucket, set(strconv.FormatInt(now+1_000_000, 10)), []any{tb, iv, 4, period, now + 4_000_000, 4}, now, tbState(4_000_000, 10), tbTTL(4_000_000, 10)},
		{"tb raises a grid state", TokenBucket, set(tbOld(1_000_000, 10)), []any{tb, iv, 4, period, now + 4_000_000, 4}, now, tbState(4_000_000, 10), tbTTL(4_000_000, 10)},
		{"tb never lowers", TokenBucket, set(strconv.FormatInt(now+5_000_000, 10)), []any{tb, iv, 4, period, now + 4_000_000, 4}, now,
			strconv.FormatInt(now+5_000_000, 10), -1},
		{"tb never lowers a grid state", TokenBucket, set(tbOld(5_000_000, 12)), []any{tb, iv, 4, period, now + 4_000_000, 4}, now, tbOld(5_000_000, 12), -1},
		{"tb no usage", TokenBucket, nil, []any{tb, iv, 4, period, now - 4_000_000, 4, "garbage", 1}, now, "", 0},
		// 4 s ahead at 2 s a unit is 2 units, whatever the rate given: 2 s
		// ahead at tb's 1 s a unit.
		{"tb seeds from a state of another interval", TokenBucket, nil, []any{tb, iv, 1, period, tbTwice(4_000_000, 10), 7}, now, tbState(2_000_000, 10), tbTTL(2_000_000, 10)},
		{"tb replaces foreign state", TokenBucket, zset, []any{tb, iv, 1, period, now + 500_000, 1}, now, tbState(500_000, 10), tbTTL(500_000, 10)},
	}
	for _, st := range steps {
		key := testKey(t)
		if st.old != nil {
			st.old(key)
		}
		args := append(slices.Clone(st.args), st.at/1_000_000, st.at%1_000_000)
		start := time.Now()
		if err := fakeTime(st.alg).Run(ctx, client, []string{key}, args...).Err(); err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		got := client.Get(ctx, key).Val()
		if got != st.state {
			t.Errorf("%s: state %q, want %q", st.name, got, st.state)
		}
		if st.state == "" || st.ttl == 0 {
			continue
		}
		ttl := client.PTTL(ctx, key).Val()
		elapsed := time.Since(start) // bounds how far the PTTL ran down since the script set it
		if st.ttl < 0 {
			if ttl != -1 {
				t.Errorf("%s: a key left as it was got PTTL %v", st.name, ttl)
			}
			continue
		}
		if ttl < st.ttl-elapsed-time.Millisecond || ttl > st.ttl+time.Millisecond {
			t.Errorf("%s: PTTL %v %v after the script, want %v less that time", st.name, ttl, elapsed, st.ttl)
		}
	}

	t.Run("sliding log", func(t *testing.T) {
		key := testKey(t)
		// Two live entries already, newer than the seed's; the seed has
		// one expired entry and five live ones. The log's two newest stay
		// (each later than the seed's of its rank), and the seed's 3rd to
		// 5th newest are added.
		client.ZAdd(ctx, key, redis.Z{Score: float64(now - 1000), Member: "a"}, redis.Z{Score: float64(now - 2000), Member: "b"})
		args := []any{p}
		for i, at := range []int64{now - p, now - 9_000_000, now - 8_000_000, now - 7_000_000, now - 6_000_000, now - 5_000_000} {
			args = append(args, at, fmt.Sprintf("%d:r%d", at, i))
		}
		run := func() {
			t.Helper()
			if err := fakeTime(SlidingLog).Run(ctx, client, []string{key}, append(args, now/1_000_000, now%1_000_000)...).Err(); err != nil {
				t.Fatal(err)
			}
		}
		start := time.Now()
		run()
		got := client.ZRange(ctx, key, 0, -1).Val()
		want := []string{
			fmt.Sprintf("%d:r1", now-9_000_000), fmt.Sprintf("%d:r2", now-8_000_000), fmt.Sprintf("%d:r3", now-7_000_000), "b", "a",
		}
		if !slices.Equal(got, want) {
			t.Errorf("log %q, want %q", got, want)
		}
		// A period after the newest entry, a.
		ttl := client.PTTL(ctx, key).Val()
		if elapsed := time.Since(start); ttl < 9999*time.Millisecond-elapsed-time.Millisecond || ttl > 9999*time.Millisecond {
			t.Errorf("PTTL %v %v after the script, want 9.999 s less that time", ttl, elapsed)
		}
		run() // holds at every rank what the seed has or later: nothing to change
		if again := client.ZRange(ctx, key, 0, -1).Val(); !slices.Equal(again, want) {
			t.Errorf("second seed: log %q, want %q", again, want)
		}
		// Entries of the log's own older than the seed's (the key is back
		// at a level it left within the period) are replaced, rank by
		// rank: holding as many entries as the seed, some of them older,
		// would free units before the seed's would. A third, newer than
		// every seeded one, stays.
		key = testKey(t)
		client.ZAdd(ctx, key, redis.Z{Score: float64(now - 9_500_000), Member: "x"}, redis.Z{Score: float64(now - 9_200_000), Member: "y"},
			redis.Z{Score: float64(now - 1000), Member: "z"})
		run()
		want = []string{
			fmt.Sprintf("%d:r1", now-9_000_000), fmt.Sprintf("%d:r2", now-8_000_000), fmt.Sprintf("%d:r3", now-7_000_000), fmt.Sprintf("%d:r4", now-6_000_000), "z",
		}
		if got := client.ZRange(ctx, key, 0, -1).Val(); !slices.Equal(got, want) {
			t.Errorf("over older entries: log %q, want %q", got, want)
		}
		// Foreign state is replaced by the seed.
		key = testKey(t)
		client.Set(ctx, key, "x", 0)
		run()
		if n := client.ZCard(ctx, key).Val(); n != 5 {
			t.Errorf("over foreign state: %d entries, want 5", n)
		}
	})
}

func TestShares(t *testing.T) {
	shards := func(rates ...int64) []Shard {
		var out []Shard
		for _, r := range rates {
			out = append(out, Shard{Limit: Limit{Rate: r}})
		}
		return out
	}
	for _, tc := range []struct {
		sum   int64
		rates []int64
		want  []int64
	}{
		{60, []int64{25, 25, 25, 25}, []int64{15, 15, 15, 15}},
		{61, []int64{25, 25, 25, 25}, []int64{16, 15, 15, 15}},
		{63, []int64{25, 25, 25, 25}, []int64{16, 16, 16, 15}},
		{3, []int64{26, 25, 25, 25}, []int64{1, 1, 1, 0}},
		{45, []int64{70, 30}, []int64{32, 13}},
		{0, []int64{1, 2}, []int64{0, 0}},
		{math.MaxInt64, []int64{math.MaxInt64 - 1, 1}, []int64{MaxCount, 1}}, // a seed is at most MaxCount
	} {
		var total int64
		for _, r := range tc.rates {
			total += r
		}
		if got := shares(tc.sum, shards(tc.rates...), total); !slices.Equal(got, tc.want) {
			t.Errorf("shares(%d, %v) = %v, want %v", tc.sum, tc.rates, got, tc.want)
		}
	}
}

func TestSpread(t *testing.T) {
	for _, tc := range []struct {
		counts []int64
		want   []int
	}{
		{[]int64{2, 2, 2}, []int{0, 1, 2, 0, 1, 2}},
		{[]int64{3, 2}, []int{0, 1, 0, 1, 0}},
		{[]int64{3, 1}, []int{0, 0, 1, 0}},
		{[]int64{0, 2}, []int{1, 1}},
		{[]int64{0, 0}, []int{}},
	} {
		n := 0
		for _, c := range tc.counts {
			n += int(c)
		}
		if got := spread(n, tc.counts); !slices.Equal(got, tc.want) {
			t.Errorf("spread(%v) = %v, want %v", tc.counts, got, tc.want)
		}
	}
}
