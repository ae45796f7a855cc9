// Package keyhash is the one hash of a key within a process: a decision
// computes it once and every in-process structure that the key reaches (the
// hot-key detector, the split table, the deny cache, the memory store, the
// gossip store) knows the key by it.
//
// It is hash/maphash under a seed drawn at random when the process starts,
// so that its values are a secret: a client cannot craft keys that share
// one, as it can for an unseeded hash such as xxhash64, whose full 64-bit
// collisions are computed by inverting its lane rounds. Its values differ
// from process to process: nothing that another process must agree on
// (node placement, anything sent over the wire) may use it.
package keyhash

import "hash/maphash"

// seed is the process's secret. maphash.MakeSeed draws it at random.
var seed = maphash.MakeSeed()

// Sum returns the hash of key under the process's seed. It is safe for
// concurrent use and does not allocate.
func Sum(key string) uint64 { return maphash.String(seed, key) }
