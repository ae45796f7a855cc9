// The counter store: memory, or Redis with its client options and TLS.

package daemon

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"log/slog"
	"os"
	"strings"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	"github.com/hotkeyd/hotkey/counter"
	"github.com/hotkeyd/hotkey/internal/redact"
)

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
	case len(cfg.RedisSentinel) > 0:
		opt, err := redisFailoverOptions(cfg)
		if err != nil {
			return err
		}
		d.redis = redis.NewFailoverClient(opt)
		what = fmt.Sprintf("Redis master %q of the Sentinels at %s, set by %s", cfg.RedisMaster, strings.Join(cfg.RedisSentinel, ","), flagName("redis-sentinel"))
	default:
		d.store = counter.NewMemoryStore(counter.MemoryConfig{MaxKeys: cfg.MaxKeys})
		apart := d.rules.Load().apart
		if len(apart) > 0 && cfg.NATS != NATSNone && (cfg.NATS != "" || cfg.NATSClusterListen != "" || !loopback(cfg.NATSListen)) {
			d.log.Warn("counters are in memory, yet other daemons may share this NATS: each keeps its own counters of " + plural(apart, "policy ", "policies ") + ", and requests spread over them (hotkey.allow's queue group, a load balancer) are counted apart, so a key may be admitted once per daemon; give them one store with " +
				flagName("redis") + ", " + flagName("redis-cluster") + " or " + flagName("redis-sentinel") + ", or give those policies sync: gossip (/readyz warns while peers are seen)")
		}
		return nil
	}
	if cfg.RequireStore {
		if err := d.redis.Ping(ctx).Err(); err != nil {
			return fmt.Errorf("cannot reach %s: %w%s", what, err, certHint(cfg, err))
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
	// degraded, until the store is set up.
	ctx, cancel := context.WithTimeout(ctx, storeSetupTimeout)
	defer cancel()
	s, err := counter.NewRedisStore(ctx, d.redis, counter.RedisConfig{Prefix: cfg.RedisPrefix, SetupRetry: storeSetupRetry})
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	d.store, d.rstore = s, s
	if err := s.Ready(); err != nil {
		d.log.Warn("cannot reach the store: starting degraded; decisions follow each policy's on_store_failure, and /readyz says degraded, until it answers (retried every "+storeSetupRetry.String()+"); "+flagName("require-store")+" makes this stop the start instead",
			"store", what, "err", err.Error()+certHint(cfg, err))
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

// redisFailoverOptions are the client options of --redis-sentinel and
// the flags that refine it: the master's name, the Sentinels' password,
// and the data nodes' user, password and TLS (which the Sentinels share).
func redisFailoverOptions(cfg Config) (*redis.FailoverOptions, error) {
	tc, err := redisTLS(cfg, nil)
	if err != nil {
		return nil, err
	}
	return &redis.FailoverOptions{
		MasterName:            cfg.RedisMaster,
		SentinelAddrs:         cfg.RedisSentinel,
		SentinelPassword:      cfg.RedisSentinelPassword,
		Username:              cfg.RedisUser,
		Password:              cfg.RedisPassword,
		TLSConfig:             tc,
		DialTimeout:           redisDial,
		MaxRetries:            1,
		DialerRetries:         1,
		ContextTimeoutEnabled: true,
	}, nil
}

// redisTLS is the TLS configuration to Redis: tc (that of a rediss://
// URL, or nil), turned on by --redis-tls, --redis-ca or --redis-cert,
// with the CA of --redis-ca as its roots and the client certificate of
// --redis-cert and --redis-key.
func redisTLS(cfg Config, tc *tls.Config) (*tls.Config, error) {
	if tc == nil && (cfg.RedisTLS || cfg.RedisCA != "" || cfg.RedisCert != "") {
		tc = &tls.Config{MinVersion: tls.VersionTLS12}
	}
	if cfg.RedisCert != "" || cfg.RedisKey != "" {
		cert, err := tls.LoadX509KeyPair(cfg.RedisCert, cfg.RedisKey)
		if err != nil {
			return nil, fmt.Errorf("%s %s and %s %s: %w", flagName("redis-cert"), cfg.RedisCert, flagName("redis-key"), cfg.RedisKey, err)
		}
		tc.Certificates = []tls.Certificate{cert}
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

// certHint points to --redis-cert when Redis asked for a client
// certificate and none was given; else it is empty.
func certHint(cfg Config, err error) string {
	if cfg.RedisCert != "" || !strings.Contains(err.Error(), "certificate required") {
		return ""
	}
	return " (Redis requires a client certificate: give " + flagName("redis-cert") + " and " + flagName("redis-key") + ")"
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

// redisLogger sends go-redis's own log lines to slog.
type redisLogger struct{ log *slog.Logger }

func (l redisLogger) Printf(ctx context.Context, format string, v ...any) {
	l.log.Debug("redis: " + fmt.Sprintf(format, v...))
}
