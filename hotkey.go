// Package hotkey is a rate-limiting engine that survives hot keys.
//
// Cold keys cost one counter in the store. A split key is spread over 4, 16
// or 64 subcounters, each enforcing its share of the limit, so one key at
// tens of thousands of requests per second no longer lands on one Redis
// counter. A decision hashes the key once; that hash feeds the split-table
// lookup, the choice of subcounter and the store's striping.
//
// Keys are split when the hot-key detector (package detector) finds them hot
// on this instance, and merged back when they cool; WithSplitKeys splits
// keys statically as well.
//
// A decision is Allow or AllowN with a *Policy: the limit, its name (the
// counter's namespace) and what to do when the store cannot answer.
package hotkey

import (
	"errors"
	"time"

	"github.com/hotkeyd/hotkey/counter"
	"github.com/hotkeyd/hotkey/shard"
)

// Limit is a rate limit; see counter.Limit.
type Limit = counter.Limit

// Algorithm names a rate-limiting algorithm; see counter.Algorithm.
type Algorithm = counter.Algorithm

// The algorithms.
const (
	TokenBucket   = counter.TokenBucket
	SlidingWindow = counter.SlidingWindow
	FixedWindow   = counter.FixedWindow
	SlidingLog    = counter.SlidingLog
)

// PerSecond returns a token-bucket limit of rate per second with a burst of rate.
func PerSecond(rate int64) Limit { return counter.PerSecond(rate) }

// PerMinute returns a token-bucket limit of rate per minute with a burst of rate.
func PerMinute(rate int64) Limit { return counter.PerMinute(rate) }

// Errors for bad input; store errors come back wrapped as the store made
// them.
var (
	ErrEmptyKey         = errors.New("empty key")
	ErrKeyTooLong       = errors.New("key too long")
	ErrClosed           = errors.New("engine closed")
	ErrNilPolicy        = errors.New("nil policy")
	ErrInvalidCost      = counter.ErrInvalidCost
	ErrCostExceedsBurst = counter.ErrCostExceedsBurst
	// ErrInvalidLimit is in every error for a policy's limit that cannot
	// be enforced (counter.ErrInvalidLimit); counter's ErrInvalidRate,
	// ErrInvalidPeriod, ErrLimitTooLarge and the like tell which field is
	// at fault.
	ErrInvalidLimit = counter.ErrInvalidLimit
	// ErrStoreUnavailable wraps the cause when the store cannot answer and
	// the fallback is FallbackError.
	ErrStoreUnavailable = errors.New("store unavailable")
	// ErrBreakerOpen is the cause while the circuit breaker is open.
	ErrBreakerOpen = errors.New("circuit breaker open")
	// ErrInvalidPolicyName: a policy's name holds '|', which separates it
	// from the key in counter names.
	ErrInvalidPolicyName = errors.New("invalid policy name")
	// ErrInvalidConfig is in every error New returns for an option it
	// refuses (errors.Is), as detector.ErrInvalidConfig is for a refused
	// detector configuration.
	ErrInvalidConfig = errors.New("invalid config")
)

// Result is the outcome of one decision.
type Result struct {
	// Allowed says the request may pass: it fit the limit, or its policy
	// is in shadow mode (see ShadowDenied).
	Allowed bool
	// ShadowDenied says the policy, in shadow mode (Policy.Shadow), would
	// have denied the request: Allowed is true, and RetryAfter is how long
	// until it would have passed.
	ShadowDenied bool
	// Limit is the key's capacity: its burst (token bucket) or rate.
	Limit int64
	// Remaining estimates how much more the key would admit now. For a split
	// key it is N × the remaining of the subcounter that decided.
	Remaining int64
	// RetryAfter is how long until a denied request could pass; 0 if
	// allowed, but for ShadowDenied.
	RetryAfter time.Duration
	// ResetAfter is how long until the counter is back to full.
	ResetAfter time.Duration
	// Shards is the number of subcounters the key was split into (1 if not).
	Shards shard.Level
	// Degraded says the store could not answer and the policy's fallback
	// decided (see Fallback).
	Degraded bool
}

// nameOf returns the name of the counter that AllowN charges for key under a
// policy named policy: policy + "|" + key, or key alone for an unnamed
// policy. A policy name must not hold '|', so that two named
// policies' counters never share a name. Under an unnamed policy, a key that
// holds '|' (say "login|bob") names the same counter as key "bob" under the
// policy "login": keep unnamed policies to keys without '|' where named ones
// are in use.
func nameOf(policy, key string) string {
	if policy == "" {
		return key
	}
	return policy + "|" + key
}
