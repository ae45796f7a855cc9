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
}
