package coordinator

import (
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/goleak"

	"github.com/hotkeyd/hotkey/internal/natsserver"
	"github.com/hotkeyd/hotkey/internal/testkit"
	"github.com/hotkeyd/hotkey/shard"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// recorder is a Handler that keeps the levels and instance counts it is
// told, and checks the Handler contract: the right hash, no concurrent
// calls, no call after Close.
type recorder struct {
	name    string
	inCall  atomic.Int32
	closed  atomic.Bool
	errs    atomic.Int32
	mu      sync.Mutex
	levels  map[string]shard.Level
	changes int   // SetLevel calls
	maxKeys int   // most keys held above level 1 at once
	insts   []int // SetInstances calls, in order
	lastErr string
}

func newRecorder(name string) *recorder {
	return &recorder{name: name, levels: make(map[string]shard.Level)}
}

func (r *recorder) enter() {
	if r.inCall.Add(1) != 1 {
		r.fail("concurrent Handler calls")
	}
	if r.closed.Load() {
		r.fail("Handler called after Close returned")
	}
}

func (r *recorder) fail(msg string) {
	r.errs.Add(1)
	r.mu.Lock()
	r.lastErr = msg
	r.mu.Unlock()
}

func (r *recorder) SetLevel(key string, hash uint64, level shard.Level) {
	r.enter()
	defer r.inCall.Add(-1)
	if hash != shard.NameHash(key) {
		r.fail(fmt.Sprintf("key %q: hash %x", key, hash))
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.changes++
	if level == 1 {
		delete(r.levels, key)
	} else {
		r.levels[key] = level
	}
	r.maxKeys = max(r.maxKeys, len(r.levels))
}

func (r *recorder) SetInstances(n int) {
	r.enter()
	defer r.inCall.Add(-1)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.insts = append(r.insts, n)
}

// level returns key's level as last told (1 if never).
func (r *recorder) level(key string) shard.Level {
	r.mu.Lock()
	defer r.mu.Unlock()
	if l, ok := r.levels[key]; ok {
		return l
	}
	return 1
}

// instances returns the last instance count told (0 if none).
func (r *recorder) instances() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.insts) == 0 {
		return 0
	}
	return r.insts[len(r.insts)-1]
}

// setLevels returns the number of SetLevel calls so far.
func (r *recorder) setLevels() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.changes
}

// has reports whether every key of want is at its level (1: not split).
func (r *recorder) has(want map[string]shard.Level) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for k, l := range want {
		got, ok := r.levels[k]
		if !ok {
			got = 1
		}
		if got != l {
			return false
		}
	}
	return true
}

// check fails t if the Handler contract was broken.
func (r *recorder) check(t *testing.T) {
	t.Helper()
	if r.errs.Load() > 0 {
		r.mu.Lock()
		defer r.mu.Unlock()
		t.Errorf("%s: %d Handler contract violations, last: %s", r.name, r.errs.Load(), r.lastErr)
	}
}

// spec is a coordinator for a test: its Config, and the servers its
// connection dials (several for a cluster) with options added to dial's, or
// the connection to use.
type spec struct {
	Config
	urls     []string
	dialOpts []nats.Option
	conn     *nats.Conn
}

// onClock returns testConfig on clock c (Config.Now).
func onClock(c *testkit.Clock, id string, urls ...string) spec {
	s := testConfig(id, urls...)
	s.Now = c.Now
	return s
}

// testConfig returns a config with short intervals for tests, on a clock
// of its own that stands still: its leases lapse and its peers die only in
// tests that give it a clock they move.
func testConfig(id string, urls ...string) spec {
	return spec{Config: Config{
		ID:        id,
		TTL:       300 * time.Millisecond,
		Heartbeat: 50 * time.Millisecond,
		Now:       testkit.NewClock().Now,
	}, urls: urls}
}

// dial connects to the servers at urls as a coordinator's connection is
// meant to be made (NewNATS), reconnecting quickly, with opts applied last;
// it is closed at cleanup, after the coordinators started later are.
func dial(t *testing.T, urls []string, opts ...nats.Option) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(strings.Join(urls, ","), append([]nats.Option{
		nats.MaxReconnects(-1), nats.ReconnectWait(50 * time.Millisecond),
		nats.ReconnectBufSize(-1), nats.NoEcho(),
		// Start flushes its subscriptions within this: a loaded machine
		// may take longer than the 2 s default.
		nats.Timeout(10 * time.Second),
	}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// newCoord builds a coordinator for s, on s.conn or else a connection
// dialed to s.urls, failing t if NewNATS refuses it.
func newCoord(t *testing.T, s spec) *NATS {
	t.Helper()
	nc := s.conn
	if nc == nil {
		nc = dial(t, s.urls, s.dialOpts...)
	}
	c, err := NewNATS(nc, s.Config)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// announceKeys has c announce n keys (prefix + i, at levels 4, 16 and 64 in
// turn) and waits until its recorder r applies them. It returns the levels.
func announceKeys(t *testing.T, c *NATS, r *recorder, prefix string, n int) map[string]shard.Level {
	t.Helper()
	want := make(map[string]shard.Level, n)
	for i := range n {
		k := prefix + strconv.Itoa(i)
		want[k] = levels[i%3]
		c.Announce(k, shard.NameHash(k), want[k])
	}
	testkit.For(t, patience, "applying its own", func() bool { return r.has(want) })
	return want
}

// unstarted builds a coordinator for cfg that tests never start, on an
// unconnected connection it never uses.
func unstarted(t *testing.T, cfg Config) *NATS {
	t.Helper()
	c, err := NewNATS(new(nats.Conn), cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// startCoord builds a coordinator for cfg (newCoord) and starts it
// reporting to a new recorder; cleanup closes it and checks the recorder.
func startCoord(t *testing.T, cfg spec) (*NATS, *recorder) {
	t.Helper()
	c := newCoord(t, cfg)
	r := newRecorder(cfg.ID)
	if err := c.Start(r); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closeCoord(t, c, r) })
	return c, r
}

// closeCoord closes c and marks r so later Handler calls are errors.
func closeCoord(t *testing.T, c *NATS, r *recorder) {
	t.Helper()
	if err := c.Close(); err != nil {
		t.Error(err)
	}
	r.closed.Store(true)
	r.check(t)
}

// patience bounds every wait for an event: what takes milliseconds on an
// idle machine may take seconds on a loaded one.
const patience = testkit.Patience

// startServer starts a standalone server, shut down at cleanup.
func startServer(t *testing.T, opts natsserver.Options) *natsserver.Server {
	t.Helper()
	s, err := natsserver.Start(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Shutdown)
	return s
}

// startCluster starts a routed cluster, closed at cleanup.
func startCluster(t *testing.T, n int) *natsserver.Cluster {
	t.Helper()
	c, err := natsserver.StartCluster(n, natsserver.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}
