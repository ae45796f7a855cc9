package hotkey

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hotkeyd/hotkey/counter"
)

// skewStore reports a clock skew set by the test: a real Redis on this host
// shares its clock, so a skewed server cannot be had for a unit test.
type skewStore struct {
	counter.Store
	skew time.Duration
}

func (s *skewStore) ClockSkew() (time.Duration, bool) { return s.skew, true }

// TestClockSkew: the Redis store measures its server's clock against ours
// (the same host here: near zero); the engine warns once above 100 ms and
// notes the return under it.
func TestClockSkew(t *testing.T) {
	checkLeaks(t)
	client := redis.NewClient(&redis.Options{Addr: env.Server.Addr})
	defer client.Close()
	rs, err := counter.NewRedisStore(context.Background(), client, counter.RedisConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer rs.Close()
	d, ok := rs.ClockSkew()
	t.Logf("measured skew of a local redis-server: %v", d)
	if !ok || d > time.Second || d < -time.Second {
		t.Fatalf("skew %v, %v; want a measure near 0 for a server on this host", d, ok)
	}

	var buf bytes.Buffer
	store := &skewStore{Store: counter.NewMemoryStore(counter.MemoryConfig{}), skew: 250 * time.Millisecond}
	e, err := New(store, WithoutDetector(), WithLogger(slog.New(slog.NewTextHandler(&buf, nil))))
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	warned := e.checkSkew(false)
	warned = e.checkSkew(warned) // still over: no second warning
	store.skew = -20 * time.Millisecond
	warned = e.checkSkew(warned)
	out := buf.String()
	if warned || strings.Count(out, "level=WARN") != 1 || !strings.Contains(out, "skew=250ms") || !strings.Contains(out, "back under") {
		t.Fatalf("log:\n%s\nwant one warning at 250ms, then a note when back under 100ms", out)
	}
}
