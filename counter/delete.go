package counter

import (
	"context"
	"fmt"
	"maps"
	"slices"

	"github.com/redis/go-redis/v9"
)

// Deleter is implemented by stores that can delete counters.
type Deleter interface {
	// Delete removes the counters named by the Names of counters (each
	// Hash as passed to Take; Limit is not read), so that the next Take
	// on each finds a fresh one. A counter not held is no error. A Take
	// concurrent with Delete lands before or after it. Delete may block
	// on I/O.
	Delete(ctx context.Context, counters []Shard) error
}

var (
	_ Deleter = (*MemoryStore)(nil)
	_ Deleter = (*RedisStore)(nil)
	_ Deleter = (*ReserveStore)(nil)
)

// Delete implements Deleter. It never fails. A counter whose units the
// tally holds (see TakeTallied) is made fresh and kept until they are
// drained: units admitted before still go out.
func (s *MemoryStore) Delete(_ context.Context, counters []Shard) error {
	for _, c := range counters {
		id := s.identify(c.Name, c.Hash)
		st := s.stripe(id)
		st.mu.Lock()
		if i := st.t.find(id); i >= 0 {
			if st.t.cells[i].tally > 0 {
				st.t.reset(i)
			} else {
				st.t.remove(i)
			}
		}
		st.mu.Unlock()
	}
	return nil
}

// Delete implements Deleter in one round trip: one DEL of every name on a
// standalone server; on a Cluster one DEL per hash slot, and on a Ring one
// per name, pipelined (go-redis sends each node its part at once). Each
// counter's generation goes with it (genKey).
func (s *RedisStore) Delete(ctx context.Context, counters []Shard) error {
	if len(counters) == 0 {
		return nil
	}
	if !s.ready.Load() {
		return fmt.Errorf("redis delete: %w", s.notReady())
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	var err error
	switch s.client.(type) {
	case *redis.ClusterClient:
		slots := make(map[int][]string)
		var order []int
		for _, c := range counters {
			slot := keySlot(s.cfg.Prefix, c.Name)
			if _, ok := slots[slot]; !ok {
				order = append(order, slot)
			}
			slots[slot] = append(slots[slot], s.leaseKeys(c.Name)...)
		}
		_, err = s.client.Pipelined(ctx, func(p redis.Pipeliner) error {
			for _, slot := range order {
				p.Del(ctx, slots[slot]...)
			}
			return nil
		})
	case *redis.Ring:
		_, err = s.client.Pipelined(ctx, func(p redis.Pipeliner) error {
			for _, c := range counters {
				p.Del(ctx, s.leaseKeys(c.Name)...)
			}
			return nil
		})
	default:
		keys := make([]string, 0, 2*len(counters))
		for _, c := range counters {
			keys = append(keys, s.leaseKeys(c.Name)...)
		}
		err = s.client.Del(ctx, keys...).Err()
	}
	if err != nil {
		return fmt.Errorf("redis delete: %w", err)
	}
	return nil
}

// Delete implements Deleter when the store it leases from is a Deleter:
// the counters' blocks are dropped, their unused units not returned (the
// counters they would go back to are deleted), and the counters deleted on
// the store, the blocks held meanwhile so that no decision admits from
// them across the deletion.
func (s *ReserveStore) Delete(ctx context.Context, counters []Shard) error {
	d, ok := s.base.(Deleter)
	if !ok {
		return fmt.Errorf("reserve delete: %T cannot delete", s.base)
	}
	// Locked in name order, each once: a decision holds one block at a
	// time, and two Deletes take theirs in the same order.
	names := make(map[string]*block)
	for _, c := range counters {
		sh := &s.shards[c.Hash&uint64(len(s.shards)-1)]
		sh.mu.Lock()
		if b := sh.blocks[c.Name]; b != nil {
			names[c.Name] = b
		}
		sh.mu.Unlock()
	}
	held := make([]*block, 0, len(names))
	for _, name := range slices.Sorted(maps.Keys(names)) {
		b := names[name]
		b.mu.Lock()
		held = append(held, b)
	}
	err := d.Delete(ctx, counters)
	for _, b := range held {
		if err == nil {
			b.left, b.until, b.wait, b.next = 0, 0, nil, nil // the units of both were on the counters deleted
			b.epoch++
		}
		b.mu.Unlock()
	}
	return err
}
