package daemon

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

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

const (
	exampleBody  = `{"policy":"default","key":"user_123","cost":1}`
	exampleBatch = `{"requests":[{"policy":"default","key":"user_123","cost":1},{"key":"user_456"}]}`
)

// errBatchField is decodeRequest's error for a request with a "requests"
// field: a batch, or a body mixing the two forms. Callers tell it by
// identity and answer in its stead.
var errBatchField = &apiError{Status: http.StatusBadRequest, Msg: `malformed JSON body: unknown field "requests"`}

// DecodeAllow parses a request body: one JSON object with the fields of
// AllowRequest and nothing else. policy defaults to "default", cost to 1.
// It checks the JSON only; the key and cost are checked by the decision.
// A refusal is the answer to give: a status, 400 or 413, and a message.
func DecodeAllow(body []byte) (AllowRequest, *apiError) {
	if ae := checkBody(body); ae != nil {
		return AllowRequest{}, ae
	}
	req, ae := decodeRequest(body)
	if ae == errBatchField {
		return AllowRequest{}, errorf(http.StatusBadRequest, "malformed JSON body: unknown field \"requests\" (the fields are policy, key and cost); send an object like %s", exampleBody)
	}
	return req, ae
}

// DecodeAllowBody parses a body of POST /v1/allow or hotkey.allow: one
// request, as DecodeAllow, or a batch, {"requests":[...]} with 1 to
// MaxBatch items, each decoded as DecodeAllow decodes a body. batch is nil
// for one request. A refusal is of the whole body, as DecodeAllow's.
func DecodeAllowBody(body []byte) (req AllowRequest, batch []AllowRequest, ae *apiError) {
	if ae := checkBody(body); ae != nil {
		return AllowRequest{}, nil, ae
	}
	if !opensBatch(body) {
		req, ae := decodeRequest(body)
		if ae != errBatchField {
			return req, nil, ae
		}
	}
	batch, ae = decodeBatch(body)
	return AllowRequest{}, batch, ae
}

// checkBody refuses a body over MaxBody, or empty.
func checkBody(body []byte) *apiError {
	if len(body) > MaxBody {
		return errorf(http.StatusRequestEntityTooLarge, "request body is %d bytes, over the %d allowed", len(body), MaxBody)
	}
	if len(bytes.TrimSpace(body)) == 0 {
		return errorf(http.StatusBadRequest, "empty body: send a JSON object like %s", exampleBody)
	}
	return nil
}

// opensBatch reports whether body is an object whose first field is
// "requests": a batch, decoded as one without trying the single form
// first. Other batches are found by that try.
func opensBatch(body []byte) bool {
	const field = `"requests"`
	i := skipSpace(body, 0)
	if i == len(body) || body[i] != '{' {
		return false
	}
	i = skipSpace(body, i+1)
	return len(body)-i >= len(field) && bytes.EqualFold(body[i:i+len(field)], []byte(field))
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// decodeRequest decodes one request, the whole body or an item of a batch:
// the request with its defaults, an *apiError, or errBatchField.
func decodeRequest(data []byte) (AllowRequest, *apiError) {
	var req AllowRequest
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		if isUnknownField(err, "requests") {
			return AllowRequest{}, errBatchField
		}
		return AllowRequest{}, errorf(http.StatusBadRequest, "malformed JSON body: %s; send an object like %s", jsonErrText(err), exampleBody)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return AllowRequest{}, errorf(http.StatusBadRequest, "malformed JSON body: data after the object; send one object like %s", exampleBody)
	}
	// encoding/json turns invalid UTF-8 and lone surrogate escapes into
	// U+FFFD, so that "\xff", "\xfe" and "\ud800" would all name one
	// counter: refuse them.
	if !utf8.Valid(data) {
		return AllowRequest{}, errorf(http.StatusBadRequest, "request body is not valid UTF-8: keys and policy names are text")
	}
	if strings.ContainsRune(req.Key, utf8.RuneError) && !validStrings(data) {
		return AllowRequest{}, errorf(http.StatusBadRequest, "key holds a \\u escape of a lone UTF-16 surrogate, which is no character: send the key as valid UTF-8")
	}
	if req.Policy == "" {
		req.Policy = DefaultPolicy
	}
	if req.Cost == nil {
		one := int64(1)
		req.Cost = &one
	}
	return req, nil
}

// isUnknownField reports whether err is encoding/json's refusal of the
// field name (matched as encoding/json matches names: ignoring case).
func isUnknownField(err error, name string) bool {
	s, ok := strings.CutPrefix(err.Error(), "json: unknown field ")
	if !ok {
		return false
	}
	got, uerr := strconv.Unquote(s)
	return uerr == nil && strings.EqualFold(got, name)
}

// decodeBatch decodes a body holding a "requests" field: a batch of 1 to
// MaxBatch requests and nothing else.
func decodeBatch(body []byte) ([]AllowRequest, *apiError) {
	var b struct {
		Requests []json.RawMessage `json:"requests"`
		// The fields of the single form, to refuse a body mixing both.
		Policy json.RawMessage `json:"policy"`
		Key    json.RawMessage `json:"key"`
		Cost   json.RawMessage `json:"cost"`
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&b); err != nil {
		msg := jsonErrText(err)
		if strings.HasPrefix(msg, "unknown field ") {
			msg = strings.TrimPrefix(err.Error(), "json: ") + ` (a batch has the one field "requests")`
		}
		return nil, errorf(http.StatusBadRequest, "malformed JSON body: %s; send a batch like %s", msg, exampleBatch)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, errorf(http.StatusBadRequest, "malformed JSON body: data after the object; send one object like %s", exampleBatch)
	}
	var mixed []string
	for _, f := range []struct {
		name string
		v    json.RawMessage
	}{{"policy", b.Policy}, {"key", b.Key}, {"cost", b.Cost}} {
		if f.v != nil {
			mixed = append(mixed, `"`+f.name+`"`)
		}
	}
	if len(mixed) > 0 {
		return nil, errorf(http.StatusBadRequest, `body mixes a batch ("requests") with the fields of one request (%s): send either one request like %s or a batch like %s`, strings.Join(mixed, ", "), exampleBody, exampleBatch)
	}
	switch n := len(b.Requests); {
	case n == 0:
		return nil, errorf(http.StatusBadRequest, `empty batch: "requests" must hold 1 to %d requests, like %s`, MaxBatch, exampleBatch)
	case n > MaxBatch:
		return nil, errorf(http.StatusBadRequest, "batch of %d requests, over the %d allowed: split it into batches of at most %d", n, MaxBatch, MaxBatch)
	}
	reqs := make([]AllowRequest, len(b.Requests))
	for i, raw := range b.Requests {
		req, ae := decodeRequest(raw)
		switch {
		case ae == errBatchField:
			return nil, errorf(http.StatusBadRequest, "requests[%d]: a batch cannot hold a batch: send requests like %s", i, exampleBody)
		case ae != nil:
			return nil, errorf(ae.Status, "requests[%d]: %s", i, ae.Msg)
		}
		reqs[i] = req
	}
	// The items are valid UTF-8: the rest must be too.
	if !utf8.Valid(body) {
		return nil, errorf(http.StatusBadRequest, "request body is not valid UTF-8: keys and policy names are text")
	}
	return reqs, nil
}

// validStrings reports whether no string of the JSON document body (valid
// UTF-8) holds a \u escape of a UTF-16 surrogate that is not half of a
// pair: encoding/json decodes such an escape as U+FFFD, so two keys that
// differ only there would name one counter.
func validStrings(body []byte) bool {
	hex4 := func(b []byte) (rune, bool) {
		if len(b) < 4 {
			return 0, false
		}
		var r rune
		for _, c := range b[:4] {
			switch {
			case '0' <= c && c <= '9':
				r = r<<4 | rune(c-'0')
			case 'a' <= c && c <= 'f':
				r = r<<4 | rune(c-'a'+10)
			case 'A' <= c && c <= 'F':
				r = r<<4 | rune(c-'A'+10)
			default:
				return 0, false
			}
		}
		return r, true
	}
	inString := false
	for i := 0; i < len(body); i++ {
		switch c := body[i]; {
		case c == '"':
			inString = !inString
		case c == '\\' && inString && i+1 < len(body):
			if body[i+1] != 'u' {
				i++ // a one-character escape
				continue
			}
			r, ok := hex4(body[i+2:])
			if !ok {
				return false
			}
			i += 5
			switch {
			case r >= 0xDC00 && r <= 0xDFFF:
				return false // a low surrogate with no high one before it
			case r >= 0xD800 && r <= 0xDBFF:
				if i+6 >= len(body) || body[i+1] != '\\' || body[i+2] != 'u' {
					return false
				}
				lo, ok := hex4(body[i+3:])
				if !ok || lo < 0xDC00 || lo > 0xDFFF {
					return false
				}
				i += 6
			}
		}
	}
	return true
}

// jsonErrText makes encoding/json's errors read well after "malformed JSON
// body: ".
func jsonErrText(err error) string {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		want := te.Type.String()
		switch want {
		case "int64", "*int64":
			want = "a whole number"
		case "string":
			want = "a string"
		case "daemon.AllowRequest":
			want = "an object"
		case "[]json.RawMessage":
			want = "a list of requests"
		}
		if te.Field != "" {
			return fmt.Sprintf("field %q must be %s, not a JSON %s", te.Field, want, te.Value)
		}
		return fmt.Sprintf("want %s, not a JSON %s", want, te.Value)
	}
	if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
		return "unexpected end of input"
	}
	s := strings.TrimPrefix(err.Error(), "json: ")
	if strings.HasPrefix(s, "unknown field ") {
		return s + " (the fields are policy, key and cost)"
	}
	return s
}

// decide runs one decision for req: the response, or an *apiError.
func (d *Daemon) decide(ctx context.Context, req AllowRequest) (AllowResponse, *hotkey.Policy, hotkey.Result, *apiError) {
	p, ae := d.policy(req)
	if ae != nil {
		return AllowResponse{}, nil, hotkey.Result{}, ae
	}
	res, err := d.engine.AllowN(ctx, req.Key, p, *req.Cost)
	resp, ae := d.answer(ctx, req, p, res, err)
	return resp, p, res, ae
}

// decideBatch decides a batch: the requests whose policy is known in one
// call to the engine, so that the store takes them together; the others
// get their 404 without it. Each request gets its own answer, in order.
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
		return errorf(http.StatusBadRequest, "cost must be at least 1, got %d (leave it out for 1)", *req.Cost)
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
	}
}

// ceilDiv is d/unit rounded up, 0 for d ≤ 0.
func ceilDiv(d, unit time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + unit - 1) / unit)
}
