package loadgen

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"

	"github.com/valyala/fasthttp"
)

// EndpointConfig is how an Endpoint asks. The zero value sends GET with
// no key.
type EndpointConfig struct {
	// Method is each request's method (default GET); requests have no body.
	Method string
	// KeyHeader, if set, names a header that carries the workload's key,
	// such as X-Api-Key.
	KeyHeader string
	// KeyParam, if set, names a query parameter that carries the key.
	KeyParam string
	// Client sends the requests; nil means loadgen's own client, as for
	// HTTP: HTTP/1.1 over keep-alive connections, pooled requests and
	// answers; it follows up to 10 redirects, as an http.Client does.
	Client *http.Client
}

// Endpoint decides by one request to rawURL per decision, as a client of
// any HTTP service behind a rate limit (a gateway, a proxy, a service's
// own middleware): a 2xx answer is admitted, 429 denied, and any other
// status, or no answer, an error. Each answer's rate-limit headers are its
// Quota (HeaderQuota). The cost is not sent: Decide refuses a cost other
// than 1. It returns an error if rawURL is not an absolute http or https
// URL.
func Endpoint(rawURL string, cfg EndpointConfig) (Target, error) {
	u, err := url.Parse(rawURL)
	if err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
		return nil, fmt.Errorf("loadgen: endpoint %q: want http://host[:port][/path] or https://…", rawURL)
	}
	if cfg.Method == "" {
		cfg.Method = http.MethodGet
	}
	e := &endpointTarget{u: u, cfg: cfg}
	if cfg.Client == nil {
		e.fast = newFastClient()
		e.pre, e.post = splitURL(u, cfg.KeyParam)
	}
	return e, nil
}

type endpointTarget struct {
	u         *url.URL
	cfg       EndpointConfig
	fast      *fasthttp.Client // loadgen's, if cfg has no Client
	pre, post string           // the URL sent, before and after the key's place in it
}

// splitURL returns the URL sent for u, its fragment left out, with the
// query parameter param set to a key, before and after the key: as u with
// param set by url.Values.Set and the query encoded by Encode (its keys in
// order). With param "", pre is the URL and post "".
func splitURL(u *url.URL, param string) (pre, post string) {
	c := *u
	c.Fragment, c.RawFragment = "", ""
	if param == "" {
		return c.String(), ""
	}
	q := c.Query()
	delete(q, param)
	before, after := url.Values{}, url.Values{}
	for k, v := range q {
		if k < param {
			before[k] = v
		} else {
			after[k] = v
		}
	}
	c.RawQuery, c.ForceQuery = "", false
	pre = c.String() + "?"
	if len(before) > 0 {
		pre += before.Encode() + "&"
	}
	pre += url.QueryEscape(param) + "="
	if len(after) > 0 {
		post = "&" + after.Encode()
	}
	return pre, post
}

func (e *endpointTarget) Decide(ctx context.Context, key string, cost int64) (Outcome, error) {
	if cost != 1 {
		return Outcome{}, fmt.Errorf("%s: cost %d: an HTTP endpoint is asked one request a decision", e.u.Redacted(), cost)
	}
	if e.fast != nil {
		return e.decideFast(ctx, key)
	}
	u := e.u
	if e.cfg.KeyParam != "" {
		c := *e.u
		q := c.Query()
		q.Set(e.cfg.KeyParam, key)
		c.RawQuery = q.Encode()
		u = &c
	}
	req, err := http.NewRequestWithContext(ctx, e.cfg.Method, u.String(), nil)
	if err != nil {
		return Outcome{}, err
	}
	if e.cfg.KeyHeader != "" {
		req.Header.Set(e.cfg.KeyHeader, key)
	}
	resp, err := e.cfg.Client.Do(req)
	if err != nil {
		return Outcome{}, err
	}
	defer resp.Body.Close()
	// Read to the end (a bounded part of it), so the connection is reused.
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswer))
	if err != nil {
		return Outcome{}, err
	}
	if !decided(resp.StatusCode) {
		return Outcome{}, e.statusError(resp.Status, b)
	}
	return Outcome{Allowed: resp.StatusCode != http.StatusTooManyRequests, Quota: HeaderQuota(resp.Header)}, nil
}

// decideFast is Decide on loadgen's own client.
func (e *endpointTarget) decideFast(ctx context.Context, key string) (Outcome, error) {
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	if e.cfg.KeyParam == "" {
		req.SetRequestURI(e.pre)
	} else {
		buf := bufPool.Get().(*[]byte)
		*buf = append(append(append((*buf)[:0], e.pre...), url.QueryEscape(key)...), e.post...)
		req.SetRequestURIBytes(*buf) // a copy
		bufPool.Put(buf)
	}
	req.Header.SetMethod(e.cfg.Method)
	if e.cfg.KeyHeader != "" {
		req.Header.Set(e.cfg.KeyHeader, key)
	}
	if err := doFast(ctx, e.fast, req, resp, true); err != nil {
		rawURL := e.pre
		if e.cfg.KeyParam != "" {
			rawURL += url.QueryEscape(key) + e.post
		}
		return Outcome{}, urlError(req, rawURL, err)
	}
	if code := resp.StatusCode(); !decided(code) {
		b := resp.Body()
		return Outcome{}, e.statusError(status(resp), b[:min(len(b), maxAnswer)])
	}
	q := quotaOf(func(name string) string { return string(resp.Header.Peek(name)) })
	return Outcome{Allowed: resp.StatusCode() != http.StatusTooManyRequests, Quota: q}, nil
}

// decided reports whether an endpoint's answer of status code is a
// decision: 2xx admitted, 429 denied.
func decided(code int) bool {
	return code >= 200 && code < 300 || code == http.StatusTooManyRequests
}

// statusError is the error of an answer that is no decision, of status
// line status and body b.
func (e *endpointTarget) statusError(status string, b []byte) error {
	return fmt.Errorf("%s %s: %s: %.200s", e.cfg.Method, e.u.Redacted(), status, bytes.TrimSpace(b))
}
