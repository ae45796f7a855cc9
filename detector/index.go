package detector

import "sync/atomic"

// index maps key hashes to entries of the exact table: open addressing with
// linear probing, at most a quarter full, 64 KiB at the default capacity. A
// cell holds the top 16 bits of the hash and the entry number plus one; 0 is
// empty. In front of it a filter of 16 bits per entry, 8 KiB, says which
// hashes may be there, so that a key not in the table, nearly every key,
// costs one load that hits L1. Lookups take no lock and check the full hash
// against the entry, so they tolerate an index being rebuilt under them:
// they may miss, never count into the wrong key. Inserts hold the detector's
// mutex. There are no deletions: the detector rebuilds the spare index
// without the evicted keys and swaps it in.
type index struct {
	filter []atomic.Uint64
	fmask  uint64 // bits in filter - 1
	cells  []atomic.Uint32
	mask   uint64 // len(cells) - 1
}

// maxCapacity bounds the entries an index can address.
const maxCapacity = 1<<16 - 1

func newIndex(capacity int) index {
	n := 4
	for n < 4*capacity {
		n <<= 1
	}
	return index{
		filter: make([]atomic.Uint64, 4*n/64),
		fmask:  uint64(4*n - 1),
		cells:  make([]atomic.Uint32, n),
		mask:   uint64(n - 1),
	}
}

// find returns the entry holding hash, or -1.
func (x *index) find(hash uint64, hashes []atomic.Uint64) int {
	if f := hash >> 32 & x.fmask; x.filter[f/64].Load()&(1<<(f%64)) == 0 {
		return -1
	}
	tag := uint32(hash >> 48)
	for i := hash & x.mask; ; i = (i + 1) & x.mask {
		c := x.cells[i].Load()
		if c == 0 {
			return -1
		}
		if c>>16 == tag {
			if n := int(c&0xffff) - 1; hashes[n].Load() == hash {
				return n
			}
		}
	}
}

// insert maps hash to entry n; hash must not be in the index.
func (x *index) insert(hash uint64, n int) {
	i := hash & x.mask
	for x.cells[i].Load() != 0 {
		i = (i + 1) & x.mask
	}
	x.cells[i].Store(uint32(hash>>48)<<16 | uint32(n+1))
	f := hash >> 32 & x.fmask
	x.filter[f/64].Or(1 << (f % 64))
}

// reset empties the index.
func (x *index) reset() {
	for i := range x.filter {
		x.filter[i].Store(0)
	}
	for i := range x.cells {
		x.cells[i].Store(0)
	}
}
