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
// handshake, and every scrape of its metrics, reads the files again (a few
// KiB, far less than the handshake costs) and puts their contents in force
// when they changed, so that a rotation in place or by a link swap
// (cert-manager, Kubernetes secrets) is seen by the next handshake, with
// no clock to wait on. Contents that fail to load, or whose certificate
// has expired or is not valid yet, keep the pair in force: a warning is
// logged and errors counted, once per contents seen. A certificate not
// valid yet is put in force once it is. Safe for concurrent use.
type tlsFiles struct {
	cert, key, ca string // file paths; ca empty: no client certificates asked
	log           *slog.Logger
	errors        prometheus.Counter
	successful    prometheus.GaugeFunc
	now           func() time.Time // judges the certificates' validity

	mu      sync.Mutex // guards the fields below
	seen    [3][]byte  // the files' contents last read: cert, key, ca
	readErr string     // the last error reading them, counted once; "" after a read
	refused bool       // seen is not in force: it failed to load, or is out of its validity
	pair    *tls.Certificate
	pool    *x509.CertPool // nil without ca
	// early and earlyPool are seen's, refused as not valid yet, put in
	// force once they are.
	early     *tls.Certificate
	earlyPool *x509.CertPool
}

// newTLSFiles loads the files of cfg's --tls-* flags, or returns nil when
// TLS is off. Errors name the flag whose file is at fault; a certificate
// that has expired or is not valid yet is one. The caller registers the
// metrics.
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
	if err := f.validity(f.pair.Leaf, f.now()); err != nil {
		return nil, err
	}
	f.seen = seen
	f.errors = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "hotkeyd_tls_reload_errors_total",
		Help: "Changes of the files of --tls-cert, --tls-key or --tls-client-ca that could not be loaded, or whose certificate has expired or is not valid yet: the certificate and client CA in force stay.",
	})
	f.successful = prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "hotkeyd_tls_last_reload_successful",
		Help: "1 if the files of --tls-cert, --tls-key and --tls-client-ca, read again at this scrape, are in force; 0 if they were refused (unreadable, not loading, a certificate expired or not valid yet): the certificate and client CA in force stay.",
	}, func() float64 {
		if f.inForce() {
			return 1
		}
		return 0
	})
	return f, nil
}

// metrics are the collectors of f, for the caller to register.
func (f *tlsFiles) metrics() []prometheus.Collector {
	return []prometheus.Collector{f.errors, f.successful}
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

// inForce reports whether the files, read again, are in force.
func (f *tlsFiles) inForce() bool {
	f.current()
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.readErr == "" && !f.refused
}

// current returns the pair and client CA pool in force, after loading the
// files if they changed since they were last read, or putting in force
// those refused as not valid yet if they now are.
func (f *tlsFiles) current() (*tls.Certificate, *x509.CertPool) {
	seen, err := f.read()
	now := f.now()
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
		if f.early != nil && !now.Before(f.early.Leaf.NotBefore) {
			if f.validity(f.early.Leaf, now) == nil {
				f.useLocked(f.early, f.earlyPool)
			}
			f.early, f.earlyPool = nil, nil
		}
		return f.pair, f.pool
	}
	f.readErr, f.seen, f.refused, f.early, f.earlyPool = "", seen, true, nil, nil
	pair, pool, err := f.parse(seen)
	if err == nil {
		if err = f.validity(pair.Leaf, now); err != nil && now.Before(pair.Leaf.NotBefore) {
			f.early, f.earlyPool = pair, pool
		}
	}
	if err != nil {
		f.failLocked(err)
		return f.pair, f.pool
	}
	f.useLocked(pair, pool)
	return f.pair, f.pool
}

// useLocked puts pair and pool in force, the contents of seen.
func (f *tlsFiles) useLocked(pair *tls.Certificate, pool *x509.CertPool) {
	f.pair, f.pool, f.refused = pair, pool, false
	f.log.Info("TLS files loaded", "cert", f.cert, "serial", pair.Leaf.SerialNumber.String(), "not_after", pair.Leaf.NotAfter)
}

// failLocked logs and counts a change that could not be loaded.
func (f *tlsFiles) failLocked(err error) {
	f.errors.Inc()
	f.log.Warn("TLS files changed but cannot be loaded: the certificate and client CA in force stay", "err", err)
}

// validity returns an error naming the flag if leaf has expired or is not
// valid yet at now: clients would refuse it.
func (f *tlsFiles) validity(leaf *x509.Certificate, now time.Time) error {
	switch {
	case now.After(leaf.NotAfter):
		return fmt.Errorf("%s %q: the certificate has expired (not after %s): clients refuse it", flagName("tls-cert"), f.cert, leaf.NotAfter.UTC().Format(time.RFC3339))
	case now.Before(leaf.NotBefore):
		return fmt.Errorf("%s %q: the certificate is not valid yet (not before %s): clients refuse it", flagName("tls-cert"), f.cert, leaf.NotBefore.UTC().Format(time.RFC3339))
	}
	return nil
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
