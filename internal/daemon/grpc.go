package daemon

import (
	"context"
	"errors"
	"math"
	"strings"
	"sync"
	"time"

	rlpb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hotkeyd/hotkey"
	"github.com/hotkeyd/hotkey/counter"
	"github.com/hotkeyd/hotkey/internal/envoyconf"
)

// MaxDescriptors bounds the descriptors of one ShouldRateLimit request, as
// MaxBatch bounds a batch.
const MaxDescriptors = MaxBatch

// healthInterval is how often the gRPC health service re-reads readiness.
const healthInterval = time.Second

// rlsService is the gRPC service name of Envoy's rate-limit protocol, under
// which the health service reports too.
const rlsService = "envoy.service.ratelimit.v3.RateLimitService"

// strictService is the gRPC health service name whose status is
// NOT_SERVING while the daemon is degraded, as /readyz?strict=true.
const strictService = "hotkeyd.strict"

// rls serves envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit
// from the rules of --envoy-config.
type rls struct {
	rlpb.UnimplementedRateLimitServiceServer
	d *Daemon

	// overrides holds the rules of descriptors that carry their own limit
	// (RateLimitDescriptor.limit), by domain and limit.
	overMu    sync.RWMutex
	overrides map[overrideID]*envoyconf.Rule
}

// overrideID names the rule of a domain's descriptors that carry one limit.
type overrideID struct {
	domain     string
	rpu        uint32
	unit       envoyconf.Unit
	multiplier uint32
}

// maxOverrides bounds the rules kept for descriptors' own limits, one per
// domain and limit; past it, such a rule is built per request.
const maxOverrides = 10000

// rlsServiceDesc is RateLimitService with a handler that decodes the
// request itself (unmarshalRLSRequest), so that a value that is not UTF-8
// is counted and malformed wire data is answered InvalidArgument.
var rlsServiceDesc = grpc.ServiceDesc{
	ServiceName: rlsService,
	HandlerType: (*rlpb.RateLimitServiceServer)(nil),
	Methods:     []grpc.MethodDesc{{MethodName: "ShouldRateLimit", Handler: shouldRateLimitHandler}},
	Metadata:    "envoy/service/ratelimit/v3/rls.proto",
}

// shouldRateLimitHandler is the grpc.MethodDesc handler of
// ShouldRateLimit: it reads the request's wire data (rlsCodec), which it
// must not keep once it returns (the lean server reuses it), and decodes
// it. Without an interceptor it decides on the decoded request as it is
// and answers an *rlsAnswer, which rlsCodec encodes by hand; with one, the
// interceptor sees the protobuf messages ShouldRateLimit takes and returns.
func shouldRateLimitHandler(srv any, ctx context.Context, dec func(any) error, interceptor grpc.UnaryServerInterceptor) (any, error) {
	var w rlsWire
	if err := dec(&w); err != nil {
		return nil, err
	}
	if interceptor == nil {
		s := srv.(*rls)
		var req rlsRequest
		if err := decodeRLSWire(w.b, &req); err != nil {
			return nil, status.Error(codes.InvalidArgument, "request: "+err.Error())
		}
		a := new(rlsAnswer)
		if err := s.decide(ctx, &req, a); err != nil {
			return nil, err
		}
		return a, nil
	}
	req := &rlpb.RateLimitRequest{}
	if err := unmarshalRLSRequest(w.b, req); err != nil {
		return nil, status.Error(codes.InvalidArgument, "request: "+err.Error())
	}
	s := srv.(rlpb.RateLimitServiceServer)
	info := &grpc.UnaryServerInfo{Server: srv, FullMethod: rlpb.RateLimitService_ShouldRateLimit_FullMethodName}
	return interceptor(ctx, req, info, func(ctx context.Context, req any) (any, error) {
		return s.ShouldRateLimit(ctx, req.(*rlpb.RateLimitRequest))
	})
}

// rlsItem is what one descriptor of a request comes to.
type rlsItem struct {
	m      envoyconf.Match // m.Rule nil: no rule applies
	hits   int64
	decide int // index in the batch, -1 if no decision is asked
	// peek is the answer to a descriptor of hits 0 (not a refund) under a
	// policy: what one unit would be answered, nothing charged; peekErr
	// the engine's error.
	peek    *hotkey.Result
	peekErr error
	refund  bool // is_negative_hits
}

// ShouldRateLimit decides each descriptor of req under the rule it
// matches, as envoyproxy/ratelimit does (see docs/envoy.md): the
// descriptors with a limit go to the engine as one batch; the overall code
// is OVER_LIMIT if any descriptor is, shadow-mode and quota-mode ones
// aside. The gRPC service calls decide without the protobuf messages.
func (s *rls) ShouldRateLimit(ctx context.Context, req *rlpb.RateLimitRequest) (*rlpb.RateLimitResponse, error) {
	var a rlsAnswer
	if err := s.decide(ctx, rlsRequestOf(req), &a); err != nil {
		return nil, err
	}
	return a.proto(), nil
}

// decide is ShouldRateLimit of req, answered in a, which must be empty.
func (s *rls) decide(ctx context.Context, req *rlsRequest, a *rlsAnswer) error {
	if req.domain == "" {
		return status.Error(codes.InvalidArgument, "rate limit domain must not be empty")
	}
	descs := req.descs
	switch {
	case len(descs) == 0:
		return status.Error(codes.InvalidArgument, "rate limit descriptor list must not be empty")
	case len(descs) > MaxDescriptors:
		return status.Errorf(codes.InvalidArgument, "%d descriptors, over the %d allowed in one request", len(descs), MaxDescriptors)
	}
	cfg := s.d.rules.Load().envoy
	known := cfg != nil && cfg.HasDomain(req.domain)
	var (
		itemsBuf [1]rlsItem
		rulesBuf [1]*envoyconf.Rule
	)
	items, rules := itemsBuf[:0], rulesBuf[:0]
	if len(descs) > 1 {
		items, rules = make([]rlsItem, 0, len(descs)), make([]*envoyconf.Rule, 0, len(descs))
	}
	for i := range descs {
		desc := &descs[i]
		items = append(items, rlsItem{decide: -1})
		it := &items[i]
		switch {
		case !known:
			// An unknown domain has no limit, a descriptor's own
			// included, as in envoyproxy/ratelimit.
		case desc.limit != nil:
			it.m = s.override(req.domain, desc.entries, desc.limit)
		default:
			it.m, _ = cfg.Match(req.domain, desc.entries)
		}
		rules = append(rules, it.m.Rule)
		it.hits = max(1, int64(req.hits))
		if desc.hasHits {
			it.hits = int64(min(desc.hits, math.MaxInt64))
		}
		if desc.negative {
			it.hits, it.refund = 0, true // not supported: nothing is charged
		}
	}
	var replaced []bool // none, unless a rule replaces others
	for _, r := range rules {
		if r != nil && len(r.Replaces) > 0 {
			replaced = envoyconf.Replaced(rules)
			break
		}
	}
	var (
		reqsBuf [1]hotkey.Request
		outBuf  [1]hotkey.Decision
	)
	reqs := reqsBuf[:0]
	for i := range items {
		it := &items[i]
		if replaced != nil && replaced[i] {
			it.m.Rule = nil
		}
		r := it.m.Rule
		if r == nil || r.Policy == nil {
			continue
		}
		if it.hits == 0 {
			if !it.refund {
				// Over the limit if one unit would be refused now:
				// envoyproxy/ratelimit adds 0 and compares, and
				// answers over the limit a counter past it.
				res, err := s.d.engine.Peek(ctx, it.m.Key, r.Policy)
				it.peek, it.peekErr = &res, err
			}
			continue
		}
		if it.hits > r.Policy.Limit.Capacity() {
			continue // over the limit whatever the counter holds
		}
		it.decide = len(reqs)
		reqs = append(reqs, hotkey.Request{Key: it.m.Key, Policy: r.Policy, Cost: it.hits})
	}
	out := outBuf[:0]
	if len(reqs) > 1 {
		out = make([]hotkey.Decision, len(reqs))
	} else {
		out = out[:len(reqs)]
	}
	if len(reqs) > 0 {
		s.d.engine.AllowBatch(ctx, reqs, out)
	}

	a.overall = rlpb.RateLimitResponse_OK
	if len(items) == 1 {
		a.statuses = a.statusBuf[:1]
	} else {
		a.statuses = make([]rlsStatus, len(items))
	}
	// The headers describe the descriptor closest to its limit: the first
	// over it, else the one with the least remaining.
	var head *hotkey.Policy
	var headRes hotkey.Result
	now := time.Now()
	for i := range items {
		it := &items[i]
		st := &a.statuses[i]
		res, decided, err := s.status(it, out, st)
		if err != nil {
			return err
		}
		if !decided {
			continue
		}
		r := it.m.Rule
		over := st.code == rlpb.RateLimitResponse_OVER_LIMIT
		shadow := r.ShadowMode || s.d.cfg.Shadow
		if it.hits > 0 {
			s.d.descMetrics.count(it.m, it.hits, res, over, shadow)
		}
		if over && (shadow || r.QuotaMode) {
			st.code = rlpb.RateLimitResponse_OK
			over = false
			res.Allowed, res.RetryAfter, res.ShadowDenied = true, 0, false // its headers say OK too
		}
		if over && a.overall != rlpb.RateLimitResponse_OVER_LIMIT {
			a.overall = rlpb.RateLimitResponse_OVER_LIMIT
			head, headRes = ruleHeaderPolicy(r), res
		} else if a.overall == rlpb.RateLimitResponse_OK && (head == nil || res.Remaining < headRes.Remaining) {
			head, headRes = ruleHeaderPolicy(r), res
		}
	}
	if head != nil {
		a.setHeaders(head, headRes, now)
	}
	return nil
}

// status writes to st the descriptor status of it, given the batch's
// decisions out, and if a decision was made (one charged, a peek for hits
// 0, or refused whatever the counter holds), returns that decision: the
// headers describe it, and the metrics unless it charged nothing.
func (s *rls) status(it *rlsItem, out []hotkey.Decision, st *rlsStatus) (_ hotkey.Result, decided bool, _ error) {
	r := it.m.Rule
	switch {
	case r == nil:
		*st = rlsStatus{code: rlpb.RateLimitResponse_OK}
		return hotkey.Result{}, false, nil
	case r.Unlimited:
		*st = rlsStatus{code: rlpb.RateLimitResponse_OK, remaining: math.MaxUint32}
		return hotkey.Result{}, false, nil
	}
	if it.refund || errors.Is(it.peekErr, errors.ErrUnsupported) {
		// Nothing to charge (a refund, or a store that cannot peek): the
		// status says only the limit.
		*st = rlsStatus{code: rlpb.RateLimitResponse_OK, limit: r}
		return hotkey.Result{}, false, nil
	}
	period := r.Period()
	var res hotkey.Result
	switch {
	case it.peek != nil:
		if it.peekErr != nil {
			return res, false, decisionStatus(it.peekErr)
		}
		res = *it.peek
		if res.Allowed { // the unit the peek asked of is not charged
			res.Remaining = min(res.Remaining+1, res.Limit)
		}
	case it.decide >= 0:
		d := out[it.decide]
		if d.Err != nil {
			return res, false, decisionStatus(d.Err)
		}
		res = d.Result
	default: // requests_per_unit 0, or hits over the limit: over whatever the counter holds (hits 0 too)
		res = hotkey.Result{Limit: int64(r.RequestsPerUnit), RetryAfter: period, ResetAfter: period}
	}
	code := rlpb.RateLimitResponse_OK
	if !res.Allowed || res.ShadowDenied { // over, whatever shadow answers
		code = rlpb.RateLimitResponse_OVER_LIMIT
	}
	*st = rlsStatus{
		code:      code,
		limit:     r,
		remaining: uint32(min(max(0, res.Remaining), math.MaxUint32)),
		reset:     res.ResetAfter,
		hasReset:  true,
	}
	return res, true, nil
}

// decisionStatus is the gRPC error for a decision the engine could not
// make (bad input is refused before it reaches the engine).
func decisionStatus(err error) error {
	switch {
	case errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, err.Error())
	case errors.Is(err, context.DeadlineExceeded):
		return status.Error(codes.DeadlineExceeded, err.Error())
	case errors.Is(err, hotkey.ErrClosed):
		return status.Error(codes.Unavailable, "the daemon is shutting down: retry on another instance")
	case errors.Is(err, hotkey.ErrEmptyKey), errors.Is(err, hotkey.ErrKeyTooLong):
		return status.Error(codes.InvalidArgument, err.Error())
	}
	return status.Error(codes.Unavailable, "no decision: "+err.Error())
}

// ruleHeaderPolicy is the policy the RateLimit headers name for r.
func ruleHeaderPolicy(r *envoyconf.Rule) *hotkey.Policy {
	if r.Policy != nil {
		return r.Policy
	}
	name := envoyconf.PolicyName(r.Path)
	if r.Override {
		name = envoyconf.OverridePolicyName(r.Domain)
	}
	return &hotkey.Policy{Name: name, Limit: counter.Limit{Rate: max(1, int64(r.RequestsPerUnit)), Period: r.Period()}}
}

// override returns the match of a descriptor of domain, a domain of the
// configuration, that carries its own limit: the domain's rule of that
// limit (OverrideRule), its counter that of the limit's unit and the
// descriptor's keys and values (OverrideKey), apart from the configured
// rules' counters. Its metrics label is the domain and the descriptor's
// keys, bounded as the detailed labels are.
//
// A limit that cannot be enforced (a unit of UNKNOWN, a unit_multiplier of
// 0, a period longer than a store times exactly) is answered OVER_LIMIT, as
// requests_per_unit 0 is: refusing the request would have Envoy, by its
// default failure_mode_deny: false, admit it with every other descriptor
// uncounted.
func (s *rls) override(domain string, entries []envoyconf.Entry, ov *rlsOverride) envoyconf.Match {
	rpu, unit, multiplier := ov.rpu, ov.unit, ov.units()
	id := overrideID{domain, rpu, unit, multiplier}
	s.overMu.RLock()
	rule := s.overrides[id]
	s.overMu.RUnlock()
	if rule == nil {
		var err error
		if rule, err = envoyconf.OverrideRule(domain, rpu, unit, multiplier); err != nil {
			rule, _ = envoyconf.OverrideRule(domain, 0, unit, 1)
		}
		if rule.Policy != nil {
			rule.Policy.Shadow = s.d.cfg.Shadow
		}
		s.overMu.Lock()
		if s.overrides == nil {
			s.overrides = make(map[overrideID]*envoyconf.Rule)
		}
		if r, ok := s.overrides[id]; ok {
			rule = r
		} else if len(s.overrides) < maxOverrides {
			s.overrides[id] = rule
		}
		s.overMu.Unlock()
	}
	var label strings.Builder
	label.WriteString(domain)
	for _, e := range entries {
		label.WriteByte('.')
		label.WriteString(e.Key)
	}
	return envoyconf.Match{Rule: rule, Key: envoyconf.OverrideKey(unit, multiplier, entries), Metric: label.String()}
}
