// Package prefetch asks the processor to start loading a cache line that
// the caller will read soon, so that its miss overlaps with other work. The
// hint changes no memory and never faults, whatever the address.
//
// It exists for the one place where it pays: a decision on a large in-memory
// store misses the cache twice, on the key's counter and on the hot-key
// detector's sketch, and the locked instructions between the two keep the
// processor from overlapping them by itself. A prefetch is not ordered by
// locked instructions, so one issued before them overlaps.
package prefetch
