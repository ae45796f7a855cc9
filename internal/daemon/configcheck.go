package daemon

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"github.com/hotkeyd/hotkey/internal/namespace"
	"github.com/hotkeyd/hotkey/internal/redact"
)

// check refuses contradictory or invalid settings, naming the flag.
func (c *Config) check() error {
	if _, _, err := net.SplitHostPort(c.Listen); err != nil {
		return fmt.Errorf("%s %q: want host:port, e.g. 127.0.0.1:8080 or :8080", flagName("listen"), c.Listen)
	}
	if c.GRPCListen != "" {
		if _, _, err := net.SplitHostPort(c.GRPCListen); err != nil {
			return fmt.Errorf("%s %q: want host:port, e.g. 127.0.0.1:8081, or empty to turn gRPC off", flagName("grpc-listen"), c.GRPCListen)
		}
	}
	switch {
	case (c.TLSCert == "") != (c.TLSKey == ""):
		return fmt.Errorf("%s and %s go together", flagName("tls-cert"), flagName("tls-key"))
	case c.TLSClientCA != "" && c.TLSCert == "":
		return fmt.Errorf("%s needs %s and %s: client certificates are asked for in a TLS handshake", flagName("tls-client-ca"), flagName("tls-cert"), flagName("tls-key"))
	}
	if c.AdminListen != "" {
		if _, _, err := net.SplitHostPort(c.AdminListen); err != nil {
			return fmt.Errorf("%s %q: want host:port, e.g. 127.0.0.1:8082, or empty to turn the admin listener off", flagName("admin-listen"), c.AdminListen)
		}
		for _, o := range []struct{ flag, addr string }{{"listen", c.Listen}, {"grpc-listen", c.GRPCListen}} {
			if sameListen(c.AdminListen, o.addr) {
				return fmt.Errorf("%s %q is the address of %s %q: the admin listener serves raw keys and profiles, and needs an address of its own, off the API's network", flagName("admin-listen"), c.AdminListen, flagName(o.flag), o.addr)
			}
		}
	}
	if c.EnvoyConfig != "" && c.GRPCListen == "" {
		return fmt.Errorf("%s is served over gRPC, which an empty %s turns off", flagName("envoy-config"), flagName("grpc-listen"))
	}
	if c.GRPCServer != GRPCServerLean && c.GRPCServer != GRPCServerGRPCGo {
		return fmt.Errorf("%s %q: want %s or %s", flagName("grpc-server"), c.GRPCServer, GRPCServerLean, GRPCServerGRPCGo)
	}
	for _, f := range []string{"grpc-max-connection-age", "grpc-max-connection-age-grace", "grpc-idle-timeout", "grpc-server"} {
		if c.set[f] && c.GRPCListen == "" {
			return fmt.Errorf("%s applies to gRPC, which an empty %s turns off", flagName(f), flagName("grpc-listen"))
		}
	}
	switch {
	case c.GRPCMaxConnectionAge < 0:
		return fmt.Errorf("%s %v: want a positive duration, e.g. 5m, or 0 to keep connections for ever", flagName("grpc-max-connection-age"), c.GRPCMaxConnectionAge)
	case c.GRPCMaxConnectionAgeGrace < 0:
		return fmt.Errorf("%s %v: want a positive duration, e.g. 30s, or 0 to wait for the requests in flight for ever", flagName("grpc-max-connection-age-grace"), c.GRPCMaxConnectionAgeGrace)
	case c.GRPCIdleTimeout < 0:
		return fmt.Errorf("%s %v: want a positive duration, e.g. 5m, or 0 to keep idle connections for ever", flagName("grpc-idle-timeout"), c.GRPCIdleTimeout)
	case c.GRPCMaxConnectionAgeGrace > 0 && c.GRPCMaxConnectionAge == 0:
		return fmt.Errorf("%s follows %s, which is 0 (connections kept for ever): set it too", flagName("grpc-max-connection-age-grace"), flagName("grpc-max-connection-age"))
	}
	if c.DrainDelay < 0 {
		return fmt.Errorf("%s %v: want a positive duration, e.g. 5s, or 0 to shut down at once", flagName("drain-delay"), c.DrainDelay)
	}
	if err := c.checkRedis(); err != nil {
		return err
	}
	if c.RedisPrefix == "" || strings.ContainsAny(c.RedisPrefix, "{}") {
		return fmt.Errorf("%s %q: want a non-empty prefix without '{' or '}' (a counter's own hash tag decides its Cluster slot)", flagName("redis-prefix"), c.RedisPrefix)
	}
	if c.set["region"] && !namespace.Valid(c.Region) {
		return fmt.Errorf("%s %q: want 1 to %d of A-Z a-z 0-9 - _ (one NATS subject token: no '.', spaces or wildcards)", flagName("region"), c.Region, namespace.Max)
	}
	if err := c.checkRegions(); err != nil {
		return err
	}
	switch c.NATS {
	case NATSNone:
		for _, d := range flagDocs {
			if strings.HasPrefix(d.name, "nats-") && c.set[d.name] {
				return fmt.Errorf("%s applies to NATS, which %s none turns off: give one or the other", flagName(d.name), flagName("nats"))
			}
		}
		if c.set["namespace"] {
			return fmt.Errorf("%s names the fleet's NATS subjects, which %s none turns off: give one or the other", flagName("namespace"), flagName("nats"))
		}
		if c.set["gossip-interval"] {
			return fmt.Errorf("%s times the rounds sync: gossip sends over NATS, which %s none turns off (a gossip policy then decides alone): give one or the other", flagName("gossip-interval"), flagName("nats"))
		}
		for _, f := range []string{"regions", "region-interval"} {
			if c.set[f] {
				return fmt.Errorf("%s is for the exchange between regions over NATS, which %s none turns off: give one or the other", flagName(f), flagName("nats"))
			}
		}
	case "off", "false", "no", "0":
		return fmt.Errorf("%s %q: want none to run with no NATS, or a URL such as nats://host:4222", flagName("nats"), c.NATS)
	}
	if c.NATS != "" {
		for _, f := range []string{"nats-listen", "nats-cluster-listen", "nats-routes", "nats-cluster-name", "nats-gateway-listen", "nats-gateways", "nats-client-user", "nats-client-password"} {
			if c.set[f] {
				return fmt.Errorf("%s is for the embedded NATS server, which %s replaces: give one or the other", flagName(f), flagName("nats"))
			}
		}
	} else {
		if c.NATSClusterListen != "" {
			if err := checkListen("nats-cluster-listen", c.NATSClusterListen, "0.0.0.0:6222"); err != nil {
				return err
			}
		} else {
			if c.set["nats-routes"] {
				return fmt.Errorf("%s needs %s: the embedded server accepts routes there", flagName("nats-routes"), flagName("nats-cluster-listen"))
			}
			if c.set["nats-cluster-name"] && c.NATSGatewayListen == "" {
				return fmt.Errorf("%s needs %s (the embedded server accepts routes there) or %s", flagName("nats-cluster-name"), flagName("nats-cluster-listen"), flagName("nats-gateway-listen"))
			}
		}
		if err := c.checkGateways(); err != nil {
			return err
		}
		for _, r := range c.NATSRoutes {
			if _, err := routeURL(r); err != nil {
				return fmt.Errorf("%s %q: %v", flagName("nats-routes"), redact.URL(r), err)
			}
		}
		switch {
		case c.NATSClientUser != "" && c.NATSUser == "":
			return fmt.Errorf("%s needs %s: the daemons log in as that user, with every right", flagName("nats-client-user"), flagName("nats-user"))
		case (c.NATSClientUser == "") != (c.NATSClientPassword == ""):
			return fmt.Errorf("%s and %s go together", flagName("nats-client-user"), flagName("nats-client-password"))
		case c.NATSClientUser != "" && c.NATSPassword == "":
			return fmt.Errorf("%s needs %s: without it anyone could log in as %s's user, with every right", flagName("nats-client-user"), flagName("nats-password"), flagName("nats-user"))
		case c.NATSClientUser != "" && c.NATSClientUser == c.NATSUser:
			return fmt.Errorf("%s %q is %s's user: give API clients a user of their own", flagName("nats-client-user"), c.NATSClientUser, flagName("nats-user"))
		}
		if c.NATSClusterName == "" || strings.ContainsAny(c.NATSClusterName, " \t\n.*>") {
			return fmt.Errorf("%s %q: want a name without spaces, '.', '*' or '>'", flagName("nats-cluster-name"), c.NATSClusterName)
		}
		if c.NATSClusterListen != "" && !c.routeAuth() && !loopback(c.NATSClusterListen) {
			return fmt.Errorf("%s %q: any host that reaches it could join the daemons' NATS cluster with no password or token, and publish as a daemon; add %s and %s, or %s (the same on every daemon: routes log in with them), or listen on a loopback address",
				flagName("nats-cluster-listen"), c.NATSClusterListen, flagName("nats-user"), flagName("nats-password"), flagName("nats-token"))
		}
		if err := checkListen("nats-listen", c.NATSListen, "127.0.0.1:4222"); err != nil {
			return err
		}
		for _, f := range []string{"nats-nkey-seed", "nats-creds", "nats-ca", "nats-cert", "nats-key"} {
			if c.set[f] {
				return fmt.Errorf("%s applies when joining an existing NATS with %s; the embedded server takes only --nats-user/--nats-password or --nats-token", flagName(f), flagName("nats"))
			}
		}
	}
	auth := 0
	for _, on := range []bool{c.NATSUser != "" || c.NATSPassword != "", c.NATSToken != "", c.NATSNkeySeed != "", c.NATSCreds != ""} {
		if on {
			auth++
		}
	}
	switch {
	case auth > 1:
		return errors.New("give at most one of --nats-user/--nats-password, --nats-token, --nats-nkey-seed and --nats-creds")
	case c.NATSPassword != "" && c.NATSUser == "":
		return fmt.Errorf("%s needs %s", flagName("nats-password"), flagName("nats-user"))
	case (c.NATSCert == "") != (c.NATSKey == ""):
		return fmt.Errorf("%s and %s go together", flagName("nats-cert"), flagName("nats-key"))
	case !namespace.Valid(c.Namespace):
		return fmt.Errorf("%s %q: want 1 to %d of A-Z a-z 0-9 - _ (one NATS subject token: no '.', spaces or wildcards)", flagName("namespace"), c.Namespace, namespace.Max)
	case c.NATSConcurrency < 1 || c.NATSConcurrency > 1<<20:
		return fmt.Errorf("%s %d: want 1 to %d", flagName("nats-concurrency"), c.NATSConcurrency, 1<<20)
	case c.MaxKeys < 1 || c.MaxKeys > maxMaxKeys:
		return fmt.Errorf("%s %d: want 1 to %d", flagName("max-keys"), c.MaxKeys, maxMaxKeys)
	case !(c.HotThreshold > 0) || c.HotThreshold > 1e12:
		return fmt.Errorf("%s %v: want a positive rate in requests per second", flagName("hot-threshold"), c.HotThreshold)
	case !(c.HotFloor >= 0) || c.HotFloor > 1e12:
		return fmt.Errorf("%s %v: want a rate in requests per second, 0 or more", flagName("hot-floor"), c.HotFloor)
	case c.CoolDown <= 0:
		return fmt.Errorf("%s %v: want a positive duration, e.g. 60s", flagName("cool-down"), c.CoolDown)
	case c.BreakerProbe <= 0:
		return fmt.Errorf("%s %v: want a positive duration, e.g. 10s", flagName("breaker-probe"), c.BreakerProbe)
	case c.ReserveLease <= 0 || c.ReserveLease > maxReserveLease:
		return fmt.Errorf("%s %v: want a positive duration, at most %v, e.g. 100ms", flagName("reserve-lease"), c.ReserveLease, maxReserveLease)
	case c.GossipInterval < minGossipInterval || c.GossipInterval > maxGossipInterval:
		return fmt.Errorf("%s %v: want a duration from %v to %v, e.g. 100ms", flagName("gossip-interval"), c.GossipInterval, minGossipInterval, maxGossipInterval)
	case c.ReloadInterval < 0:
		return fmt.Errorf("%s %v: want a positive duration, e.g. 2s, or 0 to check never", flagName("reload-interval"), c.ReloadInterval)
	}
	return nil
}

// checkGateways refuses gateway settings of the embedded server that
// cannot make a supercluster: gateways without a listener or a region, a
// cluster named apart from its region, a gateway to this region, a gateway
// listener off loopback that lets anyone in.
func (c *Config) checkGateways() error {
	if c.NATSGatewayListen == "" {
		if c.set["nats-gateways"] {
			return fmt.Errorf("%s needs %s: the embedded server joins the other regions' clusters through its own gateway", flagName("nats-gateways"), flagName("nats-gateway-listen"))
		}
		return nil
	}
	if err := checkListen("nats-gateway-listen", c.NATSGatewayListen, "0.0.0.0:7222"); err != nil {
		return err
	}
	switch {
	case c.Region == "":
		return fmt.Errorf("%s needs %s: the gateway, and the embedded cluster, are named by their region, as the other regions' %s name them", flagName("nats-gateway-listen"), flagName("region"), flagName("nats-gateways"))
	case c.NATSClusterName != c.Region:
		return fmt.Errorf("%s %q is not %s %q: with %s the cluster is named by its region; leave %s out", flagName("nats-cluster-name"), c.NATSClusterName, flagName("region"), c.Region, flagName("nats-gateway-listen"), flagName("nats-cluster-name"))
	case !c.routeAuth() && !loopback(c.NATSGatewayListen):
		return fmt.Errorf("%s %q: any host that reaches it could join the regions' NATS supercluster with no password or token, and publish as a daemon; add %s and %s, or %s (the same in every region: gateways log in with them), or listen on a loopback address",
			flagName("nats-gateway-listen"), c.NATSGatewayListen, flagName("nats-user"), flagName("nats-password"), flagName("nats-token"))
	}
	for _, g := range c.NATSGateways {
		if g.Region == c.Region {
			return fmt.Errorf("%s: region %s is this daemon's own %s: list the other regions' gateways", flagName("nats-gateways"), g.Region, flagName("region"))
		}
	}
	return nil
}

// sameListen reports whether listening on a and on b would take the same
// port: the same port, not 0 (each listen gets a port of its own), on the
// same host or on all addresses.
func sameListen(a, b string) bool {
	ha, pa, err := net.SplitHostPort(a)
	if err != nil {
		return false
	}
	hb, pb, err := net.SplitHostPort(b)
	if err != nil || pa != pb || pa == "0" {
		return false
	}
	wild := func(h string) bool { return h == "" || h == "0.0.0.0" || h == "::" }
	return ha == hb || wild(ha) || wild(hb)
}

// checkRedis refuses contradictory Redis settings: more than one store,
// a Sentinel without its master's name, half a client certificate, a
// refinement of a Redis that no flag names.
func (c *Config) checkRedis() error {
	var stores []string
	for f, on := range map[string]bool{"redis": c.Redis != "", "redis-cluster": c.set["redis-cluster"] || len(c.RedisCluster) > 0, "redis-sentinel": c.set["redis-sentinel"] || len(c.RedisSentinel) > 0} {
		if on {
			stores = append(stores, flagName(f))
		}
	}
	slices.Sort(stores)
	if len(stores) > 1 {
		return fmt.Errorf("%s: give one of them", strings.Join(stores, " and "))
	}
	if c.set["redis-cluster"] && len(c.RedisCluster) == 0 {
		return fmt.Errorf("%s: no address given", flagName("redis-cluster"))
	}
	if c.set["redis-sentinel"] && len(c.RedisSentinel) == 0 {
		return fmt.Errorf("%s: no address given", flagName("redis-sentinel"))
	}
	if len(c.RedisSentinel) > 0 && c.RedisMaster == "" {
		return fmt.Errorf("%s needs %s: the name the Sentinels monitor the master under", flagName("redis-sentinel"), flagName("redis-master"))
	}
	if len(c.RedisSentinel) == 0 {
		for _, f := range []string{"redis-master", "redis-sentinel-password"} {
			if c.set[f] {
				return fmt.Errorf("%s applies to Redis Sentinel: give %s too", flagName(f), flagName("redis-sentinel"))
			}
		}
	}
	if (c.RedisCert == "") != (c.RedisKey == "") {
		return fmt.Errorf("%s and %s go together: a client certificate and its key", flagName("redis-cert"), flagName("redis-key"))
	}
	if c.Redis == "" && len(c.RedisCluster) == 0 && len(c.RedisSentinel) == 0 {
		for _, f := range []string{"redis-user", "redis-password", "redis-tls", "redis-ca", "redis-cert", "redis-key", "redis-prefix"} {
			if c.set[f] {
				return fmt.Errorf("%s applies to Redis, which none of %s, %s and %s names: counters are in memory", flagName(f), flagName("redis"), flagName("redis-cluster"), flagName("redis-sentinel"))
			}
		}
	}
	return nil
}

// routeAuth reports whether the embedded server's routes log in: with
// --nats-user and --nats-password, or with --nats-token. A user without a
// password is no secret.
func (c *Config) routeAuth() bool {
	return c.NATSUser != "" && c.NATSPassword != "" || c.NATSToken != ""
}

// routeURL parses a route of --nats-routes: nats-route://host:port,
// nats://host:port or host:port, without credentials (the daemon adds its
// own).
func routeURL(s string) (*url.URL, error) {
	if !strings.Contains(s, "://") {
		s = "nats-route://" + s
	}
	u, err := url.Parse(s)
	switch {
	case err != nil:
		return nil, errors.New("want nats-route://host:port or host:port")
	case u.Scheme != "nats-route" && u.Scheme != "nats":
		return nil, fmt.Errorf("scheme %q: want nats-route://host:port or host:port", u.Scheme)
	case u.User != nil:
		return nil, errors.New("no credentials in a route: routes log in with --nats-user/--nats-password or --nats-token")
	case u.Hostname() == "" || u.Port() == "" || u.Path != "" && u.Path != "/":
		return nil, errors.New("want nats-route://host:port or host:port")
	}
	return u, nil
}

// gatewayURL parses a URL of --nats-gateways: nats://host:port or
// host:port, without credentials (the daemon adds its own).
func gatewayURL(s string) (*url.URL, error) {
	if !strings.Contains(s, "://") {
		s = "nats://" + s
	}
	u, err := url.Parse(s)
	switch {
	case err != nil:
		return nil, errors.New("want nats://host:port or host:port")
	case u.Scheme != "nats":
		return nil, fmt.Errorf("scheme %q: want nats://host:port or host:port", u.Scheme)
	case u.User != nil:
		return nil, errors.New("no credentials in a gateway URL: gateways log in with --nats-user/--nats-password or --nats-token")
	case u.Hostname() == "" || u.Port() == "" || u.Path != "" && u.Path != "/":
		return nil, errors.New("want nats://host:port or host:port")
	}
	return u, nil
}

// checkListen refuses an address of flag f that is not host:port with a
// port number; example is one that is.
func checkListen(f, addr, example string) error {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("%s %q: want host:port, e.g. %s", flagName(f), addr, example)
	}
	if p, err := strconv.Atoi(port); err != nil || p < 0 || p > 65535 {
		return fmt.Errorf("%s %q: bad port", flagName(f), addr)
	}
	return nil
}

// checkRegions refuses --regions and --region-interval that cannot hold:
// a list without this daemon's --region, or with a name that is no NATS
// subject token, given twice, or of one region alone; an interval out of
// bounds.
func (c *Config) checkRegions() error {
	if c.RegionInterval < minRegionInterval || c.RegionInterval > maxRegionInterval {
		return fmt.Errorf("%s %v: want a duration from %v to %v, e.g. 1s", flagName("region-interval"), c.RegionInterval, minRegionInterval, maxRegionInterval)
	}
	if len(c.Regions) == 0 {
		if c.set["regions"] {
			return fmt.Errorf("%s is empty: want this daemon's region and the others', e.g. eu,us,ap", flagName("regions"))
		}
		return nil
	}
	if c.Region == "" {
		return fmt.Errorf("%s needs %s: the region of this daemon, among them", flagName("regions"), flagName("region"))
	}
	seen := make(map[string]bool, len(c.Regions))
	for _, r := range c.Regions {
		if !namespace.Valid(r) {
			return fmt.Errorf("%s: region %q: want 1 to %d of A-Z a-z 0-9 - _ (one NATS subject token)", flagName("regions"), r, namespace.Max)
		}
		if seen[r] {
			return fmt.Errorf("%s: region %s given twice", flagName("regions"), r)
		}
		seen[r] = true
	}
	if !seen[c.Region] {
		return fmt.Errorf("%s %s lacks this daemon's %s %s", flagName("regions"), strings.Join(c.Regions, ","), flagName("region"), c.Region)
	}
	if len(c.Regions) < 2 {
		return fmt.Errorf("%s %s: want this region and at least one other", flagName("regions"), strings.Join(c.Regions, ","))
	}
	return nil
}
