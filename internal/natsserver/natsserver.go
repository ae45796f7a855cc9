// Package natsserver runs nats-server in process: one server, or a cluster of
// routed servers on loopback. Tests use it, and the daemon embeds a server
// with it.
//
// Servers listen on 127.0.0.1 only (client and cluster ports chosen by the
// kernel), or not at all for clients (DontListen: clients connect with
// nats.InProcessServer). They log nothing and install no signal handlers.
package natsserver

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// Defaults.
const (
	DefaultReadyTimeout = 30 * time.Second // how long a server may take to accept clients, on a loaded machine too
	DefaultMeshTimeout  = 30 * time.Second // how long a cluster may take to mesh, on a loaded machine too
	loopback            = "127.0.0.1"
)

// Options configure a server, or every server of a cluster.
type Options struct {
	// DontListen starts the server without a client listener: clients
	// connect in process (Server.Connect, or nats.InProcessServer). URL is
	// then empty.
	DontListen bool
	// MaxPayload is the largest message the server accepts, in bytes; zero
	// keeps the server's default (1 MiB).
	MaxPayload int32
	// Configure, if set, is called last on the server options, to set
	// authentication, TLS or anything else. A standalone server may be
	// given another Host or Port here (a daemon's listen address). For a
	// cluster it is called once per server and must leave Host, Port,
	// Cluster and Routes alone; for a supercluster, Gateway too.
	Configure func(o *server.Options)
	// ReadyTimeout bounds how long Start waits for the server to accept
	// clients (default DefaultReadyTimeout); for a cluster it also bounds
	// the wait until the servers are meshed (default DefaultMeshTimeout).
	ReadyTimeout time.Duration
}

func (o Options) readyTimeout() time.Duration {
	if o.ReadyTimeout > 0 {
		return o.ReadyTimeout
	}
	return DefaultReadyTimeout
}

// Server is one embedded nats-server.
type Server struct {
	srv *server.Server
	url string
}

// Start starts a standalone server on 127.0.0.1 with a random client port
// (or no client listener with DontListen) and waits until it accepts
// clients. The caller must call Shutdown.
func Start(opts Options) (*Server, error) {
	return start(opts, baseOptions(opts, ""))
}

// baseOptions returns the options of a server named name ("" for the
// server's default, its ID).
func baseOptions(opts Options, name string) *server.Options {
	o := &server.Options{
		Host:       loopback,
		Port:       server.RANDOM_PORT,
		DontListen: opts.DontListen,
		NoLog:      true,
		NoSigs:     true,
		ServerName: name,
	}
	if opts.MaxPayload > 0 {
		o.MaxPayload = opts.MaxPayload
	}
	if opts.Configure != nil {
		opts.Configure(o)
	}
	return o
}

func start(opts Options, o *server.Options) (*Server, error) {
	srv, err := server.NewServer(o)
	if err != nil {
		return nil, fmt.Errorf("natsserver: new server: %w", err)
	}
	go srv.Start()
	if !srv.ReadyForConnections(opts.readyTimeout()) {
		srv.Shutdown()
		srv.WaitForShutdown()
		return nil, fmt.Errorf("natsserver: server not ready within %v", opts.readyTimeout())
	}
	s := &Server{srv: srv}
	if !o.DontListen {
		s.url = srv.ClientURL()
	}
	return s, nil
}

// URL returns the client URL, "nats://127.0.0.1:PORT", or "" with
// DontListen.
func (s *Server) URL() string { return s.url }

// Server returns the underlying nats-server.
func (s *Server) Server() *server.Server { return s.srv }

// Connect connects a client to the server: in process with DontListen, over
// TCP otherwise. The caller closes the connection.
func (s *Server) Connect(opts ...nats.Option) (*nats.Conn, error) {
	if s.url == "" {
		return nats.Connect("", append([]nats.Option{nats.InProcessServer(s.srv)}, opts...)...)
	}
	return nats.Connect(s.url, opts...)
}

// Shutdown stops the server, closing its client and route connections, and
// waits until it has stopped. It may be called more than once.
func (s *Server) Shutdown() {
	s.srv.Shutdown()
	s.srv.WaitForShutdown()
}

// Running reports whether the server is running (not shut down).
func (s *Server) Running() bool { return s.srv.Running() }

// Cluster is a set of servers routed to each other on loopback, each with
// its own client port. Node 0 is the seed: the others have a route to it and
// learn of each other from it.
//
// Its methods are safe for concurrent use.
type Cluster struct {
	name   string
	prefix string                         // of node names
	node   func(i int, o *server.Options) // more options of node i, or nil
	opts   Options
	mu     sync.Mutex
	nodes  []*Server // nil while a node is shut down
	ports  []int     // client port of each node (0 with DontListen)
	cport  []int     // cluster port of each node
	urls   []string
}

// StartCluster starts n ≥ 1 routed servers and waits until each has a route
// to each of the others. The caller must call Close.
func StartCluster(n int, opts Options) (*Cluster, error) {
	return startCluster("hotkey", "", n, opts, nil)
}

// startCluster starts a cluster named name of n servers named prefix+"n0"
// and on, node(i, o) setting more options of node i at each start.
func startCluster(name, prefix string, n int, opts Options, node func(i int, o *server.Options)) (*Cluster, error) {
	if n < 1 {
		return nil, fmt.Errorf("natsserver: cluster of %d servers", n)
	}
	c := &Cluster{
		name:   name,
		prefix: prefix,
		node:   node,
		opts:   opts,
		nodes:  make([]*Server, n),
		ports:  make([]int, n),
		cport:  make([]int, n),
		urls:   make([]string, n),
	}
	for i := range n {
		if err := c.startNode(i, server.RANDOM_PORT, server.RANDOM_PORT); err != nil {
			c.Close()
			return nil, err
		}
	}
	if err := c.WaitMeshed(); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

func (c *Cluster) nodeName(i int) string { return c.prefix + "n" + strconv.Itoa(i) }

// startNode starts node i on the given client and cluster ports. It is
// called with c.mu held, or before c is shared.
func (c *Cluster) startNode(i, port, clusterPort int) error {
	o := baseOptions(c.opts, c.nodeName(i))
	o.Port = port
	o.Cluster = server.ClusterOpts{Name: c.name, Host: loopback, Port: clusterPort}
	if i > 0 {
		o.Routes = server.RoutesFromStr("nats://" + net.JoinHostPort(loopback, strconv.Itoa(c.cport[0])))
	}
	if c.node != nil {
		c.node(i, o)
	}
	s, err := start(c.opts, o)
	if err != nil {
		return fmt.Errorf("natsserver: node %d: %w", i, err)
	}
	c.nodes[i] = s
	c.cport[i] = s.srv.ClusterAddr().Port
	if !o.DontListen && c.urls[i] == "" { // first start; Restart keeps both
		c.ports[i] = s.srv.Addr().(*net.TCPAddr).Port
		c.urls[i] = s.url
	}
	return nil
}

// Len returns the number of nodes, running or not.
func (c *Cluster) Len() int { return len(c.nodes) }

// Server returns node i, or nil while it is shut down.
func (c *Cluster) Server(i int) *Server {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.nodes[i]
}

// URL returns node i's client URL. It does not change across Restart.
func (c *Cluster) URL(i int) string { return c.urls[i] }

// URLs returns every node's client URL.
func (c *Cluster) URLs() []string { return append([]string(nil), c.urls...) }

// Shutdown stops node i and waits until it has stopped. The other nodes keep
// running; Restart brings it back.
func (c *Cluster) Shutdown(i int) {
	c.mu.Lock()
	s := c.nodes[i]
	c.nodes[i] = nil
	c.mu.Unlock()
	if s != nil {
		s.Shutdown()
	}
}

// Restart starts node i again, on the client and cluster ports it had, and
// waits until the running nodes are meshed. Restarting a running node
// shuts it down first.
func (c *Cluster) Restart(i int) error {
	c.Shutdown(i)
	c.mu.Lock()
	port := c.ports[i]
	if port == 0 { // DontListen: no client port to keep
		port = server.RANDOM_PORT
	}
	err := c.startNode(i, port, c.cport[i])
	c.mu.Unlock()
	if err != nil {
		return err
	}
	return c.WaitMeshed()
}

// WaitMeshed waits until every running node has a route to every other
// running node (distinct remote server names in Routez), up to the ready
// timeout.
func (c *Cluster) WaitMeshed() error {
	timeout := DefaultMeshTimeout
	if c.opts.ReadyTimeout > 0 {
		timeout = c.opts.ReadyTimeout
	}
	deadline := time.Now().Add(timeout)
	for {
		missing := c.unmeshed()
		if missing == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("natsserver: cluster not meshed within %v: %w", timeout, missing)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// unmeshed returns nil if every running node routes to every other running
// node, or an error naming a missing route.
func (c *Cluster) unmeshed() error {
	c.mu.Lock()
	running := make(map[string]*Server)
	for i, s := range c.nodes {
		if s != nil {
			running[c.nodeName(i)] = s
		}
	}
	c.mu.Unlock()
	for name, s := range running {
		rz, err := s.srv.Routez(nil)
		if err != nil {
			return fmt.Errorf("%s: routez: %w", name, err)
		}
		seen := make(map[string]bool)
		for _, r := range rz.Routes {
			seen[r.RemoteName] = true
		}
		for other := range running {
			if other != name && !seen[other] {
				return errors.New(name + " has no route to " + other)
			}
		}
	}
	return nil
}

// Close shuts every node down and waits until they have stopped.
func (c *Cluster) Close() {
	for i := range c.nodes {
		c.Shutdown(i)
	}
}
