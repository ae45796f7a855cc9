package daemon

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/hotkeyd/hotkey"
)

// MaxBody is the largest request body accepted, over HTTP and NATS: room
// for a full batch of long keys, and NATS's default max payload.
const MaxBody = 1 << 20

// MaxBatch is the most requests a batch holds.
const MaxBatch = 1000

// AllowRequest is the body of POST /v1/allow and of a request on
// hotkey.allow.
type AllowRequest struct {
	Policy string `json:"policy"`
	Key    string `json:"key"`
	Cost   *int64 `json:"cost"`
}

// AllowResponse is the body of a decision, allowed (200) or denied (429).
type AllowResponse struct {
	Allowed      bool  `json:"allowed"`
	Limit        int64 `json:"limit"`
	Remaining    int64 `json:"remaining"`
	ResetAfterMs int64 `json:"reset_after_ms"`
	RetryAfterMs int64 `json:"retry_after_ms"`
	Shards       int   `json:"shards"`
	// Degraded says the store could not answer and the policy's
	// on_store_failure decided.
	Degraded bool `json:"degraded"`
	// ShadowDenied says the policy, in shadow mode, would have denied the
	// request: it is allowed (200); absent when not.
	ShadowDenied bool `json:"shadow_denied,omitempty"`
}

// BatchRequest is the body of a batch: {"requests":[...]}, each item an
// AllowRequest.
type BatchRequest struct {
	Requests []AllowRequest `json:"requests"`
}

// BatchItem is the answer to one request of a batch: Status 200 (allowed)
// or 429 (denied) with the fields of AllowResponse, or the status of an
// error (4xx, 503) with the message the request alone would have had.
type BatchItem struct {
	Status int `json:"status"`
	*AllowResponse
	Error string `json:"error,omitempty"`
}

// BatchResponse is the body of the answer to a batch: an item per request,
// in order.
type BatchResponse struct {
	Responses []BatchItem `json:"responses"`
}

// ErrorResponse is the body of every error.
type ErrorResponse struct {
	Error string `json:"error"`
}

// apiError is an error answered with Status and Msg.
type apiError struct {
	Status int
	Msg    string
}

func (e *apiError) Error() string { return e.Msg }

func errorf(status int, format string, args ...any) *apiError {
	return &apiError{Status: status, Msg: fmt.Sprintf(format, args...)}
}

// decide runs one decision for req: the response, or an *apiError.
func (d *Daemon) decide(ctx context.Context, req AllowRequest) (AllowResponse, *hotkey.Policy, hotkey.Result, *apiError) {
	p, ae := d.policy(req)
	if ae != nil {
		return AllowResponse{}, nil, hotkey.Result{}, ae
	}
	res, err := d.allowOrPeek(ctx, req.Key, p, *req.Cost)
	resp, ae := d.answer(ctx, req, p, res, err)
	return resp, p, res, ae
}

// allowOrPeek is the engine's answer to cost units of key under p: a
// decision, or for a cost of 0 a Peek, which answers as a decision of one
// unit would and charges nothing.
func (d *Daemon) allowOrPeek(ctx context.Context, key string, p *hotkey.Policy, cost int64) (hotkey.Result, error) {
	if cost == 0 {
		return d.engine.Peek(ctx, key, p)
	}
	return d.engine.AllowN(ctx, key, p, cost)
}

// decideBatch decides a batch: the requests whose policy is known in one
// call to the engine, so that the store takes them together, but for those
// of cost 0, peeked one by one; the others get their 404 without it. Each
// request gets its own answer, in order.
func (d *Daemon) decideBatch(ctx context.Context, reqs []AllowRequest) BatchResponse {
	items := make([]BatchItem, len(reqs))
	resps := make([]AllowResponse, len(reqs))
	ereqs := make([]hotkey.Request, 0, len(reqs))
	at := make([]int, 0, len(reqs)) // ereqs[j] is reqs[at[j]]
	rs := d.rules.Load()
	for i, req := range reqs {
		p, ok := rs.policies[req.Policy]
		if !ok {
			ae := unknownPolicy(req.Policy, rs.known)
			items[i] = BatchItem{Status: ae.Status, Error: ae.Msg}
			continue
		}
		if *req.Cost == 0 {
			res, err := d.engine.Peek(ctx, req.Key, p)
			resp, ae := d.answer(ctx, req, p, res, err)
			if ae != nil {
				items[i] = BatchItem{Status: ae.Status, Error: ae.Msg}
				continue
			}
			resps[i] = resp
			items[i] = BatchItem{Status: allowStatus(resp.Allowed), AllowResponse: &resps[i]}
			continue
		}
		ereqs = append(ereqs, hotkey.Request{Key: req.Key, Policy: p, Cost: *req.Cost})
		at = append(at, i)
	}
	if len(ereqs) > 0 {
		out := make([]hotkey.Decision, len(ereqs))
		d.engine.AllowBatch(ctx, ereqs, out)
		for j, dec := range out {
			i := at[j]
			resp, ae := d.answer(ctx, reqs[i], ereqs[j].Policy, dec.Result, dec.Err)
			if ae != nil {
				items[i] = BatchItem{Status: ae.Status, Error: ae.Msg}
				continue
			}
			resps[i] = resp
			items[i] = BatchItem{Status: allowStatus(resp.Allowed), AllowResponse: &resps[i]}
		}
	}
	return BatchResponse{Responses: items}
}

// policy is req's policy, or the 404 of an unknown one.
func (d *Daemon) policy(req AllowRequest) (*hotkey.Policy, *apiError) {
	rs := d.rules.Load()
	p, ok := rs.policies[req.Policy]
	if !ok {
		return nil, unknownPolicy(req.Policy, rs.known)
	}
	return p, nil
}

// unknownPolicy is the 404 of a policy not among known.
func unknownPolicy(name, known string) *apiError {
	return errorf(http.StatusNotFound, "unknown policy %q: this daemon has %s", truncate(name, maxPolicyName+8), known)
}

// answer maps the engine's answer to req under p, res and err as AllowN
// returns them, to the response or an *apiError.
func (d *Daemon) answer(ctx context.Context, req AllowRequest, p *hotkey.Policy, res hotkey.Result, err error) (AllowResponse, *apiError) {
	if err != nil {
		return AllowResponse{}, d.decisionError(ctx, req, p, err)
	}
	if p.Unavailable(res) {
		return AllowResponse{}, errorf(http.StatusServiceUnavailable,
			"the counter store is unavailable and policy %q fails closed (on_store_failure: closed): only its allowlisted keys pass until the store is back", p.Name)
	}
	return response(res), nil
}

// allowStatus is the HTTP status of a decision: 200 allowed, 429 denied.
func allowStatus(allowed bool) int {
	if allowed {
		return http.StatusOK
	}
	return http.StatusTooManyRequests
}

func (d *Daemon) decisionError(ctx context.Context, req AllowRequest, p *hotkey.Policy, err error) *apiError {
	capacity := p.Limit.Capacity()
	switch {
	case errors.Is(err, hotkey.ErrEmptyKey):
		return errorf(http.StatusBadRequest, `empty key: send a non-empty "key", e.g. %s`, exampleBody)
	case errors.Is(err, hotkey.ErrKeyTooLong):
		return errorf(http.StatusBadRequest, "key is %d bytes, longer than the %d allowed", len(req.Key), hotkey.DefaultMaxKeyLen)
	case errors.Is(err, hotkey.ErrInvalidCost):
		return errorf(http.StatusBadRequest, "cost must not be negative, got %d (leave it out for 1; 0 answers without charging)", *req.Cost)
	case errors.Is(err, hotkey.ErrCostExceedsBurst):
		what := "limit"
		if p.Limit.Algorithm == hotkey.TokenBucket {
			what = "burst"
		}
		return errorf(http.StatusBadRequest, "cost %d is over policy %q's %s of %d: no request of that cost can ever pass", *req.Cost, p.Name, what, capacity)
	case errors.Is(err, hotkey.ErrClosed):
		return errorf(http.StatusServiceUnavailable, "the daemon is shutting down: retry on another instance")
	case ctx.Err() != nil:
		return errorf(http.StatusServiceUnavailable, "request cancelled before a decision: %v", ctx.Err())
	}
	d.log.Error("decision failed", "policy", p.Name, "err", err)
	return errorf(http.StatusServiceUnavailable, "no decision: %v", err)
}

func quoteAll(ss []string) []string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = fmt.Sprintf("%q", s)
	}
	return out
}

func response(r hotkey.Result) AllowResponse {
	return AllowResponse{
		Allowed:      r.Allowed,
		Limit:        r.Limit,
		Remaining:    max(0, r.Remaining),
		ResetAfterMs: ceilDiv(r.ResetAfter, time.Millisecond),
		RetryAfterMs: ceilDiv(r.RetryAfter, time.Millisecond),
		Shards:       int(r.Shards),
		Degraded:     r.Degraded,
		ShadowDenied: r.ShadowDenied,
	}
}

// ceilDiv is d/unit rounded up, 0 for d ≤ 0.
func ceilDiv(d, unit time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + unit - 1) / unit)
}
