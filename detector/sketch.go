package detector

import (
	"math/bits"
	"sync/atomic"
)

// sketches is a ring of Count-Min sketches with conservative update, one per
// sub-window, in one flat array of counters. Each sketch is blocked: a key
// maps to one 64-byte block of 16 counters, chosen by the low bits of its
// hash, and within it to one counter in each of depth groups of 16/depth,
// chosen by the high bits. So an Observe touches one cache line where a
// textbook sketch touches depth of them; each row still has width counters
// and two keys collide in a row with probability 1/width. The hash must be
// uniform over all 64 bits (xxhash is).
//
// Why blocked: the counters are shared by every core, and a line one core
// just raised must travel to the next core that reads it. With two cores
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
type sketches struct {
	cells  []atomic.Uint32 // sketch s, block b, counter j at (s·blocks+b)·16+j
	blocks int             // per sketch
	mask   uint64          // blocks-1
	depth  int
	gbits  uint // log2 of the counters in a group
}

// blockCells is the number of counters in a block: 64 bytes.
const blockCells = 16

func newSketches(n, depth, width int) sketches {
	blocks := width * depth / blockCells
	return sketches{
		cells:  make([]atomic.Uint32, n*blocks*blockCells),
		blocks: blocks,
		mask:   uint64(blocks - 1),
		depth:  depth,
		gbits:  uint(bits.TrailingZeros(uint(blockCells / depth))),
	}
}

// block returns the block of hash in sketch s.
func (k *sketches) block(s int, hash uint64) *[blockCells]atomic.Uint32 {
	i := (s*k.blocks + int(hash&k.mask)) * blockCells
	return (*[blockCells]atomic.Uint32)(k.cells[i : i+blockCells])
}

// cell returns the counter of row i for hash within its block: group i,
// picked by the bits of hash just under those of the rows before it.
func (k *sketches) cell(i int, hash uint64) int {
	shift := 64 - uint(i+1)*k.gbits
	return i<<k.gbits | int(hash>>shift&(1<<k.gbits-1))
}

// add counts one occurrence of hash in sketch s and returns the new estimate.
// Conservative update raises only the counters equal to the minimum, so an
// estimate overstates a key's count only by what colliding keys added to all
// of its counters. Sequentially an estimate never understates the count.
// Two concurrent adds of one key may each raise the same single counter
// while another counter was only one above it, so under concurrency an
// estimate can fall short by about one per such race; a promotion threshold
// loses no hot key to that.
func (k *sketches) add(s int, hash uint64) uint32 {
	b := k.block(s, hash)
	if k.depth == 4 { // the default, unrolled: four loads, then the adds
		c0 := &b[hash>>62]
		c1 := &b[4|hash>>60&3]
		c2 := &b[8|hash>>58&3]
		c3 := &b[12|hash>>56&3]
		v0, v1, v2, v3 := c0.Load(), c1.Load(), c2.Load(), c3.Load()
		m := min(v0, v1, v2, v3)
		if v0 == m {
			c0.Add(1)
		}
		if v1 == m {
			c1.Add(1)
		}
		if v2 == m {
			c2.Add(1)
		}
		if v3 == m {
			c3.Add(1)
		}
		return m + 1
	}
	var v [blockCells]uint32
	m := ^uint32(0)
	for i := range k.depth {
		v[i] = b[k.cell(i, hash)].Load()
		m = min(m, v[i])
	}
	for i := range k.depth {
		if v[i] == m {
			b[k.cell(i, hash)].Add(1)
		}
	}
	return m + 1
}

// estimate returns the count of hash in sketch s: the minimum of its counters.
func (k *sketches) estimate(s int, hash uint64) uint32 {
	b := k.block(s, hash)
	m := ^uint32(0)
	for i := range k.depth {
		m = min(m, b[k.cell(i, hash)].Load())
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
		sum += uint64(k.cells[(s*k.blocks+b)*blockCells+n%blockCells].Load())
		n++
	}
	return float64(sum) / float64(n)
}

// clear zeroes part i of parts of sketch s. Only a straggler that read the
// slot number before the ring moved twice could add to it meanwhile; the
// stores are atomic so that such a straggler is a lost count, not a race.
func (k *sketches) clear(s, i, parts int) {
	all := k.cells[s*k.blocks*blockCells : (s+1)*k.blocks*blockCells]
	n := (len(all) + parts - 1) / parts
	all = all[min(len(all), i*n):min(len(all), (i+1)*n)]
	for j := range all {
		all[j].Store(0)
	}
}
