package loadgen

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

	"github.com/nats-io/nats.go"

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

// HTTP decides on a hotkeyd's POST /v1/allow at base (http://host:port),
// under the named policy ("" for the daemon's default). client nil means a
// client that keeps up to 1,024 idle connections to the daemon, so a run's
// senders do not open a connection per request.
func HTTP(base, policy string, client *http.Client) Target {
	if client == nil {
		client = pooledClient()
	}
	return &httpTarget{url: strings.TrimRight(base, "/") + "/v1/allow", policy: policy, client: client}
}

// pooledClient is a client that keeps up to 1,024 idle connections, so a
// run's senders do not open a connection per request.
func pooledClient() *http.Client {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConns, tr.MaxIdleConnsPerHost = 1024, 1024
	return &http.Client{Transport: tr}
}

type httpTarget struct {
	url, policy string
	client      *http.Client
}

func (h *httpTarget) Decide(ctx context.Context, key string, cost int64) (Outcome, error) {
	body, _ := json.Marshal(request{Policy: h.policy, Key: key, Cost: cost})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, h.url, bytes.NewReader(body))
	if err != nil {
		return Outcome{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := h.client.Do(req)
	if err != nil {
		return Outcome{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if err != nil {
		return Outcome{}, err
	}
	if resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusTooManyRequests {
		return Outcome{}, fmt.Errorf("%s: %s: %s", h.url, resp.Status, bytes.TrimSpace(b))
	}
	var d decision
	if err := json.Unmarshal(b, &d); err != nil {
		return Outcome{}, fmt.Errorf("%s: %s: %w", h.url, resp.Status, err)
	}
	return d.outcome(), nil
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
	body, _ := json.Marshal(request{Policy: n.policy, Key: key, Cost: cost})
	msg, err := n.nc.RequestWithContext(ctx, n.subject, body)
	if errors.Is(err, nats.ErrNoResponders) {
		return Outcome{}, fmt.Errorf("%s: %w: no hotkeyd of namespace %q on this NATS (a daemon's --namespace names the subject it answers on)", n.subject, err, n.ns)
	}
	if err != nil {
		return Outcome{}, err
	}
	if code := msg.Header.Get("Nats-Service-Error-Code"); code != "" {
		return Outcome{}, fmt.Errorf("%s: %s %s", n.subject, code, msg.Header.Get("Nats-Service-Error"))
	}
	var d decision
	if err := json.Unmarshal(msg.Data, &d); err != nil {
		return Outcome{}, fmt.Errorf("%s: %w", n.subject, err)
	}
	return d.outcome(), nil
}
