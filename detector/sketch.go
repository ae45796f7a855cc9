package detector

import (
	"math/bits"
	"sync/atomic"
)

// sketches is a ring of Count-Min sketches with conservative update, one per
// sub-window, in one flat array of 16-bit counters. Each sketch is blocked: a
// key maps to one 32-byte block of 16 counters, chosen by the low bits of its
// hash, and within it to one counter in each of depth groups of 16/depth,
// chosen by the high bits. So an Observe touches one cache line where a
// textbook sketch touches depth of them; each row still has width counters
// and two keys collide in a row with probability 1/width. The hash must be
// uniform over all 64 bits (the engine's seeded hash is).
//
// Why blocked: the counters may be shared by several cores (the detector
// gives each processor a stripe of its own, up to Config.Stripes), and a line
// one core just raised must travel to the next core that reads it. With two cores
// on this design's test machine, a textbook sketch made Observe up to 3.5
// times slower on two cores than on one, the blocked one half as much. The
// cost of blocking is that keys sharing a block share all their counters
// one time in 4^depth, which fattens the tail of the estimates of keys never
// seen: about twice the mean counter at most for a flood of distinct keys
// (1.3 times for a textbook sketch), which the promotion threshold allows
// for. It cannot fatten it much more: conservative update raises a counter
// only to the estimate of the key being counted, and a key leaves the sketch
// for the exact table once its estimate reaches the promotion threshold P,
// so while the table has room no counter exceeds P by more than a few races,
// and a key credited with an inflated estimate gets at most P.
//
// Why 16 bits: a counter only has to reach P, and half the bytes is half
// the cache misses. Observe is bound by the miss on its block: on the
// design's test machine (512 KiB of L2 per core), one core observing 1M
// distinct keys took 165 ns per key with a 1 MiB sketch and 70 ns with a
// 512 KiB one. Counters stop at maxCount, and P never exceeds it.
type sketches struct {
	words  []atomic.Uint32 // two counters each: sketch s, block b, counter j in word (s·blocks+b)·8+j/2, half j%2
	blocks int             // per sketch
	mask   uint64          // blocks-1
	depth  int
	gbits  uint // log2 of the counters in a group
}

const (
	// blockCells is the number of counters in a block: 32 bytes, so a block
	// never straddles two cache lines.
	blockCells = 16
	// blockWords is the number of 32-bit words in a block.
	blockWords = blockCells / 2
	// maxCount is where a counter stops: 16 bits, less a margin for
	// concurrent adds that each saw it one short, so that it never carries
	// into its neighbour. The promotion threshold is at most maxCount, so a
	// counter that stops has already promoted its key.
	maxCount = 1<<16 - 1<<12
)

func newSketches(n, depth, width int) sketches {
	blocks := width * depth / blockCells
	return sketches{
		words:  make([]atomic.Uint32, n*blocks*blockWords),
		blocks: blocks,
		mask:   uint64(blocks - 1),
		depth:  depth,
		gbits:  uint(bits.TrailingZeros(uint(blockCells / depth))),
	}
}

// block returns the block of hash in sketch s.
func (k *sketches) block(s int, hash uint64) *[blockWords]atomic.Uint32 {
	i := (s*k.blocks + int(hash&k.mask)) * blockWords
	return (*[blockWords]atomic.Uint32)(k.words[i : i+blockWords])
}

// cell returns the counter of row i for hash within its block: group i,
// picked by the bits of hash just under those of the rows before it.
func (k *sketches) cell(i int, hash uint64) int {
	shift := 64 - uint(i+1)*k.gbits
	return i<<k.gbits | int(hash>>shift&(1<<k.gbits-1))
}

// get returns counter j of block b.
func get(b *[blockWords]atomic.Uint32, j int) uint32 {
	return b[j>>1].Load() >> (16 * (j & 1)) & 0xffff
}

// inc adds one to counter j of block b.
func inc(b *[blockWords]atomic.Uint32, j int) {
	b[j>>1].Add(1 << (16 * (j & 1)))
}

// add counts one occurrence of hash in sketch s and returns the new estimate.
// Conservative update raises only the counters equal to the minimum, so an
// estimate overstates a key's count only by what colliding keys added to all
// of its counters. Sequentially an estimate never understates the count, up
// to maxCount, where the counters stop.
// Two concurrent adds of one key may each raise the same single counter
// while another counter was only one above it, so under concurrency an
// estimate can fall short by about one per such race; a promotion threshold
// loses no hot key to that.
func (k *sketches) add(s int, hash uint64) uint32 {
	b := k.block(s, hash)
	if k.depth == 4 { // the default, unrolled: four loads, then the adds
		j0 := int(hash >> 62)
		j1 := 4 | int(hash>>60&3)
		j2 := 8 | int(hash>>58&3)
		j3 := 12 | int(hash>>56&3)
		v0, v1, v2, v3 := get(b, j0), get(b, j1), get(b, j2), get(b, j3)
		m := min(v0, v1, v2, v3)
		if m >= maxCount {
			return m + 1
		}
		// Raise the minimal ones without branching on which they are: the
		// pattern is a coin toss per counter, and mispredicting it cost more
		// than the adds of 0 do.
		b[j0>>1].Add(b2u(v0 == m) << (16 * (j0 & 1)))
		b[j1>>1].Add(b2u(v1 == m) << (16 * (j1 & 1)))
		b[j2>>1].Add(b2u(v2 == m) << (16 * (j2 & 1)))
		b[j3>>1].Add(b2u(v3 == m) << (16 * (j3 & 1)))
		return m + 1
	}
	var v [maxDepth]uint32
	m := ^uint32(0)
	for i := range k.depth {
		v[i] = get(b, k.cell(i, hash))
		m = min(m, v[i])
	}
	if m >= maxCount {
		return m + 1
	}
	for i := range k.depth {
		if v[i] == m {
			inc(b, k.cell(i, hash))
		}
	}
	return m + 1
}

// estimate returns the count of hash in sketch s: the minimum of its counters.
func (k *sketches) estimate(s int, hash uint64) uint32 {
	b := k.block(s, hash)
	m := ^uint32(0)
	for i := range k.depth {
		m = min(m, get(b, k.cell(i, hash)))
	}
	return m
}

// load returns the mean counter of sketch s, from a sample of at most 512
// blocks, one counter each, spread over the groups.
func (k *sketches) load(s int) float64 {
	stride := max(1, k.blocks/512)
	var sum uint64
	n := 0
	for b := 0; b < k.blocks; b += stride {
		sum += uint64(get(k.block(s, uint64(b)), n%blockCells))
		n++
	}
	return float64(sum) / float64(n)
}

// clear zeroes part i of parts of sketch s. Only a straggler that read the
// slot number before the ring moved twice could add to it meanwhile; the
// stores are atomic so that such a straggler is a lost count, not a race.
func (k *sketches) clear(s, i, parts int) {
	all := k.words[s*k.blocks*blockWords : (s+1)*k.blocks*blockWords]
	n := (len(all) + parts - 1) / parts
	all = all[min(len(all), i*n):min(len(all), (i+1)*n)]
	for j := range all {
		all[j].Store(0)
	}
}

// b2u is 1 for true, 0 for false, without a branch.
func b2u(v bool) uint32 {
	var u uint32
	if v {
		u = 1
	}
	return u
}
