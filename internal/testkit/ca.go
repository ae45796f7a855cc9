package testkit

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"sync/atomic"
	"testing"
	"time"
)

// serials numbers the certificates of every CA of a test binary, so that no
// two share a serial number.
var serials atomic.Int64

// CA is a certificate authority for tests that run TLS servers and clients:
// an ECDSA P-256 key and its self-signed certificate. Its methods are safe
// for concurrent use.
type CA struct {
	Cert    *x509.Certificate
	CertPEM []byte // the certificate, to write as a CA bundle
	key     *ecdsa.PrivateKey
}

// Leaf is a certificate a CA issued, with its private key in PEM.
type Leaf struct {
	Cert    *x509.Certificate
	CertPEM []byte
	KeyPEM  []byte
}

// LeafConfig says what a certificate is for. A zero NotBefore and NotAfter
// make it valid from an hour ago for a day.
type LeafConfig struct {
	Name      string   // the subject's common name
	IPs       []net.IP // subject alternative names, for a server
	DNS       []string // subject alternative names, for a server
	Client    bool     // for client authentication, else server
	NotBefore time.Time
	NotAfter  time.Time
}

// NewCA returns a new CA named name, valid from an hour ago for a day. It
// fails t if a key cannot be made.
func NewCA(t testing.TB, name string) *CA {
	t.Helper()
	key := newKey(t)
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(serials.Add(1)),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	cert, certPEM := sign(t, tmpl, tmpl, &key.PublicKey, key)
	return &CA{Cert: cert, CertPEM: certPEM, key: key}
}

// Issue returns a certificate for c signed by ca, with a key of its own
// and a serial number no other certificate of the test binary has.
func (ca *CA) Issue(t testing.TB, c LeafConfig) *Leaf {
	t.Helper()
	key := newKey(t)
	if c.NotBefore.IsZero() && c.NotAfter.IsZero() {
		now := time.Now()
		c.NotBefore, c.NotAfter = now.Add(-time.Hour), now.Add(24*time.Hour)
	}
	usage := x509.ExtKeyUsageServerAuth
	if c.Client {
		usage = x509.ExtKeyUsageClientAuth
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serials.Add(1)),
		Subject:      pkix.Name{CommonName: c.Name},
		NotBefore:    c.NotBefore,
		NotAfter:     c.NotAfter,
		IPAddresses:  c.IPs,
		DNSNames:     c.DNS,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{usage},
	}
	cert, certPEM := sign(t, tmpl, ca.Cert, &key.PublicKey, ca.key)
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return &Leaf{Cert: cert, CertPEM: certPEM, KeyPEM: pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der})}
}

func newKey(t testing.TB) *ecdsa.PrivateKey {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return key
}

func sign(t testing.TB, tmpl, parent *x509.Certificate, pub *ecdsa.PublicKey, key *ecdsa.PrivateKey) (*x509.Certificate, []byte) {
	t.Helper()
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, pub, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return cert, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}
