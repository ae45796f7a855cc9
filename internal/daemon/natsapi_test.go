package daemon

import (
	"sync"
	"sync/atomic"
	"testing"
)

// TestNATSRequests: decisions run on goroutines of their own, never more
// than the slots at once; stop waits for them, and later ones run on the
// caller's goroutine (the connection's drain then waits for them).
func TestNATSRequests(t *testing.T) {
	n := natsRequests{slots: make(chan struct{}, 4)}
	release := make(chan struct{})
	var running, most, done, starts atomic.Int64
	var started sync.WaitGroup
	started.Add(4)
	work := func() {
		r := running.Add(1)
		for m := most.Load(); r > m && !most.CompareAndSwap(m, r); m = most.Load() {
		}
		if starts.Add(1) <= 4 {
			started.Done()
		}
		<-release
		running.Add(-1)
		done.Add(1)
	}
	submitted := make(chan struct{})
	go func() {
		for range 10 {
			n.run(work) // the 5th waits here for a slot
		}
		close(submitted)
	}()
	started.Wait() // 4 run at once, on goroutines of their own
	if r := running.Load(); r != 4 {
		t.Fatalf("%d running, want 4", r)
	}
	close(release)
	<-submitted
	n.stop()
	if done.Load() != 10 || most.Load() > 4 {
		t.Fatalf("%d done, at most %d at once; want 10, at most 4", done.Load(), most.Load())
	}
	ran := false
	n.run(func() { ran = true }) // inline: no goroutine to wait for
	if !ran {
		t.Fatal("a request after stop did not run on the caller's goroutine")
	}
}
