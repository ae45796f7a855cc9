package counter

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"time"

	"github.com/redis/go-redis/v9"
)

type dialFunc = func(ctx context.Context, network, addr string) (net.Conn, error)

// probe dials the client's servers the way the client does, but outside its
// pools, and closes what it dialed: for a Client its server, for a Cluster
// any one seed, for a Ring every shard. Retrying the setup through the pool
// instead would count each refused dial against it, and a go-redis pool that
// has counted PoolSize of them answers its last dial error without dialing
// until its own background dial succeeds, up to a second after the server is
// back: the store would say ready while its Takes still failed.
func probe(ctx context.Context, client redis.UniversalClient) error {
	var (
		dial    dialFunc
		network = "tcp"
		addrs   []string
		any1    bool // one address answering is enough
	)
	switch c := client.(type) {
	case *redis.Client:
		o := c.Options()
		dial, network, addrs = o.Dialer, o.Network, []string{o.Addr}
	case *redis.ClusterClient:
		o := c.Options()
		dial, addrs, any1 = o.Dialer, o.Addrs, true
		if dial == nil {
			dial = plainDialer(o.TLSConfig, o.DialTimeout)
		}
	case *redis.Ring:
		o := c.Options()
		dial = o.Dialer
		if dial == nil {
			dial = plainDialer(o.TLSConfig, o.DialTimeout)
		}
		for _, a := range o.Addrs {
			addrs = append(addrs, a)
		}
	default:
		return nil // a client of another kind: the setup itself is the probe
	}
	if dial == nil || len(addrs) == 0 {
		return nil
	}
	var errs []error
	for _, a := range addrs {
		conn, err := dial(ctx, network, a)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		conn.Close()
		if any1 {
			return nil
		}
	}
	return errors.Join(errs...)
}

// plainDialer dials as go-redis does for a node whose options name no
// Dialer.
func plainDialer(conf *tls.Config, timeout time.Duration) dialFunc {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		d := &net.Dialer{Timeout: timeout}
		if conf == nil {
			return d.DialContext(ctx, network, addr)
		}
		return (&tls.Dialer{NetDialer: d, Config: conf}).DialContext(ctx, network, addr)
	}
}
