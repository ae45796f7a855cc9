package loadgen

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// TestBuckets: buckets tile the values with no gap or overlap, and each is
// at most 1/64 of its values wide.
func TestBuckets(t *testing.T) {
	prevTop := int64(-1)
	for i := range histBuckets {
		top := bucketTop(i)
		lo := uint64(prevTop + 1)
		if bucket(lo) != i || bucket(top) != i {
			t.Fatalf("bucket %d: [%d, %d] maps to %d and %d", i, lo, top, bucket(lo), bucket(top))
		}
		if i >= 128 && float64(top-lo+1) > float64(lo)/64+1 {
			t.Fatalf("bucket %d: [%d, %d] wider than 1/64", i, lo, top)
		}
		if top == 1<<63-1 {
			break
		}
		prevTop = int64(top)
	}
	if b := bucket(1<<63 - 1); b >= histBuckets {
		t.Fatalf("largest duration in bucket %d of %d", b, histBuckets)
	}
}

// TestQuantile: quantiles of random durations are within 1/64 of the exact
// ones, never below them, and merging two halves gives the whole.
func TestQuantile(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	var all, a, b Histogram
	var vals []time.Duration
	for i := range 100_000 {
		d := time.Duration(r.ExpFloat64() * float64(time.Millisecond))
		vals = append(vals, d)
		all.Record(d)
		if i%2 == 0 {
			a.Record(d)
		} else {
			b.Record(d)
		}
	}
	a.Merge(&b)
	slices.Sort(vals)
	for _, q := range []float64{0, 0.5, 0.9, 0.99, 0.999, 1} {
		rank := max(1, int(float64(len(vals))*q+0.999999))
		exact := vals[rank-1]
		got := all.Quantile(q)
		if got < exact || float64(got-exact) > float64(exact)/64+1 {
			t.Errorf("q %v: %v, exact %v", q, got, exact)
		}
		if m := a.Quantile(q); m != got {
			t.Errorf("q %v: merged halves %v, whole %v", q, m, got)
		}
	}
	if all.Count() != 100_000 || all.Max() != vals[len(vals)-1] {
		t.Errorf("count %d max %v", all.Count(), all.Max())
	}
	var empty Histogram
	if empty.Quantile(0.99) != 0 || empty.Mean() != 0 {
		t.Error("empty histogram: want 0")
	}
}
