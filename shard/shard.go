// Package shard holds the arithmetic of splitting one rate-limited key into
// subcounters: the levels a key can be split to, the share of the limit each
// subcounter enforces, the subcounters' names and how a decision picks one.
// Which keys are split, and the moves of their usage, are package split's.
//
// A key split N ways becomes N counters, each enforcing limit/N with the
// remainder limit%N given one each to the first subcounters, so the shares sum
// to the limit exactly; the burst is split the same way. If every subcounter
// receives 1/N of the traffic, the split key admits what the unsplit key
// would, while the store sees the load spread over N counters. Names are
// chosen from the store's node map (Placement) so that the N subcounters lie on
// the nodes as evenly as possible: at most ceil(N/nodes) on any node, and no
// two (key, level, subcounter) share a name (name.go).
package shard

import (
	"errors"
	"fmt"
	"math/bits"
	"strconv"

	"github.com/hotkeyd/hotkey/internal/keyhash"
)

// Level is how many subcounters a key is split into: 1 (not split), 4, 16
// or 64. The arithmetic below takes a Level where it means a key's split,
// and an int where it means any count.
type Level int

// The levels. Level1 is an unsplit key.
const (
	Level1  Level = 1
	Level4  Level = 4
	Level16 Level = 16
	Level64 Level = 64
	// MaxLevel is the highest level.
	MaxLevel = Level64
)

// ErrInvalidLevel is in every error CheckSplit returns.
var ErrInvalidLevel = errors.New("invalid level")

// Valid reports whether l is one of 1, 4, 16, 64.
func (l Level) Valid() bool {
	return l == Level1 || l == Level4 || l == Level16 || l == Level64
}

// Split reports whether l splits a key: 4, 16 or 64.
func (l Level) Split() bool { return l.Valid() && l != Level1 }

// CheckSplit returns nil if l splits a key (4, 16 or 64), and an error
// wrapping ErrInvalidLevel that names l otherwise.
func CheckSplit(l Level) error {
	if l.Split() {
		return nil
	}
	return fmt.Errorf("%w %d: want 4, 16 or 64", ErrInvalidLevel, int(l))
}

// String returns the level as a number: "1", "4", "16" or "64".
func (l Level) String() string { return strconv.Itoa(int(l)) }

// Up returns the level above l (MaxLevel stays MaxLevel).
func (l Level) Up() Level { return min(MaxLevel, max(Level4, l*4)) }

// Down returns the level below l (Level1 stays Level1).
func (l Level) Down() Level { return max(Level1, l/4) }

// Index maps 1, 4, 16, 64 to 0, 1, 2, 3, for tables kept per level; l is
// valid.
func (l Level) Index() int { return bits.TrailingZeros(uint(l)) / 2 }

// Share returns subcounter i's share of total split n ways: total/n, plus one
// for the first total%n subcounters. The n shares sum to total.
func Share(total int64, n, i int) int64 {
	q, r := total/int64(n), total%int64(n)
	if int64(i) < r {
		q++
	}
	return q
}

// Fit returns the number of subcounters to use for a key at level, the
// largest level ≤ level at which every subcounter keeps at least minShare of
// rate and at least cost of capacity (so any admissible request fits in every
// subcounter).
func Fit(level Level, rate, capacity, minShare, cost int64) Level {
	minShare = max(minShare, 1)
	for n := level; n > Level1; n /= 4 {
		if rate/int64(n) >= minShare && capacity/int64(n) >= cost {
			return n
		}
	}
	return Level1
}

// Placement maps counter names to the store's nodes. It is satisfied by the
// Redis store's node map; an immutable snapshot, safe for concurrent use.
type Placement interface {
	// Nodes returns the number of nodes, at least 1.
	Nodes() int
	// Node returns the index in [0, Nodes()) of the node holding name.
	Node(name string) int
	// Version differs between snapshots whose mappings differ.
	Version() uint64
}

// maxProbe bounds the names tried per subcounter to land on its node. With
// k nodes a try lands with probability 1/k; after maxProbe·k tries the
// chance of missing is (1-1/k)^(maxProbe·k) < e^-maxProbe.
const maxProbe = 40

// Mix is a 64-bit finaliser (SplitMix64's): it spreads the bits of x so that
// close inputs give unrelated outputs.
func Mix(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// NameHash is the hash stores and the deny cache know a counter name by,
// the counter package's Hash: seeded per process, so it never leaves it.
func NameHash(name string) uint64 { return keyhash.Sum(name) }

// Selection is how a decision picks one of a split key's subcounters.
type Selection uint8

const (
	// RoundRobin walks the subcounters in turn, from a per-instance offset.
	// Each subcounter gets exactly 1/N of an instance's decisions for the
	// key, so none runs dry while another has room.
	RoundRobin Selection = iota
	// Random picks by hashing the key hash with a per-key sequence: the
	// classic probabilistic split. Subcounters see binomially uneven load.
	Random
)

// SecondChance returns the subcounter to probe after subcounter i of n denied:
// another one, chosen by r (a random value).
func SecondChance(i, n int, r uint64) int {
	return (i + 1 + int(r%uint64(n-1))) % n
}
