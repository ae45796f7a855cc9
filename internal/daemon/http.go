package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/hotkeyd/hotkey"
)

// routes returns the HTTP API: decisions and health only. What lists keys
// or the rules is on the admin listener (adminRoutes).
func (d *Daemon) routes() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/v1/allow", d.tracer.http("/v1/allow", timedHTTP(d.reqs.api(apiHTTP), d.handleAllow)))
	auth := d.tracer.http("/v1/auth", timedHTTP(d.reqs.api(apiAuth), d.handleAuth))
	mux.Handle("/v1/auth", auth)
	mux.Handle("/v1/auth/{policy}", auth)
	mux.HandleFunc("/healthz", get(handleHealth))
	mux.HandleFunc("/readyz", get(d.handleReady))
	moved := func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, fmt.Sprintf("%s is not served here: it moved to the admin listener, %s", truncate(r.URL.Path, 100), flagName("admin-listen")))
	}
	for _, p := range []string{"/metrics", "/v1/hotkeys", "/v1/config", "/v1/reset", "/debug/pprof/"} {
		mux.HandleFunc(p, moved)
	}
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, fmt.Sprintf("no such endpoint %s: the API is POST /v1/allow, /v1/auth/{policy} (forward auth, any method), GET /healthz, /readyz; /metrics, /v1/hotkeys and /v1/config are on the admin listener, %s", truncate(r.URL.Path, 100), flagName("admin-listen")))
	})
	return mux
}

// get allows only GET and HEAD to h.
func get(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			writeError(w, http.StatusMethodNotAllowed, fmt.Sprintf("method %s not allowed on %s: use GET", r.Method, r.URL.Path))
			return
		}
		h(w, r)
	}
}

// writeJSON writes v as JSON with status; it returns the status written.
func writeJSON(w http.ResponseWriter, status int, v any) int {
	b, err := json.Marshal(v)
	if err != nil { // not with the types written here
		status, b = http.StatusInternalServerError, []byte(`{"error":"encoding the response failed"}`)
	}
	return writeBody(w, status, append(b, '\n'))
}

// writeError writes msg as an ErrorResponse with status; it returns the
// status written.
func writeError(w http.ResponseWriter, status int, msg string) int {
	return writeJSON(w, status, ErrorResponse{Error: msg})
}

// handleAllow is POST /v1/allow; it returns the status it wrote.
func (d *Daemon) handleAllow(w http.ResponseWriter, r *http.Request) int {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", "POST")
		return writeError(w, http.StatusMethodNotAllowed, fmt.Sprintf("method %s not allowed on /v1/allow: use POST with a JSON body like %s", r.Method, exampleBody))
	}
	buf := getBuf()
	defer putBuf(buf)
	body, err := readBody(*buf, http.MaxBytesReader(w, r.Body, MaxBody))
	*buf = body
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return writeError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("request body over the %d bytes allowed", MaxBody))
		}
		return writeError(w, http.StatusBadRequest, "reading the request body: "+err.Error())
	}
	req, batch, ae := DecodeAllowBody(body)
	if ae != nil {
		return writeError(w, ae.Status, ae.Msg)
	}
	if batch != nil {
		// 200 with an answer per request, and no rate-limit headers: no
		// one decision for them to describe.
		return writeJSON(w, http.StatusOK, d.decideBatch(r.Context(), batch))
	}
	resp, p, res, ae := d.decide(r.Context(), req)
	if ae != nil {
		return writeError(w, ae.Status, ae.Msg)
	}
	hotkey.SetHeaders(w.Header(), p, res, time.Now()) // the X-RateLimit-*, RateLimit-Policy, RateLimit and, if denied, Retry-After headers
	*buf = appendAllowResponse((*buf)[:0], resp)
	return writeBody(w, allowStatus(res.Allowed), *buf)
}

// readBody appends what r reads to b, until EOF: b grown, and the error
// of a read that failed.
func readBody(b []byte, r io.Reader) ([]byte, error) {
	for {
		if len(b) == cap(b) {
			b = append(b, 0)[:len(b)]
		}
		n, err := r.Read(b[len(b):cap(b)])
		b = b[:len(b)+n]
		if err == io.EOF {
			return b, nil
		}
		if err != nil {
			return b, err
		}
	}
}

// HotKey is one entry of GET /v1/hotkeys: a policy's counter for a key.
type HotKey struct {
	Policy      string `json:"policy"`
	Key         string `json:"key"`
	Level       int    `json:"level"`
	ExpiresInMs int64  `json:"expires_in_ms"`
	Origin      string `json:"origin"`
}

// HotKeys is the body of GET /v1/hotkeys.
type HotKeys struct {
	Peers   int      `json:"peers"`
	HotKeys []HotKey `json:"hotkeys"`
}

func (d *Daemon) handleHotKeys(w http.ResponseWriter, r *http.Request) {
	hot := d.engine.HotKeys()
	out := HotKeys{Peers: max(0, d.engine.Stats().Instances-1), HotKeys: make([]HotKey, 0, len(hot))}
	for _, h := range hot {
		if d.coord == nil { // --nats none: levels this daemon set, with no lease
			h.Origin = d.id
		}
		out.HotKeys = append(out.HotKeys, HotKey{Policy: h.Policy, Key: h.Key, Level: int(h.Level), ExpiresInMs: ceilDiv(h.ExpiresIn, time.Millisecond), Origin: h.Origin})
	}
	writeJSON(w, http.StatusOK, out)
}

// Readiness is the body of GET /readyz.
type Readiness struct {
	// Status is "ready", "degraded" (answering, but by each policy's
	// on_store_failure or without agreeing hot keys: Reason says why) or
	// "draining" (shutting down: no longer taking decisions).
	Status string `json:"status"`
	Reason string `json:"reason,omitempty"`
	// Warnings say what works but not as a deployment would want.
	Warnings []string `json:"warnings,omitempty"`
}

// handleReady is GET /readyz: 200 while the daemon answers decisions,
// degraded or not, 503 once it drains. With ?strict=true a degraded
// daemon answers 503 too, for deployments that would rather take it out
// of a load balancer on a store outage than have it decide by fallbacks.
func (d *Daemon) handleReady(w http.ResponseWriter, r *http.Request) {
	strict := false
	if v := r.URL.Query().Get("strict"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("strict=%q: want true or false", truncate(v, 100)))
			return
		}
		strict = b
	}
	if d.draining.Load() {
		writeJSON(w, http.StatusServiceUnavailable, Readiness{Status: "draining", Reason: "shutting down: decisions in flight finish, new ones go to other daemons"})
		return
	}
	warnings := d.warnings()
	if reasons := d.degraded(r.Context()); len(reasons) > 0 {
		status := http.StatusOK
		if strict {
			status = http.StatusServiceUnavailable
		}
		writeJSON(w, status, Readiness{Status: "degraded", Reason: strings.Join(reasons, "; "), Warnings: warnings})
		return
	}
	writeJSON(w, http.StatusOK, Readiness{Status: "ready", Warnings: warnings})
}

// warnings are /readyz's: daemons on memory counters that share NATS
// with policies other than sync: gossip; sync: gossip policies with
// --nats none; an embedded NATS server with routes configured and none up,
// or gateways configured and some down.
func (d *Daemon) warnings() []string {
	var w []string
	if n, apart := d.engine.Stats().Instances, d.rules.Load().apart; d.redis == nil && n > 1 && len(apart) > 0 {
		w = append(w, fmt.Sprintf("%d daemons share NATS but each keeps the counters of %s in memory, apart from the others': requests spread over them (hotkey.allow's queue group, a load balancer) are counted apart, so a key may be admitted up to %d times its limit; give them one store with --redis, --redis-cluster or --redis-sentinel, or give those policies sync: gossip to share their counts over NATS",
			n, plural(apart, "policy ", "policies "), n))
	}
	if gossip := d.rules.Load().gossip; len(gossip) > 0 && d.nc == nil {
		// A daemon run alone on purpose: nothing to reach, so not degraded.
		w = append(w, "with "+flagName("nats")+" none, "+gossipAlone(gossip))
	}
	if d.ns != nil && len(d.cfg.NATSRoutes) > 0 && d.ns.Server().NumRoutes() == 0 {
		w = append(w, "no route of the embedded NATS server to the other daemons' (--nats-routes) is up: this daemon agrees hot keys with none of them; check their addresses, that they run, and that they share --nats-user/--nats-password")
	}
	if down := d.gatewaysDown(); len(down) > 0 {
		w = append(w, fmt.Sprintf("no gateway of the embedded NATS server is up to %s of --nats-gateways: NATS messages do not cross to it; check the addresses, that the region runs, and that it shares --nats-user/--nats-password or --nats-token",
			plural(down, "region ", "regions ")))
	}
	return w
}

// gossipAlone says what deciding the sync: gossip policies (or rules)
// named by gossip without peers means.
func gossipAlone(gossip []string) string {
	return fmt.Sprintf("this daemon decides the sync: gossip %s on its own counts alone, so each daemon admits a key's limit by itself and a key may be admitted up to N times its limit across N daemons",
		plural(gossip, "policy ", "policies "))
}

// degraded says why the store or the coordinator is not usable now, if it
// is not: decisions are then made by each policy's on_store_failure,
// without agreeing hot keys with other daemons, or, for sync: gossip
// policies, on this daemon's counts alone.
func (d *Daemon) degraded(ctx context.Context) []string {
	var reasons []string
	if gossip := d.rules.Load().gossip; len(gossip) > 0 && d.nc != nil {
		if st := d.nc.Status(); st != nats.CONNECTED {
			reasons = append(reasons, fmt.Sprintf("NATS connection %s: %s", strings.ToLower(st.String()), gossipAlone(gossip)))
		}
	}
	if d.nc != nil { // with --nats none, hot keys are this daemon's alone to agree
		if st := d.nc.Status(); st != nats.CONNECTED {
			reasons = append(reasons, fmt.Sprintf("NATS connection %s: hot keys are not agreed with other daemons", strings.ToLower(st.String())))
		} else if !d.natsSynced.Load() {
			// Connected since the last check: the server has the
			// subscriptions (hotkey.allow, the coordinator's) once it
			// answers a PING sent after them.
			if err := d.nc.FlushTimeout(pingTimeout); err != nil {
				reasons = append(reasons, "NATS subscriptions not confirmed yet: "+err.Error())
			} else {
				d.natsSynced.Store(true)
			}
		}
	}
	if d.rstore != nil {
		if err := d.rstore.Ready(); err != nil {
			reasons = append(reasons, "store not set up, decisions follow each policy's on_store_failure: "+err.Error())
		}
	}
	pingOK := true
	if d.redis != nil {
		pctx, cancel := context.WithTimeout(ctx, pingTimeout)
		err := d.redis.Ping(pctx).Err()
		cancel()
		if err != nil {
			pingOK = false
			reasons = append(reasons, "Redis PING failed: "+err.Error())
		}
	}
	if d.engine.Stats().Breaker == hotkey.BreakerOpen {
		// With no traffic an open breaker would never probe the store:
		// this decision lets it, when its probe is due.
		open := !pingOK
		if !open {
			res, err := d.engine.AllowN(ctx, readyzKey, d.readyz, 1)
			open = err != nil || res.Degraded
		}
		if open {
			reasons = append(reasons, "store circuit breaker open: decisions follow each policy's on_store_failure until a probe of the store succeeds")
		}
	}
	return reasons
}

// plural is nameList(names) after one or many: "policy a", "policies a and b".
func plural(names []string, one, many string) string {
	if len(names) == 1 {
		return one + names[0]
	}
	return many + nameList(names)
}

// slogPrinter is promhttp's error log.
type slogPrinter struct{ d *Daemon }

func (p slogPrinter) Println(v ...any) { p.d.log.Warn("metrics: " + fmt.Sprint(v...)) }
