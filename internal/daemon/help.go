package daemon

import (
	"flag"
	"fmt"
	"io"
	"strings"
)

// flagDoc describes one flag for --help.
type flagDoc struct {
	name, arg, usage string
}

// flagDocs lists the flags in the order --help shows them.
var flagDocs = []flagDoc{
	{"listen", "ADDR", "the HTTP API (POST /v1/allow, forward auth on /v1/auth/{policy}) and health checks (/healthz, /readyz) listen on ADDR"},
	{"admin-listen", "ADDR", "the admin listener: /metrics, GET /v1/hotkeys (raw keys), GET /v1/config (the rules in force), POST /v1/reset (one key's counters), /healthz, /readyz and /debug/pprof/, plaintext, apart from the API; keep it off the API's network (Prometheus scrapes it); empty turns it off"},
	{"grpc-listen", "ADDR", "Envoy's rate-limit service (envoy.service.ratelimit.v3, gRPC health and reflection) listens on ADDR; empty turns it off"},
	{"grpc-max-connection-age", "DURATION", "ask each gRPC client, with an HTTP/2 GOAWAY, to reconnect once its connection is this old (±10%), so that clients such as Envoy spread over daemons added since (requests in flight finish); 0 keeps connections for ever"},
	{"grpc-max-connection-age-grace", "DURATION", "after a connection's --grpc-max-connection-age, give its requests in flight this long before it is closed; 0 waits for them for ever"},
	{"grpc-idle-timeout", "DURATION", "send a gRPC connection with no request in flight for this long an HTTP/2 GOAWAY, and close it (its client reconnects when it has a request); 0 keeps idle connections for ever"},
	{"grpc-server", "NAME", "the gRPC server: lean (hotkeyd's own HTTP/2 transport, headers of 16 KiB at most) or grpc-go; either takes at most 1000 calls at once a connection; with tracing on (OTEL_*), lean falls back to grpc-go"},
	{"drain-delay", "DURATION", "after SIGTERM or SIGINT, answer not ready (/readyz 503, gRPC health NOT_SERVING) for DURATION while still deciding over HTTP, gRPC and NATS, then shut down (in 4.5 s at most): time for load balancers, and a Kubernetes Service's endpoints, to stop sending requests before the listeners close; a second signal ends the delay; 0 shuts down at once"},
	{"tls-cert", "FILE", "PEM certificate (chain) that the HTTP and gRPC listeners serve TLS with, only (TLS 1.2 at least), with --tls-key; read again when the file changes, a change that cannot be loaded keeping the one in force"},
	{"tls-key", "FILE", "PEM private key of --tls-cert"},
	{"tls-client-ca", "FILE", "PEM CA bundle: the HTTP and gRPC listeners require a client certificate signed by one of them (mTLS); needs --tls-cert; read again when the file changes"},
	{"envoy-config", "PATH", "envoyproxy/ratelimit's YAML configuration (a file, or a directory of them) for the gRPC rate-limit service; see docs/envoy.md"},
	{"policies", "PATH", "YAML file of named policies, or a directory of them (see docs/api.md); without it, the built-in \"default\": token_bucket 100/s, burst 100, on_store_failure local"},
	{"reload-interval", "DURATION", "check the files of --policies and --envoy-config for changes this often, and reload them when they change (SIGHUP reloads too; a file refused keeps the rules in force); 0 checks never"},
	{"redis", "URL", "keep counters in a standalone Redis (redis://[user:password@]host:port[/db], rediss:// for TLS); without --redis, --redis-cluster or --redis-sentinel, counters are in memory"},
	{"redis-cluster", "ADDR,ADDR,...", "keep counters in a Redis Cluster reached through these seed nodes (host:port)"},
	{"redis-sentinel", "ADDR,ADDR,...", "keep counters in the Redis master that these Redis Sentinels (host:port) name --redis-master, following its failovers; not with --redis or --redis-cluster"},
	{"redis-master", "NAME", "the master's name in the Sentinels' configuration (sentinel monitor NAME ...), with --redis-sentinel"},
	{"redis-sentinel-password", "PASSWORD", "the Sentinels' own password (their requirepass), with --redis-sentinel; the master and replicas take --redis-user/--redis-password"},
	{"redis-user", "USER", "Redis ACL user, with --redis, --redis-cluster or --redis-sentinel (wins over the URL's)"},
	{"redis-password", "PASSWORD", "Redis password, with --redis, --redis-cluster or --redis-sentinel (wins over the URL's; prefer the environment variable to the flag)"},
	{"redis-tls", "", "TLS to Redis, verified against the system's roots (rediss:// in --redis turns it on too)"},
	{"redis-ca", "FILE", "PEM CA that signs Redis's certificates; turns TLS on"},
	{"redis-cert", "FILE", "PEM client certificate presented to Redis (for tls-auth-clients), with --redis-key; turns TLS on"},
	{"redis-key", "FILE", "PEM private key of --redis-cert"},
	{"redis-prefix", "PREFIX", "prepended to every counter name in Redis (no '{' or '}'), so that deployments can share a Redis apart"},
	{"require-store", "", "stop the start when Redis cannot be reached; without it the daemon starts degraded (each policy's on_store_failure decides, /readyz says degraded) until Redis answers"},
	{"nats", "URL", "join an existing NATS (nats:// or tls://, comma-separated for a cluster) instead of embedding a server; \"none\" runs with no NATS at all: no embedded server, no hotkey.allow, hot keys split by this daemon alone (for one daemon; every other --nats-* flag, and --namespace, is then refused)"},
	{"nats-listen", "ADDR", "the embedded NATS server listens on ADDR (other daemons join with --nats nats://ADDR); not with --nats"},
	{"nats-cluster-listen", "ADDR", "the embedded NATS server accepts routes from other daemons' embedded servers on ADDR, so that they form one NATS cluster without a separate nats-server (see --nats-routes); off loopback, needs --nats-user/--nats-password or --nats-token for the routes to log in with; not with --nats"},
	{"nats-routes", "URL,URL,...", "the --nats-cluster-listen addresses of the other daemons (nats-route://host:6222, or host:6222) to route to; with --nats-user/--nats-password or --nats-token, routes must log in with them too"},
	{"nats-cluster-name", "NAME", "the name of the embedded servers' NATS cluster: the same on every daemon of the cluster; with --region, the region (and with --nats-gateway-listen it must be)"},
	{"nats-gateway-listen", "ADDR", "the embedded NATS server accepts gateways from the other regions' clusters on ADDR, joining them in one NATS supercluster (see --nats-gateways); the gateway is named by --region, which it needs; give it on every daemon of the region; off loopback, needs --nats-user/--nats-password or --nats-token, the same in every region, for the gateways to log in with; not with --nats"},
	{"nats-gateways", "REGION=URL,...;...", "the other regions' gateways (their --nats-gateway-listen addresses, nats://host:7222 or host:7222), by region: us-east=10.1.0.5:7222,10.1.0.6:7222;ap-south=10.2.0.5:7222 (quote the ';' in a shell), or the flag repeated; one region listing another is enough, the other connects back; needs --nats-gateway-listen"},
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
	{"region", "NAME", "this daemon's region (1 to 64 of A-Z a-z 0-9 - _), shown in hotkey_region_info and the serving log: the daemons of a region, on their own Redis, agree hot keys and count each other only within it (their coordination subjects are hotkey.NAMESPACE.REGION.*), so regions joined in one NATS supercluster (--nats-gateway-listen, or a NATS of your own with --nats) stay apart; each region enforces every limit on its own (N regions admit up to N times it); default: none"},
	{"namespace", "NAME", "the fleet's NATS namespace (1 to 64 of A-Z a-z 0-9 - _): daemons agree on hot keys and count instances only with daemons of the same namespace, and serve decisions on hotkey.NAME.api.allow (hotkey.allow for \"default\"), as the micro service hotkey-NAME (hotkey for \"default\"), so that fleets sharing a NATS stay apart; refused with --nats none"},
	{"nats-concurrency", "N", "decide up to N requests on hotkey.allow at once (1: one at a time); more wait in the NATS client's buffer"},
	{"hot-threshold", "RATE", "T: requests per second for one key, over all daemons, at which it is split in 4 (16 at 4T, 64 at 16T). Each daemon measures the key's rate it sees over the last 100 ms (sliding by 10 ms) and compares it with T divided by the live daemons, or --hot-floor if that is more (so among more than T/floor daemons a key evenly spread splits at daemons x floor, over T)"},
	{"hot-floor", "RATE", "the least rate one daemon must see of a key for it to split, however many daemons divide --hot-threshold (capped at it): without it, among 20 daemons at T 1000, 5 requests in 100 ms on one would split a key"},
	{"cool-down", "DURATION", "how long a split key's rate must stay under half its level's threshold before it is merged back a level"},
	{"max-keys", "N", "keep at most N counters in memory: the store's without --redis, and the local fallback's; a table full of live counters denies new keys until one expires (hotkey_memory_store_full_total counts them), it never drops a key's usage"},
	{"breaker-probe", "DURATION", "after the store fails (3 calls in a row), decisions follow each policy's on_store_failure; the store is probed again after DURATION, doubling up to 2m (or DURATION if longer)"},
	{"reserve-lease", "DURATION", "a policy with sync: reserve admits from a block of a key's units leased from the store for up to DURATION (at most 1m), then gives its unused units back: longer leases cost fewer store calls, hold units from other daemons longer, and let a token bucket admit up to rate × DURATION more"},
	{"regions", "LIST", "the fleet's regions, comma-separated, this daemon's --region among them (default, with --nats-gateways: this region and the gateways'): a policy with regions: exchange sends the units it admits here to the other regions' daemons over NATS every --region-interval, and charges theirs to this region's counters, so that the regions together admit about one limit, not one each (docs/operations.md, Regions)"},
	{"region-interval", "DURATION", "how often a policy with regions: exchange sends the other regions what it admitted here (10ms to 1m; default 1s): the regions together admit at most the limit plus (regions - 1) x rate x (DURATION + the slowest delivery between regions)"},
	{"gossip-interval", "DURATION", "a policy with sync: gossip decides on this daemon's memory counters and sends the other daemons, over NATS every DURATION (1ms to 1m), the units it admitted since the last round, which they charge to theirs: a shorter interval tightens the bound (the daemons together admit at most the limit plus (daemons - 1) x rate x (DURATION + a delivery)) at the cost of more, smaller NATS messages; a longer one sends fewer and lets more through; refused with --nats none"},
	{"auth-key-header", "HEADER,...", "forward auth (/v1/auth/{policy}) keys a request by the first of these headers it carries (comma-separated, or the flag repeated), e.g. X-Api-Key; none: by its client address. That header repeated, or holding a list (a comma), is refused as a missing key"},
	{"auth-missing-key", "MODE", "what forward auth answers a request that carries none of --auth-key-header: reject (400, or ?missing_key_status) or client-address (key it by its client address)"},
	{"auth-trusted-proxies", "CIDR,...", "forward auth believes X-Forwarded-For, X-Real-IP and Forwarded only from these peers (CIDRs or addresses; empty: none), and keys any other request by its TCP peer: anyone can write those headers"},
	{"log-level", "LEVEL", "debug, info, warn or error (logs go to stderr)"},
	{"log-format", "FORMAT", "text (key=value lines) or json (one JSON object a line, for log collectors)"},
	{"shadow", "", "shadow mode for every policy and Envoy rule: decisions are made and counted as usual (hotkey_decisions_total result shadow_denied for those over the limit), but every request is admitted, with \"shadow_denied\":true and X-RateLimit-Shadow: denied where it would have been denied; gRPC answers OK. A policy's own shadow: true does the same for it alone"},
}

// EnvName returns the environment variable of flag name: HOTKEYD_ and the
// name upper-cased, dashes to underscores.
func EnvName(name string) string {
	return envPrefix + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))
}

// flagName names a flag with its environment variable, for errors.
func flagName(name string) string {
	return "--" + name + " (" + EnvName(name) + ")"
}

// Usage writes --help.
func Usage(w io.Writer, fs *flag.FlagSet) {
	fmt.Fprint(w, `hotkeyd: a rate-limiting daemon that survives hot keys.

Usage:
  hotkeyd [flags]      serve (HTTP API, NATS micro service "hotkey", admin listener)
  hotkeyd loadgen ...  send load to a running hotkeyd (hotkeyd loadgen --help)
  hotkeyd version      print the version (or --version)
  hotkeyd --help       this text

With no flags: counters in memory, an embedded NATS server on 127.0.0.1:4222
(--nats none for no NATS at all), HTTP on 127.0.0.1:8080, gRPC on
127.0.0.1:8081, the admin listener on 127.0.0.1:8082, and the policy
"default" (token_bucket, 100/s, burst 100, on_store_failure local).

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
GET /healthz, /readyz; admin: GET /metrics, /v1/hotkeys, /v1/config, /healthz,
/readyz, /debug/pprof/; NATS: request on hotkey.allow
(hotkey.NAME.api.allow with --namespace NAME);
gRPC: envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit.
See docs/api.md and docs/envoy.md.
`)
}
