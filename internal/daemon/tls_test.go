package daemon

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	ratelimit "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlpb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/hotkeyd/hotkey/internal/testkit"
)

// tlsDir holds a daemon's TLS files as a Kubernetes secret volume does:
// each path a link through ..data, a link to the directory of the current
// version.
type tlsDir struct {
	dir     string
	version int
}

// newTLSDir returns a directory with the files name: contents, as its
// first version.
func newTLSDir(t *testing.T, files map[string][]byte) *tlsDir {
	t.Helper()
	d := &tlsDir{dir: t.TempDir()}
	d.swap(t, files)
	for name := range files {
		if err := os.Symlink(filepath.Join("..data", name), d.path(name)); err != nil {
			t.Fatal(err)
		}
	}
	return d
}

func (d *tlsDir) path(name string) string { return filepath.Join(d.dir, name) }

// swap writes files as a new version and points ..data at it, as the
// kubelet updates a secret.
func (d *tlsDir) swap(t *testing.T, files map[string][]byte) {
	t.Helper()
	d.version++
	v := filepath.Join(d.dir, "..v"+string(rune('0'+d.version)))
	if err := os.Mkdir(v, 0o700); err != nil {
		t.Fatal(err)
	}
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(v, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	tmp := filepath.Join(d.dir, "..data_tmp")
	if err := os.Symlink(filepath.Base(v), tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(d.dir, "..data")); err != nil {
		t.Fatal(err)
	}
}

// write overwrites the file name in place.
func (d *tlsDir) write(t *testing.T, name string, b []byte) {
	t.Helper()
	if err := os.WriteFile(d.path(name), b, 0o600); err != nil {
		t.Fatal(err)
	}
}

var localhost = []net.IP{net.IPv4(127, 0, 0, 1)}

// startTLS starts a daemon with no NATS, on free loopback ports, with the
// flags args; it stops at cleanup.
func startTLS(t *testing.T, args ...string) *Daemon {
	t.Helper()
	d, err := StartArgs(context.Background(), append([]string{"--listen", "127.0.0.1:0", "--nats", "none"}, args...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { shutdown(t, d) })
	return d
}

// clientTLS trusts ca and presents leaf (none if nil).
func clientTLS(ca *testkit.CA, leaf *testkit.Leaf) *tls.Config {
	pool := x509.NewCertPool()
	pool.AddCert(ca.Cert)
	c := &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	if leaf != nil {
		pair, err := tls.X509KeyPair(leaf.CertPEM, leaf.KeyPEM)
		if err != nil {
			panic(err)
		}
		c.Certificates = []tls.Certificate{pair}
	}
	return c
}

// httpsDo sends a request to the daemon's HTTP listener over TLS (HTTP/2
// offered) with c, on a connection of its own, and returns the status,
// the protocol and the body. HTTP/2 is offered unless c names its
// protocols.
func httpsDo(d *Daemon, c *tls.Config, method, path, body string) (int, string, string, error) {
	tr := &http.Transport{TLSClientConfig: c.Clone(), ForceAttemptHTTP2: len(c.NextProtos) == 0} // the transport adds to its NextProtos
	defer tr.CloseIdleConnections()
	req, err := http.NewRequest(method, "https://"+d.Addr()+path, strings.NewReader(body))
	if err != nil {
		return 0, "", "", err
	}
	resp, err := (&http.Client{Transport: tr, Timeout: time.Minute}).Do(req)
	if err != nil {
		return 0, "", "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Proto, string(b), err
}

// grpcAsk asks the daemon's gRPC listener, with creds, for one decision
// and its health.
func grpcAsk(d *Daemon, creds credentials.TransportCredentials) (rlpb.RateLimitResponse_Code, healthpb.HealthCheckResponse_ServingStatus, error) {
	conn, err := grpc.NewClient(d.GRPCAddr(), grpc.WithTransportCredentials(creds))
	if err != nil {
		return 0, 0, err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute) // only catches a hang
	defer cancel()
	resp, err := rlpb.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx, &rlpb.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimit.RateLimitDescriptor{{Entries: []*ratelimit.RateLimitDescriptor_Entry{{Key: "user", Value: "a"}}}}}, grpc.WaitForReady(false))
	if err != nil {
		return 0, 0, err
	}
	h, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		return resp.OverallCode, 0, err
	}
	return resp.OverallCode, h.Status, nil
}

// servedSerial returns the serial number of the certificate addr presents
// to a client with c, on a new connection.
func servedSerial(t *testing.T, addr string, c *tls.Config, protos ...string) *big.Int {
	t.Helper()
	c = c.Clone()
	c.NextProtos = protos
	conn, err := tls.Dial("tcp", addr, c)
	if err != nil {
		t.Fatalf("handshake with %s: %v", addr, err)
	}
	defer conn.Close()
	return conn.ConnectionState().PeerCertificates[0].SerialNumber
}

// tlsMetric scrapes the value of the metric name, without labels, from
// the admin listener (plaintext, on loopback).
func tlsMetric(t *testing.T, d *Daemon, name string) string {
	t.Helper()
	resp, err := http.Get("http://" + d.AdminAddr() + "/metrics")
	if err != nil {
		t.Fatalf("/metrics: %v", err)
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("/metrics: %d %v", resp.StatusCode, err)
	}
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(name) + ` (\S+)$`).FindStringSubmatch(string(b))
	if m == nil {
		t.Fatalf("/metrics has no %s", name)
	}
	return m[1]
}

// tlsReloadErrors scrapes hotkeyd_tls_reload_errors_total.
func tlsReloadErrors(t *testing.T, d *Daemon) string {
	t.Helper()
	return tlsMetric(t, d, "hotkeyd_tls_reload_errors_total")
}

// TestTLSServes: with --tls-cert and --tls-key, a decision over HTTPS
// (HTTP/2) and over gRPC with TLS, and the gRPC health service, answer;
// plaintext clients of either port get no decision.
func TestTLSServes(t *testing.T) {
	ca := testkit.NewCA(t, "hotkeyd test CA")
	srv := ca.Issue(t, testkit.LeafConfig{Name: "hotkeyd", IPs: localhost})
	files := newTLSDir(t, map[string][]byte{"tls.crt": srv.CertPEM, "tls.key": srv.KeyPEM})
	d := startTLS(t, "--tls-cert", files.path("tls.crt"), "--tls-key", files.path("tls.key"))
	c := clientTLS(ca, nil)

	code, proto, body, err := httpsDo(d, c, http.MethodPost, "/v1/allow", `{"key":"a"}`)
	if err != nil || code != http.StatusOK || !strings.Contains(body, `"allowed":true`) {
		t.Errorf("HTTPS POST /v1/allow: %d %q %v, want 200 allowed", code, body, err)
	}
	if proto != "HTTP/2.0" {
		t.Errorf("HTTPS protocol %s, want HTTP/2.0 (ALPN h2)", proto)
	}
	c11 := c.Clone()
	c11.NextProtos = []string{"http/1.1"}
	if code, proto, _, err := httpsDo(d, c11, http.MethodPost, "/v1/allow", `{"key":"a"}`); err != nil || code != http.StatusOK || proto != "HTTP/1.1" {
		t.Errorf("HTTPS with HTTP/1.1 only: %d %s %v, want 200 over HTTP/1.1", code, proto, err)
	}
	rc, hs, err := grpcAsk(d, credentials.NewTLS(c))
	if err != nil || rc != rlpb.RateLimitResponse_OK || hs != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("gRPC over TLS: %v %v %v, want OK and SERVING", rc, hs, err)
	}

	resp, err := (&http.Client{Transport: &http.Transport{}, Timeout: time.Minute}).Post("http://"+d.Addr()+"/v1/allow", "application/json", strings.NewReader(`{"key":"a"}`))
	if err == nil {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK || strings.Contains(string(b), "allowed") {
			t.Errorf("plaintext HTTP to the TLS port: %d %q, want no decision", resp.StatusCode, b)
		}
	}
	if _, _, err := grpcAsk(d, insecure.NewCredentials()); err == nil {
		t.Error("plaintext gRPC to the TLS port answered, want an error")
	}
	old := c.Clone()
	old.MaxVersion = tls.VersionTLS11
	if _, _, _, err := httpsDo(d, old, http.MethodGet, "/healthz", ""); err == nil {
		t.Error("TLS 1.1 accepted, want at least 1.2")
	}
}

// TestMTLS: with --tls-client-ca, both listeners answer a client whose
// certificate the CA signed, and refuse one with a certificate of another
// CA, an expired one, or none.
func TestMTLS(t *testing.T) {
	ca, other := testkit.NewCA(t, "hotkeyd test CA"), testkit.NewCA(t, "unrelated CA")
	srv := ca.Issue(t, testkit.LeafConfig{Name: "hotkeyd", IPs: localhost})
	files := newTLSDir(t, map[string][]byte{"tls.crt": srv.CertPEM, "tls.key": srv.KeyPEM, "ca.crt": ca.CertPEM})
	d := startTLS(t, "--tls-cert", files.path("tls.crt"), "--tls-key", files.path("tls.key"), "--tls-client-ca", files.path("ca.crt"))

	good := ca.Issue(t, testkit.LeafConfig{Name: "envoy", Client: true})
	code, _, _, err := httpsDo(d, clientTLS(ca, good), http.MethodPost, "/v1/allow", `{"key":"a"}`)
	if err != nil || code != http.StatusOK {
		t.Errorf("HTTPS with a client certificate of the CA: %d %v, want 200", code, err)
	}
	if rc, _, err := grpcAsk(d, credentials.NewTLS(clientTLS(ca, good))); err != nil || rc != rlpb.RateLimitResponse_OK {
		t.Errorf("gRPC with a client certificate of the CA: %v %v, want OK", rc, err)
	}
	now := time.Now()
	for _, c := range []struct {
		name string
		leaf *testkit.Leaf
	}{
		{"no client certificate", nil},
		{"a certificate of another CA", other.Issue(t, testkit.LeafConfig{Name: "envoy", Client: true})},
		{"an expired certificate", ca.Issue(t, testkit.LeafConfig{Name: "envoy", Client: true, NotBefore: now.Add(-2 * time.Hour), NotAfter: now.Add(-time.Hour)})},
	} {
		if code, _, _, err := httpsDo(d, clientTLS(ca, c.leaf), http.MethodPost, "/v1/allow", `{"key":"a"}`); err == nil {
			t.Errorf("HTTPS with %s: %d, want the handshake refused", c.name, code)
		}
		if rc, _, err := grpcAsk(d, credentials.NewTLS(clientTLS(ca, c.leaf))); err == nil {
			t.Errorf("gRPC with %s: %v, want the handshake refused", c.name, rc)
		}
	}
}

// TestTLSRotationOutOfValidity: a rotation to a certificate that has
// expired, or is not valid yet, keeps the certificate in force on both
// listeners, logs a warning, counts in hotkeyd_tls_reload_errors_total and
// sets hotkeyd_tls_last_reload_successful to 0; the next good rotation is
// in force and sets it back to 1.
func TestTLSRotationOutOfValidity(t *testing.T) {
	ca := testkit.NewCA(t, "hotkeyd test CA")
	now := time.Now()
	first := ca.Issue(t, testkit.LeafConfig{Name: "hotkeyd", IPs: localhost})
	files := newTLSDir(t, map[string][]byte{"tls.crt": first.CertPEM, "tls.key": first.KeyPEM})
	var logs testkit.Buffer
	d, err := startLogged(t, &logs, nil, "--nats", "none", "--tls-cert", files.path("tls.crt"), "--tls-key", files.path("tls.key"))
	if err != nil {
		t.Fatal(err)
	}
	defer shutdown(t, d)
	c := clientTLS(ca, nil)
	check := func(want *testkit.Leaf, errors, successful, when string) {
		t.Helper()
		h, g := servedSerial(t, d.Addr(), c, "h2"), servedSerial(t, d.GRPCAddr(), c, "h2")
		t.Logf("%s: HTTP serves serial %v, gRPC %v; want %v", when, h, g, want.Cert.SerialNumber)
		if h.Cmp(want.Cert.SerialNumber) != 0 || g.Cmp(want.Cert.SerialNumber) != 0 {
			t.Errorf("%s: HTTP listener serves serial %v, gRPC %v, want %v", when, h, g, want.Cert.SerialNumber)
		}
		if got := tlsReloadErrors(t, d); got != errors {
			t.Errorf("%s: hotkeyd_tls_reload_errors_total %s, want %s", when, got, errors)
		}
		if got := tlsMetric(t, d, "hotkeyd_tls_last_reload_successful"); got != successful {
			t.Errorf("%s: hotkeyd_tls_last_reload_successful %s, want %s", when, got, successful)
		}
	}
	check(first, "0", "1", "at start")

	expired := ca.Issue(t, testkit.LeafConfig{Name: "hotkeyd", IPs: localhost, NotBefore: now.Add(-2 * time.Hour), NotAfter: now.Add(-time.Hour)})
	files.swap(t, map[string][]byte{"tls.crt": expired.CertPEM, "tls.key": expired.KeyPEM})
	check(first, "1", "0", "after a rotation to an expired certificate")
	if !strings.Contains(logs.String(), "level=WARN") || !strings.Contains(logs.String(), "has expired") {
		t.Errorf("no warning of the expired certificate; logs:\n%s", logs.String())
	}

	early := ca.Issue(t, testkit.LeafConfig{Name: "hotkeyd", IPs: localhost, NotBefore: now.Add(time.Hour), NotAfter: now.Add(2 * time.Hour)})
	files.swap(t, map[string][]byte{"tls.crt": early.CertPEM, "tls.key": early.KeyPEM})
	check(first, "2", "0", "after a rotation to a certificate not valid yet")
	if !strings.Contains(logs.String(), "not valid yet") {
		t.Errorf("no warning of the certificate not valid yet; logs:\n%s", logs.String())
	}

	next := ca.Issue(t, testkit.LeafConfig{Name: "hotkeyd", IPs: localhost})
	files.swap(t, map[string][]byte{"tls.crt": next.CertPEM, "tls.key": next.KeyPEM})
	check(next, "2", "1", "after a rotation to a valid certificate")
	if code, _, _, err := httpsDo(d, c, http.MethodPost, "/v1/allow", `{"key":"a"}`); err != nil || code != http.StatusOK {
		t.Errorf("HTTPS after the rotations: %d %v, want 200", code, err)
	}
}

// TestTLSNotYetValidInForceLater: a certificate written before its
// validity begins is put in force once the clock reaches it, with no
// further change of the files; until then the one in force stays.
func TestTLSNotYetValidInForceLater(t *testing.T) {
	ca := testkit.NewCA(t, "hotkeyd test CA")
	clock := testkit.NewClock()
	clock.Set(time.Now())
	first := ca.Issue(t, testkit.LeafConfig{Name: "hotkeyd", IPs: localhost})
	early := ca.Issue(t, testkit.LeafConfig{Name: "hotkeyd", IPs: localhost, NotBefore: clock.Now().Add(time.Hour), NotAfter: clock.Now().Add(2 * time.Hour)})
	files := newTLSDir(t, map[string][]byte{"tls.crt": first.CertPEM, "tls.key": first.KeyPEM})
	var logs testkit.Buffer
	f, err := newTLSFiles(Config{TLSCert: files.path("tls.crt"), TLSKey: files.path("tls.key")}, slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	f.now = clock.Now
	ln, err := tls.Listen("tcp", "127.0.0.1:0", f.config("h2"))
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			conn.(*tls.Conn).Handshake()
			conn.Close()
		}
	})
	defer wg.Wait()
	defer ln.Close()
	c := clientTLS(ca, nil)
	c.Time = clock.Now // the client checks validity on the same clock
	served := func(want *testkit.Leaf, successful float64, when string) {
		t.Helper()
		got := servedSerial(t, ln.Addr().String(), c, "h2")
		t.Logf("%s: serves serial %v; want %v", when, got, want.Cert.SerialNumber)
		if got.Cmp(want.Cert.SerialNumber) != 0 {
			t.Errorf("%s: serves serial %v, want %v", when, got, want.Cert.SerialNumber)
		}
		if got := testutil.ToFloat64(f.successful); got != successful {
			t.Errorf("%s: hotkeyd_tls_last_reload_successful %v, want %v", when, got, successful)
		}
	}
	served(first, 1, "at start")
	files.swap(t, map[string][]byte{"tls.crt": early.CertPEM, "tls.key": early.KeyPEM})
	served(first, 0, "the new certificate not valid yet")
	clock.Advance(59 * time.Minute)
	served(first, 0, "a minute before its validity begins")
	clock.Advance(2 * time.Minute)
	served(early, 1, "a minute into its validity")
	if got := testutil.ToFloat64(f.errors); got != 1 {
		t.Errorf("hotkeyd_tls_reload_errors_total %v, want 1: the certificate not valid yet counted once", got)
	}
	if n := strings.Count(logs.String(), "not valid yet"); n != 1 {
		t.Errorf("%d warnings of the certificate not valid yet, want 1; logs:\n%s", n, logs.String())
	}
}

// TestTLSRotation: the next handshake after the certificate and key
// change on disk, in place or by a link swap, presents the new
// certificate on both listeners, with no restart; a broken file keeps the
// certificate in force and counts in hotkeyd_tls_reload_errors_total.
func TestTLSRotation(t *testing.T) {
	ca := testkit.NewCA(t, "hotkeyd test CA")
	issue := func() *testkit.Leaf { return ca.Issue(t, testkit.LeafConfig{Name: "hotkeyd", IPs: localhost}) }
	first := issue()
	files := newTLSDir(t, map[string][]byte{"tls.crt": first.CertPEM, "tls.key": first.KeyPEM})
	d := startTLS(t, "--tls-cert", files.path("tls.crt"), "--tls-key", files.path("tls.key"))
	c := clientTLS(ca, nil)
	served := func(want *testkit.Leaf, when string) {
		t.Helper()
		h, g := servedSerial(t, d.Addr(), c, "h2"), servedSerial(t, d.GRPCAddr(), c, "h2")
		t.Logf("%s: HTTP serves serial %v, gRPC %v; want %v", when, h, g, want.Cert.SerialNumber)
		if h.Cmp(want.Cert.SerialNumber) != 0 || g.Cmp(want.Cert.SerialNumber) != 0 {
			t.Errorf("%s: HTTP listener serves serial %v, gRPC %v, want %v", when, h, g, want.Cert.SerialNumber)
		}
	}
	served(first, "at start")

	second := issue()
	files.write(t, "tls.crt", second.CertPEM)
	files.write(t, "tls.key", second.KeyPEM)
	served(second, "after the files were overwritten")

	files.write(t, "tls.crt", []byte("-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n"))
	served(second, "after a broken certificate was written")
	if got := tlsReloadErrors(t, d); got != "1" {
		t.Errorf("hotkeyd_tls_reload_errors_total %s after a broken certificate, want 1", got)
	}

	third := issue()
	files.swap(t, map[string][]byte{"tls.crt": third.CertPEM, "tls.key": third.KeyPEM})
	served(third, "after a link swap")
	if rc, _, err := grpcAsk(d, credentials.NewTLS(c)); err != nil || rc != rlpb.RateLimitResponse_OK {
		t.Errorf("gRPC after the rotations: %v %v", rc, err)
	}
	if got := tlsReloadErrors(t, d); got != "1" {
		t.Errorf("hotkeyd_tls_reload_errors_total %s after a good rotation, want still 1", got)
	}
}

// TestTLSClientCARotation: a new --tls-client-ca bundle written on disk
// decides the next handshake: clients of the new CA get in, those of the
// old one no longer; a file with no certificate keeps the CA in force.
func TestTLSClientCARotation(t *testing.T) {
	ca, next := testkit.NewCA(t, "hotkeyd test CA"), testkit.NewCA(t, "next client CA")
	srv := ca.Issue(t, testkit.LeafConfig{Name: "hotkeyd", IPs: localhost})
	files := newTLSDir(t, map[string][]byte{"tls.crt": srv.CertPEM, "tls.key": srv.KeyPEM, "ca.crt": ca.CertPEM})
	d := startTLS(t, "--tls-cert", files.path("tls.crt"), "--tls-key", files.path("tls.key"), "--tls-client-ca", files.path("ca.crt"))
	oldClient := clientTLS(ca, ca.Issue(t, testkit.LeafConfig{Name: "old", Client: true}))
	newClient := clientTLS(ca, next.Issue(t, testkit.LeafConfig{Name: "new", Client: true}))
	admitted := func(c *tls.Config) bool {
		code, _, _, err := httpsDo(d, c, http.MethodGet, "/healthz", "")
		_, _, gerr := grpcAsk(d, credentials.NewTLS(c))
		if (err == nil) != (gerr == nil) {
			t.Errorf("HTTP %v (%d) and gRPC %v disagree", err, code, gerr)
		}
		return err == nil && code == http.StatusOK
	}
	if !admitted(oldClient) || admitted(newClient) {
		t.Fatal("at start: want the client of the CA in, the other out")
	}
	files.write(t, "ca.crt", next.CertPEM)
	if admitted(oldClient) || !admitted(newClient) {
		t.Error("after the client CA was rotated: want the client of the new CA in, the old one out")
	}
	files.write(t, "ca.crt", []byte("no certificate here\n"))
	if admitted(oldClient) || !admitted(newClient) {
		t.Error("after a CA file with no certificate: want the CA in force kept")
	}
	if got := tlsReloadErrors(t, d); got != "1" {
		t.Errorf("hotkeyd_tls_reload_errors_total %s, want 1", got)
	}
}

// TestTLSStartRefused: a daemon does not start with a TLS file missing,
// unreadable, not matching its pair, a certificate that has expired or is
// not valid yet, or a client CA with no certificate, and the error names
// the flag.
func TestTLSStartRefused(t *testing.T) {
	ca := testkit.NewCA(t, "hotkeyd test CA")
	a, b := ca.Issue(t, testkit.LeafConfig{Name: "a", IPs: localhost}), ca.Issue(t, testkit.LeafConfig{Name: "b", IPs: localhost})
	now := time.Now()
	expired := ca.Issue(t, testkit.LeafConfig{Name: "hotkeyd", IPs: localhost, NotBefore: now.Add(-2 * time.Hour), NotAfter: now.Add(-time.Hour)})
	early := ca.Issue(t, testkit.LeafConfig{Name: "hotkeyd", IPs: localhost, NotBefore: now.Add(time.Hour), NotAfter: now.Add(2 * time.Hour)})
	files := newTLSDir(t, map[string][]byte{"a.crt": a.CertPEM, "a.key": a.KeyPEM, "b.key": b.KeyPEM, "ca.crt": ca.CertPEM, "empty.pem": []byte("# no certificate\n"),
		"expired.crt": expired.CertPEM, "expired.key": expired.KeyPEM, "early.crt": early.CertPEM, "early.key": early.KeyPEM})
	for _, c := range []struct {
		give []string
		want string
	}{
		{[]string{"--tls-cert", files.path("missing.crt"), "--tls-key", files.path("a.key")}, "--tls-cert (HOTKEYD_TLS_CERT)"},
		{[]string{"--tls-cert", files.path("a.crt"), "--tls-key", files.path("missing.key")}, "--tls-key (HOTKEYD_TLS_KEY)"},
		{[]string{"--tls-cert", files.path("a.crt"), "--tls-key", files.path("b.key")}, "does not match"},
		{[]string{"--tls-cert", files.path("a.key"), "--tls-key", files.path("a.key")}, "--tls-cert (HOTKEYD_TLS_CERT)"},
		{[]string{"--tls-cert", files.path("a.crt"), "--tls-key", files.path("a.crt")}, "--tls-key (HOTKEYD_TLS_KEY)"},
		{[]string{"--tls-cert", files.path("a.crt"), "--tls-key", files.path("a.key"), "--tls-client-ca", files.path("empty.pem")}, "--tls-client-ca (HOTKEYD_TLS_CLIENT_CA)"},
		{[]string{"--tls-cert", files.path("a.crt"), "--tls-key", files.path("a.key"), "--tls-client-ca", files.path("missing.pem")}, "--tls-client-ca (HOTKEYD_TLS_CLIENT_CA)"},
		{[]string{"--tls-cert", files.dir, "--tls-key", files.path("a.key")}, "--tls-cert (HOTKEYD_TLS_CERT)"},
		{[]string{"--tls-cert", files.path("expired.crt"), "--tls-key", files.path("expired.key")}, "has expired"},
		{[]string{"--tls-cert", files.path("early.crt"), "--tls-key", files.path("early.key")}, "not valid yet"},
	} {
		d, err := StartArgs(context.Background(), append([]string{"--listen", "127.0.0.1:0", "--nats", "none"}, c.give...)...)
		if err == nil {
			shutdown(t, d)
			t.Errorf("%v: started, want it refused", c.give)
			continue
		}
		if !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v, want it to name %s", c.give, err, c.want)
		}
	}
}

// TestTLSEnv: the TLS flags come from their environment variables too.
func TestTLSEnv(t *testing.T) {
	ca := testkit.NewCA(t, "hotkeyd test CA")
	srv := ca.Issue(t, testkit.LeafConfig{Name: "hotkeyd", IPs: localhost})
	files := newTLSDir(t, map[string][]byte{"tls.crt": srv.CertPEM, "tls.key": srv.KeyPEM, "ca.crt": ca.CertPEM})
	d, err := startLogged(t, nil, map[string]string{"HOTKEYD_TLS_CERT": files.path("tls.crt"), "HOTKEYD_TLS_KEY": files.path("tls.key"), "HOTKEYD_TLS_CLIENT_CA": files.path("ca.crt")}, "--nats", "none")
	if err != nil {
		t.Fatal(err)
	}
	defer shutdown(t, d)
	if _, _, _, err := httpsDo(d, clientTLS(ca, nil), http.MethodGet, "/healthz", ""); err == nil {
		t.Error("HTTPS without a client certificate answered: HOTKEYD_TLS_CLIENT_CA not applied")
	}
	client := clientTLS(ca, ca.Issue(t, testkit.LeafConfig{Name: "envoy", Client: true}))
	if code, _, _, err := httpsDo(d, client, http.MethodGet, "/healthz", ""); err != nil || code != http.StatusOK {
		t.Errorf("HTTPS with a client certificate: %d %v, want 200: HOTKEYD_TLS_CERT and HOTKEYD_TLS_KEY not applied", code, err)
	}
}
