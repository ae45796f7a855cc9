package split

import (
	"cmp"
	"strings"

	"github.com/hotkeyd/hotkey/shard"
)

// Ranked is a key competing for room in a full table: its level, and its
// entry if the table holds it (else nil).
type Ranked struct {
	Key   string
	Hash  uint64
	Level shard.Level
	Entry *Entry
}

// Outranks orders keys competing for a full table, first first: the higher
// level, then the lower hash, then the key. Every instance ranks alike, so
// instances told the same levels, in whatever order, hold the same keys and
// never decide one key on different counters.
func Outranks(a, b Ranked) int {
	if c := cmp.Compare(b.Level, a.Level); c != 0 {
		return c
	}
	if c := cmp.Compare(a.Hash, b.Hash); c != 0 {
		return c
	}
	return strings.Compare(a.Key, b.Key)
}
