package daemon

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/reflection"

	"github.com/hotkeyd/hotkey/internal/grpcserve"
)

// grpcStreamWorkers is the count of goroutines kept to serve gRPC calls:
// a call goes to an idle one, whose stack has grown to what a call needs,
// or to a new goroutine when none is idle. A call's stack growing from the
// start was a tenth of the server's CPU time under load.
const grpcStreamWorkers = 256

// grpcMaxConcurrentStreams is the count of calls a gRPC connection may
// have open at once, on either server; more are refused REFUSED_STREAM.
const grpcMaxConcurrentStreams = 1000

// grpcServer is the gRPC server startGRPC builds: grpcserve's or
// grpc-go's, which serve the same services.
type grpcServer interface {
	grpc.ServiceRegistrar
	GetServiceInfo() map[string]grpc.ServiceInfo
	Serve(net.Listener) error
	GracefulStop()
	Stop()
}

var (
	_ grpcServer = (*grpc.Server)(nil)
	_ grpcServer = (*grpcserve.Server)(nil)
)

// startGRPC listens on --grpc-listen and serves the rate-limit service, the
// health service and reflection, over TLS only with --tls-cert, sending each connection a GOAWAY at
// --grpc-max-connection-age (0: never) and after --grpc-idle-timeout with no call (0: never), on the
// server --grpc-server names.
// It does nothing when the flag is empty.
func (d *Daemon) startGRPC() error {
	if d.cfg.GRPCListen == "" {
		return nil
	}
	ln, err := net.Listen("tcp", d.cfg.GRPCListen)
	if err != nil {
		return listenError("gRPC", d.cfg.GRPCListen, "grpc-listen", err)
	}
	d.grpcLn = ln
	timer := rpcTimer{newObservers(d.reqs.api(apiGRPC), grpcCodes())}
	if d.cfg.GRPCServer == GRPCServerLean && d.tracer == nil {
		cfg := grpcserve.Config{Codec: newRLSCodec(), MaxRecvMsgSize: MaxBody, StatsHandler: timer, Workers: grpcStreamWorkers,
			MaxConcurrentStreams: grpcMaxConcurrentStreams, IdleTimeout: d.cfg.GRPCIdleTimeout,
			MaxConnectionAge: d.cfg.GRPCMaxConnectionAge, MaxConnectionAgeGrace: d.cfg.GRPCMaxConnectionAgeGrace}
		if d.tls != nil {
			cfg.TLS = d.tls.config("h2")
		}
		d.grpcSrv = grpcserve.NewServer(cfg)
	} else {
		if d.cfg.GRPCServer == GRPCServerLean {
			d.log.Info("gRPC served by grpc-go, not the lean server: tracing is on, and only grpc-go's server carries its spans")
		}
		opts := []grpc.ServerOption{grpc.MaxRecvMsgSize(MaxBody), grpc.StatsHandler(timer), grpc.ForceServerCodecV2(newRLSCodec()),
			grpc.NumStreamWorkers(grpcStreamWorkers), grpc.MaxConcurrentStreams(grpcMaxConcurrentStreams),
			grpc.KeepaliveParams(keepalive.ServerParameters{MaxConnectionIdle: d.cfg.GRPCIdleTimeout,
				MaxConnectionAge: d.cfg.GRPCMaxConnectionAge, MaxConnectionAgeGrace: d.cfg.GRPCMaxConnectionAgeGrace})}
		opts = append(opts, d.tracer.grpcOptions()...)
		if d.tls != nil {
			opts = append(opts, grpc.Creds(credentials.NewTLS(d.tls.config("h2"))))
		}
		d.grpcSrv = grpc.NewServer(opts...)
	}
	d.rls = &rls{d: d}
	d.grpcSrv.RegisterService(&rlsServiceDesc, d.rls)
	d.health = health.NewServer()
	healthpb.RegisterHealthServer(d.grpcSrv, d.health)
	reflection.Register(d.grpcSrv)
	d.healthStop = make(chan struct{})
	d.readyWake = make(chan struct{}, 1)
	d.healthDone = make(chan struct{})
	go d.followReadiness()
	go func() {
		if err := d.grpcSrv.Serve(ln); err != nil && !errors.Is(err, grpc.ErrServerStopped) && !errors.Is(err, grpcserve.ErrServerStopped) {
			select {
			case d.failed <- fmt.Errorf("gRPC: %w", err):
			default:
			}
		}
	}()
	return nil
}

// followReadiness sets the gRPC health status until Shutdown: for the
// whole server and for the rate-limit service, SERVING while the daemon
// answers decisions (degraded included), NOT_SERVING once it drains; for
// strictService, NOT_SERVING while it is degraded too, as /readyz?strict=true.
func (d *Daemon) followReadiness() {
	defer close(d.healthDone)
	t := time.NewTicker(healthInterval)
	defer t.Stop()
	for {
		st, strict := healthpb.HealthCheckResponse_SERVING, healthpb.HealthCheckResponse_SERVING
		ctx, cancel := context.WithTimeout(context.Background(), healthInterval)
		if d.draining.Load() {
			st, strict = healthpb.HealthCheckResponse_NOT_SERVING, healthpb.HealthCheckResponse_NOT_SERVING
		} else if reasons := d.degraded(ctx); len(reasons) > 0 {
			strict = healthpb.HealthCheckResponse_NOT_SERVING
		}
		cancel()
		d.health.SetServingStatus("", st)
		d.health.SetServingStatus(rlsService, st)
		d.health.SetServingStatus(strictService, strict)
		select {
		case <-d.healthStop:
			return
		case <-t.C:
		case <-d.readyWake:
		}
	}
}

// stopGRPC stops the gRPC server: gracefully until ctx is done, then at
// once.
func (d *Daemon) stopGRPC(ctx context.Context) error {
	if d.grpcSrv == nil {
		return nil
	}
	close(d.healthStop)
	<-d.healthDone
	d.health.Shutdown() // NOT_SERVING, so that clients move away first
	done := make(chan struct{})
	go func() { d.grpcSrv.GracefulStop(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		d.grpcSrv.Stop()
		<-done
		return errors.New("gRPC: requests in flight not done within the shutdown timeout")
	}
}

// GRPCAddr returns the gRPC listen address, or "" when gRPC is off.
func (d *Daemon) GRPCAddr() string {
	if d.grpcLn == nil {
		return ""
	}
	return d.grpcLn.Addr().String()
}
