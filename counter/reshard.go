package counter

import "context"

// Shard is one counter of a key's split: its name, its hash (Hash(Name) or
// 0, as passed to Take) and its share of the key's limit.
type Shard struct {
	Name  string
	Hash  uint64
	Limit Limit
}

// Resharder is implemented by stores that can carry a key's usage across a
// change of level, so that a split does not hand out a fresh quota and a
// merge does not forget what the subcounters admitted.
type Resharder interface {
	// Reshard reads the state of the counters from, sums their usage, and
	// seeds each counter of to with its share of that usage: raising the
	// counter's usage to its seed where it is below, never lowering it. So
	// seeding twice (two instances making the same transition) or seeding
	// a counter already in use counts nothing twice. from and to are not
	// empty, and all their limits have the same algorithm and period;
	// otherwise Reshard returns an error wrapping ErrInvalidReshard. The
	// counters of from are left as they are. Each counter is read as a Take
	// on it would read it (absent or expired, it is unused), and usage is
	// split in proportion to the rates of to. A store with no room for a
	// counter of to fails with an error wrapping ErrFull, having lost
	// nothing: the usage stays on from.
	Reshard(ctx context.Context, from, to []Shard) error
}
