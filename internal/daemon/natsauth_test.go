package daemon

import (
	"errors"
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

// natsServer starts a standalone NATS server configured by configure,
// shut down at cleanup.
func natsServer(t *testing.T, configure func(o *server.Options)) *natsserver.Server {
	t.Helper()
	s, err := natsserver.Start(natsserver.Options{Configure: configure})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Shutdown)
	return s
}

// dialAuth connects to url with natsAuth's options for cfg, and returns
// the error of natsAuth or of connecting; a connection made is closed.
func dialAuth(t *testing.T, url string, cfg Config) error {
	t.Helper()
	opts, err := natsAuth(&cfg)
	if err != nil {
		return err
	}
	nc, err := nats.Connect(url, append(opts, nats.Timeout(10*time.Second), nats.NoReconnect())...)
	if err != nil {
		return err
	}
	nc.Close()
	return nil
}

// wantAuthErr checks err is the server's authorization refusal.
func wantAuthErr(t *testing.T, what string, err error) {
	t.Helper()
	if !errors.Is(err, nats.ErrAuthorization) {
		t.Errorf("%s: error %v, want %v", what, err, nats.ErrAuthorization)
	}
}

func TestNATSCredUserPassword(t *testing.T) {
	s := natsServer(t, func(o *server.Options) { o.Username, o.Password = "hotkey", "right-pass" })
	if err := dialAuth(t, s.URL(), Config{NATSUser: "hotkey", NATSPassword: "right-pass"}); err != nil {
		t.Fatal(err)
	}
	wantAuthErr(t, "wrong password", dialAuth(t, s.URL(), Config{NATSUser: "hotkey", NATSPassword: "wrong-pass"}))
}

func TestNATSCredToken(t *testing.T) {
	s := natsServer(t, func(o *server.Options) { o.Authorization = "right-token" })
	if err := dialAuth(t, s.URL(), Config{NATSToken: "right-token"}); err != nil {
		t.Fatal(err)
	}
	wantAuthErr(t, "wrong token", dialAuth(t, s.URL(), Config{NATSToken: "wrong-token"}))
	wantAuthErr(t, "no token", dialAuth(t, s.URL(), Config{}))
}

func TestNATSCredNkey(t *testing.T) {
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
	s := natsServer(t, func(o *server.Options) { o.Nkeys = []*server.NkeyUser{{Nkey: pub}} })
	if err := dialAuth(t, s.URL(), Config{NATSNkeySeed: write("user.nk", seed)}); err != nil {
		t.Fatal(err)
	}
	wantAuthErr(t, "another user's seed", dialAuth(t, s.URL(), Config{NATSNkeySeed: write("other.nk", otherSeed)}))
	missing := filepath.Join(dir, "missing.nk")
	err = dialAuth(t, s.URL(), Config{NATSNkeySeed: missing})
	if err == nil || !strings.Contains(err.Error(), flagName("nats-nkey-seed")+" "+missing+": ") || !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing seed file: %v", err)
	}
}

// TestNATSTLS: a server that requires TLS and verifies client certificates.
func TestNATSTLS(t *testing.T) {
	ca := testkit.NewCA(t, "hotkey test CA")
	other := testkit.NewCA(t, "another CA")
	srvCert, srvKey := ca.Server(t, "nats", "127.0.0.1", "localhost")
	tc, err := server.GenTLSConfig(&server.TLSConfigOpts{CertFile: srvCert, KeyFile: srvKey, CaFile: ca.File(t), Verify: true})
	if err != nil {
		t.Fatal(err)
	}
	s := natsServer(t, func(o *server.Options) {
		o.TLSConfig, o.TLS, o.TLSVerify, o.TLSTimeout = tc, true, true, 5
	})
	cert, key := ca.Client(t, "hotkey")
	good := Config{NATSCA: ca.File(t), NATSCert: cert, NATSKey: key}
	if err := dialAuth(t, s.URL(), good); err != nil {
		t.Fatal(err)
	}
	strangerCert, strangerKey := other.Client(t, "stranger")
	fails := []struct {
		name string
		mod  func(*Config)
	}{
		{"no client certificate", func(c *Config) { c.NATSCert, c.NATSKey = "", "" }},
		{"client certificate from another CA", func(c *Config) { c.NATSCert, c.NATSKey = strangerCert, strangerKey }},
		{"server not trusted", func(c *Config) { c.NATSCA = other.File(t) }},
		{"missing CA file", func(c *Config) { c.NATSCA = filepath.Join(t.TempDir(), "none.pem") }},
	}
	for _, f := range fails {
		c := good
		f.mod(&c)
		if err := dialAuth(t, s.URL(), c); err == nil {
			t.Errorf("%s: connected", f.name)
		} else {
			t.Logf("%s: %v", f.name, err)
		}
	}
}

// TestNATSNkeySeedMissing: a seed file that cannot be read is refused at
// start with the flag, the file and the reason.
func TestNATSNkeySeedMissing(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "missing.nk")
	d, err := StartArgs(t.Context(), "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0",
		"--nats", "nats://127.0.0.1:1", "--nats-nkey-seed", missing)
	if d != nil {
		d.Shutdown(t.Context())
		t.Fatal("started with a missing nkey seed file")
	}
	if !errors.Is(err, os.ErrNotExist) || !strings.Contains(err.Error(), missing+": ") {
		t.Errorf("error %q, want the file and why it cannot be read", err)
	}
}
