package coordinator

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/hotkeyd/hotkey/internal/natsserver"
	"github.com/hotkeyd/hotkey/internal/testkit"
)

// startErr builds and starts a coordinator with cfg, returning Start's
// error; a coordinator that starts is closed at cleanup.
func startErr(t *testing.T, cfg Config) error {
	t.Helper()
	_, _, err := launch(t, cfg)
	return err
}

// wantAuthErr checks err is a clear authorization failure that does not
// leak secret.
func wantAuthErr(t *testing.T, err error, secret string) {
	t.Helper()
	if err == nil {
		t.Fatal("connected with wrong credentials")
	}
	if !errors.Is(err, nats.ErrAuthorization) || !strings.Contains(err.Error(), "coordinator: connect to NATS at") {
		t.Errorf("error %q", err)
	}
	if secret != "" && strings.Contains(err.Error(), secret) {
		t.Errorf("error %q shows the secret", err)
	}
	t.Logf("wrong credentials: %v", err)
}

func TestUserPassword(t *testing.T) {
	s := startServer(t, natsserver.Options{Configure: func(o *server.Options) {
		o.Username, o.Password = "hotkey", "right-pass"
	}})
	cfg := testConfig("up", s.URL())
	cfg.User, cfg.Password = "hotkey", "right-pass"
	if err := startErr(t, cfg); err != nil {
		t.Fatal(err)
	}
	cfg.ID, cfg.Password = "up-wrong", "wrong-pass"
	wantAuthErr(t, startErr(t, cfg), "")
	// Credentials in the URL: redacted in the error.
	cfg = testConfig("up-url", strings.Replace(s.URL(), "nats://", "nats://hotkey:wrong-pass@", 1))
	wantAuthErr(t, startErr(t, cfg), "wrong-pass")
}

func TestToken(t *testing.T) {
	s := startServer(t, natsserver.Options{Configure: func(o *server.Options) { o.Authorization = "right-token" }})
	cfg := testConfig("tok", s.URL())
	cfg.Token = "right-token"
	if err := startErr(t, cfg); err != nil {
		t.Fatal(err)
	}
	cfg.ID, cfg.Token = "tok-wrong", "wrong-token"
	wantAuthErr(t, startErr(t, cfg), "")
	cfg.Token = ""
	wantAuthErr(t, startErr(t, cfg), "")
}

func TestNkey(t *testing.T) {
	user, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	pub, _ := user.PublicKey()
	seed, _ := user.Seed()
	other, _ := nkeys.CreateUser()
	otherSeed, _ := other.Seed()
	dir := t.TempDir()
	write := func(name string, b []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	s := startServer(t, natsserver.Options{Configure: func(o *server.Options) {
		o.Nkeys = []*server.NkeyUser{{Nkey: pub}}
	}})
	cfg := testConfig("nk", s.URL())
	cfg.NkeySeedFile = write("user.nk", seed)
	if err := startErr(t, cfg); err != nil {
		t.Fatal(err)
	}
	cfg.ID, cfg.NkeySeedFile = "nk-wrong", write("other.nk", otherSeed)
	wantAuthErr(t, startErr(t, cfg), "")
	cfg.NkeySeedFile = filepath.Join(dir, "missing.nk")
	if err := startErr(t, cfg); err == nil || !strings.Contains(err.Error(), "nkey seed file") {
		t.Errorf("missing seed file: %v", err)
	}
}

// testPKI writes a CA and a server and a client certificate (ECDSA P-256)
// to dir and returns the server's TLS config (verifying clients) and the
// file names.
type testPKI struct {
	server                    *tls.Config
	caFile, certFile, keyFile string
	otherCAFile               string
	strangerCert, strangerKey string // a client certificate from another CA
}

func newPKI(t *testing.T) testPKI {
	t.Helper()
	dir := t.TempDir()
	newKey := func() *ecdsa.PrivateKey {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	serial := int64(1)
	issue := func(tmpl *x509.Certificate, parent *x509.Certificate, parentKey *ecdsa.PrivateKey, key *ecdsa.PrivateKey) *x509.Certificate {
		serial++
		tmpl.SerialNumber = big.NewInt(serial)
		tmpl.NotBefore = time.Now().Add(-time.Hour)
		tmpl.NotAfter = time.Now().Add(time.Hour)
		if parent == nil {
			parent, parentKey = tmpl, key
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, parentKey)
		if err != nil {
			t.Fatal(err)
		}
		c, err := x509.ParseCertificate(der)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	writePEM := func(name, typ string, der []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	writeKey := func(name string, k *ecdsa.PrivateKey) string {
		der, err := x509.MarshalECPrivateKey(k)
		if err != nil {
			t.Fatal(err)
		}
		return writePEM(name, "EC PRIVATE KEY", der)
	}
	newCA := func(name string) (*x509.Certificate, *ecdsa.PrivateKey) {
		k := newKey()
		return issue(&x509.Certificate{
			Subject:               pkix.Name{CommonName: name},
			IsCA:                  true,
			BasicConstraintsValid: true,
			KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		}, nil, nil, k), k
	}
	ca, caKey := newCA("hotkey test CA")
	other, otherKey := newCA("another CA")

	srvKey := newKey()
	srv := issue(&x509.Certificate{
		Subject:     pkix.Name{CommonName: "nats"},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		DNSNames:    []string{"localhost"},
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}, ca, caKey, srvKey)
	client := func(parent *x509.Certificate, parentKey *ecdsa.PrivateKey) (*x509.Certificate, *ecdsa.PrivateKey) {
		k := newKey()
		return issue(&x509.Certificate{
			Subject:     pkix.Name{CommonName: "hotkey"},
			KeyUsage:    x509.KeyUsageDigitalSignature,
			ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		}, parent, parentKey, k), k
	}
	cli, cliKey := client(ca, caKey)
	stranger, strangerKey := client(other, otherKey)

	pool := x509.NewCertPool()
	pool.AddCert(ca)
	return testPKI{
		server: &tls.Config{
			Certificates: []tls.Certificate{{Certificate: [][]byte{srv.Raw}, PrivateKey: srvKey}},
			ClientCAs:    pool,
			ClientAuth:   tls.RequireAndVerifyClientCert,
			MinVersion:   tls.VersionTLS12,
		},
		caFile:       writePEM("ca.pem", "CERTIFICATE", ca.Raw),
		certFile:     writePEM("client.pem", "CERTIFICATE", cli.Raw),
		keyFile:      writeKey("client-key.pem", cliKey),
		otherCAFile:  writePEM("other-ca.pem", "CERTIFICATE", other.Raw),
		strangerCert: writePEM("stranger.pem", "CERTIFICATE", stranger.Raw),
		strangerKey:  writeKey("stranger-key.pem", strangerKey),
	}
}

// TestTLS: a server that requires TLS and verifies client certificates.
func TestTLS(t *testing.T) {
	pki := newPKI(t)
	s := startServer(t, natsserver.Options{Configure: func(o *server.Options) {
		o.TLSConfig = pki.server
		o.TLS = true
		o.TLSVerify = true
		o.TLSTimeout = 5
	}})
	cfg := func(id string) Config {
		c := testConfig(id, s.URL())
		c.CAFile, c.CertFile, c.KeyFile = pki.caFile, pki.certFile, pki.keyFile
		return c
	}
	a, ra := startCoord(t, cfg("tls-a"))
	_, rb := startCoord(t, cfg("tls-b"))
	waitMesh(t, 2, ra, rb)
	a.Announce("secure", 0, 16)
	testkit.For(t, patience, "lease over TLS", func() bool { return rb.level("secure") == 16 })

	fails := []struct {
		name string
		mod  func(*Config)
	}{
		{"no client certificate", func(c *Config) { c.CertFile, c.KeyFile = "", "" }},
		{"client certificate from another CA", func(c *Config) { c.CertFile, c.KeyFile = pki.strangerCert, pki.strangerKey }},
		{"server not trusted", func(c *Config) { c.CAFile = pki.otherCAFile }},
		{"missing CA file", func(c *Config) { c.CAFile = filepath.Join(t.TempDir(), "none.pem") }},
	}
	for _, f := range fails {
		c := cfg("tls-" + strings.ReplaceAll(f.name, " ", "-"))
		f.mod(&c)
		err := startErr(t, c)
		if err == nil {
			t.Errorf("%s: connected", f.name)
			continue
		}
		if !strings.Contains(err.Error(), "coordinator: connect to NATS at") {
			t.Errorf("%s: error %q", f.name, err)
		}
		t.Logf("%s: %v", f.name, err)
	}
}
