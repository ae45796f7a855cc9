package testkit

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/hotkeyd/hotkey/counter"
)

func TestClock(t *testing.T) {
	c := NewClock()
	t0 := c.Now()
	if !c.Now().Equal(t0) {
		t.Fatal("the clock moved by itself")
	}
	c.Advance(1500 * time.Millisecond)
	if got := c.Now().Sub(t0); got != 1500*time.Millisecond {
		t.Fatalf("advanced %v, want 1.5s", got)
	}
	c.Set(t0.Add(time.Hour))
	if got := c.Now().Sub(t0); got != time.Hour {
		t.Fatalf("set an hour on: %v", got)
	}
}

func TestStore(t *testing.T) {
	c := NewClock()
	s := &Store{Store: counter.NewMemoryStore(counter.MemoryConfig{Clock: c.Now})}
	ctx, lim := context.Background(), counter.PerSecond(1)
	if r, err := s.Take(ctx, "k", 1, lim, 1); err != nil || !r.Allowed {
		t.Fatalf("up: %+v %v", r, err)
	}
	s.Down.Store(true)
	if _, err := s.Take(ctx, "k", 1, lim, 1); !errors.Is(err, ErrDown) {
		t.Fatalf("down: %v, want ErrDown", err)
	}
	s.Down.Store(false)
	if r, err := s.Take(ctx, "k", 1, lim, 1); err != nil || r.Allowed {
		t.Fatalf("up again, bucket of 1 spent: %+v %v; want a denial the failed call did not change", r, err)
	}
	if n := s.Takes.Load(); n != 3 {
		t.Fatalf("%d takes counted, want 3", n)
	}
}

func TestBuffer(t *testing.T) {
	var b Buffer
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for range 100 {
				b.Write([]byte("x"))
				_ = b.String()
			}
		})
	}
	wg.Wait()
	if n := len(b.String()); n != 400 {
		t.Fatalf("%d bytes, want 400", n)
	}
}
