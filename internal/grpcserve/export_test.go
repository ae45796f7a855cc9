package grpcserve

import "time"

// SetHandshakeTimeout sets the handshake timeout of the servers made
// from now, and returns a func that restores it.
func SetHandshakeTimeout(d time.Duration) (restore func()) {
	old := handshakeTimeout
	handshakeTimeout = d
	return func() { handshakeTimeout = old }
}
