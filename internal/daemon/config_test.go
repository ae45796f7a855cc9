package daemon

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"runtime/debug"
	"strings"
	"testing"
	"time"
)

func env(m map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

// startLogged starts a daemon on args and the environment environ, after
// loopback ports of its own for the HTTP, gRPC and admin listeners (args
// given later win), logging as text to logs (nil: nowhere). It fails t if
// ParseArgs refuses args, and returns Start's error.
func startLogged(t *testing.T, logs io.Writer, environ map[string]string, args ...string) (*Daemon, error) {
	t.Helper()
	args = append([]string{"--listen", "127.0.0.1:0", "--grpc-listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"}, args...)
	cfg, err := ParseArgs(args, env(environ), nil)
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.DiscardHandler)
	if logs != nil {
		log = slog.New(slog.NewTextHandler(logs, nil))
	}
	return Start(context.Background(), cfg, log, "test")
}

func TestParseArgsDefaults(t *testing.T) {
	cfg, err := ParseArgs(nil, env(nil), nil)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Listen != "127.0.0.1:8080" || cfg.NATSListen != "127.0.0.1:4222" || cfg.NATS != "" || cfg.Redis != "" ||
		cfg.HotThreshold != 1000 || cfg.CoolDown != time.Minute || cfg.BreakerProbe != 10*time.Second || cfg.ReserveLease != 100*time.Millisecond || cfg.GossipInterval != 100*time.Millisecond || cfg.LogLevel != slog.LevelInfo || cfg.MaxKeys != 1<<20 {
		t.Errorf("defaults: %+v", cfg)
	}
}

func TestParseArgsEnv(t *testing.T) {
	e := env(map[string]string{
		"HOTKEYD_LISTEN":           "127.0.0.1:9000",
		"HOTKEYD_HOT_THRESHOLD":    "50",
		"HOTKEYD_REDIS_CLUSTER":    "a:1, b:2,,",
		"HOTKEYD_LOG_LEVEL":        "debug",
		"HOTKEYD_COOL_DOWN":        "5s",
		"HOTKEYD_NATS_SECRET_FILE": "/run/secrets/hotkey",
		"HOTKEYD_MAX_KEYS":         "4096",
		"HOTKEYD_RESERVE_LEASE":    "250ms",
		"HOTKEYD_GOSSIP_INTERVAL":  "40ms",
	})
	cfg, err := ParseArgs([]string{"--listen", "127.0.0.1:9001", "--cool-down=7s"}, e, nil)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Listen != "127.0.0.1:9001" || cfg.CoolDown != 7*time.Second {
		t.Errorf("the flag must win over the environment: %+v", cfg)
	}
	if cfg.HotThreshold != 50 || strings.Join(cfg.RedisCluster, ";") != "a:1;b:2" || cfg.LogLevel != slog.LevelDebug || cfg.NATSSecretFile != "/run/secrets/hotkey" || cfg.MaxKeys != 4096 || cfg.ReserveLease != 250*time.Millisecond || cfg.GossipInterval != 40*time.Millisecond {
		t.Errorf("environment not applied: %+v", cfg)
	}
}

func TestParseArgsErrors(t *testing.T) {
	cases := []struct {
		args []string
		env  map[string]string
		msg  string
	}{
		{[]string{"--hot-threshold", "x"}, nil, "hot-threshold"},
		{[]string{"--namespace", ""}, nil, "--namespace (HOTKEYD_NAMESPACE) \"\": want 1 to 64"},
		{[]string{"--namespace", "prod.eu"}, nil, "--namespace (HOTKEYD_NAMESPACE) \"prod.eu\": want 1 to 64"},
		{[]string{"--namespace", "prod eu"}, nil, "--namespace"},
		{[]string{"--namespace", "*"}, nil, "--namespace"},
		{[]string{"--namespace", ">"}, nil, "--namespace"},
		{[]string{"--namespace", strings.Repeat("n", 65)}, nil, "--namespace"},
		{nil, map[string]string{"HOTKEYD_NAMESPACE": "a.b"}, "HOTKEYD_NAMESPACE"},
		{[]string{"--nats", "none", "--namespace", "fleet-a"}, nil, "--namespace (HOTKEYD_NAMESPACE) names the fleet's NATS subjects, which --nats (HOTKEYD_NATS) none turns off"},
		{[]string{"--nats", "none"}, map[string]string{"HOTKEYD_NAMESPACE": "fleet-a"}, "--namespace (HOTKEYD_NAMESPACE) names the fleet's NATS subjects"},
		{[]string{"--nats", "none", "--gossip-interval", "1s"}, nil, "--gossip-interval (HOTKEYD_GOSSIP_INTERVAL) times the rounds sync: gossip sends over NATS, which --nats (HOTKEYD_NATS) none turns off"},
		{nil, map[string]string{"HOTKEYD_NATS": "none", "HOTKEYD_NAMESPACE": "default"}, "--namespace (HOTKEYD_NAMESPACE) names"},
		{nil, map[string]string{"HOTKEYD_COOL_DOWN": "soon"}, "HOTKEYD_COOL_DOWN"},
		{[]string{"--cool-down", "5"}, nil, "want a duration with its unit, e.g. 60s"},
		{[]string{"--drain-delay", "-1s"}, nil, "--drain-delay (HOTKEYD_DRAIN_DELAY) -1s: want a positive duration"},
		{nil, map[string]string{"HOTKEYD_DRAIN_DELAY": "5"}, "HOTKEYD_DRAIN_DELAY=\"5\": want a duration with its unit"},
		{nil, map[string]string{"HOTKEYD_BREAKER_PROBE": "10"}, "HOTKEYD_BREAKER_PROBE=\"10\": want a duration with its unit"},
		{[]string{"--hot-threshold", "0"}, nil, "--hot-threshold"},
		{[]string{"--cool-down", "0s"}, nil, "--cool-down"},
		{[]string{"--breaker-probe", "-1s"}, nil, "--breaker-probe"},
		{[]string{"--nats-concurrency", "0"}, nil, "--nats-concurrency"},
		{[]string{"--reserve-lease", "0s"}, nil, "--reserve-lease (HOTKEYD_RESERVE_LEASE) 0s: want a positive duration, at most 1m0s"},
		{[]string{"--reserve-lease", "61s"}, nil, "--reserve-lease (HOTKEYD_RESERVE_LEASE) 1m1s: want a positive duration, at most 1m0s"},
		{nil, map[string]string{"HOTKEYD_RESERVE_LEASE": "100"}, "HOTKEYD_RESERVE_LEASE=\"100\": want a duration with its unit"},
		{[]string{"--gossip-interval", "500us"}, nil, "--gossip-interval (HOTKEYD_GOSSIP_INTERVAL) 500µs: want a duration from 1ms to 1m0s"},
		{[]string{"--gossip-interval", "2m"}, nil, "--gossip-interval (HOTKEYD_GOSSIP_INTERVAL) 2m0s: want a duration from 1ms to 1m0s"},
		{nil, map[string]string{"HOTKEYD_GOSSIP_INTERVAL": "100"}, "HOTKEYD_GOSSIP_INTERVAL=\"100\": want a duration with its unit"},
		{[]string{"--max-keys", "0"}, nil, "--max-keys (HOTKEYD_MAX_KEYS) 0: want 1 to"},
		{[]string{"--max-keys", "2000000000"}, nil, "--max-keys"},
		{[]string{"--log-level", "loud"}, nil, "--log-level"},
		{[]string{"--listen", "8080"}, nil, "--listen"},
		{[]string{"--redis", "redis://x", "--redis-cluster", "a:1"}, nil, "--redis"},
		{[]string{"--nats", "nats://x:4222", "--nats-listen", "127.0.0.1:4223"}, nil, "--nats-listen"},
		{[]string{"--nats-creds", "f"}, nil, "--nats-creds"},
		{[]string{"--nats", "nats://x", "--nats-cert", "c"}, nil, "--nats-key"},
		{[]string{"--nats", "nats://x", "--nats-token", "t", "--nats-user", "u"}, nil, "at most one"},
		{[]string{"--nats-password", "p"}, nil, "--nats-user"},
		{[]string{"serve"}, nil, `unexpected argument "serve"`},
		{[]string{"--reload-interval", "-1s"}, nil, "--reload-interval"},
		{[]string{"--redis-password", "pw"}, nil, "--redis-password (HOTKEYD_REDIS_PASSWORD) applies to Redis"},
		{[]string{"--redis-sentinel", "10.0.0.5:26379"}, nil, "--redis-sentinel (HOTKEYD_REDIS_SENTINEL) needs --redis-master (HOTKEYD_REDIS_MASTER)"},
		{nil, map[string]string{"HOTKEYD_REDIS_SENTINEL": " , ", "HOTKEYD_REDIS_MASTER": "m"}, "--redis-sentinel (HOTKEYD_REDIS_SENTINEL): no address given"},
		{[]string{"--redis-master", "m"}, nil, "--redis-master (HOTKEYD_REDIS_MASTER) applies to Redis Sentinel"},
		{[]string{"--redis", "redis://h:1", "--redis-master", "m"}, nil, "--redis-master (HOTKEYD_REDIS_MASTER) applies to Redis Sentinel"},
		{[]string{"--redis", "redis://h:1", "--redis-sentinel-password", "pw"}, nil, "--redis-sentinel-password (HOTKEYD_REDIS_SENTINEL_PASSWORD) applies to Redis Sentinel"},
		{[]string{"--redis", "redis://h:1", "--redis-sentinel", "s:26379", "--redis-master", "m"}, nil, "--redis (HOTKEYD_REDIS) and --redis-sentinel (HOTKEYD_REDIS_SENTINEL): give one of them"},
		{[]string{"--redis-cluster", "a:1", "--redis-master", "m"}, map[string]string{"HOTKEYD_REDIS_SENTINEL": "s:26379"}, "--redis-cluster (HOTKEYD_REDIS_CLUSTER) and --redis-sentinel (HOTKEYD_REDIS_SENTINEL): give one of them"},
		{[]string{"--redis", "redis://h:1", "--redis-cert", "c.pem"}, nil, "--redis-cert (HOTKEYD_REDIS_CERT) and --redis-key (HOTKEYD_REDIS_KEY) go together"},
		{[]string{"--redis-sentinel", "s:26379", "--redis-master", "m"}, map[string]string{"HOTKEYD_REDIS_KEY": "k.pem"}, "--redis-cert (HOTKEYD_REDIS_CERT) and --redis-key (HOTKEYD_REDIS_KEY) go together"},
		{[]string{"--redis-cert", "c.pem", "--redis-key", "k.pem"}, nil, "--redis-cert (HOTKEYD_REDIS_CERT) applies to Redis"},
		{nil, map[string]string{"HOTKEYD_REDIS_PREFIX": "gw:"}, "--redis-prefix"},
		{[]string{"--redis", "redis://h:1", "--redis-prefix", "{gw}:"}, nil, "--redis-prefix"},
		{[]string{"--redis", "redis://h:1", "--redis-prefix", ""}, nil, "--redis-prefix"},
		{[]string{"--nats-routes", "10.0.0.6:6222"}, nil, "--nats-routes (HOTKEYD_NATS_ROUTES) needs --nats-cluster-listen"},
		{[]string{"--nats", "nats://x:4222", "--nats-cluster-listen", ":6222"}, nil, "--nats-cluster-listen"},
		{[]string{"--nats", "nats://x:4222", "--nats-routes", "h:6222"}, nil, "--nats-routes"},
		{[]string{"--nats-cluster-listen", "6222"}, nil, "want host:port"},
		{[]string{"--nats-cluster-listen", ":6222", "--nats-routes", "nats-route://u:p@h:6222"}, nil, "no credentials in a route"},
		{[]string{"--nats-cluster-listen", ":6222", "--nats-routes", "http://h:6222"}, nil, `scheme "http"`},
		{[]string{"--nats-cluster-listen", ":6222", "--nats-routes", "h"}, nil, "want nats-route://host:port"},
		{[]string{"--nats-cluster-listen", ":6222", "--nats-cluster-name", "a.b"}, nil, "--nats-cluster-name"},
		{[]string{"--nats-cluster-name", "fleet"}, nil, "--nats-cluster-name (HOTKEYD_NATS_CLUSTER_NAME) needs --nats-cluster-listen"},
		{[]string{"--nats-cluster-listen", ":6222", "--nats-routes", "nats-route://u:s3cret@h:6222"}, nil, "nats-route://u:xxxxx@h:6222"},
		{[]string{"--nats-user", "hotkey", "--nats-client-user", "gw", "--nats-client-password", "p"}, nil, "--nats-client-user (HOTKEYD_NATS_CLIENT_USER) needs --nats-password"},
		{[]string{"--nats-client-user", "gw", "--nats-client-password", "p"}, nil, "needs --nats-user"},
		{[]string{"--nats-user", "u", "--nats-password", "p", "--nats-client-user", "gw"}, nil, "go together"},
		{[]string{"--nats-user", "u", "--nats-password", "p", "--nats-client-user", "u", "--nats-client-password", "q"}, nil, "a user of their own"},
		{[]string{"--tls-cert", "tls.crt"}, nil, "--tls-cert (HOTKEYD_TLS_CERT) and --tls-key (HOTKEYD_TLS_KEY) go together"},
		{[]string{"--tls-key", "tls.key"}, nil, "--tls-cert (HOTKEYD_TLS_CERT) and --tls-key (HOTKEYD_TLS_KEY) go together"},
		{nil, map[string]string{"HOTKEYD_TLS_CERT": "tls.crt"}, "--tls-key (HOTKEYD_TLS_KEY)"},
		{[]string{"--tls-client-ca", "ca.crt"}, nil, "--tls-client-ca (HOTKEYD_TLS_CLIENT_CA) needs --tls-cert (HOTKEYD_TLS_CERT)"},
		{nil, map[string]string{"HOTKEYD_TLS_CLIENT_CA": "ca.crt"}, "--tls-client-ca (HOTKEYD_TLS_CLIENT_CA) needs"},
	}
	for _, c := range cases {
		_, err := ParseArgs(c.args, env(c.env), nil)
		if err == nil || !strings.Contains(err.Error(), c.msg) {
			t.Errorf("%v %v: err %v, want it to mention %q", c.args, c.env, err, c.msg)
		}
	}
}

func TestHelpAndVersion(t *testing.T) {
	var out bytes.Buffer
	if _, err := ParseArgs([]string{"--help"}, env(nil), &out); !errors.Is(err, errHelp) {
		t.Fatal(err)
	}
	for _, d := range flagDocs {
		if !strings.Contains(out.String(), "  "+strings.TrimSpace("--"+d.name+" "+d.arg)+"\n") || !strings.Contains(out.String(), "env "+EnvName(d.name)+", default ") {
			t.Errorf("--help does not document --%s with its environment variable and default", d.name)
		}
	}
	var stdout, stderr bytes.Buffer
	if code := Main("v1.2.3", []string{"version"}, env(nil), &stdout, &stderr); code != 0 || stdout.String() != "hotkeyd v1.2.3\n" {
		t.Errorf("version: code %d, %q", code, stdout.String())
	}
	if code := Main("", []string{"--nope"}, env(nil), &stdout, &stderr); code != 2 || !strings.Contains(stderr.String(), "--help") {
		t.Errorf("bad flag: code %d, %q", code, stderr.String())
	}
	if got := serviceVersion("devel"); got != "0.0.0-devel" {
		t.Errorf("serviceVersion(devel) = %q", got)
	}
	if got := serviceVersion("v1.2.3"); got != "1.2.3" {
		t.Errorf("serviceVersion(v1.2.3) = %q", got)
	}
}

// TestVersionFlag: --version asks for the version as the version command
// does; HOTKEYD_VERSION does not.
func TestVersionFlag(t *testing.T) {
	if _, err := ParseArgs([]string{"--version"}, env(nil), nil); !errors.Is(err, errVersion) {
		t.Errorf("--version: %v", err)
	}
	if _, err := ParseArgs(nil, env(map[string]string{"HOTKEYD_VERSION": "true"}), nil); err != nil {
		t.Errorf("HOTKEYD_VERSION=true: %v, want a daemon to start", err)
	}
}

// TestBuildVersion: without a version set at link time, the version is
// the module's and the VCS revision of the build.
func TestBuildVersion(t *testing.T) {
	rev := func(r, modified string) []debug.BuildSetting {
		return []debug.BuildSetting{{Key: "vcs.revision", Value: r}, {Key: "vcs.modified", Value: modified}}
	}
	for _, c := range []struct {
		bi   *debug.BuildInfo
		want string
	}{
		{nil, "devel"},
		{&debug.BuildInfo{Main: debug.Module{Version: "(devel)"}}, "devel"},
		{&debug.BuildInfo{Main: debug.Module{Version: "(devel)"}, Settings: rev("0123456789abcdef0123", "false")}, "devel+0123456789ab"},
		{&debug.BuildInfo{Main: debug.Module{Version: "(devel)"}, Settings: rev("0123456789abcdef0123", "true")}, "devel+0123456789ab-dirty"},
		{&debug.BuildInfo{Main: debug.Module{Version: "v1.2.3"}}, "v1.2.3"},
		{&debug.BuildInfo{Main: debug.Module{Version: "v0.0.0-20261203-0123456789ab"}, Settings: rev("0123456789abcdef0123", "false")}, "v0.0.0-20261203-0123456789ab"},
	} {
		if got := buildVersion(c.bi); got != c.want {
			t.Errorf("%+v: %q, want %q", c.bi, got, c.want)
		}
	}
}

// TestClusterListenAuth: the embedded server's route port off loopback
// needs credentials for the routes (a user with its password, or a token);
// on loopback it is let through, and the daemon warns (TestClusterListenWarn).
func TestClusterListenAuth(t *testing.T) {
	for _, c := range []struct {
		give []string
		env  map[string]string
		want bool // accepted
	}{
		{give: []string{"--nats-cluster-listen", ":6222"}},
		{give: []string{"--nats-cluster-listen", "0.0.0.0:6222"}},
		{give: []string{"--nats-cluster-listen", "10.0.0.5:6222", "--nats-routes", "10.0.0.6:6222"}},
		{give: []string{"--nats-cluster-listen", "[::]:6222"}},
		{give: []string{"--nats-cluster-listen", ":6222", "--nats-user", "hotkey"}},
		{give: []string{"--nats-cluster-listen", ":6222", "--nats-user", "hotkey"}, env: map[string]string{"HOTKEYD_NATS_PASSWORD": "pw"}, want: true},
		{give: []string{"--nats-cluster-listen", ":6222", "--nats-token", "tok"}, want: true},
		{give: []string{"--nats-cluster-listen", "127.0.0.1:6222"}, want: true},
		{give: []string{"--nats-cluster-listen", "[::1]:6222"}, want: true},
		{give: []string{"--nats-cluster-listen", "localhost:6222"}, want: true},
	} {
		_, err := ParseArgs(c.give, env(c.env), nil)
		switch {
		case c.want && err != nil:
			t.Errorf("%v %v: %v, want it accepted", c.give, c.env, err)
		case !c.want && err == nil:
			t.Errorf("%v %v: accepted, want it refused: the route port would let anyone in", c.give, c.env)
		case !c.want && !strings.Contains(err.Error(), "--nats-cluster-listen (HOTKEYD_NATS_CLUSTER_LISTEN)") ||
			!c.want && !strings.Contains(err.Error(), "add --nats-user (HOTKEYD_NATS_USER) and --nats-password (HOTKEYD_NATS_PASSWORD), or --nats-token (HOTKEYD_NATS_TOKEN)"):
			t.Errorf("%v %v: %v, want it to name the flags to add", c.give, c.env, err)
		}
	}
}
