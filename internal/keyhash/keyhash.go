//go:build !hotkey_fixedhash

package keyhash

import "hash/maphash"

// seed is the process's secret. maphash.MakeSeed draws it at random.
var seed = maphash.MakeSeed()

// Sum returns the hash of key under the process's seed. It is safe for
// concurrent use and does not allocate.
func Sum(key string) uint64 { return maphash.String(seed, key) }

// Fixed reports whether Sum is the same in every run (the tag
// hotkey_fixedhash): tests of flood resistance skip then.
const Fixed = false
