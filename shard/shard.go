// Package shard holds the arithmetic of splitting one rate-limited key into
// subcounters: the levels a key can be split to, the share of the limit each
// subcounter enforces, the subcounters' names and how a decision picks one,
// and the table of keys currently split.
//
// A key split N ways becomes N counters, each enforcing limit/N with the
// remainder limit%N given one each to the first subcounters, so the shares sum
// to the limit exactly; the burst is split the same way. If every subcounter
// receives 1/N of the traffic, the split key admits what the unsplit key
// would, while the store sees the load spread over N counters. Names are
// chosen from the store's node map (Placement) so that the N subcounters lie on
// the nodes as evenly as possible: at most ceil(N/nodes) on any node.
package shard

import (
	"errors"
	"fmt"
	"math/bits"
	"strconv"
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

// index maps 1, 4, 16, 64 to 0, 1, 2, 3.
func (l Level) index() int { return bits.TrailingZeros(uint(l)) / 2 }

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

// Names returns the names of the n subcounters of key. Subcounter i goes to
// node (hash+i) mod nodes, so no node holds more than ceil(n/nodes); with p
// nil or a single node, names are chosen without probing. The names carry no
// shared Redis Cluster hash tag: if key has a tag, the names start with "{}",
// which disables it. The result is deterministic in (key, hash, n, p), so every
// instance with the same node map picks the same names. For n == 1 the name
// is the key itself.
func Names(key string, hash uint64, n Level, p Placement) []string {
	if n == Level1 {
		return []string{key}
	}
	base := make([]byte, 0, len(key)+16)
	if hasHashTag(key) {
		base = append(base, "{}"...)
	}
	base = append(base, key...)
	base = append(base, '|')
	base = strconv.AppendInt(base, int64(n), 10)
	base = append(base, '|')
	nodes := 1
	if p != nil {
		nodes = p.Nodes()
	}
	names := make([]string, n)
	buf := make([]byte, 0, len(base)+12)
	for i := range names {
		buf = strconv.AppendInt(append(buf[:0], base...), int64(i), 10)
		if nodes <= 1 {
			names[i] = string(buf)
			continue
		}
		target := int((hash + uint64(i)) % uint64(nodes))
		stem := len(buf)
		for c := 0; ; c++ {
			if c > 0 {
				buf = strconv.AppendInt(append(buf[:stem], '|'), int64(c), 10)
			}
			if name := string(buf); p.Node(name) == target || c == maxProbe*nodes {
				names[i] = name
				break
			}
		}
	}
	return names
}

// hasHashTag reports whether Redis Cluster would hash only part of key: a
// '{' followed later by a '}' with at least one byte between.
func hasHashTag(key string) bool {
	for i := 0; i < len(key); i++ {
		if key[i] == '{' {
			for j := i + 1; j < len(key); j++ {
				if key[j] == '}' {
					return j > i+1
				}
			}
			return false
		}
	}
	return false
}

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

// SubHash returns the hash of subcounter i of a key with hash h split n ways;
// stores use it for striping and the deny cache as identity.
func SubHash(h uint64, n Level, i int) uint64 {
	if n == Level1 {
		return h
	}
	return Mix(h ^ uint64(n)<<32 ^ uint64(i+1)*0x9e3779b97f4a7c15)
}
