package counter

import (
	"context"
	"fmt"
	"github.com/hotkeyd/hotkey/shard"
	"slices"
	"strconv"
	"sync"

	"github.com/cespare/xxhash/v2"
	"github.com/redis/go-redis/v9"
)

// Placement maps counter names to the store's nodes (see shard.Placement).
// Node is given a counter's name without the store's Prefix, which the
// store adds itself before hashing.
type Placement = shard.Placement

// readPlacement builds the snapshot of client's node map as of now, with the
// given version:
//
//   - a ClusterClient: hash slots (CLUSTER SLOTS) to masters, numbered in
//     address order so that every instance reading the same map numbers
//     the nodes alike;
//   - a Ring: go-redis's own shard choice over the live shards, numbered in
//     shard-name order (the shards of RingOptions.Addrs: after
//     Ring.SetAddrs with new addresses, reads fail and the snapshot stays);
//   - anything else: one node.
func readPlacement(ctx context.Context, client redis.UniversalClient, prefix string, version uint64) (Placement, error) {
	switch c := client.(type) {
	case *redis.ClusterClient:
		return readSlots(ctx, c, prefix, version)
	case *redis.Ring:
		return readRing(ctx, c, prefix, version)
	}
	return singleNode{}, nil
}

// samePlacement reports whether a and b map every name to the same node.
func samePlacement(a, b Placement) bool {
	switch a := a.(type) {
	case singleNode:
		_, ok := b.(singleNode)
		return ok
	case *slotPlacement:
		b, ok := b.(*slotPlacement)
		return ok && slices.Equal(a.masters, b.masters) && *a.slots == *b.slots
	case *ringPlacement:
		b, ok := b.(*ringPlacement)
		return ok && slices.Equal(a.names, b.names) && slices.Equal(a.live, b.live) &&
			(a.custom == nil) == (b.custom == nil)
	}
	return false
}

// singleNode is the placement of a standalone server: one node, forever.
type singleNode struct{}

func (singleNode) Nodes() int      { return 1 }
func (singleNode) Node(string) int { return 0 }
func (singleNode) Version() uint64 { return 1 }

// pendingNode is the placement of a Cluster or Ring store not set up yet
// (RedisConfig.SetupRetry): one node, under version 0, which no node map
// read from the server has.
type pendingNode struct{}

func (pendingNode) Nodes() int      { return 1 }
func (pendingNode) Node(string) int { return 0 }
func (pendingNode) Version() uint64 { return 0 }

// slotPlacement maps names to Cluster masters by hash slot.
type slotPlacement struct {
	prefix  string
	masters []string          // addresses, sorted; a node is an index here
	slots   *[numSlots]uint16 // slot → node; unowned slots map to node 0
	version uint64
}

func (p *slotPlacement) Nodes() int           { return len(p.masters) }
func (p *slotPlacement) Node(name string) int { return int(p.slots[keySlot(p.prefix, name)]) }
func (p *slotPlacement) Version() uint64      { return p.version }

func readSlots(ctx context.Context, c *redis.ClusterClient, prefix string, version uint64) (*slotPlacement, error) {
	ranges, err := c.ClusterSlots(ctx).Result()
	if err != nil {
		return nil, fmt.Errorf("cluster slots: %w", err)
	}
	p := &slotPlacement{prefix: prefix, slots: new([numSlots]uint16), version: version}
	for _, r := range ranges {
		if len(r.Nodes) > 0 && !slices.Contains(p.masters, r.Nodes[0].Addr) {
			p.masters = append(p.masters, r.Nodes[0].Addr)
		}
	}
	if len(p.masters) == 0 {
		return nil, fmt.Errorf("cluster slots: no master")
	}
	slices.Sort(p.masters)
	for _, r := range ranges {
		if len(r.Nodes) == 0 || r.Start < 0 || r.End >= numSlots {
			continue
		}
		node := uint16(slices.Index(p.masters, r.Nodes[0].Addr))
		for slot := r.Start; slot <= r.End; slot++ {
			p.slots[slot] = node
		}
	}
	return p, nil
}

// ringPlacement maps names to Ring shards the way the Ring does: by
// rendezvous hashing of the key's hash tag (or whole key) over the live
// shards' names.
type ringPlacement struct {
	prefix string
	names  []string // every configured shard name, sorted; a node is an index here
	live   []int    // nodes of the shards that are up, ascending
	hashes []uint64 // xxhash of each live shard's name, parallel to live
	// custom is the Ring's own ConsistentHash over the live shard names when
	// the Ring does not hash the way go-redis does by default; Node then
	// asks it, at the cost of building the key.
	custom  redis.ConsistentHash
	version uint64
}

func (p *ringPlacement) Nodes() int      { return len(p.names) }
func (p *ringPlacement) Version() uint64 { return p.version }

func (p *ringPlacement) Node(name string) int {
	if len(p.live) == 0 {
		return 0
	}
	if p.custom != nil {
		key := p.prefix + name
		if tag, ok := shard.HashTag(key); ok {
			key = tag
		}
		if i, ok := slices.BinarySearch(p.names, p.custom.Get(key)); ok {
			return i
		}
		return 0
	}
	var h uint64
	if tag, ok := shard.HashTag(name); ok { // the prefix has no braces
		h = xxhash.Sum64String(tag)
	} else {
		var d xxhash.Digest
		d.Reset()
		d.WriteString(p.prefix)
		d.WriteString(name)
		h = d.Sum64()
	}
	return p.live[p.pick(h)]
}

// pick returns the index in p.live of the shard rendezvous hashing gives
// the key hashed to kh: the highest score, the first one on a tie.
func (p *ringPlacement) pick(kh uint64) int {
	best, bestScore := 0, mix64(kh^p.hashes[0])
	for i := 1; i < len(p.hashes); i++ {
		if score := mix64(kh ^ p.hashes[i]); score > bestScore {
			best, bestScore = i, score
		}
	}
	return best
}

// mix64 is the xorshift mix of go-redis's rendezvous hash
// (internal/hashtag.RendezvousHash in go-redis v9.23).
func mix64(x uint64) uint64 {
	x ^= x >> 12
	x ^= x << 25
	x ^= x >> 27
	return x * 2685821657736338717
}

func readRing(ctx context.Context, c *redis.Ring, prefix string, version uint64) (*ringPlacement, error) {
	opt := c.Options()
	byAddr := make(map[string]string, len(opt.Addrs))
	p := &ringPlacement{prefix: prefix, version: version}
	for name, addr := range opt.Addrs {
		byAddr[addr] = name
		p.names = append(p.names, name)
	}
	if len(p.names) == 0 {
		return nil, fmt.Errorf("ring: no shards")
	}
	slices.Sort(p.names)
	// ForEachShard visits the shards that are up; map them back to names.
	var mu sync.Mutex // guards p.live
	err := c.ForEachShard(ctx, func(_ context.Context, shard *redis.Client) error {
		name, ok := byAddr[shard.Options().Addr]
		if !ok {
			return fmt.Errorf("ring: shard %s is not in RingOptions.Addrs", shard.Options().Addr)
		}
		i, _ := slices.BinarySearch(p.names, name)
		mu.Lock()
		p.live = append(p.live, i)
		mu.Unlock()
		return nil
	})
	if err != nil {
		return nil, err
	}
	slices.Sort(p.live)
	liveNames := make([]string, len(p.live))
	for j, i := range p.live {
		liveNames[j] = p.names[i]
		p.hashes = append(p.hashes, xxhash.Sum64String(p.names[i]))
	}
	// Check the built-in rendezvous hash against the Ring's own; if they
	// ever disagree (a custom NewConsistentHash, another go-redis), ask the
	// Ring's.
	if opt.NewConsistentHash != nil && len(p.live) > 1 {
		ch := opt.NewConsistentHash(liveNames)
		for i := range 64 {
			key := prefix + strconv.Itoa(i)
			if ch.Get(key) != liveNames[p.pick(xxhash.Sum64String(key))] {
				p.custom = ch
				break
			}
		}
	}
	return p, nil
}
