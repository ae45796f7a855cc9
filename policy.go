package hotkey

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/hotkeyd/hotkey/counter"
)

// Fallback is what a decision does when the store cannot answer: while the
// engine's circuit breaker is open, and for a call that just failed.
type Fallback uint8

const (
	// FallbackLocal decides on a memory store in this process, at the
	// limit divided by the live instances: each instance keeps its share,
	// so together they admit about the limit (fail open, with local
	// limiting). The default.
	FallbackLocal Fallback = iota
	// FallbackOpen admits every request.
	FallbackOpen
	// FallbackClosed denies every request but those for keys on the
	// policy's allowlist.
	FallbackClosed
	// FallbackError returns the store's error, wrapped: the caller decides.
	FallbackError
	numFallbacks
)

var fallbackNames = [numFallbacks]string{"local", "open", "closed", "error"}

// String returns the fallback's name as used in configuration files.
func (f Fallback) String() string {
	if f < numFallbacks {
		return fallbackNames[f]
	}
	return fmt.Sprintf("Fallback(%d)", uint8(f))
}

// MarshalText returns the fallback's name (see String); it fails for a
// value that is not one of the Fallback constants.
func (f Fallback) MarshalText() ([]byte, error) {
	if f >= numFallbacks {
		return nil, fmt.Errorf("unknown fallback %d", uint8(f))
	}
	return []byte(fallbackNames[f]), nil
}

// UnmarshalText sets f to the fallback named text (see String), so a
// Fallback reads from encoding/json, YAML and flag.TextVar. An unknown name
// leaves f as it was.
func (f *Fallback) UnmarshalText(text []byte) error {
	for i, n := range fallbackNames {
		if n == string(text) {
			*f = Fallback(i)
			return nil
		}
	}
	return fmt.Errorf("unknown fallback: %q (want local, open, closed or error)", text)
}

// Sync is how a policy's counters are kept across the instances that share
// a store.
type Sync uint8

const (
	// SyncStore makes every decision a store call (batched on Redis): the
	// store holds the count exactly. The default.
	SyncStore Sync = iota
	// SyncReserve has each instance lease blocks of a key's units from the
	// store and admit from them locally (counter.ReserveStore): a warm key
	// costs about one store call per lease (WithReserveLease) instead of
	// one per decision. Units leave the store before they are admitted, so
	// windows hold their limit exactly; a token bucket admits at most rate
	// × lease more than one deciding each unit as it is admitted. It does
	// not keep a sliding log (see Keeps), and never splits a key. Its error is a denial
	// while units sit in another instance's block. The store must lease
	// (counter.LeaseStore: the memory and Redis stores do).
	SyncReserve
	// SyncGossip has each instance decide on a memory store of its own and
	// send its peers, every interval (WithGossipInterval, default 100 ms),
	// the units each key consumed since the last round, which they charge
	// to their own counters (gossip.Store). No store call is made. It
	// admits at most the limit plus (instances − 1) × rate × (interval +
	// one delivery), more while instances cannot reach each other; a key
	// is never split (the detector still sees it). Peers are the
	// coordinator's, if it is a coordinator.Gossiper; with none, as with
	// coordinator.Local, it is the memory store alone.
	SyncGossip
	numSyncs
)

var syncNames = [numSyncs]string{"store", "reserve", "gossip"}

// String returns the mode's name as used in configuration files.
func (s Sync) String() string {
	if s < numSyncs {
		return syncNames[s]
	}
	return fmt.Sprintf("Sync(%d)", uint8(s))
}

// MarshalText returns the mode's name (see String); it fails for a value
// that is not one of the Sync constants.
func (s Sync) MarshalText() ([]byte, error) {
	if s >= numSyncs {
		return nil, fmt.Errorf("unknown sync mode %d", uint8(s))
	}
	return []byte(syncNames[s]), nil
}

// UnmarshalText sets s to the mode named text (see String), so a Sync reads
// from encoding/json, YAML and flag.TextVar. An unknown name leaves s as it
// was.
func (s *Sync) UnmarshalText(text []byte) error {
	for i, n := range syncNames {
		if n == string(text) {
			*s = Sync(i)
			return nil
		}
	}
	return fmt.Errorf("unknown sync mode: %q (want store, reserve or gossip)", text)
}

// Keeps reports whether the mode can keep a limit of algorithm a: an
// error wrapping errors.ErrUnsupported if not. SyncReserve cannot keep a
// sliding log: a unit of a log counts from the instant it is admitted,
// which a block leased before cannot know, so a block would cost a store
// call per decision as SyncStore does, or admit more than the limit.
func (s Sync) Keeps(a Algorithm) error {
	if s == SyncReserve && a == counter.SlidingLog {
		return fmt.Errorf("sync reserve cannot keep a %v (each unit counts from the instant it is admitted, which a block leased before cannot know): use sync store, or a sliding_window: %w", a, errors.ErrUnsupported)
	}
	return nil
}

// Policy is a limit with what to do when the store fails. A Policy must not
// be changed once in use; it may be shared by goroutines and engines.
type Policy struct {
	// Name labels the policy's decisions in metrics; empty reads "default".
	Name string
	// Limit is the rate limit.
	Limit Limit
	// OnStoreFailure is the fallback while the store cannot answer; the
	// zero value is FallbackLocal.
	OnStoreFailure Fallback
	// Allowlist holds keys that FallbackClosed still admits.
	Allowlist []string
	// Sync is how the policy's counters are kept across instances; the
	// zero value is SyncStore.
	Sync Sync
	// Regions is what the limit means across regions (WithRegion); the
	// zero value is RegionsIndependent. A policy with RegionsExchange
	// needs a Name, by which the regions know it, and an engine that
	// exchanges with other regions.
	Regions RegionMode
	// Shadow admits every request: decisions are made and charged as
	// usual, but one the policy would deny is answered Allowed, with
	// Result.ShadowDenied set, and counted as shadow_denied. A shadowed
	// denial charges what a denial does: nothing but its own usage stays
	// out, so the counters hold what a live policy's would.
	Shadow bool

	once  sync.Once
	allow map[string]struct{}
	known atomic.Pointer[checked] // as a decision last found it valid
}

// checked is a policy's limit and name as a decision found them: the
// limit valid, with its capacity, and whether the name may name counters.
type checked struct {
	lim      Limit
	name     string
	capacity int64
	nameOK   bool
}

// check validates p's limit, once for as long as p's limit and name stay
// what they were, and returns what it found.
func (p *Policy) check() (*checked, error) {
	if c := p.known.Load(); c != nil && c.lim == p.Limit && c.name == p.Name {
		return c, nil
	}
	if err := p.Limit.Validate(); err != nil {
		return nil, err
	}
	c := &checked{lim: p.Limit, name: p.Name, capacity: p.Limit.Capacity(), nameOK: strings.IndexByte(p.Name, '|') < 0}
	p.known.Store(c)
	return c, nil
}

// allowlisted reports whether key is on the policy's allowlist.
func (p *Policy) allowlisted(key string) bool {
	if p == nil || len(p.Allowlist) == 0 {
		return false
	}
	p.once.Do(func() {
		p.allow = make(map[string]struct{}, len(p.Allowlist))
		for _, k := range p.Allowlist {
			p.allow[k] = struct{}{}
		}
	})
	_, ok := p.allow[key]
	return ok
}

// name returns the policy's metrics label.
func (p *Policy) name() string {
	if p == nil || p.Name == "" {
		return "default"
	}
	return p.Name
}

// shadowed is r under p: for a Shadow policy, a denial turned into an
// admission that says it would have been denied.
func (p *Policy) shadowed(r Result) Result {
	if p.Shadow && !r.Allowed {
		r.Allowed, r.ShadowDenied = true, true
	}
	return r
}

// Unavailable reports whether r denies only because the store could not
// answer and p fails closed (FallbackClosed): the service is unavailable
// (HTTP 503) rather than the key over its limit (429).
func (p *Policy) Unavailable(r Result) bool {
	return r.Degraded && !r.Allowed && p.OnStoreFailure == FallbackClosed
}
