//go:build !race

package grpcserve_test

// raceEnabled reports whether the tests run under the race detector, whose
// sync.Pool drops a share of what is put back: pooled values are allocated
// again then.
const raceEnabled = false
