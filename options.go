package hotkey

import (
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/hotkeyd/hotkey/coordinator"
	"github.com/hotkeyd/hotkey/detector"
	"github.com/hotkeyd/hotkey/internal/namespace"
	"github.com/hotkeyd/hotkey/shard"
)

// Option configures an Engine.
type Option func(*options) error

type options struct {
	maxKeyLen                     int
	splitAll                      shard.Level
	staticKeys                    []staticKey
	splitKeys                     map[string]shard.Level // counter name to static level, made by New from staticKeys
	minShare                      int64
	denyCache                     int
	secondChance                  bool
	selection                     shard.Selection
	clock                         func() time.Time
	monotonic                     func() time.Duration // SyncReserve's block times; nil: clock through time.Time.Sub (see withMonotonic)
	maxHotKeys                    int
	detect                        bool
	detector                      detector.Config
	coord                         coordinator.Coordinator
	levelHook                     func(key string, level shard.Level)
	transfer                      bool
	localKeys                     int
	breakerFailures               int
	breakerProbe, breakerMaxProbe time.Duration
	logger                        *slog.Logger
	registerer                    prometheus.Registerer
	reserveLease                  time.Duration
	reserveSweep                  time.Duration // see counter.ReserveConfig.Sweep
	gossipInterval                time.Duration
	regionInterval                time.Duration
	gossipRounds                  bool   // keep SyncGossip's rounds without a Gossiper (see withGossipRounds)
	region                        string // WithRegion's; empty: none
}

// DefaultMaxKeyLen is the longest key accepted by default (WithMaxKeyLen).
const DefaultMaxKeyLen = 512

const (
	defaultMinShare   = 10
	defaultDenyCache  = 1 << 16
	defaultMaxHotKeys = 10_000
	// defaultLocalKeys bounds the counters FallbackLocal keeps in memory.
	defaultLocalKeys = 1 << 20
)

func defaultOptions() options {
	return options{
		maxKeyLen:       DefaultMaxKeyLen,
		minShare:        defaultMinShare,
		denyCache:       defaultDenyCache,
		secondChance:    true,
		clock:           time.Now,
		maxHotKeys:      defaultMaxHotKeys,
		detect:          true,
		detector:        detector.DefaultConfig(),
		transfer:        true,
		localKeys:       defaultLocalKeys,
		breakerFailures: DefaultBreakerFailures,
		breakerProbe:    DefaultBreakerProbe,
		breakerMaxProbe: DefaultBreakerMaxProbe,
		logger:          slog.New(slog.DiscardHandler),
		gossipInterval:  DefaultGossipInterval,
		regionInterval:  DefaultRegionInterval,
	}
}

// DefaultGossipInterval is how often a SyncGossip policy's counts go to
// peers by default (WithGossipInterval).
const DefaultGossipInterval = 100 * time.Millisecond

// WithMaxKeyLen sets the longest key accepted, in bytes (default 512).
func WithMaxKeyLen(n int) Option {
	return func(o *options) error {
		if n <= 0 {
			return fmt.Errorf("max key length %d: must be positive", n)
		}
		o.maxKeyLen = n
		return nil
	}
}

// WithSplitKeys splits the counters of keys under p at level (4, 16 or 64),
// always: the counters AllowN charges for those keys under p, and under no
// other policy. A nil p, or one with no Name, means the keys under unnamed
// policies. New refuses a p whose Name holds '|' (ErrInvalidPolicyName) and
// a key AllowN would refuse (ErrEmptyKey, ErrKeyTooLong). A cost over one
// subcounter's share (its burst over the level) is refused: see the
// README's guarantees.
func WithSplitKeys(level shard.Level, p *Policy, keys ...string) Option {
	return func(o *options) error {
		if err := shard.CheckSplit(level); err != nil {
			return fmt.Errorf("split keys: %w", err)
		}
		var policy string
		if p != nil {
			policy = p.Name
		}
		if strings.IndexByte(policy, '|') >= 0 {
			return fmt.Errorf("split keys: %w: %q holds '|'", ErrInvalidPolicyName, policy)
		}
		for _, k := range keys {
			o.staticKeys = append(o.staticKeys, staticKey{policy, k, level})
		}
		return nil
	}
}

// staticKey is a key WithSplitKeys splits: New checks the key as a
// decision does, under the options all given.
type staticKey struct {
	policy, key string
	level       shard.Level
}

// WithMaxHotKeys caps the number of split keys tracked (default 10000).
// When more keys are hot, the table holds those of the highest level, then
// of the lowest hash, the same on every instance; the others stay unsplit
// and wait, in a bounded list, for room.
func WithMaxHotKeys(n int) Option {
	return func(o *options) error {
		if n <= 0 {
			return fmt.Errorf("max hot keys %d: must be positive", n)
		}
		o.maxHotKeys = n
		return nil
	}
}

// WithReserveLease sets how long a block leased for a SyncReserve policy
// is admitted from before its unused units go back to the store (default
// counter.DefaultLease, 100 ms). Longer leases cost fewer store calls and
// hold units longer: a token bucket may admit up to rate × lease over its
// limit, and another instance's denial lasts up to a lease.
func WithReserveLease(d time.Duration) Option {
	return func(o *options) error {
		if d <= 0 || d > time.Minute {
			return fmt.Errorf("reserve lease %v: want more than 0, at most 1m", d)
		}
		o.reserveLease = d
		return nil
	}
}

// WithGossipInterval sets how often the units SyncGossip policies
// admitted go to the coordinator's peers (default 100 ms), at least 1 ms
// and at most 1 min. A longer interval sends fewer, larger messages and
// lets the instances together admit up to (instances − 1) × rate ×
// (interval + delivery) over a key's limit.
func WithGossipInterval(d time.Duration) Option {
	return func(o *options) error {
		if d < time.Millisecond || d > time.Minute {
			return fmt.Errorf("gossip interval %v: want at least 1ms, at most 1m", d)
		}
		o.gossipInterval = d
		return nil
	}
}

// maxRegionLen bounds a region's name (WithRegion).
const maxRegionLen = namespace.Max

// WithRegion names the region this engine decides in: 1 to maxRegionLen of
// A-Z a-z 0-9 - _, one NATS subject token. Stats reports it, and the
// metrics as hotkey_region_info. It changes no decision: each region's
// engines enforce a policy's whole limit on their own store (default: no
// region).
func WithRegion(name string) Option {
	return func(o *options) error {
		if !namespace.Valid(name) {
			return fmt.Errorf("region %q: want 1 to %d of A-Z a-z 0-9 - _ (one NATS subject token: no '.', spaces or wildcards)", name, maxRegionLen)
		}
		o.region = name
		return nil
	}
}

// WithRegionInterval sets how often an engine sends the other regions the
// units it admitted under RegionsExchange policies (default
// DefaultRegionInterval, 1 s), at least 10ms and at most 1 min. The
// regions together admit up to (regions − 1) × rate × (interval + the
// slowest delivery between them) over a key's limit.
func WithRegionInterval(d time.Duration) Option {
	return func(o *options) error {
		if d < 10*time.Millisecond || d > time.Minute {
			return fmt.Errorf("region interval %v: want at least 10ms, at most 1m", d)
		}
		o.regionInterval = d
		return nil
	}
}

// WithDetector configures the hot-key detector (default
// detector.DefaultConfig(): a key is split to level 4 at 1000 requests/s, 16
// at 4000/s, 64 at 16000/s, and merged back a level after 60 s below half of
// its level's threshold). Zero fields take the defaults.
func WithDetector(cfg detector.Config) Option {
	return func(o *options) error {
		o.detect, o.detector = true, cfg
		return nil
	}
}

// WithoutDetector turns hot-key detection off: keys are split only as
// WithSplitKeys says.
func WithoutDetector() Option {
	return func(o *options) error {
		o.detect = false
		return nil
	}
}

// WithCoordinator sets how instances agree on hot keys (default: a
// coordinator.Local, this instance alone). The engine starts c in New and
// closes it in Close. With coordinator.NATS, a key the detector of any
// instance finds hot is split on all of them.
func WithCoordinator(c coordinator.Coordinator) Option {
	return func(o *options) error {
		if c == nil {
			return fmt.Errorf("coordinator: must not be nil")
		}
		o.coord = c
		return nil
	}
}

// WithLevelHook sets a function called each time the level in force of a
// key changes on this engine: 4, 16 or 64, or 1 when the key is merged back.
// It is called on the coordinator's goroutine, or on the engine's own when
// it applies a level the split table had no room for earlier; calls do not
// overlap for one key, but may for two. It must return quickly.
func WithLevelHook(f func(key string, level shard.Level)) Option {
	return func(o *options) error {
		o.levelHook = f
		return nil
	}
}

// WithLocalKeys bounds the counters FallbackLocal keeps in memory (default
// 1<<20): a full table drops expired counters only, and denies new keys
// while it holds none (see counter.MemoryConfig.MaxKeys).
func WithLocalKeys(n int) Option {
	return func(o *options) error {
		if n <= 0 {
			return fmt.Errorf("local keys %d: must be positive", n)
		}
		o.localKeys = n
		return nil
	}
}

// WithBreaker tunes the circuit breaker around the store: it opens after
// failures store calls in a row fail (default 3), then lets one call
// through to probe the store after probe (default 10 s), doubling the wait
// after each failed probe up to maxProbe (default 2 min); a good probe
// closes it.
func WithBreaker(failures int, probe, maxProbe time.Duration) Option {
	return func(o *options) error {
		if failures <= 0 || probe <= 0 || maxProbe < probe {
			return fmt.Errorf("breaker: %d failures, probe %v, max probe %v: want positive, and max ≥ probe", failures, probe, maxProbe)
		}
		o.breakerFailures, o.breakerProbe, o.breakerMaxProbe = failures, probe, maxProbe
		return nil
	}
}

// WithLogger sets where the engine logs its events: a key changing level,
// the breaker opening and closing, clock skew (default: nowhere).
func WithLogger(l *slog.Logger) Option {
	return func(o *options) error {
		if l == nil {
			return fmt.Errorf("logger: must not be nil")
		}
		o.logger = l
		return nil
	}
}

// WithMetrics registers the engine's Prometheus metrics (prefix hotkey_)
// with r; see docs/operations.md for the list. Without it the engine keeps
// none, at no cost.
func WithMetrics(r prometheus.Registerer) Option {
	return func(o *options) error {
		o.registerer = r
		return nil
	}
}
