package loadgen

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strings"
	"time"

	ratelimit "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlpb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
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
// from the response_headers_to_add (as HeaderQuota). Envoy keeps
// no reference to descriptors; it panics if domain or descriptors is
// empty. conn is the caller's to close.
func Envoy(conn grpc.ClientConnInterface, domain string, descriptors [][]Entry) Target {
	if domain == "" || len(descriptors) == 0 {
		panic("loadgen: an Envoy target needs a domain and descriptors")
	}
	e := &envoyTarget{client: rlpb.NewRateLimitServiceClient(conn), domain: domain}
	for _, d := range descriptors {
		e.descs = append(e.descs, append([]Entry(nil), d...))
	}
	return e
}

type envoyTarget struct {
	client rlpb.RateLimitServiceClient
	domain string
	descs  [][]Entry
}

func (e *envoyTarget) Decide(ctx context.Context, key string, cost int64) (Outcome, error) {
	if cost < 1 || cost > math.MaxUint32 {
		return Outcome{}, fmt.Errorf("ShouldRateLimit: cost %d: hits_addend holds 1 to %d", cost, uint32(math.MaxUint32))
	}
	req := &rlpb.RateLimitRequest{Domain: e.domain, HitsAddend: uint32(cost), Descriptors: make([]*ratelimit.RateLimitDescriptor, len(e.descs))}
	for i, d := range e.descs {
		entries := make([]*ratelimit.RateLimitDescriptor_Entry, len(d))
		for j, en := range d {
			entries[j] = &ratelimit.RateLimitDescriptor_Entry{Key: en.Key, Value: strings.ReplaceAll(en.Value, KeyPlaceholder, key)}
		}
		req.Descriptors[i] = &ratelimit.RateLimitDescriptor{Entries: entries}
	}
	resp, err := e.client.ShouldRateLimit(ctx, req)
	if err != nil {
		return Outcome{}, fmt.Errorf("ShouldRateLimit: %w", err)
	}
	out := Outcome{Quota: statusQuota(resp.GetStatuses())}
	if !out.Quota.Reported && len(resp.GetResponseHeadersToAdd()) > 0 {
		h := make(http.Header, len(resp.GetResponseHeadersToAdd()))
		for _, hv := range resp.GetResponseHeadersToAdd() {
			h.Add(hv.GetKey(), hv.GetValue())
		}
		out.Quota = HeaderQuota(h)
	}
	switch resp.GetOverallCode() {
	case rlpb.RateLimitResponse_OK:
		out.Allowed = true
	case rlpb.RateLimitResponse_OVER_LIMIT:
	default:
		return Outcome{}, errors.New("ShouldRateLimit: overall code " + resp.GetOverallCode().String())
	}
	return out, nil
}

// statusQuota is the Quota of the status closest to its limit among those
// with a current_limit: the first over it, else the one with the least
// remaining.
func statusQuota(statuses []*rlpb.RateLimitResponse_DescriptorStatus) Quota {
	var pick *rlpb.RateLimitResponse_DescriptorStatus
	for _, st := range statuses {
		if st.GetCurrentLimit() == nil {
			continue
		}
		if st.GetCode() == rlpb.RateLimitResponse_OVER_LIMIT {
			pick = st
			break
		}
		if pick == nil || st.GetLimitRemaining() < pick.GetLimitRemaining() {
			pick = st
		}
	}
	if pick == nil {
		return Quota{}
	}
	l := pick.GetCurrentLimit()
	return Quota{
		Reported:   true,
		Limit:      int64(l.GetRequestsPerUnit()),
		Window:     unitWindow(l.GetUnit()),
		Remaining:  int64(pick.GetLimitRemaining()),
		ResetAfter: pick.GetDurationUntilReset().AsDuration(),
	}
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
