package bench

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/hotkeyd/hotkey/internal/daemon"
	"github.com/hotkeyd/hotkey/internal/faultproxy"
	"github.com/hotkeyd/hotkey/loadgen"
)

// BenchmarkDaemon is hotkeyd (in this process) asked by 64 concurrent
// clients over HTTP and over NATS, in decisions/s: the two APIs a
// deployment chooses between, measured in one run. Its Redis is the local
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
	args := []string{"--listen", "127.0.0.1:0", "--nats-listen", "127.0.0.1:0", "--redis", "redis://" + redisAddr}
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
	for _, api := range []struct {
		name   string
		target loadgen.Target
	}{
		{"http", loadgen.HTTP("http://"+d.Addr(), "", nil)},
		{"nats", loadgen.NATS(nc, "")},
	} {
		b.Run("api="+api.name, func(b *testing.B) {
			runParallel(b, func(ctx context.Context, key string) error {
				_, err := api.target.Decide(ctx, key, 1)
				return err
			})
		})
	}
}
