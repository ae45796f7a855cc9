package daemon

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/hotkeyd/hotkey"
	"github.com/hotkeyd/hotkey/coordinator"
	"github.com/hotkeyd/hotkey/counter"
	"github.com/hotkeyd/hotkey/detector"
	"github.com/hotkeyd/hotkey/internal/redact"
)

// Defaults of the flags.
const (
	DefaultListen     = "127.0.0.1:8080"
	DefaultGRPCListen = "127.0.0.1:8081"
	DefaultNATSListen = "127.0.0.1:4222"
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
	// DefaultReloadInterval is how often the rules' files are checked for
	// changes.
	DefaultReloadInterval = 2 * time.Second
	// DefaultNATSConcurrency is as many decisions in flight as the Redis
	// store batches well: a daemon over NATS forms batches as one over
	// HTTP does, where each connection has its own goroutine.
	DefaultNATSConcurrency = 1024
	envPrefix              = "HOTKEYD_"
	// maxMaxKeys caps --max-keys: about 90 GiB of counters when full.
	maxMaxKeys = 1 << 30
)

// Config is what the flags (or their environment variables) say.
type Config struct {
	Listen      string
	GRPCListen  string // Envoy's rate-limit service; empty: off
	Policies    string // a file or a directory
	EnvoyConfig string // envoyproxy/ratelimit's YAML: a file or a directory

	// GRPCMaxConnectionAge is how long a gRPC connection may live before
	// the server asks its client, with a GOAWAY, to open a new one (gRPC
	// adds a jitter of ±10%); 0: for ever. Clients that reconnect resolve
	// the daemons' addresses again, so that new daemons get connections.
	GRPCMaxConnectionAge time.Duration
	// GRPCMaxConnectionAgeGrace is how long the requests in flight on a
	// connection past its age may take before it is closed; 0: for ever.
	GRPCMaxConnectionAgeGrace time.Duration

	// ReloadInterval is how often the files of Policies and EnvoyConfig
	// are checked for changes, which reload them; 0: only SIGHUP does.
	ReloadInterval time.Duration
	Redis          string
	RedisCluster   []string
	// RequireStore stops the start when Redis cannot be reached, instead
	// of starting degraded.
	RequireStore bool
	// RedisUser and RedisPassword log in to Redis (ACL user, or the
	// password alone for requirepass); they win over those of the URL.
	RedisUser, RedisPassword string
	RedisTLS                 bool   // TLS to Redis (rediss:// turns it on too)
	RedisCA                  string // PEM CA that signs Redis's certificates; turns TLS on
	RedisPrefix              string // prepended to every counter name

	// NATS is the URL(s) of an existing NATS to join; empty: embed a
	// server; NATSNone: no NATS at all (one daemon alone, no hotkey.allow).
	NATS       string
	NATSListen string // the embedded server's address
	// NATSClusterListen is where the embedded server accepts routes from
	// the other daemons' embedded servers; empty: no cluster.
	NATSClusterListen string
	NATSRoutes        []string // the other daemons' route URLs
	NATSClusterName   string
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

	// Namespace names the NATS subjects of this fleet (AllowSubject, the
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
	LogLevel     slog.Level

	// set records which flags were given, on the command line or in the
	// environment.
	set map[string]bool
}

// flagDoc describes one flag for --help.
type flagDoc struct {
	name, arg, usage string
}

// flagDocs lists the flags in the order --help shows them.
var flagDocs = []flagDoc{
	{"listen", "ADDR", "HTTP API, /metrics and health checks listen on ADDR"},
	{"grpc-listen", "ADDR", "Envoy's rate-limit service (envoy.service.ratelimit.v3, gRPC health and reflection) listens on ADDR; empty turns it off"},
	{"grpc-max-connection-age", "DURATION", "ask each gRPC client, with an HTTP/2 GOAWAY, to reconnect once its connection is this old (±10%), so that clients such as Envoy spread over daemons added since (requests in flight finish); 0 keeps connections for ever"},
	{"grpc-max-connection-age-grace", "DURATION", "after a connection's --grpc-max-connection-age, give its requests in flight this long before it is closed; 0 waits for them for ever"},
	{"envoy-config", "PATH", "envoyproxy/ratelimit's YAML configuration (a file, or a directory of them) for the gRPC rate-limit service; see docs/envoy.md"},
	{"policies", "PATH", "YAML file of named policies, or a directory of them (see docs/api.md); without it, the built-in \"default\": token_bucket 100/s, burst 100, on_store_failure local"},
	{"reload-interval", "DURATION", "check the files of --policies and --envoy-config for changes this often, and reload them when they change (SIGHUP reloads too; a file refused keeps the rules in force); 0 checks never"},
	{"redis", "URL", "keep counters in a standalone Redis (redis://[user:password@]host:port[/db], rediss:// for TLS); without --redis or --redis-cluster, counters are in memory"},
	{"redis-cluster", "ADDR,ADDR,...", "keep counters in a Redis Cluster reached through these seed nodes (host:port)"},
	{"redis-user", "USER", "Redis ACL user, with --redis or --redis-cluster (wins over the URL's)"},
	{"redis-password", "PASSWORD", "Redis password, with --redis or --redis-cluster (wins over the URL's; prefer the environment variable to the flag)"},
	{"redis-tls", "", "TLS to Redis, verified against the system's roots (rediss:// in --redis turns it on too)"},
	{"redis-ca", "FILE", "PEM CA that signs Redis's certificates; turns TLS on"},
	{"redis-prefix", "PREFIX", "prepended to every counter name in Redis (no '{' or '}'), so that deployments can share a Redis apart"},
	{"require-store", "", "stop the start when Redis cannot be reached; without it the daemon starts degraded (each policy's on_store_failure decides, /readyz says degraded) until Redis answers"},
	{"nats", "URL", "join an existing NATS (nats:// or tls://, comma-separated for a cluster) instead of embedding a server; \"none\" runs with no NATS at all: no embedded server, no hotkey.allow, hot keys split by this daemon alone (for one daemon; every other --nats-* flag is then refused)"},
	{"nats-listen", "ADDR", "the embedded NATS server listens on ADDR (other daemons join with --nats nats://ADDR); not with --nats"},
	{"nats-cluster-listen", "ADDR", "the embedded NATS server accepts routes from other daemons' embedded servers on ADDR, so that they form one NATS cluster without a separate nats-server (see --nats-routes); off loopback, needs --nats-user/--nats-password or --nats-token for the routes to log in with; not with --nats"},
	{"nats-routes", "URL,URL,...", "the --nats-cluster-listen addresses of the other daemons (nats-route://host:6222, or host:6222) to route to; with --nats-user/--nats-password or --nats-token, routes must log in with them too"},
	{"nats-cluster-name", "NAME", "the name of the embedded servers' NATS cluster: the same on every daemon"},
	{"nats-user", "USER", "NATS user (with --nats-password); with the embedded server, clients must log in as USER"},
	{"nats-password", "PASSWORD", "NATS password for --nats-user"},
	{"nats-client-user", "USER", "a second user of the embedded NATS server, for API clients, with --nats-client-password: it may publish on the decision subject of --namespace (hotkey.allow by default) and subscribe to _INBOX.> only, so that it cannot touch the daemons' coordination subjects (needs --nats-user)"},
	{"nats-client-password", "PASSWORD", "the password of --nats-client-user"},
	{"nats-token", "TOKEN", "NATS token; with the embedded server, clients must present TOKEN"},
	{"nats-nkey-seed", "FILE", "NATS nkey seed file (with --nats)"},
	{"nats-creds", "FILE", "NATS credentials (JWT) file (with --nats)"},
	{"nats-ca", "FILE", "PEM CA to verify the NATS server's certificate; turns TLS on (with --nats)"},
	{"nats-cert", "FILE", "PEM client certificate for NATS, with --nats-key (with --nats)"},
	{"nats-key", "FILE", "PEM key of --nats-cert"},
	{"nats-secret-file", "FILE", "sign and check the daemons' coordination messages with the secret in FILE (at least 16 bytes, white space around it ignored; e.g. openssl rand -hex 32); every daemon needs the same, and drops the others' messages"},
	{"namespace", "NAME", "the fleet's NATS namespace (1 to 64 of A-Z a-z 0-9 - _): daemons agree on hot keys and count instances only with daemons of the same namespace, and serve decisions on hotkey.NAME.api.allow (hotkey.allow for \"default\"), as the micro service hotkey-NAME (hotkey for \"default\"), so that fleets sharing a NATS stay apart"},
	{"nats-concurrency", "N", "decide up to N requests on hotkey.allow at once (1: one at a time); more wait in the NATS client's buffer"},
	{"hot-threshold", "RATE", "T: requests per second for one key, over all daemons, at which it is split in 4 (16 at 4T, 64 at 16T). Each daemon measures the key's rate it sees over the last 100 ms (sliding by 10 ms) and compares it with T divided by the live daemons, or --hot-floor if that is more (so among more than T/floor daemons a key evenly spread splits at daemons x floor, over T)"},
	{"hot-floor", "RATE", "the least rate one daemon must see of a key for it to split, however many daemons divide --hot-threshold (capped at it): without it, among 20 daemons at T 1000, 5 requests in 100 ms on one would split a key"},
	{"cool-down", "DURATION", "how long a split key's rate must stay under half its level's threshold before it is merged back a level"},
	{"max-keys", "N", "keep at most N counters in memory: the store's without --redis, and the local fallback's; a table full of live counters denies new keys until one expires (hotkey_memory_store_full_total counts them), it never drops a key's usage"},
	{"breaker-probe", "DURATION", "after the store fails (3 calls in a row), decisions follow each policy's on_store_failure; the store is probed again after DURATION, doubling up to 2m (or DURATION if longer)"},
	{"log-level", "LEVEL", "debug, info, warn or error (logs go to stderr)"},
}

// EnvName returns the environment variable of flag name: HOTKEYD_ and the
// name upper-cased, dashes to underscores.
func EnvName(name string) string {
	return envPrefix + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))
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
	var cluster, routes, level string
	var showVersion bool
	fs.StringVar(&cfg.Listen, "listen", DefaultListen, "")
	fs.StringVar(&cfg.GRPCListen, "grpc-listen", DefaultGRPCListen, "")
	fs.Var((*durationFlag)(&cfg.GRPCMaxConnectionAge), "grpc-max-connection-age", "")
	fs.Var((*durationFlag)(&cfg.GRPCMaxConnectionAgeGrace), "grpc-max-connection-age-grace", "")
	fs.StringVar(&cfg.EnvoyConfig, "envoy-config", "", "")
	fs.StringVar(&cfg.Policies, "policies", "", "")
	fs.StringVar(&cfg.Redis, "redis", "", "")
	fs.StringVar(&cluster, "redis-cluster", "", "")
	fs.BoolVar(&cfg.RequireStore, "require-store", false, "")
	fs.StringVar(&cfg.RedisUser, "redis-user", "", "")
	fs.StringVar(&cfg.RedisPassword, "redis-password", "", "")
	fs.BoolVar(&cfg.RedisTLS, "redis-tls", false, "")
	fs.StringVar(&cfg.RedisCA, "redis-ca", "", "")
	fs.StringVar(&cfg.RedisPrefix, "redis-prefix", counter.DefaultRedisConfig().Prefix, "")
	fs.StringVar(&cfg.NATS, "nats", "", "")
	fs.StringVar(&cfg.NATSListen, "nats-listen", DefaultNATSListen, "")
	fs.StringVar(&cfg.NATSClusterListen, "nats-cluster-listen", "", "")
	fs.StringVar(&routes, "nats-routes", "", "")
	fs.StringVar(&cfg.NATSClusterName, "nats-cluster-name", DefaultNATSClusterName, "")
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
	cfg.ReloadInterval = DefaultReloadInterval
	fs.Var((*durationFlag)(&cfg.ReloadInterval), "reload-interval", "")
	fs.StringVar(&level, "log-level", "info", "")
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
	if cluster != "" {
		for _, a := range strings.Split(cluster, ",") {
			if a = strings.TrimSpace(a); a != "" {
				cfg.RedisCluster = append(cfg.RedisCluster, a)
			}
		}
	}
	for _, r := range strings.Split(routes, ",") {
		if r = strings.TrimSpace(r); r != "" {
			cfg.NATSRoutes = append(cfg.NATSRoutes, r)
		}
	}
	if err := cfg.LogLevel.UnmarshalText([]byte(level)); err != nil {
		return cfg, fmt.Errorf("--log-level %q: want debug, info, warn or error", level)
	}
	return cfg, cfg.check()
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

// flagName names a flag with its environment variable, for errors.
func flagName(name string) string {
	return "--" + name + " (" + EnvName(name) + ")"
}

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
	if c.EnvoyConfig != "" && c.GRPCListen == "" {
		return fmt.Errorf("%s is served over gRPC, which an empty %s turns off", flagName("envoy-config"), flagName("grpc-listen"))
	}
	for _, f := range []string{"grpc-max-connection-age", "grpc-max-connection-age-grace"} {
		if c.set[f] && c.GRPCListen == "" {
			return fmt.Errorf("%s applies to gRPC, which an empty %s turns off", flagName(f), flagName("grpc-listen"))
		}
	}
	switch {
	case c.GRPCMaxConnectionAge < 0:
		return fmt.Errorf("%s %v: want a positive duration, e.g. 5m, or 0 to keep connections for ever", flagName("grpc-max-connection-age"), c.GRPCMaxConnectionAge)
	case c.GRPCMaxConnectionAgeGrace < 0:
		return fmt.Errorf("%s %v: want a positive duration, e.g. 30s, or 0 to wait for the requests in flight for ever", flagName("grpc-max-connection-age-grace"), c.GRPCMaxConnectionAgeGrace)
	case c.GRPCMaxConnectionAgeGrace > 0 && c.GRPCMaxConnectionAge == 0:
		return fmt.Errorf("%s follows %s, which is 0 (connections kept for ever): set it too", flagName("grpc-max-connection-age-grace"), flagName("grpc-max-connection-age"))
	}
	if c.Redis != "" && len(c.RedisCluster) > 0 {
		return fmt.Errorf("%s and %s: give one or the other", flagName("redis"), flagName("redis-cluster"))
	}
	if c.set["redis-cluster"] && len(c.RedisCluster) == 0 {
		return fmt.Errorf("%s: no address given", flagName("redis-cluster"))
	}
	if c.Redis == "" && len(c.RedisCluster) == 0 {
		for _, f := range []string{"redis-user", "redis-password", "redis-tls", "redis-ca", "redis-prefix"} {
			if c.set[f] {
				return fmt.Errorf("%s applies to Redis, which neither %s nor %s names: counters are in memory", flagName(f), flagName("redis"), flagName("redis-cluster"))
			}
		}
	}
	if c.RedisPrefix == "" || strings.ContainsAny(c.RedisPrefix, "{}") {
		return fmt.Errorf("%s %q: want a non-empty prefix without '{' or '}' (a counter's own hash tag decides its Cluster slot)", flagName("redis-prefix"), c.RedisPrefix)
	}
	switch c.NATS {
	case NATSNone:
		for _, d := range flagDocs {
			if strings.HasPrefix(d.name, "nats-") && c.set[d.name] {
				return fmt.Errorf("%s applies to NATS, which %s none turns off: give one or the other", flagName(d.name), flagName("nats"))
			}
		}
	case "off", "false", "no", "0":
		return fmt.Errorf("%s %q: want none to run with no NATS, or a URL such as nats://host:4222", flagName("nats"), c.NATS)
	}
	if c.NATS != "" {
		for _, f := range []string{"nats-listen", "nats-cluster-listen", "nats-routes", "nats-cluster-name", "nats-client-user", "nats-client-password"} {
			if c.set[f] {
				return fmt.Errorf("%s is for the embedded NATS server, which %s replaces: give one or the other", flagName(f), flagName("nats"))
			}
		}
	} else {
		if c.NATSClusterListen != "" {
			if _, port, err := net.SplitHostPort(c.NATSClusterListen); err != nil {
				return fmt.Errorf("%s %q: want host:port, e.g. 0.0.0.0:6222", flagName("nats-cluster-listen"), c.NATSClusterListen)
			} else if p, err := strconv.Atoi(port); err != nil || p < 0 || p > 65535 {
				return fmt.Errorf("%s %q: bad port", flagName("nats-cluster-listen"), c.NATSClusterListen)
			}
		} else {
			for _, f := range []string{"nats-routes", "nats-cluster-name"} {
				if c.set[f] {
					return fmt.Errorf("%s needs %s: the embedded server accepts routes there", flagName(f), flagName("nats-cluster-listen"))
				}
			}
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
		if _, port, err := net.SplitHostPort(c.NATSListen); err != nil {
			return fmt.Errorf("%s %q: want host:port, e.g. 127.0.0.1:4222", flagName("nats-listen"), c.NATSListen)
		} else if p, err := strconv.Atoi(port); err != nil || p < 0 || p > 65535 {
			return fmt.Errorf("%s %q: bad port", flagName("nats-listen"), c.NATSListen)
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
	case !validNamespace(c.Namespace):
		return fmt.Errorf("%s %q: want 1 to %d of A-Z a-z 0-9 - _ (one NATS subject token: no '.', spaces or wildcards)", flagName("namespace"), c.Namespace, maxNamespace)
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
	case c.ReloadInterval < 0:
		return fmt.Errorf("%s %v: want a positive duration, e.g. 2s, or 0 to check never", flagName("reload-interval"), c.ReloadInterval)
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

// Usage writes --help.
func Usage(w io.Writer, fs *flag.FlagSet) {
	fmt.Fprint(w, `hotkeyd: a rate-limiting daemon that survives hot keys.

Usage:
  hotkeyd [flags]      serve (HTTP API, NATS micro service "hotkey", /metrics)
  hotkeyd loadgen ...  send load to a running hotkeyd (hotkeyd loadgen --help)
  hotkeyd version      print the version (or --version)
  hotkeyd --help       this text

With no flags: counters in memory, an embedded NATS server on 127.0.0.1:4222
(--nats none for no NATS at all), HTTP on 127.0.0.1:8080, gRPC on
127.0.0.1:8081, and the policy "default" (token_bucket, 100/s, burst 100,
on_store_failure local).

Each flag can also be set by its environment variable; a flag on the command
line wins over the environment.

Flags:
`)
	for _, d := range flagDocs {
		f := fs.Lookup(d.name)
		def := f.DefValue
		switch {
		case def == "":
			def = "none"
		case d.name == "hot-threshold", d.name == "hot-floor":
			def += "/s"
		}
		fmt.Fprintf(w, "  %s\n", strings.TrimSpace("--"+d.name+" "+d.arg))
		fmt.Fprintf(w, "        %s\n", d.usage)
		fmt.Fprintf(w, "        env %s, default %s\n", EnvName(d.name), def)
	}
	fmt.Fprint(w, `
API: POST /v1/allow {"policy":"default","key":"user_123","cost":1} -> 200 or 429;
GET /v1/hotkeys, /metrics, /healthz, /readyz; NATS: request on hotkey.allow
(hotkey.NAME.api.allow with --namespace NAME);
gRPC: envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit.
See docs/api.md and docs/envoy.md.
`)
}
