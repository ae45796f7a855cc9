// Package daemon is hotkeyd: the hotkey engine behind an HTTP API and a NATS
// micro service, with a policies file, Prometheus metrics and an embedded
// NATS server by default. cmd/hotkeyd is a thin main around Main.
package daemon

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"regexp"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"

	"github.com/hotkeyd/hotkey"
	"github.com/hotkeyd/hotkey/coordinator"
	"github.com/hotkeyd/hotkey/counter"
	"github.com/hotkeyd/hotkey/detector"
	"github.com/hotkeyd/hotkey/internal/envoyconf"
	"github.com/hotkeyd/hotkey/internal/loadgencmd"
	"github.com/hotkeyd/hotkey/internal/natsserver"
	"github.com/hotkeyd/hotkey/internal/redact"
)

// Timeouts of the daemon.
const (
	// ShutdownTimeout bounds a graceful shutdown; the daemon exits within
	// it whatever is left in flight.
	ShutdownTimeout = 4500 * time.Millisecond
	startTimeout    = 5 * time.Second // reaching Redis and NATS at start
	// storeSetupTimeout bounds the first try to set the store up, without
	// --require-store; then it is tried every storeSetupRetry.
	storeSetupTimeout = 2 * time.Second
	storeSetupRetry   = 250 * time.Millisecond
	pingTimeout       = 300 * time.Millisecond // /readyz's Redis PING
	drainTimeout      = 2 * time.Second        // NATS drain at shutdown
	newConnGrace      = 250 * time.Millisecond // at shutdown, connections with no request yet are closed after this
	redisDial         = time.Second
	// natsSubject is the micro endpoint's subject.
	natsSubject = "hotkey.allow"
	// ServiceName is the NATS micro service's name.
	ServiceName = "hotkey"
)

// readyzKey and readyzPolicy are the decision /readyz makes, on a key of its
// own, to let an open breaker probe the store when no traffic does.
const readyzKey = "hotkeyd:readyz"

// Main runs hotkeyd with args (without the program name), reading flags'
// environment variables through lookup. It returns the exit code: 0 after
// --help, version or a graceful shutdown on SIGTERM or SIGINT; 2 for bad
// flags; 1 when the daemon cannot start or fails. SIGHUP reloads the
// policies and Envoy rules (Reload).
func Main(version string, args []string, lookup func(string) (string, bool), stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] == "loadgen" {
		return loadgencmd.Main(args[1:], stdout, stderr)
	}
	version = fullVersion(version)
	cfg, err := ParseArgs(args, lookup, stdout)
	switch {
	case errors.Is(err, errHelp):
		return 0
	case errors.Is(err, errVersion):
		fmt.Fprintf(stdout, "hotkeyd %s\n", version)
		return 0
	case err != nil:
		fmt.Fprintf(stderr, "hotkeyd: %v\n", err)
		return 2
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: cfg.LogLevel}))
	redis.SetLogger(redisLogger{log})

	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	stop := func() { signal.Stop(sigs) }
	defer stop()
	// SIGHUP reloads the rules; one that comes while the daemon starts is
	// held until it serves.
	hups := make(chan os.Signal, 1)
	signal.Notify(hups, syscall.SIGHUP)
	defer signal.Stop(hups)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var got atomic.Value // the signal that ends the daemon
	go func() {
		select {
		case s := <-sigs:
			got.Store(s)
			cancel()
		case <-ctx.Done():
		}
	}()
	d, err := Start(ctx, cfg, log, version)
	if err != nil {
		fmt.Fprintf(stderr, "hotkeyd: %v\n", err)
		return 1
	}
	code := 0
serve:
	for {
		select {
		case <-hups:
			_ = d.Reload("SIGHUP") // logged and counted
		case <-ctx.Done():
			log.Info("shutting down", "signal", signalName(got.Load()))
			break serve
		case err := <-d.Failed():
			log.Error("server failed", "err", err)
			code = 1
			break serve
		}
	}
	stop() // a second signal ends the process at once
	sctx, cancel := context.WithTimeout(context.Background(), ShutdownTimeout)
	defer cancel()
	start := time.Now()
	if err := d.Shutdown(sctx); err != nil {
		log.Warn("shutdown incomplete", "err", err, "took", time.Since(start))
	} else {
		log.Info("stopped", "took", time.Since(start))
	}
	return code
}

// signalName names the signal s (an os.Signal), as kill -l does.
func signalName(s any) string {
	switch s {
	case syscall.SIGTERM:
		return "SIGTERM"
	case syscall.SIGINT:
		return "SIGINT"
	}
	return fmt.Sprint(s)
}

// fullVersion is the version set at link time, else the one the build
// info gives.
func fullVersion(v string) string {
	if v != "" {
		return v
	}
	bi, _ := debug.ReadBuildInfo()
	return buildVersion(bi)
}

// buildVersion is the module's version and the VCS revision the binary
// was built from, as bi records them: "v1.2.3", "devel+0123456789ab",
// "v1.2.3+0123456789ab-dirty"; "devel" when bi records neither.
func buildVersion(bi *debug.BuildInfo) string {
	v := "devel"
	if bi == nil {
		return v
	}
	if bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		v = bi.Main.Version
	}
	var rev string
	var dirty bool
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	// A module version from a proxy already names its commit.
	if rev == "" || strings.Contains(v, rev[:min(12, len(rev))]) {
		return v
	}
	v += "+" + rev[:min(12, len(rev))]
	if dirty {
		v += "-dirty"
	}
	return v
}

// semverRe is the version form micro accepts.
var semverRe = regexp.MustCompile(`^v?(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(-[0-9A-Za-z.-]+)?(\+[0-9A-Za-z.-]+)?$`)

func serviceVersion(v string) string {
	if semverRe.MatchString(v) {
		return strings.TrimPrefix(v, "v")
	}
	return "0.0.0-" + strings.Map(func(r rune) rune {
		if r < 128 && (r == '-' || r == '.' || 'a' <= r && r <= 'z' || 'A' <= r && r <= 'Z' || '0' <= r && r <= '9') {
			return r
		}
		return '-'
	}, v)
}

// Daemon is a running hotkeyd.
type Daemon struct {
	cfg    Config
	log    *slog.Logger
	id     string
	rules  atomic.Pointer[rules]
	readyz *hotkey.Policy

	reloadMu sync.Mutex // one reload at a time
	reloads  *reloadMetrics
	reqs     requestMetrics

	bg     sync.WaitGroup // the loops of background
	bgStop chan struct{}  // closed to stop them; nil before the first

	ln       net.Listener
	httpSrv  *http.Server
	conns    connTracker
	httpDone chan struct{} // closed when HTTP Shutdown has returned
	failed   chan error

	grpcLn      net.Listener // nil when gRPC is off
	grpcSrv     *grpc.Server
	rls         *rls
	health      *health.Server
	healthStop  chan struct{}
	healthDone  chan struct{}
	descMetrics *descMetrics

	ns      *natsserver.Server // nil when joining an existing NATS
	natsURL string
	nc      *nats.Conn
	// natsSynced says the server has confirmed the subscriptions since the
	// connection last came up (/readyz checks it).
	natsSynced atomic.Bool
	// natsLastErr is the last reconnect error logged (reconnects run
	// one at a time).
	natsLastErr string
	ncClosed    chan struct{}
	svc         micro.Service
	nats        natsRequests

	store  counter.Store
	rstore *counter.RedisStore   // the store if on Redis, else nil
	redis  redis.UniversalClient // nil for the memory store
	coord  *coordinator.NATS
	engine *hotkey.Engine
	reg    *prometheus.Registry

	shutdown sync.Once
	stopErr  error
}

// StartArgs starts a daemon in this process as the flags args say (the
// environment is not read), logging nowhere: for the tests, benchmarks and
// reports that run a daemon beside their clients. Unless args set
// --grpc-listen, gRPC listens on a free loopback port, not the default one.
func StartArgs(ctx context.Context, args ...string) (*Daemon, error) {
	args = append([]string{"--grpc-listen", "127.0.0.1:0"}, args...)
	cfg, err := ParseArgs(args, func(string) (string, bool) { return "", false }, nil)
	if err != nil {
		return nil, err
	}
	return Start(ctx, cfg, slog.New(slog.DiscardHandler), "in-process")
}

// Start starts a daemon as cfg says and returns once it serves. Errors name
// the flag to change.
func Start(ctx context.Context, cfg Config, log *slog.Logger, version string) (_ *Daemon, err error) {
	d := &Daemon{cfg: cfg, log: log, failed: make(chan error, 1), ncClosed: make(chan struct{}), httpDone: make(chan struct{})}
	defer func() {
		if err != nil {
			d.abort()
		}
	}()
	sources := sourcesPrint(cfg) // before reading: a change after it is seen
	r, err := loadRules(cfg)
	if err != nil {
		return nil, err
	}
	d.rules.Store(r)
	secret, err := readSecret(cfg.NATSSecretFile, log)
	if err != nil {
		return nil, err
	}
	d.readyz = &hotkey.Policy{Name: "hotkeyd_readyz", Limit: counter.Limit{Rate: 1 << 30, Period: time.Second}}
	d.id = instanceID()

	if d.ln, err = net.Listen("tcp", cfg.Listen); err != nil {
		return nil, listenError("HTTP", cfg.Listen, "listen", err)
	}
	if err = d.startNATS(); err != nil {
		return nil, err
	}
	sctx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	if err = d.openStore(sctx); err != nil {
		return nil, err
	}

	d.reg = prometheus.NewRegistry()
	d.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	build := prometheus.NewGauge(prometheus.GaugeOpts{
		Name:        "hotkeyd_build_info",
		Help:        "Always 1; the daemon's version and instance ID as labels.",
		ConstLabels: prometheus.Labels{"version": version, "instance_id": d.id},
	})
	build.Set(1)
	d.reg.MustRegister(build)
	d.reloads = newReloadMetrics(d.reg)
	d.reqs = newRequestMetrics(d.reg)
	// The series of each API from the start, at 0 (gRPC's once it serves).
	d.reqs.api(apiHTTP)
	d.nats.seconds = d.reqs.api(apiNATS)

	// Hot keys are counter names, policy|key: room for the longest.
	maxName := max(maxPolicyName, envoyconf.MaxPolicyName) + 1 + hotkey.DefaultMaxKeyLen
	if d.coord, err = coordinator.NewNATS(coordinator.Config{Conn: d.nc, ID: d.id, Logger: log, Secret: secret, MaxKeyLen: maxName}); err != nil {
		return nil, fmt.Errorf("coordinator: %w", err)
	}
	probe := cfg.BreakerProbe
	d.engine, err = hotkey.New(d.store,
		hotkey.WithCoordinator(d.coord),
		hotkey.WithMetrics(d.reg),
		hotkey.WithLogger(log),
		hotkey.WithDetector(detector.Config{Threshold: cfg.HotThreshold, Floor: cfg.HotFloor, CoolDown: cfg.CoolDown}),
		hotkey.WithBreaker(hotkey.DefaultBreakerFailures, probe, max(hotkey.DefaultBreakerMaxProbe, probe)),
		hotkey.WithLocalKeys(cfg.MaxKeys),
	)
	if err != nil {
		return nil, err
	}

	d.nats.slots = make(chan struct{}, max(1, cfg.NATSConcurrency))
	d.svc, err = micro.AddService(d.nc, micro.Config{
		Name:        ServiceName,
		Version:     serviceVersion(version),
		Description: "hotkey rate-limit decisions: request on " + natsSubject + " with {\"policy\":\"default\",\"key\":\"user_123\",\"cost\":1}",
		Metadata:    map[string]string{"instance": d.id},
	})
	if err != nil {
		return nil, fmt.Errorf("NATS micro service: %w", err)
	}
	if err = d.svc.AddEndpoint("allow", micro.HandlerFunc(d.handleNATS), micro.WithEndpointSubject(natsSubject)); err != nil {
		return nil, fmt.Errorf("NATS micro endpoint %s: %w", natsSubject, err)
	}
	if d.nc.IsConnected() {
		if err = d.nc.FlushTimeout(startTimeout); err != nil {
			return nil, fmt.Errorf("NATS: flush: %w", err)
		}
		d.natsSynced.Store(true)
	}

	d.httpSrv = &http.Server{
		Handler:           d.routes(),
		ConnState:         d.conns.track,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelDebug),
	}
	go func() {
		if err := d.httpSrv.Serve(d.ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			select {
			case d.failed <- err:
			default:
			}
		}
	}()
	if cfg.GRPCListen != "" {
		d.descMetrics = newDescMetrics(d.reg)
		if err = d.startGRPC(); err != nil {
			return nil, err
		}
	}
	store := "memory"
	switch {
	case cfg.Redis != "":
		store = "redis " + redact.URL(cfg.Redis)
	case len(cfg.RedisCluster) > 0:
		store = "redis cluster " + strings.Join(cfg.RedisCluster, ",")
	}
	nats := redact.URLs(strings.Split(d.natsURL, ","))
	if d.ns != nil {
		nats = "embedded " + d.natsURL
		if cfg.NATSClusterListen != "" {
			nats += fmt.Sprintf(" cluster %s on %s routes %s", cfg.NATSClusterName, d.ns.Server().ClusterAddr(), strings.Join(cfg.NATSRoutes, ","))
		}
	}
	grpcAddr, domains := "off", "none"
	if d.grpcLn != nil {
		grpcAddr = d.GRPCAddr()
	}
	if r.envoy != nil {
		domains = strings.Join(r.envoy.Domains(), ",")
	}
	if cfg.ReloadInterval > 0 && (cfg.Policies != "" || cfg.EnvoyConfig != "") {
		d.background(func(stop <-chan struct{}) { d.watch(cfg.ReloadInterval, sources, stop) })
	}
	log.Info("serving", "http", d.Addr(), "grpc", grpcAddr, "nats", nats, "store", store, "instance", d.id,
		"policies", strings.Join(r.policies.Names(), ","), "envoy_domains", domains, "version", version)
	if d.grpcLn != nil && r.envoy == nil {
		log.Info("the gRPC rate-limit service has no rules: every descriptor is answered OK until " + flagName("envoy-config") + " gives some")
	}
	return d, nil
}

// Addr returns the HTTP listen address.
func (d *Daemon) Addr() string { return d.ln.Addr().String() }

// NATSURL returns the URL the daemon connects to NATS with (the embedded
// server's, unless --nats).
func (d *Daemon) NATSURL() string { return d.natsURL }

// ID returns the instance ID (the origin of its leases in /v1/hotkeys).
func (d *Daemon) ID() string { return d.id }

// Failed reports an HTTP server that stopped on its own.
func (d *Daemon) Failed() <-chan error { return d.failed }

func instanceID() string {
	host, _ := os.Hostname()
	if len(host) > 40 {
		host = host[:40]
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	if host == "" {
		host = "hotkeyd"
	}
	return host + "-" + hex.EncodeToString(b[:])
}

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

// listenError explains a failed listen, naming the flag to change.
func listenError(what, addr, flag string, err error) error {
	if errors.Is(err, syscall.EADDRINUSE) {
		return fmt.Errorf("%s address %s is already in use: change it with %s", what, addr, flagName(flag))
	}
	return fmt.Errorf("cannot listen on %s for %s: %v; change it with %s", addr, what, err, flagName(flag))
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
	auth, err := coordinator.Config{
		User: cfg.NATSUser, Password: cfg.NATSPassword, Token: cfg.NATSToken,
		NkeySeedFile: cfg.NATSNkeySeed, CredsFile: cfg.NATSCreds,
		CAFile: cfg.NATSCA, CertFile: cfg.NATSCert, KeyFile: cfg.NATSKey,
	}.AuthOptions()
	if err != nil { // the nkey seed file: name the flag rather than the field
		return fmt.Errorf("%s %s: %w", flagName("nats-nkey-seed"), cfg.NATSNkeySeed, errors.Unwrap(err))
	}
	opts = append(opts, auth...)
	if cfg.NATSClientUser != "" {
		// API clients may subscribe to _INBOX.>: the daemons' own inboxes
		// (the coordinator's sync replies) are elsewhere.
		opts = append(opts, nats.CustomInboxPrefix(daemonInboxPrefix))
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
		d.log.Warn("cannot reach NATS yet: deciding alone (hot keys are not agreed with other daemons, /readyz answers 503) until it answers", "url", redact.URLs(strings.Split(d.natsURL, ",")))
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

// startEmbedded starts the embedded NATS server on --nats-listen.
func (d *Daemon) startEmbedded() error {
	addr := d.cfg.NATSListen
	host, portStr, _ := net.SplitHostPort(addr)
	port, _ := strconv.Atoi(portStr)
	// nats-server reports a port in use only as a readiness timeout: try
	// the address first, for a clear message.
	for _, a := range []struct{ addr, flag string }{{addr, "nats-listen"}, {d.cfg.NATSClusterListen, "nats-cluster-listen"}} {
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
					{Username: d.cfg.NATSClientUser, Password: d.cfg.NATSClientPassword, Permissions: clientPermissions()},
				}
			case d.cfg.NATSUser != "":
				o.Username, o.Password = d.cfg.NATSUser, d.cfg.NATSPassword
			case d.cfg.NATSToken != "":
				o.Authorization = d.cfg.NATSToken
			}
			d.configureCluster(o)
		},
	})
	if err != nil {
		return fmt.Errorf("embedded NATS server on %s: %w; change the address with %s, or join another NATS with %s", addr, err, flagName("nats-listen"), flagName("nats"))
	}
	d.ns = ns
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
// server: ask for decisions on hotkey.allow, and hear the answers.
func clientPermissions() *server.Permissions {
	return &server.Permissions{
		Publish:   &server.SubjectPermission{Allow: []string{natsSubject}},
		Subscribe: &server.SubjectPermission{Allow: []string{"_INBOX.>"}},
	}
}

// daemonInboxPrefix is the daemons' inbox prefix with --nats-client-user,
// out of the clients' _INBOX.>.
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

// openStore opens the counter store: memory, or Redis.
func (d *Daemon) openStore(ctx context.Context) error {
	cfg := d.cfg
	var what string
	switch {
	case cfg.Redis != "":
		opt, err := redisOptions(cfg)
		if err != nil {
			return err
		}
		d.redis = redis.NewClient(opt)
		what = fmt.Sprintf("Redis at %s, set by %s", redact.URL(cfg.Redis), flagName("redis"))
	case len(cfg.RedisCluster) > 0:
		opt, err := redisClusterOptions(cfg)
		if err != nil {
			return err
		}
		d.redis = redis.NewClusterClient(opt)
		what = fmt.Sprintf("Redis Cluster at %s, set by %s", strings.Join(cfg.RedisCluster, ","), flagName("redis-cluster"))
	default:
		d.store = counter.NewMemoryStore(counter.MemoryConfig{MaxKeys: cfg.MaxKeys})
		if cfg.NATS != "" || cfg.NATSClusterListen != "" || !loopback(cfg.NATSListen) {
			d.log.Warn("counters are in memory, yet other daemons may share this NATS: each keeps its own counters, and requests spread over them (hotkey.allow's queue group, a load balancer) are counted apart, so a key may be admitted once per daemon; give them one store with " +
				flagName("redis") + " or " + flagName("redis-cluster") + " (/readyz warns while peers are seen)")
		}
		return nil
	}
	if cfg.RequireStore {
		if err := d.redis.Ping(ctx).Err(); err != nil {
			return fmt.Errorf("cannot reach %s: %w", what, err)
		}
		s, err := counter.NewRedisStore(ctx, d.redis, counter.RedisConfig{Prefix: cfg.RedisPrefix})
		if err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		d.store, d.rstore = s, s
		return nil
	}
	// Without --require-store the daemon starts whether or not Redis
	// answers: decisions follow each policy's fallback, and /readyz says
	// not ready, until the store is set up.
	ctx, cancel := context.WithTimeout(ctx, storeSetupTimeout)
	defer cancel()
	s, err := counter.NewRedisStore(ctx, d.redis, counter.RedisConfig{Prefix: cfg.RedisPrefix, SetupRetry: storeSetupRetry})
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	d.store, d.rstore = s, s
	if err := s.Ready(); err != nil {
		d.log.Warn("cannot reach the store: starting degraded; decisions follow each policy's on_store_failure, and /readyz answers 503, until it answers (retried every "+storeSetupRetry.String()+"); "+flagName("require-store")+" makes this stop the start instead",
			"store", what, "err", err)
		d.background(func(stop <-chan struct{}) { d.awaitStore(stop, err) })
	}
	return nil
}

// redisOptions are the client options of --redis and the flags that
// refine it.
func redisOptions(cfg Config) (*redis.Options, error) {
	opt, err := redis.ParseURL(cfg.Redis)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", flagName("redis"), redact.URL(cfg.Redis), err)
	}
	if opt.DialTimeout == 0 {
		opt.DialTimeout = redisDial
	}
	if opt.MaxRetries == 0 {
		opt.MaxRetries = 1
	}
	if opt.DialerRetries == 0 {
		opt.DialerRetries = 1 // a refused dial fails the call at once, not at its deadline
	}
	opt.ContextTimeoutEnabled = true
	opt.MaintNotificationsConfig = &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}
	if cfg.RedisUser != "" {
		opt.Username = cfg.RedisUser
	}
	if cfg.RedisPassword != "" {
		opt.Password = cfg.RedisPassword
	}
	if opt.TLSConfig, err = redisTLS(cfg, opt.TLSConfig); err != nil {
		return nil, err
	}
	return opt, nil
}

// redisClusterOptions are the client options of --redis-cluster and the
// flags that refine it.
func redisClusterOptions(cfg Config) (*redis.ClusterOptions, error) {
	tc, err := redisTLS(cfg, nil)
	if err != nil {
		return nil, err
	}
	return &redis.ClusterOptions{
		Addrs:                    cfg.RedisCluster,
		Username:                 cfg.RedisUser,
		Password:                 cfg.RedisPassword,
		TLSConfig:                tc,
		DialTimeout:              redisDial,
		MaxRetries:               1,
		DialerRetries:            1,
		ContextTimeoutEnabled:    true,
		MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
	}, nil
}

// redisTLS is the TLS configuration to Redis: tc (that of a rediss://
// URL, or nil), turned on by --redis-tls or --redis-ca, with the CA of
// --redis-ca as its roots.
func redisTLS(cfg Config, tc *tls.Config) (*tls.Config, error) {
	if tc == nil && (cfg.RedisTLS || cfg.RedisCA != "") {
		tc = &tls.Config{MinVersion: tls.VersionTLS12}
	}
	if cfg.RedisCA != "" {
		pem, err := os.ReadFile(cfg.RedisCA)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", flagName("redis-ca"), err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("%s %s: no PEM certificate in it", flagName("redis-ca"), cfg.RedisCA)
		}
		tc.RootCAs = pool
	}
	return tc, nil
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

// awaitStore logs when the store, unreachable at start, is set up, and
// each new reason it is not (a wrong password is no outage).
func (d *Daemon) awaitStore(stop <-chan struct{}, first error) {
	last := first.Error()
	every(stop, storeSetupRetry, func() bool {
		err := d.rstore.Ready()
		if err == nil {
			d.log.Info("store ready: decisions go to it")
			return false
		}
		if err.Error() != last {
			last = err.Error()
			d.log.Warn("store still not set up: decisions follow each policy's on_store_failure", "err", err)
		}
		return true
	})
}

// every calls f every interval until stop is closed or f returns false.
func every(stop <-chan struct{}, interval time.Duration, f func() bool) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		if !f() {
			return
		}
	}
}

// background runs f on its own goroutine until Shutdown (or a failed
// Start) closes its stop channel, and waits for it there.
func (d *Daemon) background(f func(stop <-chan struct{})) {
	if d.bgStop == nil {
		d.bgStop = make(chan struct{})
	}
	d.bg.Go(func() { f(d.bgStop) })
}

// stopBackground stops what background started and waits for it.
func (d *Daemon) stopBackground() {
	if d.bgStop != nil {
		close(d.bgStop)
		d.bg.Wait()
		d.bgStop = nil
	}
}

// Shutdown stops the daemon gracefully: HTTP stops accepting and finishes
// the requests in flight, the NATS micro service stops and the connection
// drains (finishing its requests in flight), then the engine (and its
// coordinator), the store and the embedded NATS server stop. It returns
// when all is stopped or ctx is done.
func (d *Daemon) Shutdown(ctx context.Context) error {
	d.shutdown.Do(func() { d.stopErr = d.stop(ctx) })
	return d.stopErr
}

func (d *Daemon) stop(ctx context.Context) error {
	d.stopBackground()
	var errs []error
	var wg sync.WaitGroup
	var grpcErr error
	wg.Go(func() { grpcErr = d.stopGRPC(ctx) })
	wg.Add(1)
	go func() { // HTTP, gRPC and NATS drain in parallel
		defer wg.Done()
		done := make(chan struct{})
		go func() {
			defer close(done)
			// Connections that never sent a request (HTTP clients dial
			// ahead) would hold Shutdown for 5 s: close them once a
			// request sent on a new connection would have been read.
			t := time.NewTicker(newConnGrace)
			defer t.Stop()
			for {
				select {
				case <-t.C:
					d.conns.closeNew()
				case <-ctx.Done():
					return
				case <-d.httpDone:
					return
				}
			}
		}()
		err := d.httpSrv.Shutdown(ctx)
		close(d.httpDone)
		<-done
		if err != nil {
			errs = append(errs, fmt.Errorf("HTTP: %w", err))
			d.httpSrv.Close()
		}
	}()
	var natsErr error
	if err := d.svc.Stop(); err != nil {
		natsErr = fmt.Errorf("NATS micro service: %w", err)
	}
	// Replies in flight go out before the connection drains, as long as
	// ctx allows; past it, the connection is closed below.
	if !d.nats.stop(ctx) {
		natsErr = errors.Join(natsErr, errors.New("NATS: decisions in flight not done within the shutdown timeout"))
	}
	if !d.nc.IsConnected() {
		d.nc.Close() // nothing to drain to a server it never reached, or lost
	} else if err := d.nc.Drain(); err != nil && !errors.Is(err, nats.ErrConnectionClosed) {
		natsErr = errors.Join(natsErr, fmt.Errorf("NATS drain: %w", err))
	}
	select {
	case <-d.ncClosed:
	case <-ctx.Done():
		d.nc.Close()
		natsErr = errors.Join(natsErr, errors.New("NATS drain: timed out"))
	}
	wg.Wait()
	if grpcErr != nil {
		errs = append(errs, grpcErr)
	}
	if natsErr != nil {
		errs = append(errs, natsErr)
	}
	d.closeRest()
	return errors.Join(errs...)
}

// closeRest stops what runs behind the APIs: the engine and its
// coordinator, the store, the embedded NATS server.
func (d *Daemon) closeRest() {
	if d.engine != nil {
		d.engine.Close()
	} else if d.coord != nil {
		d.coord.Close()
	}
	if d.store != nil {
		d.store.Close()
	}
	if d.redis != nil {
		d.redis.Close()
	}
	if d.ns != nil {
		d.ns.Shutdown()
	}
}

// abort undoes a Start that failed part way.
func (d *Daemon) abort() {
	d.stopBackground()
	if d.svc != nil {
		d.svc.Stop()
	}
	if d.ln != nil {
		d.ln.Close()
	}
	if d.grpcSrv != nil {
		close(d.healthStop)
		<-d.healthDone
		d.grpcSrv.Stop()
	} else if d.grpcLn != nil {
		d.grpcLn.Close()
	}
	if d.nc != nil {
		d.nc.Close()
	}
	d.closeRest()
}

// redisLogger sends go-redis's own log lines to slog.
type redisLogger struct{ log *slog.Logger }

func (l redisLogger) Printf(ctx context.Context, format string, v ...any) {
	l.log.Debug("redis: " + fmt.Sprintf(format, v...))
}

// connTracker follows the HTTP connections' states, so that a shutdown can
// close those that never sent a request.
type connTracker struct {
	mu    sync.Mutex
	conns map[net.Conn]http.ConnState
}

func (t *connTracker) track(c net.Conn, s http.ConnState) {
	t.mu.Lock()
	defer t.mu.Unlock()
	switch s {
	case http.StateClosed, http.StateHijacked:
		delete(t.conns, c)
	default:
		if t.conns == nil {
			t.conns = make(map[net.Conn]http.ConnState)
		}
		t.conns[c] = s
	}
}

// closeNew closes the connections still waiting for their first request.
func (t *connTracker) closeNew() {
	t.mu.Lock()
	defer t.mu.Unlock()
	for c, s := range t.conns {
		if s == http.StateNew {
			c.Close()
		}
	}
}
