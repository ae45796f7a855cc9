// Forward auth: /v1/auth/{policy}, the endpoint that a gateway's
// sub-request (NGINX auth_request, Traefik ForwardAuth, Caddy
// forward_auth) asks before it lets a request through.

package daemon

import (
	"fmt"
	"net/http"
	"net/netip"
	"net/textproto"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/hotkeyd/hotkey"
)

// PolicyHeader names the policy of a forward-auth request whose path names
// none (/v1/auth).
const PolicyHeader = "X-Hotkey-Policy"

// DefaultAuthTrustedProxies are the peers whose X-Forwarded-For, X-Real-IP
// and Forwarded headers forward auth believes by default: loopback.
const DefaultAuthTrustedProxies = "127.0.0.0/8,::1/128"

// The values of --auth-missing-key: what forward auth does with a request
// that carries none of the --auth-key-header headers.
const (
	MissingKeyReject        = "reject"         // answer 400 (or ?missing_key_status)
	MissingKeyClientAddress = "client-address" // key it by its client address
)

// Prefixes of forward auth's counter keys, so that a header's value never
// names an address's counter.
const (
	authKeyPrefix  = "key:"
	authAddrPrefix = "ip:"
)

// authConfig is how forward auth finds a request's key.
type authConfig struct {
	// headers are the key headers, canonical, in order: the first present
	// with a value wins. None: every request is keyed by its address.
	headers []string
	// byAddress keys a request that carries none of headers by its client
	// address; false answers it missingKey.
	byAddress bool
	// trusted are the peers whose forwarding headers are believed.
	trusted []netip.Prefix
}

// authConfig is the forward-auth part of c.
func (c *Config) authConfig() authConfig {
	return authConfig{headers: c.AuthKeyHeaders, byAddress: c.AuthMissingKey == MissingKeyClientAddress, trusted: c.AuthTrustedProxies}
}

// handleAuth is /v1/auth/{policy} and /v1/auth, with any method: one unit
// of the policy for the request's key. Allowed: 200; denied: 429, or
// ?deny_status; no key, or a key header repeated or holding a list: 400,
// or ?missing_key_status. It returns the status it wrote.
func (d *Daemon) handleAuth(w http.ResponseWriter, r *http.Request) int {
	q := r.URL.Query()
	denyStatus, ae := statusParam(q.Get("deny_status"), "deny_status", http.StatusTooManyRequests, http.StatusUnauthorized, http.StatusForbidden, http.StatusTooManyRequests)
	if ae != nil {
		return writeError(w, ae.Status, ae.Msg)
	}
	missingStatus, ae := statusParam(q.Get("missing_key_status"), "missing_key_status", http.StatusBadRequest, http.StatusBadRequest, http.StatusUnauthorized, http.StatusForbidden)
	if ae != nil {
		return writeError(w, ae.Status, ae.Msg)
	}
	name := r.PathValue("policy")
	if name == "" {
		if name = r.Header.Get(PolicyHeader); name == "" {
			name = DefaultPolicy
		}
	}
	p, ae := d.policy(AllowRequest{Policy: name})
	if ae != nil {
		return writeError(w, ae.Status, ae.Msg)
	}
	key, missing, ae := authKey(r, d.cfg.authConfig())
	if ae != nil {
		if missing {
			ae.Status = missingStatus
		}
		return writeError(w, ae.Status, ae.Msg)
	}
	one := int64(1)
	req := AllowRequest{Policy: name, Key: key, Cost: &one}
	res, err := d.engine.AllowN(r.Context(), key, p, one)
	resp, ae := d.answer(r.Context(), req, p, res, err)
	if ae != nil {
		return writeError(w, ae.Status, ae.Msg)
	}
	hotkey.SetHeaders(w.Header(), p, res, time.Now())
	status := http.StatusOK
	if !resp.Allowed {
		status = denyStatus
	}
	return writeJSON(w, status, resp)
}

// statusParam parses the query parameter name of value v: def if empty,
// else one of allowed.
func statusParam(v, name string, def int, allowed ...int) (int, *apiError) {
	if v == "" {
		return def, nil
	}
	n, err := strconv.Atoi(v)
	for _, a := range allowed {
		if err == nil && n == a {
			return n, nil
		}
	}
	want := make([]string, len(allowed))
	for i, a := range allowed {
		want[i] = strconv.Itoa(a)
	}
	return 0, errorf(http.StatusBadRequest, "%s=%q: want %s", name, truncate(v, 20), strings.Join(want, ", "))
}

// authKey is the counter key of r under cfg: "key:" and the value of the
// first of cfg.headers it carries with a value, or "ip:" and its client
// address. missing reports that ae is the missing-key answer: r carries
// none of cfg.headers while they alone key, or the first it carries comes
// more than once or holds a comma-separated list. A gateway passes such a
// header on as it came, and the backend may read another of its values
// than the one charged, so it is refused even when the address could key.
func authKey(r *http.Request, cfg authConfig) (key string, missing bool, ae *apiError) {
	for _, h := range cfg.headers {
		vs := r.Header.Values(h)
		switch {
		case len(vs) > 1:
			return "", true, errorf(http.StatusBadRequest, "no rate-limit key: %s (%s) comes %d times: send it once, with one key", h, flagName("auth-key-header"), len(vs))
		case len(vs) == 0 || vs[0] == "":
			continue
		case strings.IndexByte(vs[0], ',') >= 0:
			return "", true, errorf(http.StatusBadRequest, "no rate-limit key: %s (%s) holds a list (a comma): send one key, which has no comma", h, flagName("auth-key-header"))
		}
		return authKeyPrefix + vs[0], false, nil
	}
	if len(cfg.headers) > 0 && !cfg.byAddress {
		return "", true, errorf(http.StatusBadRequest, "no rate-limit key: the request carries none of the headers %s (%s)", strings.Join(cfg.headers, ", "), flagName("auth-key-header"))
	}
	addr, ae := clientAddr(r, cfg.trusted)
	if ae != nil {
		return "", false, ae
	}
	return authAddrPrefix + addr.String(), false, nil
}

// clientAddr is the address of the client r comes from: its TCP peer's,
// unless that peer is in trusted, when the forwarding headers name the
// client: X-Forwarded-For read from the right, past the trusted proxies
// that appended to it; without it X-Real-IP; without either, the last
// "for=" of Forwarded. Headers from an untrusted peer are ignored: anyone
// can write them.
func clientAddr(r *http.Request, trusted []netip.Prefix) (netip.Addr, *apiError) {
	peer, err := netip.ParseAddrPort(r.RemoteAddr)
	if err != nil {
		a, aerr := netip.ParseAddr(r.RemoteAddr)
		if aerr != nil {
			return netip.Addr{}, errorf(http.StatusBadRequest, "no client address: the connection's peer %q is no IP address", truncate(r.RemoteAddr, 64))
		}
		peer = netip.AddrPortFrom(a, 0)
	}
	addr := peer.Addr().Unmap()
	if !isTrusted(addr, trusted) {
		return addr, nil
	}
	if xff := r.Header.Values("X-Forwarded-For"); len(xff) > 0 {
		hops := strings.Split(strings.Join(xff, ","), ",")
		for i := len(hops) - 1; i >= 0; i-- {
			hop, ae := forwardedAddr(hops[i], "X-Forwarded-For")
			if ae != nil {
				return netip.Addr{}, ae
			}
			addr = hop
			if !isTrusted(hop, trusted) {
				break
			}
		}
		return addr, nil
	}
	if v := r.Header.Get("X-Real-IP"); v != "" {
		return forwardedAddr(v, "X-Real-IP")
	}
	if fwd := r.Header.Values("Forwarded"); len(fwd) > 0 {
		var last string
		for _, elem := range strings.Split(strings.Join(fwd, ","), ",") {
			for _, pair := range strings.Split(elem, ";") {
				k, v, ok := strings.Cut(strings.TrimSpace(pair), "=")
				if ok && strings.EqualFold(k, "for") {
					last = strings.Trim(v, `"`)
				}
			}
		}
		if last != "" {
			return forwardedAddr(last, "Forwarded")
		}
	}
	return addr, nil
}

// forwardedAddr parses one address of a forwarding header: an IP, with or
// without a port, IPv6 perhaps in brackets.
func forwardedAddr(s, header string) (netip.Addr, *apiError) {
	s = strings.TrimSpace(s)
	if a, err := netip.ParseAddr(s); err == nil {
		return a.Unmap(), nil
	}
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return ap.Addr().Unmap(), nil
	}
	if a, err := netip.ParseAddr(strings.TrimSuffix(strings.TrimPrefix(s, "["), "]")); err == nil {
		return a.Unmap(), nil
	}
	return netip.Addr{}, errorf(http.StatusBadRequest, "%s from a trusted proxy holds %q, which is no IP address", header, truncate(s, 64))
}

func isTrusted(a netip.Addr, trusted []netip.Prefix) bool {
	for _, p := range trusted {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// headerListFlag is --auth-key-header: header names, comma-separated, the
// flag repeatable; each canonical, once.
type headerListFlag []string

func (f *headerListFlag) String() string { return strings.Join(*f, ",") }

func (f *headerListFlag) Set(s string) error {
	for _, h := range strings.Split(s, ",") {
		if h = strings.TrimSpace(h); h == "" {
			continue
		}
		if !validHeaderName(h) {
			return fmt.Errorf("%q is no header name", truncate(h, 64))
		}
		h = textproto.CanonicalMIMEHeaderKey(h)
		if !slices.Contains(*f, h) {
			*f = append(*f, h)
		}
	}
	return nil
}

// validHeaderName reports whether h is an HTTP token (RFC 9110).
func validHeaderName(h string) bool {
	if h == "" || len(h) > 256 {
		return false
	}
	for _, c := range []byte(h) {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0) {
			return false
		}
	}
	return true
}

// prefixListFlag is --auth-trusted-proxies: CIDRs, or single addresses,
// comma-separated; an empty value trusts none.
type prefixListFlag []netip.Prefix

func (f *prefixListFlag) String() string {
	s := make([]string, len(*f))
	for i, p := range *f {
		s[i] = p.String()
	}
	return strings.Join(s, ",")
}

func (f *prefixListFlag) Set(s string) error {
	var ps []netip.Prefix
	for _, c := range strings.Split(s, ",") {
		if c = strings.TrimSpace(c); c == "" {
			continue
		}
		p, err := netip.ParsePrefix(c)
		if err != nil {
			a, aerr := netip.ParseAddr(c)
			if aerr != nil {
				return fmt.Errorf("%q is no CIDR (e.g. 10.0.0.0/8) nor IP address", truncate(c, 64))
			}
			p = netip.PrefixFrom(a, a.BitLen())
		}
		ps = append(ps, p.Masked())
	}
	*f = ps
	return nil
}

// missingKeyFlag is --auth-missing-key.
type missingKeyFlag string

func (f *missingKeyFlag) String() string { return string(*f) }

func (f *missingKeyFlag) Set(s string) error {
	if s != MissingKeyReject && s != MissingKeyClientAddress {
		return fmt.Errorf("want %s or %s", MissingKeyReject, MissingKeyClientAddress)
	}
	*f = missingKeyFlag(s)
	return nil
}
