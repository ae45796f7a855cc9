// Main: flags, signals and the version strings hotkeyd reports.

package daemon

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"regexp"
	"runtime/debug"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hotkeyd/hotkey/internal/loadgencmd"
)

// Main runs hotkeyd with args (without the program name), reading flags'
// environment variables through lookup. It returns the exit code: 0 after
// --help, version or a graceful shutdown on SIGTERM or SIGINT; 2 for bad
// flags; 1 when the daemon cannot start or fails. After SIGTERM or SIGINT
// the daemon drains for --drain-delay (a second signal ends the delay),
// then shuts down. SIGHUP reloads the policies and Envoy rules (Reload).
func Main(version string, args []string, lookup func(string) (string, bool), stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] == "loadgen" {
		return loadgencmd.Main(args[1:], stdout, stderr)
	}
	version = fullVersion(version)
	cfg, err := ParseArgs(args, lookup, stdout)
	switch {
	case errors.Is(err, errHelp):
		return 0
	case errors.Is(err, errVersion):
		fmt.Fprintf(stdout, "hotkeyd %s\n", version)
		return 0
	case err != nil:
		fmt.Fprintf(stderr, "hotkeyd: %v\n", err)
		return 2
	}
	log := slog.New(logHandler(cfg, stderr))
	redis.SetLogger(redisLogger{log})

	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	stop := func() { signal.Stop(sigs) }
	defer stop()
	// SIGHUP reloads the rules; one that comes while the daemon starts is
	// held until it serves.
	hups := make(chan os.Signal, 1)
	signal.Notify(hups, syscall.SIGHUP)
	defer signal.Stop(hups)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var got atomic.Value // the signal that ends the daemon
	go func() {
		select {
		case s := <-sigs:
			got.Store(s)
			cancel()
		case <-ctx.Done():
		}
	}()
	d, err := Start(ctx, cfg, log, version)
	if err != nil {
		fmt.Fprintf(stderr, "hotkeyd: %v\n", err)
		return 1
	}
	code := 0
serve:
	for {
		select {
		case <-hups:
			_ = d.Reload("SIGHUP") // logged and counted
		case <-ctx.Done():
			log.Info("shutting down", "signal", signalName(got.Load()))
			break serve
		case err := <-d.Failed():
			log.Error("server failed", "err", err)
			code = 1
			break serve
		}
	}
	if code == 0 {
		drainDelay(d, cfg.DrainDelay, time.After, sigs)
	}
	stop() // another signal ends the process at once
	sctx, cancel := context.WithTimeout(context.Background(), ShutdownTimeout)
	defer cancel()
	start := time.Now()
	if err := d.Shutdown(sctx); err != nil {
		log.Warn("shutdown incomplete", "err", err, "took", time.Since(start))
	} else {
		log.Info("stopped", "took", time.Since(start))
	}
	return code
}

// logHandler is the handler of the daemon's logs to w, in cfg's format
// and level.
func logHandler(cfg Config, w io.Writer) slog.Handler {
	opts := &slog.HandlerOptions{Level: cfg.LogLevel}
	if cfg.LogFormat == LogJSON {
		return slog.NewJSONHandler(w, opts)
	}
	return slog.NewTextHandler(w, opts)
}

// drainDelay marks d draining (Drain) and keeps it deciding for delay, so
// that load balancers stop routing to it before its listeners close, or
// until a signal on sigs ends the wait; it reports whether one did. after
// is time.After but in tests. With delay 0 it returns at once.
func drainDelay(d *Daemon, delay time.Duration, after func(time.Duration) <-chan time.Time, sigs <-chan os.Signal) (cut bool) {
	if delay <= 0 {
		return false
	}
	d.Drain()
	d.log.Info("draining: not ready, still deciding", "drain_delay", delay)
	select {
	case <-after(delay):
		return false
	case s := <-sigs:
		d.log.Info("drain delay cut short", "signal", signalName(s))
		return true
	}
}

// signalName names the signal s (an os.Signal), as kill -l does.
func signalName(s any) string {
	switch s {
	case syscall.SIGTERM:
		return "SIGTERM"
	case syscall.SIGINT:
		return "SIGINT"
	}
	return fmt.Sprint(s)
}

// fullVersion is the version set at link time, else the one the build
// info gives.
func fullVersion(v string) string {
	if v != "" {
		return v
	}
	bi, _ := debug.ReadBuildInfo()
	return buildVersion(bi)
}

// buildVersion is the module's version and the VCS revision the binary
// was built from, as bi records them: "v1.2.3", "devel+0123456789ab",
// "v1.2.3+0123456789ab-dirty"; "devel" when bi records neither.
func buildVersion(bi *debug.BuildInfo) string {
	v := "devel"
	if bi == nil {
		return v
	}
	if bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		v = bi.Main.Version
	}
	var rev string
	var dirty bool
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	// A module version from a proxy already names its commit.
	if rev == "" || strings.Contains(v, rev[:min(12, len(rev))]) {
		return v
	}
	v += "+" + rev[:min(12, len(rev))]
	if dirty {
		v += "-dirty"
	}
	return v
}

// semverRe is the version form micro accepts.
var semverRe = regexp.MustCompile(`^v?(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(-[0-9A-Za-z.-]+)?(\+[0-9A-Za-z.-]+)?$`)

func serviceVersion(v string) string {
	if semverRe.MatchString(v) {
		return strings.TrimPrefix(v, "v")
	}
	return "0.0.0-" + strings.Map(func(r rune) rune {
		if r < 128 && (r == '-' || r == '.' || 'a' <= r && r <= 'z' || 'A' <= r && r <= 'Z' || '0' <= r && r <= '9') {
			return r
		}
		return '-'
	}, v)
}
