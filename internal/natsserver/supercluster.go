package natsserver

import (
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/hotkeyd/hotkey/internal/faultproxy"
)

// gatewayUser is the user every gateway logs in as; each region has its
// own password.
const gatewayUser = "gateway"

// Supercluster is one cluster per region, joined by NATS gateways on
// loopback, where every gateway connection from one region to another goes
// through a fault proxy of that link: the link from A to B has one proxy
// per server of B. Delaying or cutting the proxies delays or cuts the
// regions' traffic; routes inside a region are direct.
//
// A gateway learns other URLs for a remote than those it was given: the
// remote's advertised gateway URLs (in its INFO, and through routes), and
// a third region's URLs for it (gossip). Three things keep every gateway
// connection on its own link's proxies:
//   - each region's gateways accept only their region's password, and only
//     the URLs of the proxies carry it (a URL learned from INFO or gossip
//     carries none, so a server dialing one logs in with its own region's
//     password and is refused);
//   - each server advertises (Gateway.Advertise) a loopback port on which
//     nothing listens, nor can while the Supercluster holds it, so that a
//     dial to an advertised URL is refused at once and the server goes on
//     to the next URL without waiting;
//   - Gateway.ConnectBackoff is left off, so a server whose link is cut
//     retries about every second however long the cut lasts, and rejoins
//     within a few seconds of Heal.
//
// Its methods are safe for concurrent use.
type Supercluster struct {
	regions  []string
	clusters map[string]*Cluster
	proxies  map[link][]*faultproxy.Proxy // one per server of link.to
	secrets  map[string]string            // each region's gateway password
	adverts  map[string][]*refusingPort   // each server's advertised gateway address

	mu     sync.Mutex       // guards clusters, gports, cut, closed
	gports map[string][]int // each server's gateway port, kept across Restart
	cut    map[string]bool  // regions cut off
	closed bool
}

// link is the direction from one region to another.
type link struct{ from, to string }

// StartSupercluster starts a cluster of nodes servers for each region,
// each a gateway named by its region, joined through a fault proxy per
// link and server, and waits until every server has a gateway connection
// to every other region, accepted there (Options.ReadyTimeout bounds each
// wait, default DefaultMeshTimeout). A server's first gateway connection
// waits a second after it starts, as nats-server does. The caller must call
// Close.
func StartSupercluster(regions []string, nodes int, opts Options) (*Supercluster, error) {
	if len(regions) == 0 || nodes < 1 {
		return nil, fmt.Errorf("natsserver: supercluster of %d regions of %d servers", len(regions), nodes)
	}
	for i, r := range regions {
		if r == "" || strings.ContainsAny(r, " \t") || slices.Contains(regions[:i], r) {
			return nil, fmt.Errorf("natsserver: region %q: empty, repeated or with spaces", r)
		}
	}
	s := &Supercluster{
		regions:  slices.Clone(regions),
		clusters: make(map[string]*Cluster),
		proxies:  make(map[link][]*faultproxy.Proxy),
		secrets:  make(map[string]string),
		adverts:  make(map[string][]*refusingPort),
		gports:   make(map[string][]int),
		cut:      make(map[string]bool),
	}
	if err := s.prepare(nodes); err != nil {
		s.Close()
		return nil, err
	}
	for _, r := range s.regions {
		c, err := startCluster(r, r+"-", nodes, opts, func(i int, o *server.Options) { s.gateway(r, i, o) })
		if err != nil {
			s.Close()
			return nil, fmt.Errorf("natsserver: region %s: %w", r, err)
		}
		s.mu.Lock()
		s.clusters[r] = c
		s.mu.Unlock()
		s.started(r, c)
	}
	timeout := opts.ReadyTimeout
	if timeout <= 0 {
		timeout = DefaultMeshTimeout
	}
	if err := s.WaitJoined(timeout); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

// prepare makes the regions' passwords, the servers' advertised addresses
// and the links' proxies, which forward nowhere until their server starts.
func (s *Supercluster) prepare(nodes int) error {
	for _, r := range s.regions {
		s.secrets[r] = rand.Text()
		s.gports[r] = make([]int, nodes)
		for range nodes {
			p, err := holdRefusingPort()
			if err != nil {
				return err
			}
			s.adverts[r] = append(s.adverts[r], p)
		}
		for _, from := range s.regions {
			if from == r {
				continue
			}
			for range nodes {
				p, err := faultproxy.New("")
				if err != nil {
					return fmt.Errorf("natsserver: link %s→%s: %w", from, r, err)
				}
				l := link{from, r}
				s.proxies[l] = append(s.proxies[l], p)
			}
		}
	}
	return nil
}

// gateway sets node i of region r's gateway: its own port (random at first,
// the same on Restart), its region's password, a refusing advertised
// address, and the other regions' proxies of its links as remotes.
func (s *Supercluster) gateway(r string, i int, o *server.Options) {
	s.mu.Lock()
	port := s.gports[r][i]
	s.mu.Unlock()
	if port == 0 {
		port = server.RANDOM_PORT
	}
	o.Gateway = server.GatewayOpts{
		Name:      r,
		Host:      loopback,
		Port:      port,
		Username:  gatewayUser,
		Password:  s.secrets[r],
		Advertise: s.adverts[r][i].addr(),
	}
	for _, q := range s.regions {
		if q == r {
			continue
		}
		remote := &server.RemoteGatewayOpts{Name: q}
		for _, p := range s.proxies[link{r, q}] {
			remote.URLs = append(remote.URLs, &url.URL{Scheme: "nats", User: url.UserPassword(gatewayUser, s.secrets[q]), Host: p.Addr()})
		}
		o.Gateway.Gateways = append(o.Gateway.Gateways, remote)
	}
}

// started records region r's gateway ports and points the proxies of the
// links into r at them.
func (s *Supercluster) started(r string, c *Cluster) {
	addrs := make([]*net.TCPAddr, c.Len())
	for i := range addrs {
		addrs[i] = c.Server(i).srv.GatewayAddr()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, addr := range addrs {
		s.gports[r][i] = addr.Port
		for _, from := range s.regions {
			if from != r {
				s.proxies[link{from, r}][i].SetTarget(addr.String())
			}
		}
	}
}

// Regions returns the regions' names, in the order given.
func (s *Supercluster) Regions() []string { return slices.Clone(s.regions) }

// Cluster returns region's cluster, or nil if there is no such region. A
// node restarted with Cluster.Restart keeps its gateway port; wait for
// WaitJoined after it.
func (s *Supercluster) Cluster(region string) *Cluster {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.clusters[region]
}

// Proxies returns the proxies of the link from → to, one per server of to
// (node i's at i), to delay or cut one direction alone; nil if there is no
// such link. The caller must not Close them.
func (s *Supercluster) Proxies(from, to string) []*faultproxy.Proxy {
	return slices.Clone(s.proxies[link{from, to}])
}

// SetDelay makes every link, both ways, hold what it forwards from now on
// for a delay drawn uniformly from [lo, hi] (faultproxy's SetDelayRange).
// A message crosses one link on its way from a region to another.
func (s *Supercluster) SetDelay(lo, hi time.Duration) {
	for _, ps := range s.proxies {
		for _, p := range ps {
			p.SetDelayRange(lo, hi)
		}
	}
}

// Cut cuts region off: every link from or to it closes its connections and
// refuses new ones, until Heal. Nothing published in region reaches the
// others, nor the other way, while it is cut; the other regions still talk.
func (s *Supercluster) Cut(region string) { s.setCut(region, true) }

// Heal ends Cut(region): its links forward again, except those to a region
// still cut. The servers reconnect on their own within a few seconds
// (WaitJoined).
func (s *Supercluster) Heal(region string) { s.setCut(region, false) }

func (s *Supercluster) setCut(region string, cut bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cut[region] = cut
	for l, ps := range s.proxies {
		if l.from != region && l.to != region {
			continue
		}
		for _, p := range ps {
			if s.cut[l.from] || s.cut[l.to] {
				p.Cut()
			} else {
				p.Restore()
			}
		}
	}
}

// WaitJoined waits, up to timeout, until every running server has a
// gateway connection to every other region, through a proxy of its link
// and accepted by the server it reaches, and returns an error naming a
// missing one if not.
func (s *Supercluster) WaitJoined(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		missing := s.unjoined()
		if missing == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("natsserver: supercluster not joined within %v: %w", timeout, missing)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// unjoined returns nil if every running server's outbound gateway to each
// other region is up, goes through a proxy of its link, and is listed as
// inbound by the server it reaches (so its login passed), or an error
// naming one that is not.
func (s *Supercluster) unjoined() error {
	type node struct {
		region, name string
		srv          *server.Server
		gz           *server.Gatewayz
	}
	var nodes []*node
	byID := make(map[string]*node)
	for _, r := range s.regions {
		c := s.Cluster(r)
		if c == nil {
			return errors.New("region " + r + " not started")
		}
		for i := range c.Len() {
			srv := c.Server(i)
			if srv == nil {
				continue
			}
			gz, err := srv.srv.Gatewayz(nil)
			if err != nil {
				return fmt.Errorf("%s: gatewayz: %w", c.nodeName(i), err)
			}
			n := &node{region: r, name: c.nodeName(i), srv: srv.srv, gz: gz}
			nodes = append(nodes, n)
			byID[srv.srv.ID()] = n
		}
	}
	for _, n := range nodes {
		for _, q := range s.regions {
			if q == n.region {
				continue
			}
			out := n.gz.OutboundGateways[q]
			if out == nil || out.Connection == nil {
				return errors.New(n.name + " has no gateway to " + q)
			}
			if !s.proxied(link{n.region, q}, out.Connection.Port) {
				return fmt.Errorf("%s's gateway to %s goes to port %d, not through a proxy of the link", n.name, q, out.Connection.Port)
			}
			remote := byID[out.Connection.Name]
			if remote == nil {
				return fmt.Errorf("%s's gateway to %s reaches no running server of it", n.name, q)
			}
			accepted := slices.ContainsFunc(remote.gz.InboundGateways[n.region], func(in *server.RemoteGatewayz) bool {
				return in.Connection != nil && in.Connection.Name == n.srv.ID()
			})
			if !accepted {
				return fmt.Errorf("%s's gateway to %s is not accepted by %s", n.name, q, remote.name)
			}
		}
	}
	return nil
}

// proxied reports whether port is that of one of l's proxies.
func (s *Supercluster) proxied(l link, port int) bool {
	return slices.ContainsFunc(s.proxies[l], func(p *faultproxy.Proxy) bool {
		_, ps, _ := net.SplitHostPort(p.Addr())
		return ps == strconv.Itoa(port)
	})
}

// Close shuts every server down, then closes the proxies and frees the
// advertised ports. Safe to call twice.
func (s *Supercluster) Close() {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	s.closed = true
	clusters := make([]*Cluster, 0, len(s.clusters))
	for _, c := range s.clusters {
		clusters = append(clusters, c)
	}
	s.mu.Unlock()
	var wg sync.WaitGroup
	for _, c := range clusters {
		wg.Go(c.Close)
	}
	wg.Wait()
	for _, ps := range s.proxies {
		for _, p := range ps {
			p.Close()
		}
	}
	for _, ps := range s.adverts {
		for _, p := range ps {
			p.close()
		}
	}
}

// refusingPort holds a loopback port on which nothing listens, nor can
// while it is held: the port is the local end of an open connection to a
// listener since closed. A dial to it is refused at once.
type refusingPort struct{ a, b net.Conn }

func holdRefusingPort() (*refusingPort, error) {
	ln, err := net.Listen("tcp", net.JoinHostPort(loopback, "0"))
	if err != nil {
		return nil, fmt.Errorf("natsserver: hold a port: %w", err)
	}
	defer ln.Close()
	a, err := net.DialTimeout("tcp", ln.Addr().String(), 30*time.Second)
	if err != nil {
		return nil, fmt.Errorf("natsserver: hold a port: %w", err)
	}
	b, err := ln.Accept()
	if err != nil {
		a.Close()
		return nil, fmt.Errorf("natsserver: hold a port: %w", err)
	}
	return &refusingPort{a: a, b: b}, nil
}

// addr returns the held address, "127.0.0.1:PORT".
func (p *refusingPort) addr() string { return p.a.LocalAddr().String() }

func (p *refusingPort) close() {
	p.a.Close()
	p.b.Close()
}
