package redistest

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"os"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/hotkeyd/hotkey/internal/testkit"
)

// TestStartTLS: a server started with StartTLS answers on TLSAddr a
// client whose certificate the CA signed, and refuses one without.
func TestStartTLS(t *testing.T) {
	ca := testkit.NewCA(t, "hotkey test CA")
	scert, skey := ca.Server(t, "redis", "127.0.0.1")
	ccert, ckey := ca.Client(t, "client")
	s, err := StartTLS(t.TempDir(), TLS{Cert: scert, Key: skey, CA: ca.File(t), AuthClients: true})
	skipIfMissing(t, err)
	defer s.Close()

	pem, err := os.ReadFile(ca.File(t))
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(pem)
	cert, err := tls.LoadX509KeyPair(ccert, ckey)
	if err != nil {
		t.Fatal(err)
	}
	ping := func(certs []tls.Certificate) error {
		c := redis.NewClient(&redis.Options{Addr: s.TLSAddr, DisableIdentity: true, MaxRetries: -1, DialerRetries: 1,
			TLSConfig: &tls.Config{RootCAs: roots, Certificates: certs}})
		defer c.Close()
		return c.Ping(context.Background()).Err()
	}
	if err := ping([]tls.Certificate{cert}); err != nil {
		t.Errorf("PING over TLS with a client certificate: %v", err)
	}
	if err := ping(nil); err == nil {
		t.Error("PING over TLS without a client certificate: answered, want refused")
	}
}

// TestStartSentinel: a Sentinel started with StartSentinel names the
// master it monitors, and a replica started with StartReplica follows it.
func TestStartSentinel(t *testing.T) {
	dir := t.TempDir()
	m, err := Start(dir)
	skipIfMissing(t, err)
	defer m.Close()
	r, err := StartReplica(dir, m.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	s, err := StartSentinel(dir, "mymaster", m.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	c := client(s.Addr)
	defer c.Close()
	addr, err := c.Do(ctx, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", "mymaster").StringSlice()
	if err != nil || len(addr) != 2 || addr[0]+":"+addr[1] != m.Addr {
		t.Errorf("SENTINEL GET-MASTER-ADDR-BY-NAME: %v, %v; want %s", addr, err, m.Addr)
	}
	rc := client(r.Addr)
	defer rc.Close()
	if role, err := rc.Do(ctx, "ROLE").Slice(); err != nil || len(role) == 0 || role[0] != "slave" {
		t.Errorf("replica's ROLE: %v, %v; want slave", role, err)
	}
}
