// A CA's certificates as PEM files, for servers and clients that read
// files (redis-server, the daemon's flags).

package testkit

import (
	"net"
	"os"
	"path/filepath"
	"testing"
)

// File writes ca's certificate to a PEM file in a temp dir of t and
// returns its path.
func (ca *CA) File(t testing.TB) string {
	t.Helper()
	return writeFile(t, "ca.pem", ca.CertPEM)
}

// Server issues a server certificate for the hosts (IP addresses or DNS
// names) and returns its PEM certificate and key files.
func (ca *CA) Server(t testing.TB, name string, hosts ...string) (certFile, keyFile string) {
	t.Helper()
	c := LeafConfig{Name: name}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			c.IPs = append(c.IPs, ip)
		} else {
			c.DNS = append(c.DNS, h)
		}
	}
	return ca.Issue(t, c).Files(t)
}

// Client issues a client certificate with common name name and returns
// its PEM certificate and key files.
func (ca *CA) Client(t testing.TB, name string) (certFile, keyFile string) {
	t.Helper()
	return ca.Issue(t, LeafConfig{Name: name, Client: true}).Files(t)
}

// Files writes l's certificate and key to PEM files (0600) in a temp dir
// of t and returns their paths.
func (l *Leaf) Files(t testing.TB) (certFile, keyFile string) {
	t.Helper()
	return writeFile(t, "cert.pem", l.CertPEM), writeFile(t, "key.pem", l.KeyPEM)
}

func writeFile(t testing.TB, name string, data []byte) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}
