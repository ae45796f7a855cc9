package bench

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/hotkeyd/hotkey/internal/daemon"
	"github.com/hotkeyd/hotkey/internal/faultproxy"
	"github.com/hotkeyd/hotkey/loadgen"
)

// BenchmarkDaemon is hotkeyd (in this process) asked by 64 concurrent
// clients over HTTP, over NATS and over Envoy's rate-limit protocol (gRPC,
// one descriptor of a rules file), in decisions/s: the APIs a deployment
// chooses between, measured in one run. Its Redis is the local
// redis-server, reached directly (rtt=local) or through a proxy that delays
// each direction by 500 µs (rtt=1ms), as a Redis on another host is.
// BENCH_NATS_CONCURRENCY sets the daemon's --nats-concurrency.
func BenchmarkDaemon(b *testing.B) {
	proxy, err := faultproxy.New(env.Server.Addr)
	if err != nil {
		b.Fatal(err)
	}
	defer proxy.Close()
	proxy.SetDelay(500 * time.Microsecond)
	for _, redis := range []struct{ name, addr string }{{"local", env.Server.Addr}, {"1ms", proxy.Addr()}} {
		b.Run("rtt="+redis.name, func(b *testing.B) { benchDaemon(b, redis.addr) })
	}
}

func benchDaemon(b *testing.B, redisAddr string) {
	rules := filepath.Join(b.TempDir(), "rules.yaml")
	// The limit is far above what the benchmark sends: every decision is
	// admitted, as on the other APIs' default policy.
	if err := os.WriteFile(rules, []byte("domain: bench\ndescriptors:\n  - key: user\n    rate_limit: {unit: second, requests_per_unit: 1000000000}\n"), 0o600); err != nil {
		b.Fatal(err)
	}
	args := []string{"--listen", "127.0.0.1:0", "--nats-listen", "127.0.0.1:0", "--grpc-listen", "127.0.0.1:0",
		"--envoy-config", rules, "--redis", "redis://" + redisAddr}
	if c := os.Getenv("BENCH_NATS_CONCURRENCY"); c != "" {
		args = append(args, "--nats-concurrency", c)
	}
	d, err := daemon.StartArgs(context.Background(), args...)
	if err != nil {
		b.Fatal(err)
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		d.Shutdown(ctx)
	}()
	nc, err := nats.Connect(d.NATSURL())
	if err != nil {
		b.Fatal(err)
	}
	defer nc.Close()
	gc, err := grpc.NewClient(d.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	defer gc.Close()
	for _, api := range []struct {
		name   string
		target loadgen.Target
	}{
		{"http", loadgen.HTTP("http://"+d.Addr(), "", nil)},
		{"nats", loadgen.NATS(nc, "")},
		{"grpc", loadgen.Envoy(gc, "bench", [][]loadgen.Entry{{{Key: "user", Value: loadgen.KeyPlaceholder}}})},
	} {
		b.Run("api="+api.name, func(b *testing.B) {
			runParallel(b, func(ctx context.Context, key string) error {
				_, err := api.target.Decide(ctx, key, 1)
				return err
			})
		})
	}
}
