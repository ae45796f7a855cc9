package loadgen

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/valyala/fasthttp"

	"github.com/hotkeyd/hotkey/internal/namespace"
)

// decision is the part of hotkeyd's answer a run reads.
type decision struct {
	Allowed      bool  `json:"allowed"`
	Shards       int   `json:"shards"`
	Limit        int64 `json:"limit"`
	Remaining    int64 `json:"remaining"`
	ResetAfterMs int64 `json:"reset_after_ms"`
	RetryAfterMs int64 `json:"retry_after_ms"`
}

func (d *decision) outcome() Outcome {
	return Outcome{Allowed: d.Allowed, Shards: d.Shards, Quota: Quota{
		Reported: d.Limit > 0, Limit: d.Limit, Remaining: d.Remaining,
		ResetAfter: time.Duration(d.ResetAfterMs) * time.Millisecond, RetryAfter: time.Duration(d.RetryAfterMs) * time.Millisecond,
	}}
}

// request is hotkeyd's request body.
type request struct {
	Policy string `json:"policy,omitempty"`
	Key    string `json:"key"`
	Cost   int64  `json:"cost"`
}

// HTTP decides on a hotkeyd's POST /v1/allow at base (http://host:port or
// https://), under the named policy ("" for the daemon's default). client
// nil means loadgen's own client: HTTP/1.1 (never HTTP/2) over keep-alive
// connections, one per request in flight, each request and answer pooled,
// so that the client spends little of the CPU it shares with what it
// measures; it verifies TLS against the system's roots and reads no proxy
// from the environment; an answer's body longer than 16 MiB is an error.
// A client given (for HTTP/2, a proxy, a CA or a client certificate) sends
// every request.
func HTTP(base, policy string, client *http.Client) Target {
	t := &httpTarget{url: strings.TrimRight(base, "/") + "/v1/allow", policy: policy, client: client}
	t.req, t.err = http.NewRequest(http.MethodPost, t.url, nil)
	if client == nil {
		t.fast = newFastClient()
	}
	return t
}

type httpTarget struct {
	url, policy string
	client      *http.Client     // the caller's, if given
	fast        *fasthttp.Client // loadgen's, if none was given
	req         *http.Request    // what each request copies, nil if err
	err         error            // the URL's
}

func (h *httpTarget) Decide(ctx context.Context, key string, cost int64) (Outcome, error) {
	if h.err != nil {
		return Outcome{}, h.err
	}
	if h.fast != nil {
		return h.decideFast(ctx, key, cost)
	}
	// The transport may read the body after Do returns: it is not reused.
	body := new(requestBody)
	body.data = appendRequest(body.buf[:0], request{Policy: h.policy, Key: key, Cost: cost})
	body.Reset(body.data)
	req := h.req.WithContext(ctx)
	// GetBody lets the transport send the request again on another
	// connection when an idle one turns out closed.
	req.Body, req.GetBody, req.ContentLength = body, body.again, int64(len(body.data))
	req.Header = http.Header{"Content-Type": {"application/json"}}
	resp, err := h.client.Do(req)
	if err != nil {
		return Outcome{}, err
	}
	defer resp.Body.Close()
	buf := bufPool.Get().(*[]byte)
	defer bufPool.Put(buf)
	b, err := readAnswer((*buf)[:0], resp.Body)
	*buf = b
	if err != nil {
		return Outcome{}, err
	}
	if resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusTooManyRequests {
		return Outcome{}, fmt.Errorf("%s: %s: %s", h.url, resp.Status, bytes.TrimSpace(b))
	}
	d, err := parseDecision(b)
	if err != nil {
		return Outcome{}, fmt.Errorf("%s: %s: %w", h.url, resp.Status, err)
	}
	return d.outcome(), nil
}

// decideFast is Decide on loadgen's own client.
func (h *httpTarget) decideFast(ctx context.Context, key string, cost int64) (Outcome, error) {
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI(h.url)
	req.Header.SetMethod(http.MethodPost)
	req.Header.SetContentType("application/json")
	buf := bufPool.Get().(*[]byte)
	*buf = appendRequest((*buf)[:0], request{Policy: h.policy, Key: key, Cost: cost})
	req.SetBody(*buf) // a copy
	bufPool.Put(buf)
	if err := doFast(ctx, h.fast, req, resp, false); err != nil {
		return Outcome{}, urlError(req, h.url, err)
	}
	b := resp.Body()
	b = b[:min(len(b), maxAnswer)]
	if code := resp.StatusCode(); code != http.StatusOK && code != http.StatusTooManyRequests {
		return Outcome{}, fmt.Errorf("%s: %s: %s", h.url, status(resp), bytes.TrimSpace(b))
	}
	d, err := parseDecision(b)
	if err != nil {
		return Outcome{}, fmt.Errorf("%s: %s: %w", h.url, status(resp), err)
	}
	return d.outcome(), nil
}

// requestBody is a request's body, its bytes in the same allocation for
// the common keys.
type requestBody struct {
	bytes.Reader
	data []byte // all of it
	buf  [128]byte
}

func (*requestBody) Close() error { return nil }

// again is the body to send again, from its start.
func (b *requestBody) again() (io.ReadCloser, error) {
	c := &requestBody{data: b.data}
	c.Reset(c.data)
	return c, nil
}

// maxAnswer is the most of an answer read.
const maxAnswer = 64 << 10

// readAnswer appends to b what r reads until EOF or maxAnswer bytes.
func readAnswer(b []byte, r io.Reader) ([]byte, error) {
	for len(b) < maxAnswer {
		if len(b) == cap(b) {
			b = append(b, 0)[:len(b)]
		}
		n, err := r.Read(b[len(b):min(cap(b), maxAnswer)])
		b = b[:len(b)+n]
		if err == io.EOF {
			return b, nil
		}
		if err != nil {
			return b, err
		}
	}
	return b, nil
}

// Subject is the NATS subject hotkeyd answers decisions on in the default
// namespace.
const Subject = namespace.DefaultAllowSubject

// NATS decides by requests on hotkeyd's NATS subject (Subject) over nc,
// under the named policy ("" for the daemon's default). It is shorthand for
// NATSNamespace(nc, "default", policy).
func NATS(nc *nats.Conn, policy string) Target {
	return NATSNamespace(nc, namespace.Default, policy)
}

// NATSNamespace decides by requests over nc on the subject hotkeyd answers
// in namespace ns (its --namespace: hotkey.allow for "default",
// hotkey.<ns>.api.allow for others), under the named policy ("" for the
// daemon's default). With no daemon of ns on the NATS, Decide fails with an
// error that wraps nats.ErrNoResponders and names ns.
func NATSNamespace(nc *nats.Conn, ns, policy string) Target {
	return &natsTarget{nc: nc, ns: ns, subject: namespace.AllowSubject(ns), policy: policy}
}

type natsTarget struct {
	nc                  *nats.Conn
	ns, subject, policy string
}

func (n *natsTarget) Decide(ctx context.Context, key string, cost int64) (Outcome, error) {
	buf := bufPool.Get().(*[]byte)
	defer bufPool.Put(buf)
	*buf = appendRequest((*buf)[:0], request{Policy: n.policy, Key: key, Cost: cost})
	// The request is published, copied, before RequestWithContext returns.
	msg, err := n.nc.RequestWithContext(ctx, n.subject, *buf)
	if errors.Is(err, nats.ErrNoResponders) {
		return Outcome{}, fmt.Errorf("%s: %w: no hotkeyd of namespace %q on this NATS (a daemon's --namespace names the subject it answers on)", n.subject, err, n.ns)
	}
	if err != nil {
		return Outcome{}, err
	}
	if code := msg.Header.Get("Nats-Service-Error-Code"); code != "" {
		return Outcome{}, fmt.Errorf("%s: %s %s", n.subject, code, msg.Header.Get("Nats-Service-Error"))
	}
	d, err := parseDecision(msg.Data)
	if err != nil {
		return Outcome{}, fmt.Errorf("%s: %w", n.subject, err)
	}
	return d.outcome(), nil
}
