package scenario

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/hotkeyd/hotkey"
	"github.com/hotkeyd/hotkey/coordinator"
	"github.com/hotkeyd/hotkey/counter"
	"github.com/hotkeyd/hotkey/internal/natsserver"
	"github.com/hotkeyd/hotkey/loadgen"
	"github.com/hotkeyd/hotkey/shard"
)

// applied is one level change an engine applied.
type applied struct {
	engine int
	key    string
	at     time.Time
}

// Convergence is 3 engines, each with a NATS coordinator on its own node of
// a 3-node NATS cluster on loopback, for measuring how long a hot key
// announced by one takes to be applied by the others.
type Convergence struct {
	cluster *natsserver.Cluster
	conns   []*nats.Conn // the coordinators'
	coords  []*coordinator.NATS
	engines []*hotkey.Engine
	events  chan applied
}

// StartConvergence starts the engines and waits until every node has every
// subscription: until a first key reaches all three.
func StartConvergence() (c *Convergence, err error) {
	c = &Convergence{events: make(chan applied, 1024)}
	defer func() {
		if err != nil {
			c.Close()
			c = nil
		}
	}()
	if c.cluster, err = natsserver.StartCluster(3, natsserver.Options{}); err != nil {
		return c, err
	}
	for i := range 3 {
		nc, err := c.cluster.Server(i).Connect(nats.MaxReconnects(-1), nats.ReconnectBufSize(-1), nats.NoEcho())
		if err != nil {
			return c, err
		}
		c.conns = append(c.conns, nc)
		co, err := coordinator.NewNATS(nc, coordinator.Config{MaxHotKeys: 1 << 20})
		if err != nil {
			return c, err
		}
		hook := func(key string, level shard.Level) {
			if level > 1 {
				c.events <- applied{i, key, time.Now()}
			}
		}
		e, err := hotkey.New(counter.NewMemoryStore(counter.MemoryConfig{}),
			hotkey.WithoutDetector(), hotkey.WithCoordinator(co), hotkey.WithLevelHook(hook), hotkey.WithMaxHotKeys(1<<20))
		if err != nil {
			return c, err
		}
		c.coords, c.engines = append(c.coords, co), append(c.engines, e)
	}
	for try := 0; ; try++ {
		key := fmt.Sprintf("warmup:%d", try)
		c.coords[try%3].Announce(key, counter.Hash(key), 4)
		if c.waitApplied(key, time.Second) {
			return c, nil
		}
		if try == 60 {
			return c, errors.New("the NATS cluster never delivered to every engine")
		}
	}
}

// Measure announces keys new keys hot, one at a time, each from a random
// engine, and records in lat, for each other engine, the time from the
// announcement until that engine applied it.
func (c *Convergence) Measure(keys int, lat *loadgen.Histogram) error {
	for i := range keys {
		key := fmt.Sprintf("conv:%d:%x", i, rand.Uint64())
		from := rand.IntN(3)
		start := time.Now()
		c.coords[from].Announce(key, counter.Hash(key), 4)
		for got := 0; got < 3; { // the origin applies it too
			select {
			case ev := <-c.events:
				if ev.key != key {
					continue // a late warm-up event
				}
				got++
				if ev.engine != from {
					lat.Record(ev.at.Sub(start))
				}
			case <-time.After(30 * time.Second):
				return fmt.Errorf("key %s reached %d of 3 engines in 30 s", key, got)
			}
		}
		c.coords[from].Announce(key, counter.Hash(key), 1) // lapses on the others
	}
	return nil
}

// waitApplied reports whether every engine applied key within d.
func (c *Convergence) waitApplied(key string, d time.Duration) bool {
	deadline := time.After(d)
	seen := map[int]bool{}
	for len(seen) < 3 {
		select {
		case ev := <-c.events:
			if ev.key == key {
				seen[ev.engine] = true
			}
		case <-deadline:
			return false
		}
	}
	return true
}

// Close stops the engines (and their coordinators), their connections and
// the cluster.
func (c *Convergence) Close() {
	for _, e := range c.engines {
		e.Close()
	}
	for _, nc := range c.conns {
		nc.Close()
	}
	if c.cluster != nil {
		c.cluster.Close()
	}
}
