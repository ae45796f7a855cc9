package loadgen

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
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
	// Client sends the requests; nil means a client that keeps up to 1,024
	// idle connections.
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
	if cfg.Client == nil {
		cfg.Client = pooledClient()
	}
	return &endpointTarget{u: u, cfg: cfg}, nil
}

type endpointTarget struct {
	u   *url.URL
	cfg EndpointConfig
}

func (e *endpointTarget) Decide(ctx context.Context, key string, cost int64) (Outcome, error) {
	if cost != 1 {
		return Outcome{}, fmt.Errorf("%s: cost %d: an HTTP endpoint is asked one request a decision", e.u.Redacted(), cost)
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
	b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if err != nil {
		return Outcome{}, err
	}
	out := Outcome{Quota: HeaderQuota(resp.Header)}
	switch {
	case resp.StatusCode >= 200 && resp.StatusCode < 300:
		out.Allowed = true
	case resp.StatusCode == http.StatusTooManyRequests:
	default:
		return Outcome{}, fmt.Errorf("%s %s: %s: %.200s", e.cfg.Method, e.u.Redacted(), resp.Status, bytes.TrimSpace(b))
	}
	return out, nil
}
