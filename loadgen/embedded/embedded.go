// Package embedded is loadgen's target of embedded engines: instances of a
// gateway that embeds the engine, in one process, agreeing on hot keys over
// an in-process NATS server. It is apart from package loadgen so that the
// engine's own tests can use loadgen's workloads and pacer.
package embedded

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/nats-io/nats.go"

	"github.com/hotkeyd/hotkey"
	"github.com/hotkeyd/hotkey/coordinator"
	"github.com/hotkeyd/hotkey/counter"
	"github.com/hotkeyd/hotkey/internal/natsserver"
	"github.com/hotkeyd/hotkey/loadgen"
)

// Config is a set of embedded engines in one process: instances of
// a gateway that embeds the engine, agreeing on hot keys over one NATS
// server run in process.
type Config struct {
	// Instances is the number of engines (default 3).
	Instances int
	// Store returns the store of engine i. nil gives each engine a memory
	// store of its own, so each enforces its limits alone, as daemons on
	// the memory store do; share one Redis store among them for one limit.
	Store func(i int) (counter.Store, error)
	// Options are given to every engine, after the coordinator.
	Options []hotkey.Option
}

// Cluster is the engines of a Config. Close stops them.
type Cluster struct {
	Engines []*hotkey.Engine
	server  *natsserver.Server
	conns   []*nats.Conn
}

// Start starts cfg's engines, each with a NATS coordinator on its own
// connection to one in-process NATS server.
func Start(cfg Config) (*Cluster, error) {
	c := &Cluster{}
	if err := c.start(cfg); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

func (c *Cluster) start(cfg Config) error {
	n := cfg.Instances
	if n <= 0 {
		n = 3
	}
	var err error
	if c.server, err = natsserver.Start(natsserver.Options{DontListen: true}); err != nil {
		return err
	}
	for i := range n {
		nc, err := c.server.Connect(nats.Name(fmt.Sprintf("loadgen engine %d", i)))
		if err != nil {
			return err
		}
		c.conns = append(c.conns, nc)
		co, err := coordinator.NewNATS(nc, coordinator.Config{})
		if err != nil {
			return err
		}
		var store counter.Store = counter.NewMemoryStore(counter.MemoryConfig{})
		if cfg.Store != nil {
			if store, err = cfg.Store(i); err != nil {
				return fmt.Errorf("store of engine %d: %w", i, err)
			}
		}
		e, err := hotkey.New(store, append([]hotkey.Option{hotkey.WithCoordinator(co)}, cfg.Options...)...)
		if err != nil {
			return err
		}
		c.Engines = append(c.Engines, e)
	}
	return nil
}

// Target decides on the cluster's engines in turn, under p.
func (c *Cluster) Target(p *hotkey.Policy) (loadgen.Target, error) {
	if c == nil || len(c.Engines) == 0 {
		return nil, errors.New("embedded: no engines")
	}
	return Target(p, c.Engines...)
}

// Close stops the engines, closes their connections and the server. It
// does not close the stores Store returned.
func (c *Cluster) Close() {
	for _, e := range c.Engines {
		e.Close()
	}
	for _, nc := range c.conns {
		nc.Close()
	}
	if c.server != nil {
		c.server.Shutdown()
	}
}

// Target decides in process on engines in turn, under p: M instances of a
// gateway that embeds the engine, each taking every M-th request.
func Target(p *hotkey.Policy, engines ...*hotkey.Engine) (loadgen.Target, error) {
	if p == nil || len(engines) == 0 {
		return nil, errors.New("embedded: a target needs a policy and at least one engine")
	}
	return &target{p: p, engines: engines}, nil
}

type target struct {
	p       *hotkey.Policy
	engines []*hotkey.Engine
	next    atomic.Uint64
}

func (e *target) Decide(ctx context.Context, key string, cost int64) (loadgen.Outcome, error) {
	eng := e.engines[(e.next.Add(1)-1)%uint64(len(e.engines))]
	r, err := eng.AllowN(ctx, key, e.p, cost)
	return loadgen.Outcome{Allowed: r.Allowed, Shards: int(r.Shards)}, err
}
