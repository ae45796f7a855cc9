package hotkey

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hotkeyd/hotkey/counter"
	"github.com/hotkeyd/hotkey/internal/redistest"
	"github.com/hotkeyd/hotkey/internal/testkit"
	"github.com/hotkeyd/hotkey/shard"
	"github.com/hotkeyd/hotkey/split"
)

// TestPeekSplitRoundTrips: a peek of a key split 64 ways on Redis reads its
// subcounters in one round trip on a standalone server and in at most one
// per node on a Cluster, and answers what reading them one by one does, on
// every algorithm.
func TestPeekSplitRoundTrips(t *testing.T) {
	for _, tc := range []struct {
		name   string
		client func(trips *scriptTrips) redis.UniversalClient
		nodes  int // the most round trips a peek may take
	}{
		{"standalone", func(trips *scriptTrips) redis.UniversalClient {
			c := redis.NewClient(&redis.Options{Addr: env.Server.Addr})
			c.AddHook(trips.hook(env.Server.Addr))
			return c
		}, 1},
		{"cluster", func(trips *scriptTrips) redis.UniversalClient {
			c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: env.Cluster.Addrs})
			c.OnNewNode(func(n *redis.Client) { n.AddHook(trips.hook(n.Options().Addr)) })
			return c
		}, len(env.Cluster.Addrs)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			trips := &scriptTrips{}
			client := tc.client(trips)
			t.Cleanup(func() { client.Close() })
			ctx := context.Background()
			store, err := counter.NewRedisStore(ctx, client, counter.RedisConfig{Prefix: fmt.Sprintf("pt%x:", rand.Uint64())})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { store.Close() })
			clock := testkit.NewClock()
			const level = shard.Level64
			for _, alg := range allAlgorithms {
				t.Run(alg.String(), func(t *testing.T) {
					p := &Policy{Name: fmt.Sprintf("p%x", rand.Uint64()), Limit: Limit{Algorithm: alg, Rate: 640, Period: longPeriod}}
					name := nameOf(p.Name, "k")
					e := newSplitEngine(t, store, clock, name, level)
					ent := split.NewEntry(name, hashKey(name), level, level, nil)
					// Subcounter i spends i units of its 10, so a few
					// are spent and deny, the others hold what is left.
					for i := range int(level) {
						sub, hash := ent.Sub(level, i, nil)
						if n := int64(min(i, 10)); n > 0 {
							if r, err := store.Take(ctx, sub, hash, subLimit(p.Limit, level, i), n); err != nil || !r.Allowed {
								t.Fatalf("take of %d on subcounter %d: %+v, %v", n, i, r, err)
							}
						}
					}
					start := time.Now()
					want := peekOneByOne(t, store, ent, level, p.Limit)
					trips.reset()
					got, err := e.Peek(ctx, "k", p)
					elapsed := time.Since(start)
					if err != nil {
						t.Fatal(err)
					}
					perNode, total := trips.counts()
					t.Logf("%d subcounters peeked in %d round trips %v", level, total, perNode)
					if total == 0 || total > tc.nodes {
						t.Errorf("peek of a key split %d ways: %d round trips %v, want 1 to %d", level, total, perNode, tc.nodes)
					}
					for node, n := range perNode {
						if n > 1 {
							t.Errorf("node %s: %d round trips, want at most 1", node, n)
						}
					}
					// Real time passes between the two reads: the token
					// bucket's waits shorten by at most that.
					if got.Allowed != want.Allowed || got.Remaining != want.Remaining || got.Limit != want.Limit || got.Shards != want.Shards ||
						got.RetryAfter > want.RetryAfter || want.RetryAfter-got.RetryAfter > elapsed ||
						got.ResetAfter > want.ResetAfter || want.ResetAfter-got.ResetAfter > elapsed {
						t.Errorf("peek %+v, want %+v (read one by one, up to %v before)", got, want, elapsed)
					}
					if !got.Allowed || got.Remaining != 640-(54*10+45)-1 {
						t.Errorf("peek %+v: want allowed with %d left", got, 640-(54*10+45)-1)
					}
				})
			}
		})
	}
}

// peekOneByOne answers a peek of the key ent split at level under lim as
// Engine.Peek does, from a Peek of each subcounter in turn.
func peekOneByOne(t *testing.T, store counter.Peeker, ent *split.Entry, level shard.Level, lim Limit) Result {
	t.Helper()
	out := Result{Limit: lim.Capacity(), Shards: level}
	var held int64
	for i := range int(level) {
		sub := subLimit(lim, level, i)
		name, hash := ent.Sub(level, i, nil)
		r, err := store.Peek(context.Background(), name, hash, sub)
		if err != nil {
			t.Fatal(err)
		}
		out.ResetAfter = max(out.ResetAfter, r.ResetAfter)
		if r.Allowed {
			held += r.Remaining + 1
			out.Allowed = true
			continue
		}
		held += max(0, r.Remaining)
		if out.RetryAfter == 0 || r.RetryAfter < out.RetryAfter {
			out.RetryAfter = r.RetryAfter
		}
	}
	if out.Allowed {
		out.RetryAfter = 0
		held--
	}
	out.Remaining = min(out.Limit, held)
	return out
}

// scriptTrips counts, per node, the round trips that carry a script call:
// a command, or a pipeline of them.
type scriptTrips struct {
	mu     sync.Mutex
	byNode map[string]int
}

func (s *scriptTrips) reset() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.byNode = nil
}

func (s *scriptTrips) counts() (map[string]int, int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	total := 0
	for _, n := range s.byNode {
		total += n
	}
	return s.byNode, total
}

func (s *scriptTrips) add(node string, cmds ...redis.Cmder) {
	for _, c := range cmds {
		if strings.HasPrefix(c.Name(), "eval") {
			s.mu.Lock()
			defer s.mu.Unlock()
			if s.byNode == nil {
				s.byNode = map[string]int{}
			}
			s.byNode[node]++
			return
		}
	}
}

// hook returns a hook that counts the round trips to node.
func (s *scriptTrips) hook(node string) redis.Hook { return tripHook{s, node} }

type tripHook struct {
	s    *scriptTrips
	node string
}

func (h tripHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h tripHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.s.add(h.node, cmd)
		return next(ctx, cmd)
	}
}

func (h tripHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.s.add(h.node, cmds...)
		return next(ctx, cmds)
	}
}

// TestPeekSplitStoreDown: while the Redis server of a split key is down, a
// peek answers as the policy's fallback decides, each peek one failure for
// the breaker, as a peek of a key whole.
func TestPeekSplitStoreDown(t *testing.T) {
	srv := redistest.ForTest(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: -1})
	t.Cleanup(func() { client.Close() })
	ctx := context.Background()
	store, err := counter.NewRedisStore(ctx, client, counter.RedisConfig{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	lim := Limit{Algorithm: counter.SlidingWindow, Rate: 160, Period: longPeriod}
	e := newSplitEngine(t, store, testkit.NewClock(), nameOf("p", "k"), shard.Level16)
	if r, err := e.Peek(ctx, "k", &Policy{Name: "p", Limit: lim}); err != nil || !r.Allowed || r.Degraded || r.Shards != shard.Level16 {
		t.Fatalf("peek, server up: %+v, %v; want allowed on 16 subcounters", r, err)
	}
	if err := srv.Kill(); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Peek(ctx, "k", &Policy{Name: "p", Limit: lim, OnStoreFailure: FallbackError}); !errors.Is(err, ErrStoreUnavailable) {
		t.Errorf("fallback error, server down: %v; want ErrStoreUnavailable", err)
	}
	if r, err := e.Peek(ctx, "k", &Policy{Name: "p", Limit: lim, OnStoreFailure: FallbackOpen}); err != nil || !r.Allowed || !r.Degraded {
		t.Errorf("fallback open, server down: %+v, %v; want allowed, degraded", r, err)
	}
	if got := e.brk.State(); got != BreakerClosed {
		t.Errorf("breaker after 2 failed peeks: %v, want closed (it opens at the 3rd failure)", got)
	}
	if r, err := e.Peek(ctx, "k", &Policy{Name: "p", Limit: lim, OnStoreFailure: FallbackClosed}); err != nil || r.Allowed || !r.Degraded {
		t.Errorf("fallback closed, server down: %+v, %v; want denied, degraded", r, err)
	}
	if got := e.brk.State(); got != BreakerOpen {
		t.Errorf("breaker after 3 failed peeks: %v, want open", got)
	}
}
