package loadgen

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"time"

	rlpb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"

	"github.com/hotkeyd/hotkey/internal/rlswire"
)

// KeyPlaceholder is replaced by the workload's key in the descriptor values
// of an Envoy target.
const KeyPlaceholder = "{key}"

// Entry is one key and value of an Envoy rate-limit descriptor.
type Entry struct {
	Key, Value string
}

// Envoy decides by Envoy's RateLimitService.ShouldRateLimit over conn, as
// Envoy's rate-limit filter asks (envoyproxy/ratelimit, hotkeyd's
// --grpc-listen or any other): each request is of domain, with one
// descriptor per element of descriptors, and "{key}" in an entry's value
// replaced by the workload's key; its hits_addend is the cost. An overall
// OK is admitted, OVER_LIMIT denied, and anything else an error; the
// Quota is the status of the first descriptor over its limit, else of the
// one with the least remaining, that carries a current_limit, else read
// from the response_headers_to_add (as HeaderQuota). Keys and values go
// as the bytes they are, UTF-8 or not, as Envoy sends them. Envoy keeps no
// reference to descriptors; it panics if domain or descriptors is empty.
// conn is the caller's to close.
func Envoy(conn grpc.ClientConnInterface, domain string, descriptors [][]Entry) Target {
	if domain == "" || len(descriptors) == 0 {
		panic("loadgen: an Envoy target needs a domain and descriptors")
	}
	e := &envoyTarget{conn: conn, domain: domain, opts: []grpc.CallOption{grpc.ForceCodecV2(envoyCodec{})}}
	for _, d := range descriptors {
		e.descs = append(e.descs, append([]Entry(nil), d...))
		e.entries += len(d)
	}
	e.calls.New = func() any { return e.newCall() }
	return e
}

// shouldRateLimit is the method Envoy's rate-limit filter calls.
const shouldRateLimit = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"

type envoyTarget struct {
	conn    grpc.ClientConnInterface
	domain  string
	descs   [][]Entry
	entries int // in all of descs
	opts    []grpc.CallOption
	calls   sync.Pool // of *envoyCall, reused from one call to the next
}

// envoyCall is one ShouldRateLimit call: its request, which envoyCodec
// writes, and its answer, which envoyCodec reads into it.
type envoyCall struct {
	domain string
	hits   uint32
	descs  []rlswire.Descriptor // of the target's descriptors, with the call's key
	answer envoyAnswer
}

func (e *envoyTarget) newCall() *envoyCall {
	c := &envoyCall{domain: e.domain, descs: make([]rlswire.Descriptor, len(e.descs))}
	kv := make([]string, 0, 2*e.entries)
	for i, d := range e.descs {
		for _, en := range d {
			kv = append(kv, en.Key, en.Value)
		}
		c.descs[i].KV = kv[len(kv)-2*len(d) : len(kv) : len(kv)]
	}
	return c
}

// setKey sets c's descriptor values to the target's with key for "{key}":
// a value that is just "{key}", or has none, is used without a copy.
func (c *envoyCall) setKey(descs [][]Entry, key string) {
	for i, d := range descs {
		kv := c.descs[i].KV
		for j, en := range d {
			v := en.Value
			switch {
			case v == KeyPlaceholder:
				v = key
			case strings.Contains(v, KeyPlaceholder):
				v = strings.ReplaceAll(v, KeyPlaceholder, key)
			}
			kv[2*j+1] = v
		}
	}
}

func (e *envoyTarget) Decide(ctx context.Context, key string, cost int64) (Outcome, error) {
	if cost < 1 || cost > math.MaxUint32 {
		return Outcome{}, fmt.Errorf("ShouldRateLimit: cost %d: hits_addend holds 1 to %d", cost, uint32(math.MaxUint32))
	}
	c := e.calls.Get().(*envoyCall)
	defer e.calls.Put(c)
	c.hits = uint32(cost)
	c.setKey(e.descs, key)
	if err := e.conn.Invoke(ctx, shouldRateLimit, c, c, e.opts...); err != nil {
		return Outcome{}, fmt.Errorf("ShouldRateLimit: %w", err)
	}
	out := Outcome{Quota: c.answer.quota}
	switch c.answer.overall {
	case rlpb.RateLimitResponse_OK:
		out.Allowed = true
	case rlpb.RateLimitResponse_OVER_LIMIT:
	default:
		return Outcome{}, errors.New("ShouldRateLimit: overall code " + c.answer.overall.String())
	}
	return out, nil
}

// unitWindow is the window of an Envoy rate-limit unit, 0 for UNKNOWN.
func unitWindow(u rlpb.RateLimitResponse_RateLimit_Unit) time.Duration {
	switch u {
	case rlpb.RateLimitResponse_RateLimit_SECOND:
		return time.Second
	case rlpb.RateLimitResponse_RateLimit_MINUTE:
		return time.Minute
	case rlpb.RateLimitResponse_RateLimit_HOUR:
		return time.Hour
	case rlpb.RateLimitResponse_RateLimit_DAY:
		return 24 * time.Hour
	case rlpb.RateLimitResponse_RateLimit_WEEK:
		return 7 * 24 * time.Hour
	case rlpb.RateLimitResponse_RateLimit_MONTH:
		return 30 * 24 * time.Hour
	case rlpb.RateLimitResponse_RateLimit_YEAR:
		return 365 * 24 * time.Hour
	}
	return 0
}
