package loadgen

import (
	"math"
	"math/bits"
	"time"
)

// histBuckets is the number of buckets of a Histogram: values 0–127 ns
// exactly, then 64 buckets for each power of two from 2^7 to 2^63 ns.
const histBuckets = 128 + 56*64

// Histogram counts durations in log-linear buckets, as HDR histograms do:
// exact below 128 ns, then 64 buckets per power of two, so a percentile is
// within 1/64 (1.6%) of the true value, from nanoseconds to hours, in a
// fixed 30 KiB. The zero value is empty and ready. Not safe for concurrent
// use.
type Histogram struct {
	counts [histBuckets]uint64
	n      uint64
	sum    float64
	max    time.Duration
}

// bucket returns the bucket of v ≥ 0 ns.
func bucket(v uint64) int {
	if v < 128 {
		return int(v)
	}
	e := bits.Len64(v) - 7 // v>>e is in [64, 128)
	return e*64 + int(v>>uint(e))
}

// bucketTop returns the largest value in bucket i.
func bucketTop(i int) uint64 {
	if i < 128 {
		return uint64(i)
	}
	e := i/64 - 1
	m := uint64(i%64 + 64)
	return (m+1)<<uint(e) - 1
}

// Record adds d; a negative d counts as 0.
func (h *Histogram) Record(d time.Duration) {
	d = max(d, 0)
	h.counts[bucket(uint64(d))]++
	h.n++
	h.sum += float64(d)
	h.max = max(h.max, d)
}

// Merge adds o's counts to h.
func (h *Histogram) Merge(o *Histogram) {
	for i, c := range o.counts {
		h.counts[i] += c
	}
	h.n += o.n
	h.sum += o.sum
	h.max = max(h.max, o.max)
}

// Count returns the number of durations recorded.
func (h *Histogram) Count() uint64 { return h.n }

// Max returns the largest duration recorded.
func (h *Histogram) Max() time.Duration { return h.max }

// Mean returns the mean duration, 0 if none was recorded.
func (h *Histogram) Mean() time.Duration {
	if h.n == 0 {
		return 0
	}
	return time.Duration(h.sum / float64(h.n))
}

// Quantile returns the q-quantile (0 ≤ q ≤ 1): the top of the bucket that
// holds the ⌈q·n⌉-th smallest duration, capped at Max. 0 if none was
// recorded.
func (h *Histogram) Quantile(q float64) time.Duration {
	if h.n == 0 {
		return 0
	}
	rank := uint64(math.Ceil(min(max(q, 0), 1) * float64(h.n)))
	rank = max(rank, 1)
	var seen uint64
	for i, c := range h.counts {
		if seen += c; seen >= rank {
			return min(time.Duration(bucketTop(i)), h.max)
		}
	}
	return h.max
}
