// The admin listener: what API clients must not reach (raw keys in
// /v1/hotkeys and /metrics, the rules, profiles), on an address of its own.

package daemon

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/hotkeyd/hotkey"
)

// adminRoutes returns the admin listener's handler: /metrics,
// /v1/hotkeys, /v1/config, /v1/reset, /healthz, /readyz and /debug/pprof/.
func (d *Daemon) adminRoutes() http.Handler {
	mux := http.NewServeMux()
	metrics := promhttp.HandlerFor(d.reg, promhttp.HandlerOpts{ErrorLog: slogPrinter{d}})
	mux.HandleFunc("/metrics", get(metrics.ServeHTTP))
	mux.HandleFunc("/v1/hotkeys", get(d.handleHotKeys))
	mux.HandleFunc("/v1/config", get(d.handleConfig))
	mux.HandleFunc("/v1/reset", d.handleReset)
	mux.HandleFunc("/healthz", get(handleHealth))
	mux.HandleFunc("/readyz", get(d.handleReady))
	// On this mux, never http.DefaultServeMux: the API must not serve them.
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, fmt.Sprintf("no such endpoint %s: the admin listener serves GET /metrics, /v1/hotkeys, /v1/config, /healthz, /readyz and /debug/pprof/, and POST /v1/reset; decisions are on %s", truncate(r.URL.Path, 100), flagName("listen")))
	})
	return mux
}

// ResetRequest is the body of POST /v1/reset: the policy and key whose
// counters to delete. Both are required.
type ResetRequest struct {
	Policy string `json:"policy"`
	Key    string `json:"key"`
}

// ResetResponse is the body of a reset done.
type ResetResponse struct {
	Policy string `json:"policy"`
	Key    string `json:"key"`
	Reset  bool   `json:"reset"`
}

const exampleReset = `{"policy":"default","key":"user_123"}`

// handleReset is POST /v1/reset: Engine.Reset of the key under the policy,
// so that the key admits its whole limit again.
func (d *Daemon) handleReset(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", "POST")
		writeError(w, http.StatusMethodNotAllowed, fmt.Sprintf("method %s not allowed on /v1/reset: use POST with a JSON body like %s", r.Method, exampleReset))
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxBody))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			writeError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("request body over the %d bytes allowed", MaxBody))
			return
		}
		writeError(w, http.StatusBadRequest, "reading the request body: "+err.Error())
		return
	}
	req, ae := DecodeReset(body)
	if ae != nil {
		writeError(w, ae.Status, ae.Msg)
		return
	}
	p, ae := d.policy(AllowRequest{Policy: req.Policy})
	if ae != nil {
		writeError(w, ae.Status, ae.Msg)
		return
	}
	switch err := d.engine.Reset(r.Context(), req.Key, p); {
	case errors.Is(err, hotkey.ErrEmptyKey):
		writeError(w, http.StatusBadRequest, fmt.Sprintf(`empty key: send a non-empty "key", e.g. %s`, exampleReset))
	case errors.Is(err, hotkey.ErrKeyTooLong):
		writeError(w, http.StatusBadRequest, fmt.Sprintf("key is %d bytes, longer than the %d allowed", len(req.Key), hotkey.DefaultMaxKeyLen))
	case errors.Is(err, hotkey.ErrClosed):
		writeError(w, http.StatusServiceUnavailable, "the daemon is shutting down: nothing was reset")
	case err != nil:
		d.log.Error("reset failed", "policy", p.Name, "err", err)
		writeError(w, http.StatusServiceUnavailable, fmt.Sprintf("reset failed, the key's counters may be left as they were: %v", err))
	default:
		writeJSON(w, http.StatusOK, ResetResponse{Policy: p.Name, Key: req.Key, Reset: true})
	}
}

// DecodeReset parses a body of POST /v1/reset: one JSON object with the
// fields of ResetRequest, both present, and nothing else, of valid UTF-8.
// A refusal is the answer to give: 400 and a message.
func DecodeReset(body []byte) (ResetRequest, *apiError) {
	var req ResetRequest
	if len(bytes.TrimSpace(body)) == 0 {
		return req, errorf(http.StatusBadRequest, "empty body: send a JSON object like %s", exampleReset)
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		text := jsonErrText(err)
		if f, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
			text = "unknown field " + f + " (the fields are policy and key)"
		}
		text = strings.Replace(text, "daemon.ResetRequest", "an object", 1)
		return ResetRequest{}, errorf(http.StatusBadRequest, "malformed JSON body: %s; send an object like %s", text, exampleReset)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return ResetRequest{}, errorf(http.StatusBadRequest, "malformed JSON body: data after the object; send one object like %s", exampleReset)
	}
	if !utf8.Valid(body) || strings.ContainsRune(req.Key, utf8.RuneError) && !validStrings(body) {
		return ResetRequest{}, errorf(http.StatusBadRequest, "request body is not valid UTF-8 text: keys and policy names are text")
	}
	if req.Policy == "" {
		return ResetRequest{}, errorf(http.StatusBadRequest, `no policy: a reset names one, e.g. %s`, exampleReset)
	}
	return req, nil
}

// handleHealth is GET /healthz: 200 while the process serves.
func handleHealth(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

// ConfigDump is the body of GET /v1/config: the rules in force. It holds
// no flag values, so no password or token.
type ConfigDump struct {
	// Generation counts the loads of the rules: 1 at start, one more for
	// each reload that put new rules in force.
	Generation uint64 `json:"generation"`
	// LoadedAt is when the rules in force were read (RFC 3339).
	LoadedAt time.Time `json:"loaded_at"`
	// PoliciesFrom and EnvoyConfigFrom are --policies and --envoy-config;
	// empty when not given.
	PoliciesFrom    string `json:"policies_from,omitempty"`
	EnvoyConfigFrom string `json:"envoy_config_from,omitempty"`
	// Policies are by name, sorted.
	Policies []PolicyDump `json:"policies"`
	// EnvoyRules are the rate-limit service's rules, as Rules orders them.
	EnvoyRules []EnvoyRuleDump `json:"envoy_rules,omitempty"`
}

// PolicyDump is one policy of a ConfigDump.
type PolicyDump struct {
	Name           string   `json:"name"`
	Algorithm      string   `json:"algorithm"`
	Rate           int64    `json:"rate"`
	Period         string   `json:"period"`
	Burst          int64    `json:"burst,omitempty"`
	OnStoreFailure string   `json:"on_store_failure"`
	Allowlist      []string `json:"allowlist,omitempty"`
	Sync           string   `json:"sync"`
	// Regions is what the limit means across regions, when it is not
	// independent: exchange or shares.
	Regions string `json:"regions,omitempty"`
	// Shadow says the policy admits every request (shadow: true, or
	// --shadow).
	Shadow bool `json:"shadow,omitempty"`
	// File and Line are where the policy is defined; empty for the
	// built-in default.
	File string `json:"file,omitempty"`
	Line int    `json:"line,omitempty"`
}

// EnvoyRuleDump is one rule of the Envoy rate-limit configuration.
type EnvoyRuleDump struct {
	Domain          string `json:"domain"`
	Path            string `json:"path"`
	File            string `json:"file"`
	Line            int    `json:"line"`
	Unlimited       bool   `json:"unlimited,omitempty"`
	RequestsPerUnit uint32 `json:"requests_per_unit"`
	Unit            string `json:"unit,omitempty"`
	Multiplier      uint32 `json:"unit_multiplier,omitempty"`
	ShadowMode      bool   `json:"shadow_mode,omitempty"`
	// Policy names the counters' namespace; empty when no counting is
	// needed (unlimited, or 0 requests per unit).
	Policy string `json:"policy,omitempty"`
	// Sync is the counters' sync mode; empty when Policy is.
	Sync string `json:"sync,omitempty"`
}

// handleConfig is GET /v1/config.
func (d *Daemon) handleConfig(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, d.rules.Load().dump(d.cfg))
}

// dump describes r, loaded as cfg says.
func (r *rules) dump(cfg Config) ConfigDump {
	out := ConfigDump{Generation: r.generation, LoadedAt: r.loadedAt.UTC(), PoliciesFrom: cfg.Policies, EnvoyConfigFrom: cfg.EnvoyConfig}
	for _, name := range r.policies.Names() {
		p := r.policies[name]
		o := r.origins[name]
		out.Policies = append(out.Policies, PolicyDump{Name: name, Algorithm: p.Limit.Algorithm.String(), Rate: p.Limit.Rate, Period: p.Limit.Period.String(),
			Burst: p.Limit.Burst, OnStoreFailure: p.OnStoreFailure.String(), Allowlist: p.Allowlist, Sync: p.Sync.String(), Regions: regionsDump(p.Regions), Shadow: p.Shadow, File: o.file, Line: o.line})
	}
	if r.envoy != nil {
		for _, rule := range r.envoy.Rules() {
			rd := EnvoyRuleDump{Domain: rule.Domain, Path: rule.Path, File: rule.File, Line: rule.Line, Unlimited: rule.Unlimited,
				RequestsPerUnit: rule.RequestsPerUnit, Multiplier: rule.Multiplier, ShadowMode: rule.ShadowMode, Policy: policyName(rule.Policy)}
			if !rule.Unlimited {
				rd.Unit = rule.Unit.String()
			}
			if rule.Policy != nil {
				rd.Sync = rule.Policy.Sync.String()
			}
			out.EnvoyRules = append(out.EnvoyRules, rd)
		}
	}
	return out
}

// listenAdmin listens on --admin-listen; it does nothing when the flag is
// empty.
func (d *Daemon) listenAdmin() error {
	if d.cfg.AdminListen == "" {
		return nil
	}
	ln, err := net.Listen("tcp", d.cfg.AdminListen)
	if err != nil {
		return listenError("admin", d.cfg.AdminListen, "admin-listen", err)
	}
	d.adminLn = ln
	return nil
}

// serveAdmin serves adminRoutes on the admin listener, if any, until
// Shutdown; a server that stops on its own is reported on Failed.
func (d *Daemon) serveAdmin() {
	if d.adminLn == nil {
		return
	}
	d.adminSrv = &http.Server{
		Handler:           d.adminRoutes(),
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		// pprof's profile and trace take 30 s by default.
		WriteTimeout: 2 * time.Minute,
		IdleTimeout:  2 * time.Minute,
		ErrorLog:     slog.NewLogLogger(d.log.Handler(), slog.LevelDebug),
	}
	go func() {
		if err := d.adminSrv.Serve(d.adminLn); err != nil && !errors.Is(err, http.ErrServerClosed) {
			select {
			case d.failed <- fmt.Errorf("admin: %w", err):
			default:
			}
		}
	}()
}

// stopAdmin stops the admin server: it stops accepting, finishes the
// requests in flight until ctx is done, then closes what is left.
func (d *Daemon) stopAdmin(ctx context.Context) error {
	if d.adminSrv == nil {
		return nil
	}
	if err := d.adminSrv.Shutdown(ctx); err != nil {
		d.adminSrv.Close()
		return fmt.Errorf("admin HTTP: %w", err)
	}
	return nil
}

// AdminAddr returns the admin listen address, or "" when it is off.
func (d *Daemon) AdminAddr() string {
	if d.adminLn == nil {
		return ""
	}
	return d.adminLn.Addr().String()
}

// regionsDump is m's name in a PolicyDump: empty for independent.
func regionsDump(m hotkey.RegionMode) string {
	if m == hotkey.RegionsIndependent {
		return ""
	}
	return m.String()
}
