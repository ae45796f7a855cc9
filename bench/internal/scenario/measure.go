package scenario

import (
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Throughput runs op from g goroutines for d and returns the operations
// completed per second; op gets a per-goroutine random source. A failed op
// stops the run and is returned.
func Throughput(g int, d time.Duration, op func(r *rand.Rand) error) (float64, error) {
	var n atomic.Int64
	var stop atomic.Bool
	var firstErr atomic.Pointer[error]
	var wg sync.WaitGroup
	start := time.Now()
	for range g {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64()))
			var local int64
			for !stop.Load() {
				if err := op(r); err != nil {
					firstErr.CompareAndSwap(nil, &err)
					stop.Store(true)
					break
				}
				local++
			}
			n.Add(local)
		})
	}
	time.Sleep(d)
	stop.Store(true)
	wg.Wait()
	if e := firstErr.Load(); e != nil {
		return 0, *e
	}
	return float64(n.Load()) / time.Since(start).Seconds(), nil
}

// Rounds runs each of fns once per round, in turn (so that a noisy moment
// of the machine falls on all of them alike), and returns each one's median.
func Rounds(k int, fns []func() (float64, error)) ([]float64, error) {
	got := make([][]float64, len(fns))
	for range k {
		for i, f := range fns {
			v, err := f()
			if err != nil {
				return nil, err
			}
			got[i] = append(got[i], v)
		}
	}
	out := make([]float64, len(fns))
	for i, g := range got {
		slices.Sort(g)
		out[i] = g[len(g)/2]
	}
	return out, nil
}
