// TLS of the HTTP and gRPC listeners: the key pair and client CA of
// --tls-cert, --tls-key and --tls-client-ca, read again when they change.

package daemon

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// maxTLSFile bounds the files of --tls-cert, --tls-key and --tls-client-ca:
// a certificate chain or a CA bundle is a few KiB.
const maxTLSFile = 1 << 20

// tlsFiles serves the key pair and client CA its files hold. Every
// handshake reads the files again (a few KiB, far less than the handshake
// costs) and puts their contents in force when they changed, so that a
// rotation in place or by a link swap (cert-manager, Kubernetes secrets) is
// seen by the next handshake, with no clock to wait on. Contents that fail
// to load keep the pair in force: a warning is logged and errors counted,
// once per contents seen. Safe for concurrent use.
type tlsFiles struct {
	cert, key, ca string // file paths; ca empty: no client certificates asked
	log           *slog.Logger
	errors        prometheus.Counter
	now           func() time.Time // for the warning of a certificate out of its validity

	mu      sync.Mutex // guards the fields below
	seen    [3][]byte  // the files' contents last read: cert, key, ca
	readErr string     // the last error reading them, counted once; "" after a read
	pair    *tls.Certificate
	pool    *x509.CertPool // nil without ca
}

// newTLSFiles loads the files of cfg's --tls-* flags, or returns nil when
// TLS is off. Errors name the flag whose file is at fault. The caller
// registers the errors counter.
func newTLSFiles(cfg Config, log *slog.Logger) (*tlsFiles, error) {
	if cfg.TLSCert == "" {
		return nil, nil
	}
	f := &tlsFiles{cert: cfg.TLSCert, key: cfg.TLSKey, ca: cfg.TLSClientCA, log: log, now: time.Now}
	seen, err := f.read()
	if err != nil {
		return nil, err
	}
	if f.pair, f.pool, err = f.parse(seen); err != nil {
		return nil, err
	}
	f.seen = seen
	f.warnValidity()
	f.errors = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "hotkeyd_tls_reload_errors_total",
		Help: "Changes of the files of --tls-cert, --tls-key or --tls-client-ca that could not be loaded: the certificate and client CA in force stay.",
	})
	return f, nil
}

// config returns a server configuration (TLS 1.2 at least, ALPN protos)
// whose handshakes present the pair in force and, with a client CA,
// require and verify a client certificate against it.
func (f *tlsFiles) config(protos ...string) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		NextProtos: protos,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			pair, pool := f.current()
			c := &tls.Config{MinVersion: tls.VersionTLS12, NextProtos: protos, Certificates: []tls.Certificate{*pair}}
			if pool != nil {
				// No resumption: a session resumed would skip the check
				// against a client CA rotated since.
				c.ClientAuth, c.ClientCAs, c.SessionTicketsDisabled = tls.RequireAndVerifyClientCert, pool, true
			}
			return c, nil
		},
	}
}

// current returns the pair and client CA pool in force, after loading the
// files if they changed since they were last read.
func (f *tlsFiles) current() (*tls.Certificate, *x509.CertPool) {
	seen, err := f.read()
	f.mu.Lock()
	defer f.mu.Unlock()
	switch {
	case err != nil:
		if err.Error() != f.readErr { // once per error, not per handshake
			f.readErr = err.Error()
			f.failLocked(err)
		}
		return f.pair, f.pool
	case sameContents(seen, f.seen):
		f.readErr = ""
		return f.pair, f.pool
	}
	f.readErr, f.seen = "", seen
	pair, pool, err := f.parse(seen)
	if err != nil {
		f.failLocked(err)
		return f.pair, f.pool
	}
	f.pair, f.pool = pair, pool
	f.log.Info("TLS files loaded", "cert", f.cert, "serial", pair.Leaf.SerialNumber.String(), "not_after", pair.Leaf.NotAfter)
	f.warnValidity()
	return f.pair, f.pool
}

// failLocked logs and counts a change that could not be loaded.
func (f *tlsFiles) failLocked(err error) {
	f.errors.Inc()
	f.log.Warn("TLS files changed but cannot be loaded: the certificate and client CA in force stay", "err", err)
}

// warnValidity warns of a certificate in force out of its validity, which
// clients refuse.
func (f *tlsFiles) warnValidity() {
	leaf, now := f.pair.Leaf, f.now()
	switch {
	case now.After(leaf.NotAfter):
		f.log.Warn("the certificate of "+flagName("tls-cert")+" has expired: clients refuse it", "cert", f.cert, "not_after", leaf.NotAfter)
	case now.Before(leaf.NotBefore):
		f.log.Warn("the certificate of "+flagName("tls-cert")+" is not valid yet: clients refuse it", "cert", f.cert, "not_before", leaf.NotBefore)
	}
}

// parse returns the key pair and the client CA pool (nil without
// --tls-client-ca) of the files' contents b.
func (f *tlsFiles) parse(b [3][]byte) (*tls.Certificate, *x509.CertPool, error) {
	pair, err := tls.X509KeyPair(b[0], b[1])
	if err != nil {
		return nil, nil, fmt.Errorf("%s %q with %s %q: %w", flagName("tls-cert"), f.cert, flagName("tls-key"), f.key, err)
	}
	if f.ca == "" {
		return &pair, nil, nil
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b[2]) {
		return nil, nil, fmt.Errorf("%s %q: no PEM certificate in it", flagName("tls-client-ca"), f.ca)
	}
	return &pair, pool, nil
}

func sameContents(a, b [3][]byte) bool {
	return bytes.Equal(a[0], b[0]) && bytes.Equal(a[1], b[1]) && bytes.Equal(a[2], b[2])
}

// read returns the contents of the files: cert, key, client CA (nil
// without it). A file that cannot be read is an error naming its flag.
func (f *tlsFiles) read() ([3][]byte, error) {
	var out [3][]byte
	for i, p := range [3]struct{ flag, path string }{{"tls-cert", f.cert}, {"tls-key", f.key}, {"tls-client-ca", f.ca}} {
		if p.path == "" {
			continue
		}
		b, err := readSmall(p.path)
		if err != nil {
			return out, fmt.Errorf("%s: %w", flagName(p.flag), err)
		}
		out[i] = b
	}
	return out, nil
}

// readSmall reads a file of at most maxTLSFile bytes.
func readSmall(path string) ([]byte, error) {
	fh, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer fh.Close()
	b, err := io.ReadAll(io.LimitReader(fh, maxTLSFile+1))
	switch {
	case err != nil:
		return nil, fmt.Errorf("read %s: %w", path, err)
	case len(b) > maxTLSFile:
		return nil, fmt.Errorf("%s: over %d bytes, not a certificate or key", path, maxTLSFile)
	}
	return b, nil
}

// serverTLS returns the TLS configuration of an HTTP listener (ALPN h2 and
// http/1.1), or nil when TLS is off. Each call returns a new one, for the
// caller to own.
func (d *Daemon) serverTLS() *tls.Config {
	if d.tls == nil {
		return nil
	}
	return d.tls.config("h2", "http/1.1")
}
