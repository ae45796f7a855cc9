// Package daemon is hotkeyd: the hotkey engine behind an HTTP API and a NATS
// micro service, with a policies file, Prometheus metrics and an embedded
// NATS server by default (--nats none: no NATS, one daemon alone). cmd/hotkeyd is a thin main around Main.
package daemon

import (
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc/health"

	"github.com/hotkeyd/hotkey"
	"github.com/hotkeyd/hotkey/coordinator"
	"github.com/hotkeyd/hotkey/counter"
	"github.com/hotkeyd/hotkey/internal/namespace"
	"github.com/hotkeyd/hotkey/internal/natsserver"
)

// Timeouts of the daemon.
const (
	// ShutdownTimeout bounds a graceful shutdown; the daemon exits within
	// it whatever is left in flight.
	ShutdownTimeout = 4500 * time.Millisecond
	startTimeout    = 5 * time.Second // reaching Redis and NATS at start
	// storeSetupTimeout bounds the first try to set the store up, without
	// --require-store; then it is tried every storeSetupRetry.
	storeSetupTimeout = 2 * time.Second
	storeSetupRetry   = 250 * time.Millisecond
	pingTimeout       = 300 * time.Millisecond // /readyz's Redis PING
	drainTimeout      = 2 * time.Second        // NATS drain at shutdown
	newConnGrace      = 250 * time.Millisecond // at shutdown, connections with no request yet are closed after this
	redisDial         = time.Second
	// natsSubject is the micro endpoint's subject in the default namespace.
	natsSubject = namespace.DefaultAllowSubject
	// ServiceName is the NATS micro service's name.
	ServiceName = "hotkey"
)

// readyzKey is the key of the decision /readyz makes under d.readyz, a key
// of its own, to let an open breaker probe the store when no traffic does.
const readyzKey = "hotkeyd:readyz"

// Daemon is a running hotkeyd.
type Daemon struct {
	cfg    Config
	log    *slog.Logger
	id     string
	rules  atomic.Pointer[rules]
	readyz *hotkey.Policy

	reloadMu sync.Mutex // one reload at a time
	reloads  *reloadMetrics
	reqs     requestMetrics

	bg     sync.WaitGroup // the loops of background
	bgStop chan struct{}  // closed to stop them; nil before the first

	ln       net.Listener
	tls      *tlsFiles // nil when TLS is off
	httpSrv  *http.Server
	conns    connTracker
	httpDone chan struct{} // closed when HTTP Shutdown has returned
	failed   chan error

	adminLn  net.Listener // nil when the admin listener is off
	adminSrv *http.Server // nil until it serves

	grpcLn      net.Listener // nil when gRPC is off
	grpcSrv     grpcServer   // nil when gRPC is off
	rls         *rls
	health      *health.Server
	healthStop  chan struct{}
	readyWake   chan struct{} // tells followReadiness that draining began
	healthDone  chan struct{}
	descMetrics *descMetrics

	ns      *natsserver.Server // nil when joining an existing NATS, or with --nats none
	natsURL string
	nc      *nats.Conn // nil with --nats none; so are svc and coord
	// natsSynced says the server has confirmed the subscriptions since the
	// connection last came up (/readyz checks it).
	natsSynced atomic.Bool
	// natsLastErr is the last reconnect error logged (reconnects run
	// one at a time).
	natsLastErr string
	ncClosed    chan struct{}
	svc         micro.Service
	nats        natsRequests

	store  counter.Store
	rstore *counter.RedisStore   // the store if on Redis, else nil
	redis  redis.UniversalClient // nil for the memory store
	coord  *coordinator.NATS
	engine *hotkey.Engine
	reg    *prometheus.Registry
	tracer *tracer // nil: tracing off

	// draining is set once Drain or Shutdown begins: /readyz answers 503
	// and the gRPC health service NOT_SERVING from then on.
	draining atomic.Bool
	shutdown sync.Once
	stopErr  error
}

// Addr returns the HTTP listen address.
func (d *Daemon) Addr() string { return d.ln.Addr().String() }

// NATSURL returns the URL the daemon connects to NATS with (the embedded
// server's, unless --nats); empty with --nats none.
func (d *Daemon) NATSURL() string { return d.natsURL }

// ID returns the instance ID (the origin of its leases in /v1/hotkeys).
func (d *Daemon) ID() string { return d.id }

// Failed reports a server (HTTP, admin, gRPC) that stopped on its own.
func (d *Daemon) Failed() <-chan error { return d.failed }

// instanceID names this daemon for as long as it runs: the host name (at
// most 40 bytes) and 8 random hex digits.
func instanceID() string {
	host, _ := os.Hostname()
	if len(host) > 40 {
		host = host[:40]
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	if host == "" {
		host = "hotkeyd"
	}
	return host + "-" + hex.EncodeToString(b[:])
}

// every calls f every interval until stop is closed or f returns false.
func every(stop <-chan struct{}, interval time.Duration, f func() bool) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		if !f() {
			return
		}
	}
}

// background runs f on its own goroutine until Shutdown (or a failed
// Start) closes its stop channel, and waits for it there.
func (d *Daemon) background(f func(stop <-chan struct{})) {
	if d.bgStop == nil {
		d.bgStop = make(chan struct{})
	}
	d.bg.Go(func() { f(d.bgStop) })
}

// stopBackground stops what background started and waits for it.
func (d *Daemon) stopBackground() {
	if d.bgStop != nil {
		close(d.bgStop)
		d.bg.Wait()
		d.bgStop = nil
	}
}
