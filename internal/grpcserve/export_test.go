package grpcserve

import "time"

// SetHandshakeTimeout sets the handshake timeout of the servers made
// from now, and returns a func that restores it.
func SetHandshakeTimeout(d time.Duration) (restore func()) {
	old := handshakeTimeout
	handshakeTimeout = d
	return func() { handshakeTimeout = old }
}

// SetOpeningHook has f run while a connection's reader has taken a
// stream's ID and not yet opened it, and returns a func that removes it.
func SetOpeningHook(f func()) (restore func()) {
	openingHook = f
	return func() { openingHook = nil }
}

// DrainAll sends every connection of s a GOAWAY, as GracefulStop does,
// without waiting for them to close.
func DrainAll(s *Server) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for c := range s.conns {
		c.drain()
	}
}

// SetIdleCheckHook has f run after each check of a connection for
// IdleTimeout, and returns a func that removes it.
func SetIdleCheckHook(f func()) (restore func()) {
	idleCheckHook = f
	return func() { idleCheckHook = nil }
}

// IdlePeriod returns how often s's connections check whether they are
// idle.
func IdlePeriod(s *Server) time.Duration { return s.idlePeriod }

// MaxRefused is how far a connection's refused calls may outrun its
// served ones before it is sent a GOAWAY ENHANCE_YOUR_CALM.
const MaxRefused = maxRefused
