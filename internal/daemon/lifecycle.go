// Listeners and their end: a graceful Shutdown, or the undoing of a Start
// that failed part way.

package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
)

// listenError explains a failed listen, naming the flag to change.
func listenError(what, addr, flag string, err error) error {
	if errors.Is(err, syscall.EADDRINUSE) {
		return fmt.Errorf("%s address %s is already in use: change it with %s", what, addr, flagName(flag))
	}
	return fmt.Errorf("cannot listen on %s for %s: %v; change it with %s", addr, what, err, flagName(flag))
}

// serveHTTP serves the API on d.ln until Shutdown; a server that stops on
// its own is reported on Failed.
func (d *Daemon) serveHTTP() {
	d.httpSrv = &http.Server{
		Handler:           d.routes(),
		ConnState:         d.conns.track,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(d.log.Handler(), slog.LevelDebug),
	}
	serve := func() error { return d.httpSrv.Serve(d.ln) }
	if d.httpSrv.TLSConfig = d.serverTLS(); d.httpSrv.TLSConfig != nil {
		serve = func() error { return d.httpSrv.ServeTLS(d.ln, "", "") }
	}
	go func() {
		if err := serve(); err != nil && !errors.Is(err, http.ErrServerClosed) {
			select {
			case d.failed <- err:
			default:
			}
		}
	}()
}

// Drain marks the daemon draining without stopping anything: from its call
// /readyz answers 503 and the gRPC health service NOT_SERVING, while HTTP,
// gRPC and NATS keep deciding, so that load balancers stop sending requests
// before Shutdown stops taking them. It does not block, and may be called
// more than once.
func (d *Daemon) Drain() {
	d.draining.Store(true)
	select {
	case d.readyWake <- struct{}{}: // nil without gRPC: nothing to wake
	default:
	}
}

// Shutdown stops the daemon gracefully: from its start /readyz answers 503
// and the gRPC health service NOT_SERVING; HTTP stops accepting and finishes
// the requests in flight, the NATS micro service (if any) stops and the
// connection drains (finishing its requests in flight), then the admin
// listener (which serves /metrics until then) stops, then the engine
// (and its coordinator), the store and the embedded NATS server stop. It returns
// when all is stopped or ctx is done.
func (d *Daemon) Shutdown(ctx context.Context) error {
	d.shutdown.Do(func() { d.stopErr = d.stop(ctx) })
	return d.stopErr
}

func (d *Daemon) stop(ctx context.Context) error {
	d.draining.Store(true)
	d.stopBackground()
	var errs []error
	var wg sync.WaitGroup
	var grpcErr error
	wg.Go(func() { grpcErr = d.stopGRPC(ctx) })
	wg.Add(1)
	go func() { // HTTP, gRPC and NATS drain in parallel
		defer wg.Done()
		done := make(chan struct{})
		go func() {
			defer close(done)
			// Connections that never sent a request (HTTP clients dial
			// ahead) would hold Shutdown for 5 s: close them once a
			// request sent on a new connection would have been read.
			t := time.NewTicker(newConnGrace)
			defer t.Stop()
			for {
				select {
				case <-t.C:
					d.conns.closeNew()
				case <-ctx.Done():
					return
				case <-d.httpDone:
					return
				}
			}
		}()
		err := d.httpSrv.Shutdown(ctx)
		close(d.httpDone)
		<-done
		if err != nil {
			errs = append(errs, fmt.Errorf("HTTP: %w", err))
			d.httpSrv.Close()
		}
	}()
	natsErr := d.stopNATS(ctx)
	wg.Wait()
	if grpcErr != nil {
		errs = append(errs, grpcErr)
	}
	if natsErr != nil {
		errs = append(errs, natsErr)
	}
	// Last of the servers: metrics can be scraped while the APIs drain.
	if err := d.stopAdmin(ctx); err != nil {
		errs = append(errs, err)
	}
	d.closeRest()
	// Last: the spans of the requests drained above go out.
	if err := d.tracer.shutdown(ctx); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// stopNATS stops the micro service, waits for its decisions in flight and
// drains the connection, until ctx is done; nil at once without NATS.
func (d *Daemon) stopNATS(ctx context.Context) error {
	if d.nc == nil {
		return nil
	}
	var natsErr error
	if err := d.svc.Stop(); err != nil {
		natsErr = fmt.Errorf("NATS micro service: %w", err)
	}
	// Replies in flight go out before the connection drains, as long as
	// ctx allows; past it, the connection is closed below.
	if !d.nats.stop(ctx) {
		natsErr = errors.Join(natsErr, errors.New("NATS: decisions in flight not done within the shutdown timeout"))
	}
	if !d.nc.IsConnected() {
		d.nc.Close() // nothing to drain to a server it never reached, or lost
	} else if err := d.nc.Drain(); err != nil && !errors.Is(err, nats.ErrConnectionClosed) {
		natsErr = errors.Join(natsErr, fmt.Errorf("NATS drain: %w", err))
	}
	select {
	case <-d.ncClosed:
	case <-ctx.Done():
		d.nc.Close()
		natsErr = errors.Join(natsErr, errors.New("NATS drain: timed out"))
	}
	return natsErr
}

// closeRest stops what runs behind the APIs: the engine and its
// coordinator, the store, the embedded NATS server.
func (d *Daemon) closeRest() {
	if d.engine != nil {
		d.engine.Close()
	} else if d.coord != nil {
		d.coord.Close()
	}
	if d.store != nil {
		d.store.Close()
	}
	if d.redis != nil {
		d.redis.Close()
	}
	if d.ns != nil {
		d.ns.Shutdown()
	}
}

// abort undoes a Start that failed part way.
func (d *Daemon) abort() {
	d.stopBackground()
	if d.svc != nil {
		d.svc.Stop()
	}
	if d.ln != nil {
		d.ln.Close()
	}
	if d.adminSrv != nil {
		d.adminSrv.Close()
	} else if d.adminLn != nil {
		d.adminLn.Close()
	}
	if d.grpcSrv != nil {
		close(d.healthStop)
		<-d.healthDone
		d.grpcSrv.Stop()
	} else if d.grpcLn != nil {
		d.grpcLn.Close()
	}
	if d.nc != nil {
		d.nc.Close()
	}
	d.closeRest()
	d.tracer.shutdown(context.Background()) // within traceFlushTimeout
}

// connTracker follows the HTTP connections' states, so that a shutdown can
// close those that never sent a request.
type connTracker struct {
	mu    sync.Mutex
	conns map[net.Conn]http.ConnState
}

func (t *connTracker) track(c net.Conn, s http.ConnState) {
	t.mu.Lock()
	defer t.mu.Unlock()
	switch s {
	case http.StateClosed, http.StateHijacked:
		delete(t.conns, c)
	default:
		if t.conns == nil {
			t.conns = make(map[net.Conn]http.ConnState)
		}
		t.conns[c] = s
	}
}

// closeNew closes the connections still waiting for their first request.
func (t *connTracker) closeNew() {
	t.mu.Lock()
	defer t.mu.Unlock()
	for c, s := range t.conns {
		if s == http.StateNew {
			c.Close()
		}
	}
}
