package loadgen

import (
	"context"
	"time"
)

// SetGRPCClientHooks makes g dial with dial and read the time from now,
// where each is not nil. It is called before g's first call.
func SetGRPCClientHooks(g *GRPCClient, dial func(context.Context) (*GRPCConn, error), now func() time.Time) {
	if dial != nil {
		g.dial = dial
	}
	if now != nil {
		g.now = now
	}
}

// GRPCMinBackoff is a GRPCClient's wait after its first failed dial.
const GRPCMinBackoff = grpcMinBackoff

// DrainGRPCConn drains c, as a GRPCClient does the connection it replaces.
func DrainGRPCConn(c *GRPCConn) { c.drain() }
