package shard

import (
	"sync"
	"sync/atomic"
)

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

// Entry is one split key: its level and the per-key state used to pick
// subcounters. Its methods are safe for concurrent use.
type Entry struct {
	Key   string
	Hash  uint64
	level atomic.Int32
	seq   atomic.Uint64
	names [4]atomic.Pointer[nameSet] // by levelIndex
}

type nameSet struct {
	version uint64
	names   []string
}

// NewEntry returns an entry for key (with hash) at level.
func NewEntry(key string, hash uint64, level int) *Entry {
	e := &Entry{Key: key, Hash: hash}
	e.level.Store(int32(level))
	return e
}

// Level returns the entry's level.
func (e *Entry) Level() int { return int(e.level.Load()) }

// SetLevel changes the entry's level.
func (e *Entry) SetLevel(l int) { e.level.Store(int32(l)) }

// Names returns the names of the key's n subcounters under p (see Names),
// computed once per level and placement version. The caller must not modify
// the slice.
func (e *Entry) Names(n int, p Placement) []string {
	var v uint64
	if p != nil {
		v = p.Version()
	}
	slot := &e.names[levelIndex(n)]
	if s := slot.Load(); s != nil && s.version == v {
		return s.names
	}
	s := &nameSet{version: v, names: Names(e.Key, e.Hash, n, p)}
	slot.Store(s)
	return s.names
}

// Pick returns the subcounter, in [0, n), for the next decision on the key.
// seed is a per-instance random value, so instances do not march in step.
func (e *Entry) Pick(n int, sel Selection, seed uint64) int {
	s := e.seq.Add(1)
	if sel == Random {
		return int(Mix(e.Hash^seed+s*0x9e3779b97f4a7c15) % uint64(n))
	}
	return int((s + seed) % uint64(n))
}

// SecondChance returns the subcounter to probe after subcounter i of n denied:
// another one, chosen by r (a random value).
func SecondChance(i, n int, r uint64) int {
	return (i + 1 + int(r%uint64(n-1))) % n
}

// Table is the set of split keys. Reads take no lock: the map is replaced
// whole (copy on write) behind an atomic pointer, since it is read on every
// decision and written only when a key changes level. The zero value is not
// usable; call NewTable.
type Table struct {
	mu  sync.Mutex // serialises writers
	m   atomic.Pointer[map[uint64]*Entry]
	max int
}

// NewTable returns an empty table holding at most max keys (max ≤ 0: no cap).
func NewTable(max int) *Table {
	t := &Table{max: max}
	t.m.Store(&map[uint64]*Entry{})
	return t
}

// Lookup returns the entry of key (with hash), or nil if the key is not split.
func (t *Table) Lookup(key string, hash uint64) *Entry {
	m := *t.m.Load()
	if len(m) == 0 {
		return nil
	}
	if e := m[hash]; e != nil && e.Key == key {
		return e
	}
	return nil
}

// Set splits key at level, or changes its level if it is already split. It
// reports false, changing nothing, when the table is full or level is not a
// valid level above 1.
func (t *Table) Set(key string, hash uint64, level int) bool {
	if !ValidLevel(level) || level == Level1 {
		return false
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	old := *t.m.Load()
	if e := old[hash]; e != nil {
		if e.Key != key {
			return false // a 64-bit hash collision: the first key keeps the slot
		}
		e.SetLevel(level)
		return true
	}
	if t.max > 0 && len(old) >= t.max {
		return false
	}
	m := make(map[uint64]*Entry, len(old)+1)
	for h, e := range old {
		m[h] = e
	}
	m[hash] = NewEntry(key, hash, level)
	t.m.Store(&m)
	return true
}

// Delete merges key back: it is no longer split.
func (t *Table) Delete(key string, hash uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	old := *t.m.Load()
	if e := old[hash]; e == nil || e.Key != key {
		return
	}
	m := make(map[uint64]*Entry, len(old))
	for h, e := range old {
		if h != hash {
			m[h] = e
		}
	}
	t.m.Store(&m)
}

// Len returns the number of split keys.
func (t *Table) Len() int { return len(*t.m.Load()) }
