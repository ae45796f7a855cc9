package daemon

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hotkeyd/hotkey/internal/testkit"
)

// writeCA writes a self-signed CA certificate as PEM and returns its file.
func writeCA(t *testing.T) string {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "test CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestRedisOptions: the Redis flags reach the client options of --redis
// and --redis-cluster: user and password (winning over the URL's), TLS on
// with --redis-tls or --redis-ca, the CA as the roots, a rediss:// URL's
// server name kept.
func TestRedisOptions(t *testing.T) {
	ca := writeCA(t)
	parse := func(args ...string) Config {
		t.Helper()
		cfg, err := ParseArgs(args, env(nil), nil)
		if err != nil {
			t.Fatal(err)
		}
		return cfg
	}

	copt, err := redisClusterOptions(parse("--redis-cluster", "a:1,b:2", "--redis-user", "gw", "--redis-password", "pw", "--redis-ca", ca))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(copt.Addrs, ",") != "a:1,b:2" || copt.Username != "gw" || copt.Password != "pw" || copt.TLSConfig == nil || copt.TLSConfig.RootCAs == nil {
		t.Errorf("cluster options: %+v", copt)
	}
	copt, err = redisClusterOptions(parse("--redis-cluster", "a:1", "--redis-tls"))
	if err != nil || copt.TLSConfig == nil || copt.TLSConfig.RootCAs != nil || copt.Username != "" {
		t.Errorf("cluster with --redis-tls: %+v, %v; want TLS on the system's roots", copt, err)
	}
	copt, err = redisClusterOptions(parse("--redis-cluster", "a:1"))
	if err != nil || copt.TLSConfig != nil {
		t.Errorf("cluster without TLS flags: TLS %v, %v", copt.TLSConfig, err)
	}

	opt, err := redisOptions(parse("--redis", "rediss://alice:old@cache.internal:6380/2", "--redis-password", "new", "--redis-ca", ca))
	if err != nil {
		t.Fatal(err)
	}
	if opt.Username != "alice" || opt.Password != "new" || opt.DB != 2 || opt.TLSConfig == nil || opt.TLSConfig.ServerName != "cache.internal" || opt.TLSConfig.RootCAs == nil {
		t.Errorf("standalone options: %+v", opt)
	}
	opt, err = redisOptions(parse("--redis", "redis://h:6379", "--redis-user", "bob"))
	if err != nil || opt.Username != "bob" || opt.TLSConfig != nil {
		t.Errorf("standalone with --redis-user: %+v, %v", opt, err)
	}

	notPEM := filepath.Join(t.TempDir(), "x.pem")
	os.WriteFile(notPEM, []byte("nothing"), 0o600)
	if _, err := redisOptions(parse("--redis", "redis://h:6379", "--redis-ca", notPEM)); err == nil || !strings.Contains(err.Error(), "--redis-ca") {
		t.Errorf("a CA file without PEM: %v", err)
	}
	if _, err := redisClusterOptions(parse("--redis-cluster", "a:1", "--redis-ca", "/nonexistent/ca.pem")); err == nil || !strings.Contains(err.Error(), "--redis-ca") {
		t.Errorf("a missing CA file: %v", err)
	}

	ca2 := testkit.NewCA(t, "hotkey test CA")
	cert, key := ca2.Client(t, "hotkeyd")
	_, otherKey := ca2.Client(t, "other")
	for _, give := range [][]string{
		{"--redis", "redis://h:6379"},
		{"--redis-cluster", "a:1"},
		{"--redis-sentinel", "s:26379", "--redis-master", "m"},
	} {
		tc, err := redisTLS(parse(append(give, "--redis-cert", cert, "--redis-key", key)...), nil)
		if err != nil || tc == nil || len(tc.Certificates) != 1 {
			t.Errorf("%v with --redis-cert: TLS %+v, %v; want TLS on with the client certificate", give, tc, err)
		}
		if _, err := redisTLS(parse(append(give, "--redis-cert", cert, "--redis-key", otherKey)...), nil); err == nil || !strings.Contains(err.Error(), "--redis-cert (HOTKEYD_REDIS_CERT)") || !strings.Contains(err.Error(), "--redis-key") {
			t.Errorf("%v with a key of another certificate: %v, want an error naming --redis-cert and --redis-key", give, err)
		}
		if _, err := redisTLS(parse(append(give, "--redis-cert", "/nonexistent/c.pem", "--redis-key", key)...), nil); err == nil || !strings.Contains(err.Error(), "--redis-cert") {
			t.Errorf("%v with a missing certificate file: %v", give, err)
		}
	}
	opt, err = redisOptions(parse("--redis", "rediss://cache.internal:6380", "--redis-cert", cert, "--redis-key", key))
	if err != nil || opt.TLSConfig == nil || len(opt.TLSConfig.Certificates) != 1 || opt.TLSConfig.ServerName != "cache.internal" {
		t.Errorf("rediss:// with --redis-cert: %+v, %v", opt.TLSConfig, err)
	}
	copt, err = redisClusterOptions(parse("--redis-cluster", "a:1", "--redis-cert", cert, "--redis-key", key))
	if err != nil || copt.TLSConfig == nil || len(copt.TLSConfig.Certificates) != 1 {
		t.Errorf("cluster with --redis-cert: %+v, %v", copt.TLSConfig, err)
	}

	cfg, err := ParseArgs(nil, env(map[string]string{
		"HOTKEYD_REDIS_SENTINEL":          "s1:26379, s2:26379,",
		"HOTKEYD_REDIS_MASTER":            "counters",
		"HOTKEYD_REDIS_SENTINEL_PASSWORD": "sentinel-pw",
		"HOTKEYD_REDIS_USER":              "gw",
		"HOTKEYD_REDIS_PASSWORD":          "data-pw",
		"HOTKEYD_REDIS_CA":                ca,
		"HOTKEYD_REDIS_CERT":              cert,
		"HOTKEYD_REDIS_KEY":               key,
	}), nil)
	if err != nil {
		t.Fatal(err)
	}
	fopt, err := redisFailoverOptions(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(fopt.SentinelAddrs, ",") != "s1:26379,s2:26379" || fopt.MasterName != "counters" || fopt.SentinelPassword != "sentinel-pw" ||
		fopt.Username != "gw" || fopt.Password != "data-pw" || fopt.TLSConfig == nil || fopt.TLSConfig.RootCAs == nil || len(fopt.TLSConfig.Certificates) != 1 {
		t.Errorf("sentinel options: %+v", fopt)
	}
	fopt, err = redisFailoverOptions(parse("--redis-sentinel", "s:26379", "--redis-master", "m"))
	if err != nil || fopt.TLSConfig != nil || fopt.SentinelPassword != "" || !fopt.ContextTimeoutEnabled || fopt.DialTimeout != redisDial {
		t.Errorf("sentinel without TLS flags: %+v, %v", fopt, err)
	}
}
