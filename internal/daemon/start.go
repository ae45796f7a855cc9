// Start: the wiring of a daemon, from its Config to serving.

package daemon

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/hotkeyd/hotkey"
	"github.com/hotkeyd/hotkey/coordinator"
	"github.com/hotkeyd/hotkey/counter"
	"github.com/hotkeyd/hotkey/detector"
	"github.com/hotkeyd/hotkey/internal/envoyconf"
	"github.com/hotkeyd/hotkey/internal/redact"
)

// StartArgs starts a daemon in this process as the flags args say (the
// environment is not read), logging nowhere: for the tests, benchmarks and
// reports that run a daemon beside their clients. Unless args set
// --grpc-listen or --admin-listen, they listen on free loopback ports, not
// the default ones.
func StartArgs(ctx context.Context, args ...string) (*Daemon, error) {
	args = append([]string{"--grpc-listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"}, args...)
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
	r.generation = 1
	d.rules.Store(r)
	secret, err := readSecret(cfg.NATSSecretFile, log)
	if err != nil {
		return nil, err
	}
	if d.tls, err = newTLSFiles(cfg, log); err != nil {
		return nil, err
	}
	d.readyz = &hotkey.Policy{Name: "hotkeyd_readyz", Limit: counter.Limit{Rate: 1 << 30, Period: time.Second}}
	d.id = instanceID()

	if d.ln, err = net.Listen("tcp", cfg.Listen); err != nil {
		return nil, listenError("HTTP", cfg.Listen, "listen", err)
	}
	if err = d.listenAdmin(); err != nil {
		return nil, err
	}
	if cfg.NATS != NATSNone {
		if err = d.startNATS(); err != nil {
			return nil, err
		}
	}
	sctx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	if err = d.openStore(sctx); err != nil {
		return nil, err
	}
	if d.tracer, err = newTracer(sctx, cfg.Tracing, version, d.id); err != nil {
		return nil, err
	}
	d.store = d.tracer.store(d.store)

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
	if d.tls != nil {
		d.reg.MustRegister(d.tls.metrics()...)
	}
	d.reqs = newRequestMetrics(d.reg)
	// The series of each API from the start, at 0 (gRPC's once it serves).
	d.reqs.api(apiHTTP)
	probe := cfg.BreakerProbe
	opts := []hotkey.Option{
		hotkey.WithMetrics(d.reg),
		hotkey.WithLogger(log),
		hotkey.WithDetector(detector.Config{Threshold: cfg.HotThreshold, Floor: cfg.HotFloor, CoolDown: cfg.CoolDown}),
		hotkey.WithBreaker(hotkey.DefaultBreakerFailures, probe, max(hotkey.DefaultBreakerMaxProbe, probe)),
		hotkey.WithLocalKeys(cfg.MaxKeys),
		hotkey.WithReserveLease(cfg.ReserveLease),
		hotkey.WithGossipInterval(cfg.GossipInterval),
		hotkey.WithRegionInterval(cfg.RegionInterval),
	}
	if cfg.Region != "" {
		opts = append(opts, hotkey.WithRegion(cfg.Region))
	}
	// Without NATS the engine's own coordinator.Local agrees hot keys with
	// this daemon alone.
	if d.nc != nil {
		d.nats.seconds = newObservers(d.reqs.api(apiNATS), natsCodes)
		// The coordinator and the NATS API share the daemon's connection
		// (startNATS), which shutdown drains and closes.
		// Hot keys are counter names, policy|key: room for the longest.
		maxName := max(maxPolicyName, envoyconf.MaxPolicyName) + 1 + hotkey.DefaultMaxKeyLen
		if d.coord, err = coordinator.NewNATS(d.nc, coordinator.Config{ID: d.id, Namespace: cfg.Namespace, Region: cfg.Region, Regions: cfg.Regions, Logger: log, Secret: secret, MaxKeyLen: maxName}); err != nil {
			return nil, fmt.Errorf("coordinator: %w", err)
		}
		opts = append(opts, hotkey.WithCoordinator(d.coord))
	}
	if d.engine, err = hotkey.New(d.store, opts...); err != nil {
		return nil, err
	}
	d.engine.KnowPolicies(r.policyList()...)

	if d.nc != nil {
		if err = d.addService(version); err != nil {
			return nil, err
		}
	}
	d.serveHTTP()
	d.serveAdmin()
	if cfg.GRPCListen != "" {
		d.descMetrics = newDescMetrics(d.reg)
		if err = d.startGRPC(); err != nil {
			return nil, err
		}
	}
	if cfg.ReloadInterval > 0 && (cfg.Policies != "" || cfg.EnvoyConfig != "") {
		d.background(func(stop <-chan struct{}) { d.watch(cfg.ReloadInterval, sources, stop) })
	}
	d.logServing(r, version)
	return d, nil
}

// logServing says what the daemon serves, where, and with which rules.
func (d *Daemon) logServing(r *rules, version string) {
	cfg, log := d.cfg, d.log
	store := "memory"
	switch {
	case cfg.Redis != "":
		store = "redis " + redact.URL(cfg.Redis)
	case len(cfg.RedisCluster) > 0:
		store = "redis cluster " + strings.Join(cfg.RedisCluster, ",")
	case len(cfg.RedisSentinel) > 0:
		store = "redis master " + cfg.RedisMaster + " of sentinels " + strings.Join(cfg.RedisSentinel, ",")
	}
	nats := redact.URLs(strings.Split(d.natsURL, ","))
	switch {
	case d.nc == nil:
		nats = "off"
	case d.ns != nil:
		nats = "embedded " + d.natsURL
		if cfg.NATSClusterListen != "" {
			nats += fmt.Sprintf(" cluster %s on %s routes %s", cfg.NATSClusterName, d.ns.Server().ClusterAddr(), strings.Join(cfg.NATSRoutes, ","))
		}
		if cfg.NATSGatewayListen != "" {
			gws := make([]string, len(cfg.NATSGateways))
			for i, g := range cfg.NATSGateways {
				gws[i] = g.Region + "=" + strings.Join(g.URLs, ",")
			}
			nats += fmt.Sprintf(" gateway %s on %s gateways %s", cfg.Region, d.ns.Server().GatewayAddr(), strings.Join(gws, ";"))
		}
	}
	grpcAddr, domains := "off", "none"
	if d.grpcLn != nil {
		grpcAddr = d.GRPCAddr()
	}
	if r.envoy != nil {
		domains = strings.Join(r.envoy.Domains(), ",")
	}
	tlsMode := "off"
	switch {
	case cfg.TLSClientCA != "":
		tlsMode = "mtls"
	case cfg.TLSCert != "":
		tlsMode = "on"
	}
	adminAddr := "off"
	if d.adminLn != nil {
		adminAddr = d.AdminAddr()
	}
	log.Info("serving", "http", d.Addr(), "admin", adminAddr, "grpc", grpcAddr, "tls", tlsMode, "nats", nats, "namespace", cfg.Namespace, "region", cfg.Region, "store", store, "instance", d.id,
		"policies", strings.Join(r.policies.Names(), ","), "envoy_domains", domains, "version", version)
	if d.grpcLn != nil && r.envoy == nil {
		log.Info("the gRPC rate-limit service has no rules: every descriptor is answered OK until " + flagName("envoy-config") + " gives some")
	}
	d.warnUnsignedGossip(nil, r)
}

// warnUnsignedGossip warns when r's sync: gossip policies (or rules) go
// over NATS unsigned and old's did not: a peer's round is charged as it
// says, so whoever can publish on the namespace's gossip subject can deny
// any key of theirs.
func (d *Daemon) warnUnsignedGossip(old, r *rules) {
	if d.nc == nil || d.cfg.NATSSecretFile != "" || len(r.gossip) == 0 || old != nil && len(old.gossip) > 0 {
		return
	}
	d.log.Warn("sync: gossip over NATS without "+flagName("nats-secret-file")+": anyone who can publish on NATS in this namespace can send gossip rounds that charge units to any key of these policies, denying it; give every daemon the same secret",
		"policies", strings.Join(r.gossip, ","), "namespace", d.cfg.Namespace)
}
