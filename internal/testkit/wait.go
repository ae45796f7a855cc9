// Waiting for events in tests that run real servers (redis-server, NATS,
// the daemon), where how long an event takes is up to the machine: a loaded
// 2-core machine can take seconds where a quiet one takes milliseconds. So
// a wait bounds only a hang, and its time is for logs, never asserted.

package testkit

import (
	"testing"
	"time"
)

// Patience is how long a test waits for an event on real servers (a route,
// a reconnect, a message, a breaker probe) before it fails.
const Patience = 60 * time.Second

// For polls cond until it holds, and fails t, saying what it waited for,
// if it does not within limit. It polls every millisecond at first, then
// less often, up to every 20 ms. It returns how long it took.
func For(t testing.TB, limit time.Duration, what string, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for pause := time.Millisecond; !cond(); pause = min(2*pause, 20*time.Millisecond) {
		if time.Since(start) > limit {
			t.Fatalf("%s: not within %v", what, limit)
		}
		time.Sleep(pause)
	}
	return time.Since(start)
}
