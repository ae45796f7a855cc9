package testkit

import "runtime"

// Allocated returns the bytes f allocates, as the runtime counts them
// (other goroutines' allocations meanwhile included): for tests that bound
// what an input may cost in memory, never in time.
func Allocated(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}
