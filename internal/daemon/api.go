package daemon

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/hotkeyd/hotkey"
)

// MaxBody is the largest request body accepted, over HTTP and NATS.
const MaxBody = 64 << 10

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

const exampleBody = `{"policy":"default","key":"user_123","cost":1}`

// DecodeAllow parses a request body: one JSON object with the fields of
// AllowRequest and nothing else. policy defaults to "default", cost to 1.
// It checks the JSON only; the key and cost are checked by the decision.
func DecodeAllow(body []byte) (AllowRequest, error) {
	var req AllowRequest
	if len(body) > MaxBody {
		return req, errorf(http.StatusRequestEntityTooLarge, "request body is %d bytes, over the %d allowed", len(body), MaxBody)
	}
	if len(bytes.TrimSpace(body)) == 0 {
		return req, errorf(http.StatusBadRequest, "empty body: send a JSON object like %s", exampleBody)
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		return AllowRequest{}, errorf(http.StatusBadRequest, "malformed JSON body: %s; send an object like %s", jsonErrText(err), exampleBody)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return AllowRequest{}, errorf(http.StatusBadRequest, "malformed JSON body: data after the object; send one object like %s", exampleBody)
	}
	// encoding/json turns invalid UTF-8 and lone surrogate escapes into
	// U+FFFD, so that "\xff", "\xfe" and "\ud800" would all name one
	// counter: refuse them.
	if !utf8.Valid(body) {
		return AllowRequest{}, errorf(http.StatusBadRequest, "request body is not valid UTF-8: keys and policy names are text")
	}
	if strings.ContainsRune(req.Key, utf8.RuneError) && !validStrings(body) {
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
	p, ok := d.policies[req.Policy]
	if !ok {
		return AllowResponse{}, nil, hotkey.Result{}, errorf(http.StatusNotFound, "unknown policy %q: this daemon has %s", truncate(req.Policy, maxPolicyName+8), strings.Join(quoteAll(d.policies.Names()), ", "))
	}
	cost := *req.Cost
	res, err := d.engine.AllowN(ctx, req.Key, p, cost)
	if err != nil {
		return AllowResponse{}, p, res, d.decisionError(ctx, req, p, err)
	}
	if p.Unavailable(res) {
		return AllowResponse{}, p, res, errorf(http.StatusServiceUnavailable,
			"the counter store is unavailable and policy %q fails closed (on_store_failure: closed): only its allowlisted keys pass until the store is back", p.Name)
	}
	return response(res), p, res, nil
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
	}
}

// ceilDiv is d/unit rounded up, 0 for d ≤ 0.
func ceilDiv(d, unit time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + unit - 1) / unit)
}
