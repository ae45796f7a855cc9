package hotkey

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/hotkeyd/hotkey/counter"
	"github.com/hotkeyd/hotkey/internal/testkit"
	"github.com/hotkeyd/hotkey/shard"
)

// hashStore is a memory store that notes each call whose hash is not
// counter.Hash of the counter's name: the memory store places a counter by the
// hash it is given, so such a call may find another counter than the
// name's.
type hashStore struct {
	*counter.MemoryStore
	mu    sync.Mutex // guards calls and wrong
	calls int
	wrong []string
}

func (s *hashStore) note(op, key string, hash uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls++
	if hash != counter.Hash(key) {
		s.wrong = append(s.wrong, fmt.Sprintf("%s %q with %#x", op, key, hash))
	}
}

func (s *hashStore) Take(ctx context.Context, key string, hash uint64, lim counter.Limit, n int64) (counter.Result, error) {
	s.note("Take", key, hash)
	return s.MemoryStore.Take(ctx, key, hash, lim, n)
}

func (s *hashStore) Peek(ctx context.Context, key string, hash uint64, lim counter.Limit) (counter.Result, error) {
	s.note("Peek", key, hash)
	return s.MemoryStore.Peek(ctx, key, hash, lim)
}

func (s *hashStore) Lease(ctx context.Context, key string, hash uint64, lim counter.Limit, n int64) (counter.Lease, error) {
	s.note("Lease", key, hash)
	return s.MemoryStore.Lease(ctx, key, hash, lim, n)
}

func (s *hashStore) Return(ctx context.Context, key string, hash uint64, lim counter.Limit, r int64, token counter.Token) (int64, error) {
	s.note("Return", key, hash)
	return s.MemoryStore.Return(ctx, key, hash, lim, r, token)
}

func (s *hashStore) Reshard(ctx context.Context, from, to []counter.Shard) error {
	for _, sh := range from {
		s.note("Reshard from", sh.Name, sh.Hash)
	}
	for _, sh := range to {
		s.note("Reshard to", sh.Name, sh.Hash)
	}
	return s.MemoryStore.Reshard(ctx, from, to)
}

func (s *hashStore) Delete(ctx context.Context, cs []counter.Shard) error {
	for _, sh := range cs {
		s.note("Delete", sh.Name, sh.Hash)
	}
	return s.MemoryStore.Delete(ctx, cs)
}

// TestStoreHash: every call the engine makes on a store (takes of unsplit
// and split keys, one and in batches, with state transfer, under
// SyncReserve, peeks, resets) gives the hash of the counter's name, for
// plain names and for escaped ones (a key that ends like a subcounter's
// name): a decision hashes its key once, and the store places the counter
// by that hash.
func TestStoreHash(t *testing.T) {
	clock := testkit.NewClock()
	store := &hashStore{MemoryStore: counter.NewMemoryStore(counter.MemoryConfig{Clock: clock.Now})}
	e, err := New(store, withClock(clock.Now), WithoutDetector(), withMinShare(1), WithSplitKeys(shard.Level4, nil, "split", "split|4|1"))
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	ctx := context.Background()
	lim := Limit{Rate: 64, Period: time.Hour}
	var policies []*Policy
	for _, name := range []string{"", "p"} {
		for _, sync := range []Sync{SyncStore, SyncReserve} {
			policies = append(policies, &Policy{Name: name, Limit: lim, Sync: sync})
		}
	}
	keys := []string{"plain", "a|4|0", "a|16|2|1", "split", "split|4|1", "moved", "moved|64|3"}
	for _, p := range policies {
		for _, key := range keys {
			for range 3 {
				if _, err := e.Allow(ctx, key, p); err != nil {
					t.Fatalf("%q: %v", key, err)
				}
			}
			if _, err := e.Peek(ctx, key, p); err != nil {
				t.Fatalf("peek %q: %v", key, err)
			}
		}
		reqs := make([]Request, len(keys))
		for i, key := range keys {
			reqs[i] = Request{Key: key, Policy: p, Cost: 1}
		}
		e.AllowBatch(ctx, reqs, make([]Decision, len(reqs)))
		// Split "moved" and merge it back: its usage moves both ways.
		for _, level := range []shard.Level{shard.Level16, shard.Level1} {
			for _, key := range keys[5:] {
				name := nameOf(p.Name, key)
				handler{e}.SetLevel(name, hashKey(name), level)
				if _, err := e.Allow(ctx, key, p); err != nil {
					t.Fatalf("%q at level %d: %v", key, level, err)
				}
			}
		}
		for _, key := range keys {
			if err := e.Reset(ctx, key, p); err != nil {
				t.Fatalf("reset %q: %v", key, err)
			}
		}
	}
	store.mu.Lock()
	defer store.mu.Unlock()
	if len(store.wrong) > 0 {
		t.Errorf("%d of %d store calls given a hash other than the name's, the first: %v", len(store.wrong), store.calls, store.wrong[:min(5, len(store.wrong))])
	}
}
