// The daemon's NATS: its client connection, the embedded server with its
// users and permissions, and the cluster routes between daemons.

package daemon

import (
	"bytes"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/hotkeyd/hotkey/coordinator"
	"github.com/hotkeyd/hotkey/internal/namespace"
	"github.com/hotkeyd/hotkey/internal/natsserver"
	"github.com/hotkeyd/hotkey/internal/redact"
)

// readSecret reads the coordinator's secret from file, without the white
// space around it; nil for no file. It warns when others may read the file.
func readSecret(file string, log *slog.Logger) ([]byte, error) {
	if file == "" {
		return nil, nil
	}
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("secret file, set by %s: %w", flagName("nats-secret-file"), err)
	}
	secret := bytes.TrimSpace(data)
	if len(secret) < coordinator.MinSecret {
		return nil, fmt.Errorf("secret file %s, set by %s: %d bytes, want at least %d (e.g. openssl rand -hex 32 > %s)",
			file, flagName("nats-secret-file"), len(secret), coordinator.MinSecret, file)
	}
	if fi, err := os.Stat(file); err == nil && fi.Mode().Perm()&0o077 != 0 {
		log.Warn("the NATS secret file may be read by others than its owner", "file", file, "mode", fi.Mode().Perm().String())
	}
	return secret, nil
}

// startNATS starts the embedded server (unless --nats) and connects.
func (d *Daemon) startNATS() error {
	cfg := d.cfg
	opts := []nats.Option{
		nats.Name("hotkeyd " + d.id),
		nats.Timeout(2 * time.Second),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(500 * time.Millisecond),
		nats.ReconnectBufSize(-1),
		nats.NoEcho(), // the coordinator ignores its own messages anyway
		nats.DrainTimeout(drainTimeout),
		nats.DisconnectErrHandler(func(nc *nats.Conn, err error) {
			d.natsSynced.Store(false)
			if !nc.IsClosed() && !nc.IsDraining() {
				d.log.Warn("disconnected from NATS: decisions go on; hot keys are agreed again on reconnect", "err", err)
			}
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			d.log.Info("reconnected to NATS", "url", redact.URL(nc.ConnectedUrl()))
		}),
		nats.ClosedHandler(func(*nats.Conn) { close(d.ncClosed) }),
		nats.ReconnectErrHandler(func(_ *nats.Conn, err error) {
			// Each attempt fails alike while the server is down: say each
			// new reason once (an authorization error is no outage).
			if msg := err.Error(); msg != d.natsLastErr {
				d.natsLastErr = msg
				d.log.Warn("cannot connect to NATS", "err", err)
			}
		}),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			d.log.Warn("NATS error", "err", err)
		}),
	}
	if cfg.NATSCreds != "" && cfg.NATSUser == "" && cfg.NATSToken == "" && cfg.NATSNkeySeed == "" {
		if _, err := os.Stat(cfg.NATSCreds); err != nil {
			return fmt.Errorf("%s: %w", flagName("nats-creds"), err)
		}
	}
	auth, err := natsAuth(&cfg)
	if err != nil {
		return err
	}
	opts = append(opts, auth...)
	if p := inboxPrefix(cfg.Namespace, cfg.NATSClientUser != ""); p != "" {
		opts = append(opts, nats.CustomInboxPrefix(p))
	}

	if cfg.NATS == "" {
		if err := d.startEmbedded(); err != nil {
			return err
		}
	} else {
		d.natsURL = cfg.NATS
		// A NATS not up yet is connected to when it is: until then the
		// daemon decides alone, and /readyz says so.
		opts = append(opts, nats.RetryOnFailedConnect(true), nats.ConnectHandler(func(nc *nats.Conn) {
			d.log.Info("connected to NATS", "url", redact.URL(nc.ConnectedUrl()))
		}))
	}
	nc, err := nats.Connect(d.natsURL, opts...)
	if err == nil && !nc.IsConnected() {
		d.log.Warn("cannot reach NATS yet: deciding alone (hot keys are not agreed with other daemons, /readyz says degraded) until it answers", "url", redact.URLs(strings.Split(d.natsURL, ",")))
	}
	if err != nil {
		if d.ns != nil {
			return fmt.Errorf("connect to the embedded NATS server at %s: %w", d.natsURL, err)
		}
		return fmt.Errorf("connect to NATS at %s, set by %s: %w", redact.URLs(strings.Split(d.natsURL, ",")), flagName("nats"), err)
	}
	d.nc = nc
	return nil
}

// natsAuth returns the nats.go options for the credentials and TLS files
// cfg names: --nats-user and --nats-password, --nats-token, --nats-nkey-seed
// or --nats-creds (at most one, as check ensures); --nats-ca, --nats-cert and
// --nats-key. The only error is an nkey seed file that cannot be read.
func natsAuth(cfg *Config) ([]nats.Option, error) {
	var opts []nats.Option
	switch {
	case cfg.NATSUser != "":
		opts = append(opts, nats.UserInfo(cfg.NATSUser, cfg.NATSPassword))
	case cfg.NATSToken != "":
		opts = append(opts, nats.Token(cfg.NATSToken))
	case cfg.NATSNkeySeed != "":
		o, err := nats.NkeyOptionFromSeed(cfg.NATSNkeySeed)
		if err != nil {
			return nil, fmt.Errorf("%s %s: %w", flagName("nats-nkey-seed"), cfg.NATSNkeySeed, err)
		}
		opts = append(opts, o)
	case cfg.NATSCreds != "":
		opts = append(opts, nats.UserCredentials(cfg.NATSCreds))
	}
	if cfg.NATSCA != "" {
		opts = append(opts, nats.RootCAs(cfg.NATSCA))
	}
	if cfg.NATSCert != "" {
		opts = append(opts, nats.ClientCert(cfg.NATSCert, cfg.NATSKey))
	}
	return opts, nil
}

// startEmbedded starts the embedded NATS server on --nats-listen.
func (d *Daemon) startEmbedded() error {
	addr := d.cfg.NATSListen
	host, portStr, _ := net.SplitHostPort(addr)
	port, _ := strconv.Atoi(portStr)
	// nats-server reports a port in use only as a readiness timeout: try
	// the address first, for a clear message.
	for _, a := range []struct{ addr, flag string }{{addr, "nats-listen"}, {d.cfg.NATSClusterListen, "nats-cluster-listen"}, {d.cfg.NATSGatewayListen, "nats-gateway-listen"}} {
		if _, p, _ := net.SplitHostPort(a.addr); p == "" || p == "0" {
			continue
		}
		l, err := net.Listen("tcp", a.addr)
		if err != nil {
			return listenError("embedded NATS server", a.addr, a.flag, err)
		}
		l.Close()
	}
	if port == 0 {
		port = server.RANDOM_PORT
	}
	ns, err := natsserver.Start(natsserver.Options{
		ReadyTimeout: startTimeout,
		Configure: func(o *server.Options) {
			o.Host, o.Port = host, port
			if host == "" {
				o.Host = "0.0.0.0"
			}
			o.ServerName = "hotkeyd-" + d.id
			switch {
			case d.cfg.NATSClientUser != "":
				o.Users = []*server.User{
					{Username: d.cfg.NATSUser, Password: d.cfg.NATSPassword},
					{Username: d.cfg.NATSClientUser, Password: d.cfg.NATSClientPassword, Permissions: clientPermissions(d.cfg.Namespace)},
				}
			case d.cfg.NATSUser != "":
				o.Username, o.Password = d.cfg.NATSUser, d.cfg.NATSPassword
			case d.cfg.NATSToken != "":
				o.Authorization = d.cfg.NATSToken
			}
			d.configureCluster(o)
			configureGateway(o, &d.cfg)
		},
	})
	if err != nil {
		return fmt.Errorf("embedded NATS server on %s: %w; change the address with %s, or join another NATS with %s", addr, err, flagName("nats-listen"), flagName("nats"))
	}
	d.ns = ns
	if d.cfg.NATSGatewayListen != "" && !d.cfg.routeAuth() {
		d.log.Warn("the embedded NATS server accepts gateways without authentication: any process on this host can join the regions' NATS supercluster and publish as a daemon; add "+
			flagName("nats-user")+" and "+flagName("nats-password")+", or "+flagName("nats-token"), "gateway", ns.Server().GatewayAddr().String())
	}
	if d.cfg.NATSClusterListen != "" && !d.cfg.routeAuth() {
		// check refuses this off loopback; on it, any process of this host
		// may still join.
		d.log.Warn("the embedded NATS server accepts routes without authentication: any process on this host can join the daemons' NATS cluster and publish as a daemon; add "+
			flagName("nats-user")+" and "+flagName("nats-password")+", or "+flagName("nats-token"), "cluster", ns.Server().ClusterAddr().String())
	}
	connectHost := host
	if ip := net.ParseIP(host); host == "" || ip != nil && ip.IsUnspecified() {
		connectHost = "127.0.0.1"
		if ip != nil && ip.To4() == nil {
			connectHost = "::1"
		}
	}
	p := ns.Server().Addr().(*net.TCPAddr).Port
	d.natsURL = "nats://" + net.JoinHostPort(connectHost, strconv.Itoa(p))
	return nil
}

// clientPermissions are those of --nats-client-user on the embedded NATS
// server: ask for decisions on namespace ns's subject, and hear the answers.
func clientPermissions(ns string) *server.Permissions {
	return &server.Permissions{
		Publish:   &server.SubjectPermission{Allow: []string{namespace.AllowSubject(ns)}},
		Subscribe: &server.SubjectPermission{Allow: []string{"_INBOX.>"}},
	}
}

// daemonInboxPrefix is the daemons' inbox prefix (see inboxPrefix), out of
// the clients' _INBOX.>.
const daemonInboxPrefix = "_HOTKEYD_INBOX"

// routeUser is the user routes log in as when the daemons share a token.
const routeUser = "hotkeyd-route"

// configureCluster sets o's cluster from --nats-cluster-listen and
// --nats-routes: routes log in as clients do, with --nats-user and
// --nats-password, or as routeUser with --nats-token as the password.
func (d *Daemon) configureCluster(o *server.Options) {
	cfg := d.cfg
	if cfg.NATSClusterListen == "" {
		return
	}
	host, portStr, _ := net.SplitHostPort(cfg.NATSClusterListen)
	port, _ := strconv.Atoi(portStr)
	if port == 0 {
		port = server.RANDOM_PORT
	}
	if host == "" {
		host = "0.0.0.0"
	}
	o.Cluster.Name, o.Cluster.Host, o.Cluster.Port = cfg.NATSClusterName, host, port
	var creds *url.Userinfo
	switch {
	case cfg.NATSUser != "":
		o.Cluster.Username, o.Cluster.Password = cfg.NATSUser, cfg.NATSPassword
		creds = url.UserPassword(cfg.NATSUser, cfg.NATSPassword)
	case cfg.NATSToken != "":
		o.Cluster.Username, o.Cluster.Password = routeUser, cfg.NATSToken
		creds = url.UserPassword(routeUser, cfg.NATSToken)
	}
	for _, r := range cfg.NATSRoutes {
		u, _ := routeURL(r) // checked by ParseArgs
		u.User = creds
		o.Routes = append(o.Routes, u)
	}
}

// configureGateway sets o's gateway from --nats-gateway-listen and
// --nats-gateways: named by the region, which names the cluster too; the
// gateways log in as routes do (configureCluster).
func configureGateway(o *server.Options, cfg *Config) {
	if cfg.NATSGatewayListen == "" {
		return
	}
	host, portStr, _ := net.SplitHostPort(cfg.NATSGatewayListen)
	port, _ := strconv.Atoi(portStr)
	if port == 0 {
		port = server.RANDOM_PORT
	}
	if host == "" {
		host = "0.0.0.0"
	}
	o.Gateway.Name, o.Gateway.Host, o.Gateway.Port = cfg.Region, host, port
	switch {
	case cfg.NATSUser != "":
		o.Gateway.Username, o.Gateway.Password = cfg.NATSUser, cfg.NATSPassword
	case cfg.NATSToken != "":
		o.Gateway.Username, o.Gateway.Password = routeUser, cfg.NATSToken
	}
	for _, g := range cfg.NATSGateways {
		r := &server.RemoteGatewayOpts{Name: g.Region}
		for _, s := range g.URLs {
			u, _ := gatewayURL(s) // checked by ParseArgs
			r.URLs = append(r.URLs, u)
		}
		o.Gateway.Gateways = append(o.Gateway.Gateways, r)
	}
}

// gatewaysDown returns the regions of --nats-gateways that the embedded
// server has no outbound gateway connection to.
func (d *Daemon) gatewaysDown() []string {
	if d.ns == nil || len(d.cfg.NATSGateways) == 0 {
		return nil
	}
	gz, err := d.ns.Server().Gatewayz(nil)
	if err != nil {
		return nil
	}
	var down []string
	for _, g := range d.cfg.NATSGateways {
		if r := gz.OutboundGateways[g.Region]; r == nil || r.Connection == nil {
			down = append(down, g.Region)
		}
	}
	return down
}

// loopback reports whether addr's host is a loopback address or
// localhost: a NATS server there is reached from this host only.
func loopback(addr string) bool {
	host, _, _ := net.SplitHostPort(addr)
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// addService serves the namespace's decision subject (namespace.AllowSubject) as a
// NATS micro service, and waits, if connected, until the server has the
// subscription.
func (d *Daemon) addService(version string) error {
	var err error
	subject := namespace.AllowSubject(d.cfg.Namespace)
	d.nats.slots = make(chan struct{}, max(1, d.cfg.NATSConcurrency))
	d.svc, err = micro.AddService(d.nc, micro.Config{
		Name:        serviceName(d.cfg.Namespace),
		Version:     serviceVersion(version),
		Description: "hotkey rate-limit decisions: request on " + subject + " with {\"policy\":\"default\",\"key\":\"user_123\",\"cost\":1}",
		Metadata:    map[string]string{"instance": d.id, "namespace": d.cfg.Namespace},
	})
	if err != nil {
		return fmt.Errorf("NATS micro service: %w", err)
	}
	if err = d.svc.AddEndpoint("allow", micro.HandlerFunc(d.handleNATS), micro.WithEndpointSubject(subject)); err != nil {
		return fmt.Errorf("NATS micro endpoint %s: %w", subject, err)
	}
	if d.nc.IsConnected() {
		if err = d.nc.FlushTimeout(startTimeout); err != nil {
			return fmt.Errorf("NATS: flush: %w", err)
		}
		d.natsSynced.Store(true)
	}
	return nil
}
