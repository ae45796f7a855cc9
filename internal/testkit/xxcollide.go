package testkit

import (
	"encoding/binary"
	"fmt"
	"math/bits"

	"github.com/cespare/xxhash/v2"
)

// The primes of XXH64 that its stripes use (P3 to P5 only finish it).
const (
	xxP1 uint64 = 0x9e3779b185ebca87
	xxP2 uint64 = 0xc2b2ae3d27d4eb4f
)

// xxRound is XXH64's lane update: acc = rotl(acc + lane·P2, 31)·P1.
func xxRound(acc, lane uint64) uint64 {
	return bits.RotateLeft64(acc+lane*xxP2, 31) * xxP1
}

// xxUnround returns the lane that takes acc to out under xxRound: the
// round is a bijection of the lane, P1 and P2 being odd.
func xxUnround(acc, out uint64) uint64 {
	return (bits.RotateLeft64(out*inverse(xxP1), -31) - acc) * inverse(xxP2)
}

// inverse is the multiplicative inverse of odd x modulo 2⁶⁴ (Newton's
// iteration, each step doubling the correct low bits).
func inverse(x uint64) uint64 {
	y := x // correct to 3 bits for odd x
	for range 5 {
		y *= 2 - x*y
	}
	return y
}

// xxLanes is the state of XXH64 under seed 0 after the 32-byte stripes of
// b, whose length is a multiple of 32.
func xxLanes(b []byte) [4]uint64 {
	p1, p2 := xxP1, xxP2 // variables: the lanes' start wraps around
	v := [4]uint64{p1 + p2, p2, 0, -p1}
	for ; len(b) >= 32; b = b[32:] {
		for i := range v {
			v[i] = xxRound(v[i], binary.LittleEndian.Uint64(b[8*i:]))
		}
	}
	return v
}

// XXHashCollisions returns n keys, distinct and other than target, of
// target's length, whose xxhash64 (unseeded) is target's, as a client that
// knows the hash can craft them: each key's first 32 bytes are its own, its
// next 32 bring XXH64's four lanes to target's state after 64 bytes, and
// its rest is target's. target must be at least 64 bytes long.
func XXHashCollisions(target string, n int) []string {
	if len(target) < 64 {
		panic("testkit: XXHashCollisions needs a target of 64 bytes or more")
	}
	want := xxLanes([]byte(target[:64]))
	keys := make([]string, 0, n)
	for i := 0; len(keys) < n; i++ {
		b := make([]byte, len(target))
		copy(b, fmt.Sprintf("crafted-%024d", i))
		copy(b[64:], target[64:])
		v := xxLanes(b[:32])
		for j := range v {
			binary.LittleEndian.PutUint64(b[32+8*j:], xxUnround(v[j], want[j]))
		}
		k := string(b)
		if k == target {
			continue
		}
		if xxhash.Sum64String(k) != xxhash.Sum64String(target) {
			panic(fmt.Sprintf("testkit: crafted key %q does not collide", k))
		}
		keys = append(keys, k)
	}
	return keys
}
