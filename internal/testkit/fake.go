// Package testkit holds what the tests of several packages share: waiting
// for an event on real servers (For), a clock a test moves by hand (Clock),
// a store that fails on demand (Store), and a buffer safe for concurrent
// writes (Buffer). A fake is for what a real component cannot do on demand
// in a unit test; the tests that kill real redis-servers and NATS servers
// use the real ones (internal/redistest, internal/natsserver).
package testkit

import (
	"bytes"
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hotkeyd/hotkey/counter"
)

// Clock is a clock that stands still until Advance. Safe for concurrent use.
type Clock struct{ ns atomic.Int64 }

// NewClock returns a clock at 2026-01-01 00:00 UTC.
func NewClock() *Clock {
	c := &Clock{}
	c.ns.Store(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano())
	return c
}

// Now returns the clock's time.
func (c *Clock) Now() time.Time { return time.Unix(0, c.ns.Load()) }

// Advance moves the clock d forward.
func (c *Clock) Advance(d time.Duration) { c.ns.Add(int64(d)) }

// Set puts the clock at t.
func (c *Clock) Set(t time.Time) { c.ns.Store(t.UnixNano()) }

// ErrDown is what a Store's Take returns while it is down.
var ErrDown = errors.New("test store down")

// Store wraps a counter.Store: it counts the Takes that reach it, and fails
// each with ErrDown while Down is set, as a store whose server is gone.
type Store struct {
	counter.Store
	Down  atomic.Bool
	Takes atomic.Int64
}

// Take counts the call, then fails it if s is down, or passes it on.
func (s *Store) Take(ctx context.Context, key string, hash uint64, lim counter.Limit, n int64) (counter.Result, error) {
	s.Takes.Add(1)
	if s.Down.Load() {
		return counter.Result{}, ErrDown
	}
	return s.Store.Take(ctx, key, hash, lim, n)
}

// Buffer is a bytes.Buffer safe for concurrent writes and reads: a
// process's or a logger's output that a test reads while it is written.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write appends p.
func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

// String returns what was written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}
