package daemon

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/hotkeyd/hotkey"
	"github.com/hotkeyd/hotkey/coordinator"
	"github.com/hotkeyd/hotkey/counter"
	"github.com/hotkeyd/hotkey/detector"
	"github.com/hotkeyd/hotkey/internal/namespace"
	"github.com/hotkeyd/hotkey/internal/redact"
)

// Defaults of the flags.
const (
	DefaultListen     = "127.0.0.1:8080"
	DefaultGRPCListen = "127.0.0.1:8081"
	// DefaultAdminListen is the admin listener's: loopback, since it
	// serves raw keys (/v1/hotkeys, /metrics) and profiles.
	DefaultAdminListen = "127.0.0.1:8082"
	DefaultNATSListen  = "127.0.0.1:4222"
	// GRPCServerLean and GRPCServerGRPCGo are the values of
	// --grpc-server: internal/grpcserve's server (the default), or
	// grpc-go's.
	GRPCServerLean   = "lean"
	GRPCServerGRPCGo = "grpc-go"
	// NATSNone, as --nats, runs the daemon without NATS: no embedded
	// server, no hotkey.allow, hot keys split by this daemon alone.
	NATSNone = "none"
	// DefaultHotFloor is the least rate, per daemon, that splits a key:
	// 10 requests in a 100 ms sub-window, a count whose noise no longer
	// decides.
	DefaultHotFloor = 100
	// DefaultNATSClusterName names the embedded servers' cluster.
	DefaultNATSClusterName = "hotkey"
	DefaultBreakerProbe    = hotkey.DefaultBreakerProbe
	// DefaultReserveLease is how long a sync: reserve policy's block is
	// admitted from.
	DefaultReserveLease = counter.DefaultLease
	// maxReserveLease bounds --reserve-lease (hotkey.WithReserveLease).
	maxReserveLease = time.Minute
	// DefaultGossipInterval is how often a sync: gossip policy's units go
	// to the other daemons.
	DefaultGossipInterval = hotkey.DefaultGossipInterval
	// minGossipInterval and maxGossipInterval bound --gossip-interval
	// (hotkey.WithGossipInterval).
	minGossipInterval, maxGossipInterval = time.Millisecond, time.Minute
	// minRegionInterval and maxRegionInterval bound --region-interval
	// (hotkey.WithRegionInterval).
	minRegionInterval, maxRegionInterval = 10 * time.Millisecond, time.Minute
	// DefaultGRPCIdleTimeout is --grpc-idle-timeout's default: longer
	// than any pause of a client that sends requests at all, short
	// enough that connections left open cost nothing for long.
	DefaultGRPCIdleTimeout = 5 * time.Minute
	// DefaultReloadInterval is how often the rules' files are checked for
	// changes.
	DefaultReloadInterval = 2 * time.Second
	// DefaultNATSConcurrency is as many decisions in flight as the Redis
	// store batches well: a daemon over NATS forms batches as one over
	// HTTP does, where each connection has its own goroutine.
	DefaultNATSConcurrency = 1024
	envPrefix              = "HOTKEYD_"
	// LogText and LogJSON are the values of --log-format: slog's text and
	// JSON handlers.
	LogText, LogJSON = "text", "json"
	// maxMaxKeys caps --max-keys: about 90 GiB of counters when full.
	maxMaxKeys = 1 << 30
)

// Config is what the flags (or their environment variables) say.
type Config struct {
	Listen     string
	GRPCListen string // Envoy's rate-limit service; empty: off
	// AdminListen serves /metrics, /v1/hotkeys, /v1/config, the health
	// checks and /debug/pprof/, apart from the API; empty: off.
	AdminListen string
	Policies    string // a file or a directory
	EnvoyConfig string // envoyproxy/ratelimit's YAML: a file or a directory

	// TLSCert and TLSKey are the PEM key pair the HTTP and gRPC listeners
	// serve TLS with, only; empty: plaintext. TLSClientCA is a PEM bundle
	// that client certificates must chain to (mTLS); empty: none asked.
	// The files are read again when they change.
	TLSCert, TLSKey, TLSClientCA string

	// GRPCMaxConnectionAge is how long a gRPC connection may live before
	// the server asks its client, with a GOAWAY, to open a new one (gRPC
	// adds a jitter of ±10%); 0: for ever. Clients that reconnect resolve
	// the daemons' addresses again, so that new daemons get connections.
	GRPCMaxConnectionAge time.Duration
	// GRPCMaxConnectionAgeGrace is how long the requests in flight on a
	// connection past its age may take before it is closed; 0: for ever.
	GRPCMaxConnectionAgeGrace time.Duration
	// GRPCIdleTimeout is how long a gRPC connection may have no request
	// in flight before the server sends it a GOAWAY and closes it; 0:
	// for ever.
	GRPCIdleTimeout time.Duration
	// GRPCServer is the gRPC server: GRPCServerLean (internal/grpcserve),
	// or GRPCServerGRPCGo. With tracing on, GRPCServerLean falls back to
	// grpc-go, whose stats handler carries the spans.
	GRPCServer string

	// DrainDelay is how long, after SIGTERM or SIGINT, the daemon answers
	// not ready (/readyz 503, gRPC health NOT_SERVING) while it still
	// decides on every listener, before Shutdown: time for load balancers
	// to stop routing to it. 0: Shutdown at once.
	DrainDelay time.Duration

	// ReloadInterval is how often the files of Policies and EnvoyConfig
	// are checked for changes, which reload them; 0: only SIGHUP does.
	ReloadInterval time.Duration
	Redis          string
	RedisCluster   []string
	// RedisSentinel are the addresses of Redis Sentinels, which name the
	// master RedisMaster that holds the counters and follow its failovers.
	RedisSentinel []string
	RedisMaster   string
	// RedisSentinelPassword logs in to the Sentinels (their requirepass);
	// the data nodes take RedisUser and RedisPassword.
	RedisSentinelPassword string
	// RequireStore stops the start when Redis cannot be reached, instead
	// of starting degraded.
	RequireStore bool
	// RedisUser and RedisPassword log in to Redis (ACL user, or the
	// password alone for requirepass); they win over those of the URL.
	RedisUser, RedisPassword string
	RedisTLS                 bool   // TLS to Redis (rediss:// turns it on too)
	RedisCA                  string // PEM CA that signs Redis's certificates; turns TLS on
	// RedisCert and RedisKey are a PEM client certificate and its key,
	// presented to Redis (tls-auth-clients); they turn TLS on.
	RedisCert, RedisKey string
	RedisPrefix         string // prepended to every counter name

	// NATS is the URL(s) of an existing NATS to join; empty: embed a
	// server; NATSNone: no NATS at all (one daemon alone, no hotkey.allow).
	NATS       string
	NATSListen string // the embedded server's address
	// NATSClusterListen is where the embedded server accepts routes from
	// the other daemons' embedded servers; empty: no cluster.
	NATSClusterListen string
	NATSRoutes        []string // the other daemons' route URLs
	// NATSClusterName names the embedded servers' cluster; Region by
	// default when it is set, else DefaultNATSClusterName.
	NATSClusterName string
	// NATSGatewayListen is where the embedded server accepts gateways from
	// the other regions' clusters (a NATS supercluster); empty: no gateway.
	// The gateway's name is the cluster's, which is then Region.
	NATSGatewayListen string
	// NATSGateways are the other regions' gateways to connect to.
	NATSGateways []NATSGateway
	// NATSClientUser and NATSClientPassword are a second user of the
	// embedded server, for API clients: it may only ask for decisions.
	NATSClientUser, NATSClientPassword string
	NATSUser                           string
	NATSPassword                       string
	NATSToken                          string
	NATSNkeySeed                       string
	NATSCreds                          string
	NATSCA                             string
	NATSCert                           string
	NATSKey                            string
	// NATSSecretFile names a file holding the coordinator's shared secret
	// (coordinator.Config.Secret): read at start, never passed in argv.
	NATSSecretFile string

	// Region names this daemon's region (hotkey.WithRegion): its
	// coordinator's subjects are the region's, so that daemons of other
	// regions on one NATS supercluster are not counted or heard; empty:
	// none.
	Region string
	// Regions are the fleet's regions (--regions), this one among them:
	// a policy with regions: exchange sends the units this daemon admits
	// to the others and charges theirs (hotkey.RegionsExchange). By
	// default, with --nats-gateways, this region and the gateways'.
	Regions []string
	// RegionInterval is how often those units go to the other regions.
	RegionInterval time.Duration

	// Namespace names the NATS subjects of this fleet (namespace.AllowSubject, the
	// coordinator's Namespace, the micro service's name, the inboxes):
	// fleets that share a NATS with namespaces of their own stay apart.
	Namespace string

	// NATSConcurrency bounds the hotkey.allow requests decided at once.
	NATSConcurrency int

	// MaxKeys bounds the counters kept in memory: the store's without
	// Redis, and the local fallback's (hotkey.WithLocalKeys), each.
	MaxKeys int

	HotThreshold float64
	HotFloor     float64 // the least local threshold, requests per second
	CoolDown     time.Duration
	BreakerProbe time.Duration
	// ReserveLease is how long a block leased for a sync: reserve policy
	// is admitted from before its unused units go back to the store.
	ReserveLease time.Duration
	// GossipInterval is how often the units sync: gossip policies admitted
	// go to the other daemons over NATS.
	GossipInterval time.Duration
	LogLevel       slog.Level

	// Shadow puts every policy and Envoy rule in shadow mode
	// (hotkey.Policy.Shadow): decisions are made and counted, but every
	// request is admitted.
	Shadow bool
	// LogFormat is the logs' format: LogText (the default) or LogJSON.
	LogFormat string
	// Forward auth (/v1/auth/{policy}). AuthKeyHeaders name the headers
	// that carry a request's key, canonical, the first present winning;
	// none: every request is keyed by its client address. AuthMissingKey
	// says what a request carrying none of them gets: MissingKeyReject
	// (the default, 400) or MissingKeyClientAddress. AuthTrustedProxies
	// are the peers whose X-Forwarded-For, X-Real-IP and Forwarded are
	// believed (loopback by default; nil: none).
	AuthKeyHeaders     []string
	AuthMissingKey     string
	AuthTrustedProxies []netip.Prefix

	// Tracing is what the OTEL_* variables say (tracingFromEnv); zero: off.
	Tracing Tracing

	// set records which flags were given, on the command line or in the
	// environment.
	set map[string]bool
}

// NATSGateway is another region's gateway, of --nats-gateways: the region,
// which names its cluster, and its servers' gateway URLs.
type NATSGateway struct {
	Region string
	URLs   []string
}

// errHelp is returned by ParseArgs for --help: usage was printed.
var errHelp = errors.New("help requested")

// errVersion is returned by ParseArgs for the version command.
var errVersion = errors.New("version requested")

// ParseArgs parses the command line, then fills each flag not given on it
// from its environment variable (lookup is os.LookupEnv in the daemon).
// Usage goes to out for --help.
func ParseArgs(args []string, lookup func(string) (string, bool), out io.Writer) (Config, error) {
	cfg := Config{set: make(map[string]bool)}
	fs := flag.NewFlagSet("hotkeyd", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	var cluster, sentinels, routes, level string
	var gateways stringsFlag
	var showVersion bool
	fs.StringVar(&cfg.Listen, "listen", DefaultListen, "")
	fs.StringVar(&cfg.GRPCListen, "grpc-listen", DefaultGRPCListen, "")
	fs.StringVar(&cfg.AdminListen, "admin-listen", DefaultAdminListen, "")
	fs.Var((*durationFlag)(&cfg.GRPCMaxConnectionAge), "grpc-max-connection-age", "")
	fs.Var((*durationFlag)(&cfg.GRPCMaxConnectionAgeGrace), "grpc-max-connection-age-grace", "")
	cfg.GRPCIdleTimeout = DefaultGRPCIdleTimeout
	fs.Var((*durationFlag)(&cfg.GRPCIdleTimeout), "grpc-idle-timeout", "")
	fs.StringVar(&cfg.GRPCServer, "grpc-server", GRPCServerLean, "")
	fs.Var((*durationFlag)(&cfg.DrainDelay), "drain-delay", "")
	fs.StringVar(&cfg.TLSCert, "tls-cert", "", "")
	fs.StringVar(&cfg.TLSKey, "tls-key", "", "")
	fs.StringVar(&cfg.TLSClientCA, "tls-client-ca", "", "")
	fs.StringVar(&cfg.EnvoyConfig, "envoy-config", "", "")
	fs.StringVar(&cfg.Policies, "policies", "", "")
	fs.StringVar(&cfg.Redis, "redis", "", "")
	fs.StringVar(&cluster, "redis-cluster", "", "")
	fs.StringVar(&sentinels, "redis-sentinel", "", "")
	fs.StringVar(&cfg.RedisMaster, "redis-master", "", "")
	fs.StringVar(&cfg.RedisSentinelPassword, "redis-sentinel-password", "", "")
	fs.BoolVar(&cfg.RequireStore, "require-store", false, "")
	fs.StringVar(&cfg.RedisUser, "redis-user", "", "")
	fs.StringVar(&cfg.RedisPassword, "redis-password", "", "")
	fs.BoolVar(&cfg.RedisTLS, "redis-tls", false, "")
	fs.StringVar(&cfg.RedisCA, "redis-ca", "", "")
	fs.StringVar(&cfg.RedisCert, "redis-cert", "", "")
	fs.StringVar(&cfg.RedisKey, "redis-key", "", "")
	fs.StringVar(&cfg.RedisPrefix, "redis-prefix", counter.DefaultRedisConfig().Prefix, "")
	fs.StringVar(&cfg.NATS, "nats", "", "")
	fs.StringVar(&cfg.NATSListen, "nats-listen", DefaultNATSListen, "")
	fs.StringVar(&cfg.NATSClusterListen, "nats-cluster-listen", "", "")
	fs.StringVar(&routes, "nats-routes", "", "")
	fs.StringVar(&cfg.NATSClusterName, "nats-cluster-name", DefaultNATSClusterName, "")
	fs.StringVar(&cfg.NATSGatewayListen, "nats-gateway-listen", "", "")
	fs.Var(&gateways, "nats-gateways", "")
	fs.StringVar(&cfg.Region, "region", "", "")
	var regions string
	fs.StringVar(&regions, "regions", "", "")
	cfg.RegionInterval = hotkey.DefaultRegionInterval
	fs.Var((*durationFlag)(&cfg.RegionInterval), "region-interval", "")
	fs.StringVar(&cfg.NATSUser, "nats-user", "", "")
	fs.StringVar(&cfg.NATSClientUser, "nats-client-user", "", "")
	fs.StringVar(&cfg.NATSClientPassword, "nats-client-password", "", "")
	fs.StringVar(&cfg.NATSPassword, "nats-password", "", "")
	fs.StringVar(&cfg.NATSToken, "nats-token", "", "")
	fs.StringVar(&cfg.NATSNkeySeed, "nats-nkey-seed", "", "")
	fs.StringVar(&cfg.NATSCreds, "nats-creds", "", "")
	fs.StringVar(&cfg.NATSCA, "nats-ca", "", "")
	fs.StringVar(&cfg.NATSCert, "nats-cert", "", "")
	fs.StringVar(&cfg.NATSKey, "nats-key", "", "")
	fs.StringVar(&cfg.NATSSecretFile, "nats-secret-file", "", "")
	fs.StringVar(&cfg.Namespace, "namespace", coordinator.DefaultNamespace, "")
	fs.IntVar(&cfg.NATSConcurrency, "nats-concurrency", DefaultNATSConcurrency, "")
	fs.IntVar(&cfg.MaxKeys, "max-keys", counter.DefaultMemoryConfig().MaxKeys, "")
	fs.Float64Var(&cfg.HotThreshold, "hot-threshold", detector.DefaultConfig().Threshold, "")
	fs.Float64Var(&cfg.HotFloor, "hot-floor", DefaultHotFloor, "")
	cfg.CoolDown, cfg.BreakerProbe = detector.DefaultConfig().CoolDown, DefaultBreakerProbe
	fs.Var((*durationFlag)(&cfg.CoolDown), "cool-down", "")
	fs.Var((*durationFlag)(&cfg.BreakerProbe), "breaker-probe", "")
	cfg.ReserveLease = DefaultReserveLease
	fs.Var((*durationFlag)(&cfg.ReserveLease), "reserve-lease", "")
	cfg.GossipInterval = DefaultGossipInterval
	fs.Var((*durationFlag)(&cfg.GossipInterval), "gossip-interval", "")
	cfg.ReloadInterval = DefaultReloadInterval
	fs.Var((*durationFlag)(&cfg.ReloadInterval), "reload-interval", "")
	cfg.AuthMissingKey = MissingKeyReject
	(*prefixListFlag)(&cfg.AuthTrustedProxies).Set(DefaultAuthTrustedProxies)
	fs.Var((*headerListFlag)(&cfg.AuthKeyHeaders), "auth-key-header", "")
	fs.Var((*missingKeyFlag)(&cfg.AuthMissingKey), "auth-missing-key", "")
	fs.Var((*prefixListFlag)(&cfg.AuthTrustedProxies), "auth-trusted-proxies", "")
	fs.StringVar(&level, "log-level", "info", "")
	fs.BoolVar(&cfg.Shadow, "shadow", false, "")
	fs.StringVar(&cfg.LogFormat, "log-format", LogText, "")
	fs.BoolVar(&showVersion, "version", false, "")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			Usage(out, fs)
			return cfg, errHelp
		}
		return cfg, fmt.Errorf("%v (hotkeyd --help lists the flags)", err)
	}
	switch rest := fs.Args(); {
	case showVersion && len(rest) == 0, len(rest) == 1 && rest[0] == "version":
		return cfg, errVersion
	case len(rest) == 1 && rest[0] == "help":
		Usage(out, fs)
		return cfg, errHelp
	case len(rest) > 0:
		return cfg, fmt.Errorf("unexpected argument %q: hotkeyd takes flags only, or the commands \"version\" and \"loadgen\" (hotkeyd --help lists them)", rest[0])
	}
	fs.Visit(func(f *flag.Flag) { cfg.set[f.Name] = true })
	var envErr error
	fs.VisitAll(func(f *flag.Flag) {
		if envErr != nil || cfg.set[f.Name] || f.Name == "version" {
			return
		}
		env := EnvName(f.Name)
		v, ok := lookup(env)
		if !ok {
			return
		}
		if err := fs.Set(f.Name, v); err != nil {
			envErr = fmt.Errorf("environment variable %s=%q: %v", env, v, cleanFlagErr(err))
			return
		}
		cfg.set[f.Name] = true
	})
	if envErr != nil {
		return cfg, envErr
	}
	var err error
	cfg.RedisCluster = addrList(cluster)
	cfg.RedisSentinel = addrList(sentinels)
	for _, r := range strings.Split(routes, ",") {
		if r = strings.TrimSpace(r); r != "" {
			cfg.NATSRoutes = append(cfg.NATSRoutes, r)
		}
	}
	if cfg.NATSGateways, err = parseGateways(gateways); err != nil {
		return cfg, err
	}
	if cfg.Region != "" && !cfg.set["nats-cluster-name"] {
		cfg.NATSClusterName = cfg.Region
	}
	cfg.Regions = addrList(regions)
	if !cfg.set["regions"] && cfg.Region != "" && len(cfg.NATSGateways) > 0 {
		regions := []string{cfg.Region}
		for _, g := range cfg.NATSGateways {
			if g.Region != cfg.Region { // refused below, named
				regions = append(regions, g.Region)
			}
		}
		if len(regions) > 1 {
			cfg.Regions = regions
		}
	}
	if err := cfg.LogLevel.UnmarshalText([]byte(level)); err != nil {
		return cfg, fmt.Errorf("--log-level %q: want debug, info, warn or error", level)
	}
	if cfg.LogFormat != LogText && cfg.LogFormat != LogJSON {
		return cfg, fmt.Errorf("%s %q: want text or json", flagName("log-format"), cfg.LogFormat)
	}
	if cfg.Tracing, err = tracingFromEnv(lookup); err != nil {
		return cfg, err
	}
	return cfg, cfg.check()
}

// addrList splits a comma-separated list of addresses, dropping blanks;
// nil if there is none.
func addrList(s string) []string {
	var addrs []string
	for _, a := range strings.Split(s, ",") {
		if a = strings.TrimSpace(a); a != "" {
			addrs = append(addrs, a)
		}
	}
	return addrs
}

// stringsFlag is a flag that may be repeated: each value, in order.
type stringsFlag []string

func (f *stringsFlag) String() string { return strings.Join(*f, ";") }

func (f *stringsFlag) Set(s string) error {
	*f = append(*f, s)
	return nil
}

// parseGateways parses --nats-gateways: REGION=URL[,URL...] entries,
// separated by ';' or given in flags of their own; nil if there is none.
// It checks the syntax only (check the rest).
func parseGateways(specs []string) ([]NATSGateway, error) {
	var gws []NATSGateway
	for _, spec := range specs {
		for _, e := range strings.Split(spec, ";") {
			if e = strings.TrimSpace(e); e == "" {
				continue
			}
			region, urls, ok := strings.Cut(e, "=")
			region = strings.TrimSpace(region)
			g := NATSGateway{Region: region, URLs: addrList(urls)}
			if !ok || region == "" || len(g.URLs) == 0 {
				return nil, fmt.Errorf("%s %q: want REGION=URL[,URL...], entries separated by ';', e.g. us-east=nats://10.1.0.5:7222,10.1.0.6:7222", flagName("nats-gateways"), redactGateway(e))
			}
			if !namespace.Valid(region) {
				return nil, fmt.Errorf("%s: region %q: want 1 to %d of A-Z a-z 0-9 - _, the other region's --region", flagName("nats-gateways"), region, namespace.Max)
			}
			for _, u := range g.URLs {
				if _, err := gatewayURL(u); err != nil {
					return nil, fmt.Errorf("%s: region %s: %q: %v", flagName("nats-gateways"), region, redact.URL(u), err)
				}
			}
			if slices.ContainsFunc(gws, func(o NATSGateway) bool { return o.Region == region }) {
				return nil, fmt.Errorf("%s: region %s given twice: give all its URLs in one entry, comma-separated", flagName("nats-gateways"), region)
			}
			gws = append(gws, g)
		}
	}
	return gws, nil
}

// redactGateway is entry of --nats-gateways, for errors, with the
// passwords of its URLs hidden.
func redactGateway(entry string) string {
	region, urls, ok := strings.Cut(entry, "=")
	if !ok {
		return redact.URL(entry)
	}
	return region + "=" + redact.URLs(strings.Split(urls, ","))
}

// durationFlag is a time.Duration flag whose error says what to write.
type durationFlag time.Duration

func (d *durationFlag) String() string { return time.Duration(*d).String() }

func (d *durationFlag) Set(s string) error {
	v, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("want a duration with its unit, e.g. 60s, 1m or 500ms")
	}
	*d = durationFlag(v)
	return nil
}

func cleanFlagErr(err error) string {
	s := err.Error()
	if i := strings.LastIndex(s, ": "); i >= 0 && strings.HasPrefix(s, "parse error") {
		return s[i+2:]
	}
	return s
}
