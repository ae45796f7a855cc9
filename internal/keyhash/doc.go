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
//
// Built with the tag hotkey_fixedhash, for tests only, it is unseeded
// xxhash64 instead, the same in every run, so that a test whose course
// follows the keys' hashes (which subcounter a second chance probes, which
// sketch cells keys share) replays from its own seed; crafted keys collide
// again then.
package keyhash
