package daemon

import (
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
)

// TestAuthKey: a request's key is the first configured header it carries
// with a value, else, when allowed, its client address; a request without
// one while headers alone key gets the missing-key answer.
func TestAuthKey(t *testing.T) {
	headers := []string{"X-Api-Key", "Authorization"}
	for _, tt := range []struct {
		name        string
		cfg         authConfig
		give        map[string]string
		want        string
		wantMissing bool
	}{
		{"first header", authConfig{headers: headers}, map[string]string{"X-Api-Key": "k1", "Authorization": "Bearer t"}, "key:k1", false},
		{"second header", authConfig{headers: headers}, map[string]string{"Authorization": "Bearer t"}, "key:Bearer t", false},
		{"empty value skipped", authConfig{headers: headers}, map[string]string{"X-Api-Key": "", "Authorization": "b"}, "key:b", false},
		{"none present", authConfig{headers: headers}, nil, "", true},
		{"none present, by address", authConfig{headers: headers, byAddress: true}, nil, "ip:192.0.2.1", false},
		{"no header configured", authConfig{}, map[string]string{"X-Api-Key": "k1"}, "ip:192.0.2.1", false},
		{"value naming an address", authConfig{headers: headers, byAddress: true}, map[string]string{"X-Api-Key": "ip:192.0.2.1"}, "key:ip:192.0.2.1", false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := httptest.NewRequest(http.MethodGet, "/v1/auth/default", nil) // RemoteAddr 192.0.2.1:1234
			for k, v := range tt.give {
				r.Header.Set(k, v)
			}
			got, missing, ae := authKey(r, tt.cfg)
			if got != tt.want || missing != tt.wantMissing || (ae != nil) != tt.wantMissing {
				t.Errorf("authKey = %q, missing %v, %v; want %q, missing %v", got, missing, ae, tt.want, tt.wantMissing)
			}
			if ae != nil && (ae.Status != http.StatusBadRequest || !strings.Contains(ae.Msg, "X-Api-Key, Authorization")) {
				t.Errorf("missing key: %d %q, want 400 naming the headers", ae.Status, ae.Msg)
			}
		})
	}
}

// TestAuthKeyOneValue: the header that keys a request must come once with
// one value. A header repeated (as separate lines, or joined into a list
// with commas by a proxy) is refused with the missing-key answer, whatever
// its values and even when keying by address is allowed: the backend may
// read another of its values than the one charged.
func TestAuthKeyOneValue(t *testing.T) {
	headers := []string{"X-Api-Key", "Authorization"}
	for _, tt := range []struct {
		name    string
		cfg     authConfig
		give    [][2]string
		want    string // the key, or the start of the refusal's message
		refused bool
	}{
		{"repeated", authConfig{headers: headers}, [][2]string{{"X-Api-Key", "victim"}, {"X-Api-Key", "attacker"}}, "X-Api-Key (--auth-key-header (HOTKEYD_AUTH_KEY_HEADER)) comes 2 times", true},
		{"repeated, same value", authConfig{headers: headers}, [][2]string{{"X-Api-Key", "victim"}, {"X-Api-Key", "victim"}}, "X-Api-Key (--auth-key-header (HOTKEYD_AUTH_KEY_HEADER)) comes 2 times", true},
		{"repeated, first empty", authConfig{headers: headers}, [][2]string{{"X-Api-Key", ""}, {"X-Api-Key", "attacker"}, {"Authorization", "b"}}, "X-Api-Key (--auth-key-header (HOTKEYD_AUTH_KEY_HEADER)) comes 2 times", true},
		{"joined into a list", authConfig{headers: headers}, [][2]string{{"X-Api-Key", "victim, attacker"}}, "X-Api-Key (--auth-key-header (HOTKEYD_AUTH_KEY_HEADER)) holds a list", true},
		{"a comma alone", authConfig{headers: headers}, [][2]string{{"X-Api-Key", ","}}, "X-Api-Key (--auth-key-header (HOTKEYD_AUTH_KEY_HEADER)) holds a list", true},
		{"second header repeated", authConfig{headers: headers}, [][2]string{{"Authorization", "a"}, {"Authorization", "b"}}, "Authorization (--auth-key-header (HOTKEYD_AUTH_KEY_HEADER)) comes 2 times", true},
		{"repeated, by address allowed", authConfig{headers: headers, byAddress: true}, [][2]string{{"X-Api-Key", "victim"}, {"X-Api-Key", "attacker"}}, "X-Api-Key (--auth-key-header (HOTKEYD_AUTH_KEY_HEADER)) comes 2 times", true},
		{"list, by address allowed", authConfig{headers: headers, byAddress: true}, [][2]string{{"X-Api-Key", "victim,attacker"}}, "X-Api-Key (--auth-key-header (HOTKEYD_AUTH_KEY_HEADER)) holds a list", true},
		{"the header in force once, a later one repeated", authConfig{headers: headers}, [][2]string{{"X-Api-Key", "k1"}, {"Authorization", "a"}, {"Authorization", "b"}}, "key:k1", false},
		{"not a key header, repeated", authConfig{headers: headers}, [][2]string{{"X-Other", "a"}, {"X-Other", "b"}, {"X-Api-Key", "k1"}}, "key:k1", false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := httptest.NewRequest(http.MethodGet, "/v1/auth/default", nil)
			for _, h := range tt.give {
				r.Header.Add(h[0], h[1])
			}
			got, missing, ae := authKey(r, tt.cfg)
			if !tt.refused {
				if got != tt.want || missing || ae != nil {
					t.Errorf("authKey = %q, missing %v, %v; want %q", got, missing, ae, tt.want)
				}
				return
			}
			if ae == nil || !missing || got != "" {
				t.Fatalf("authKey = %q, missing %v, %v; want the missing-key answer", got, missing, ae)
			}
			if ae.Status != http.StatusBadRequest || !strings.HasPrefix(ae.Msg, "no rate-limit key: "+tt.want) {
				t.Errorf("refusal %d %q, want 400 %q", ae.Status, ae.Msg, tt.want)
			}
		})
	}
}

// TestAuthClientAddr: the forwarding headers name the client only when the
// TCP peer is a trusted proxy; X-Forwarded-For is read from the right, past
// the trusted proxies, so that what a client wrote to its left is never
// believed.
func TestAuthClientAddr(t *testing.T) {
	trusted := []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("::1/128"), netip.MustParsePrefix("10.0.0.0/8")}
	for _, tt := range []struct {
		name    string
		peer    string
		headers [][2]string
		want    string // an address, or the start of the 400's message
	}{
		{"untrusted peer", "203.0.113.7:5000", nil, "203.0.113.7"},
		{"forged X-Forwarded-For from an untrusted peer", "203.0.113.7:5000", [][2]string{{"X-Forwarded-For", "198.51.100.1"}}, "203.0.113.7"},
		{"forged X-Real-IP from an untrusted peer", "203.0.113.7:5000", [][2]string{{"X-Real-IP", "198.51.100.1"}}, "203.0.113.7"},
		{"forged Forwarded from an untrusted peer", "203.0.113.7:5000", [][2]string{{"Forwarded", "for=198.51.100.1"}}, "203.0.113.7"},
		{"garbage from an untrusted peer", "203.0.113.7:5000", [][2]string{{"X-Forwarded-For", "not an address"}}, "203.0.113.7"},
		{"trusted peer, no header", "127.0.0.1:5000", nil, "127.0.0.1"},
		{"trusted peer", "127.0.0.1:5000", [][2]string{{"X-Forwarded-For", "198.51.100.1"}}, "198.51.100.1"},
		{"client's forgery left of the proxy's entry", "127.0.0.1:5000", [][2]string{{"X-Forwarded-For", "6.6.6.6, 198.51.100.1"}}, "198.51.100.1"},
		{"past trusted hops", "127.0.0.1:5000", [][2]string{{"X-Forwarded-For", "6.6.6.6, 198.51.100.1, 10.1.2.3"}}, "198.51.100.1"},
		{"headers repeated", "127.0.0.1:5000", [][2]string{{"X-Forwarded-For", "6.6.6.6"}, {"X-Forwarded-For", "198.51.100.1, 10.1.2.3"}}, "198.51.100.1"},
		{"all hops trusted", "127.0.0.1:5000", [][2]string{{"X-Forwarded-For", "10.9.9.9, 10.1.2.3"}}, "10.9.9.9"},
		{"with a port", "127.0.0.1:5000", [][2]string{{"X-Forwarded-For", "198.51.100.1:4711"}}, "198.51.100.1"},
		{"IPv6 in brackets", "[::1]:5000", [][2]string{{"X-Forwarded-For", "[2001:db8::1]"}}, "2001:db8::1"},
		{"IPv4-mapped", "[::ffff:127.0.0.1]:5000", [][2]string{{"X-Forwarded-For", "::ffff:198.51.100.1"}}, "198.51.100.1"},
		{"X-Real-IP", "127.0.0.1:5000", [][2]string{{"X-Real-IP", "198.51.100.2"}}, "198.51.100.2"},
		{"X-Forwarded-For before X-Real-IP", "127.0.0.1:5000", [][2]string{{"X-Real-IP", "198.51.100.2"}, {"X-Forwarded-For", "198.51.100.1"}}, "198.51.100.1"},
		{"Forwarded, last for=", "127.0.0.1:5000", [][2]string{{"Forwarded", `for=6.6.6.6, for="[2001:db8::2]:80";proto=https`}}, "2001:db8::2"},
		{"Forwarded with no for=", "127.0.0.1:5000", [][2]string{{"Forwarded", "proto=https"}}, "127.0.0.1"},
		{"garbage from a trusted peer", "127.0.0.1:5000", [][2]string{{"X-Forwarded-For", "6.6.6.6, nope"}}, "X-Forwarded-For from a trusted proxy holds \"nope\""},
		{"empty hop from a trusted peer", "127.0.0.1:5000", [][2]string{{"X-Forwarded-For", "198.51.100.1,"}}, "X-Forwarded-For from a trusted proxy holds \"\""},
		{"peer not an address", "pipe", nil, "no client address"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := httptest.NewRequest(http.MethodGet, "/v1/auth/default", nil)
			r.RemoteAddr = tt.peer
			for _, h := range tt.headers {
				r.Header.Add(h[0], h[1])
			}
			got, ae := clientAddr(r, trusted)
			if ae != nil {
				if ae.Status != http.StatusBadRequest || !strings.HasPrefix(ae.Msg, tt.want) {
					t.Errorf("clientAddr: %d %q, want %q", ae.Status, ae.Msg, tt.want)
				}
				return
			}
			if got.String() != tt.want {
				t.Errorf("clientAddr = %v, want %s", got, tt.want)
			}
		})
	}
	r := httptest.NewRequest(http.MethodGet, "/v1/auth/default", nil)
	r.RemoteAddr = "127.0.0.1:5000"
	r.Header.Set("X-Forwarded-For", "198.51.100.1")
	if got, _ := clientAddr(r, nil); got.String() != "127.0.0.1" {
		t.Errorf("no trusted proxy: %v, want the peer", got)
	}
}

// TestAuthFlags: --auth-key-header takes a comma list or repeats, each
// name canonical and once; --auth-trusted-proxies takes CIDRs and
// addresses, loopback by default, empty trusting none; bad values are
// refused naming the flag.
func TestAuthFlags(t *testing.T) {
	cfg, err := ParseArgs(nil, env(nil), nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.AuthKeyHeaders) != 0 || cfg.AuthMissingKey != MissingKeyReject || (*prefixListFlag)(&cfg.AuthTrustedProxies).String() != DefaultAuthTrustedProxies {
		t.Errorf("defaults: %v %q %v", cfg.AuthKeyHeaders, cfg.AuthMissingKey, cfg.AuthTrustedProxies)
	}
	cfg, err = ParseArgs([]string{"--auth-key-header", "x-api-key, Authorization", "--auth-key-header", "X-API-KEY", "--auth-key-header", "x-tenant",
		"--auth-trusted-proxies", "10.0.0.0/8, 192.0.2.7,2001:db8::/32", "--auth-missing-key", "client-address"}, env(nil), nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(cfg.AuthKeyHeaders, ","); got != "X-Api-Key,Authorization,X-Tenant" {
		t.Errorf("headers %q", got)
	}
	if got := (*prefixListFlag)(&cfg.AuthTrustedProxies).String(); got != "10.0.0.0/8,192.0.2.7/32,2001:db8::/32" {
		t.Errorf("trusted %q", got)
	}
	if cfg.AuthMissingKey != MissingKeyClientAddress {
		t.Errorf("missing key %q", cfg.AuthMissingKey)
	}
	cfg, err = ParseArgs(nil, env(map[string]string{"HOTKEYD_AUTH_TRUSTED_PROXIES": "", "HOTKEYD_AUTH_KEY_HEADER": "X-Api-Key,X-Client"}), nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.AuthTrustedProxies) != 0 || strings.Join(cfg.AuthKeyHeaders, ",") != "X-Api-Key,X-Client" {
		t.Errorf("from the environment: %v %v", cfg.AuthTrustedProxies, cfg.AuthKeyHeaders)
	}
	for _, bad := range [][]string{
		{"--auth-key-header", "X Api Key"},
		{"--auth-key-header", "X-Api-Key:"},
		{"--auth-trusted-proxies", "10.0.0.0/33"},
		{"--auth-trusted-proxies", "localhost"},
		{"--auth-missing-key", "open"},
	} {
		if _, err := ParseArgs(bad, env(nil), nil); err == nil || !strings.Contains(err.Error(), strings.TrimPrefix(bad[0], "-")) {
			t.Errorf("%v: %v, want a refusal naming the flag", bad, err)
		}
	}
}

// authDaemon starts a daemon with the policy "api" at 3 a day (and the
// built-in default), keyed by X-Api-Key then X-Client, with args after.
func authDaemon(t *testing.T, args ...string) (*Daemon, http.Handler) {
	t.Helper()
	policies := filepath.Join(t.TempDir(), "policies.yaml")
	writeTestFile(t, policies, "policies:\n  api:\n    limit: 3\n    period: 24h\n")
	d, err := startLogged(t, nil, nil, append([]string{"--nats", "none", "--policies", policies, "--hot-threshold", "1e9",
		"--auth-key-header", "X-Api-Key,X-Client"}, args...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { shutdown(t, d) })
	return d, d.routes()
}

// authDo sends method path with headers (name, value pairs) from peer to
// h.
func authDo(h http.Handler, method, path, peer string, headers ...string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(method, path, nil)
	if peer != "" {
		r.RemoteAddr = peer
	}
	for i := 0; i+1 < len(headers); i += 2 {
		r.Header.Set(headers[i], headers[i+1])
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, r)
	return rec
}

// TestForwardAuth: /v1/auth/{policy} admits a key up to its limit, with any
// method, then denies it 429 (or ?deny_status) with Retry-After and the
// RateLimit headers; another key is unaffected; a request without a key,
// an unknown policy and bad parameters get clear 4xx answers.
func TestForwardAuth(t *testing.T) {
	_, h := authDaemon(t)
	for i, method := range []string{http.MethodGet, http.MethodPost, http.MethodHead} {
		rec := authDo(h, method, "/v1/auth/api", "", "X-Api-Key", "alice")
		if rec.Code != http.StatusOK || !strings.HasPrefix(rec.Header().Get("RateLimit"), `"api";r=`+string(rune('2'-i))+`;t=`) || rec.Header().Get("X-RateLimit-Limit") != "3" || rec.Header().Get("Retry-After") != "" {
			t.Fatalf("%s %d: %d %v %s, want 200 with the RateLimit headers", method, i, rec.Code, rec.Header(), rec.Body)
		}
	}
	admitted := 3
	for _, c := range []struct {
		method, path string
		want         int
	}{
		{http.MethodGet, "/v1/auth/api", http.StatusTooManyRequests},
		{http.MethodHead, "/v1/auth/api", http.StatusTooManyRequests},
		{http.MethodGet, "/v1/auth/api?deny_status=403", http.StatusForbidden},
		{http.MethodPut, "/v1/auth/api?deny_status=401", http.StatusUnauthorized},
		{http.MethodGet, "/v1/auth/api?deny_status=429", http.StatusTooManyRequests},
	} {
		rec := authDo(h, c.method, c.path, "", "X-Api-Key", "alice")
		if rec.Code == http.StatusOK {
			admitted++
		}
		if rec.Code != c.want || rec.Header().Get("Retry-After") == "" || rec.Header().Get("RateLimit") != `"api";r=0;t=86400` || rec.Header().Get("RateLimit-Policy") != `"api";q=3;w=86400` || rec.Header().Get("X-RateLimit-Remaining") != "0" {
			t.Errorf("%s %s over the limit: %d %v, want %d with Retry-After and the RateLimit headers", c.method, c.path, rec.Code, rec.Header(), c.want)
		}
		if c.method != http.MethodHead && !strings.Contains(rec.Body.String(), `"allowed":false`) {
			t.Errorf("%s %s over the limit: body %s", c.method, c.path, rec.Body)
		}
	}
	t.Logf("key alice: admitted %d of 8, limit 3", admitted)

	// Another key, by the second header, and the same key in another
	// policy, are counted apart.
	if rec := authDo(h, http.MethodGet, "/v1/auth/api", "", "X-Client", "bob"); rec.Code != http.StatusOK {
		t.Errorf("another key: %d %s", rec.Code, rec.Body)
	}
	if rec := authDo(h, http.MethodGet, "/v1/auth/default", "", "X-Api-Key", "alice"); rec.Code != http.StatusOK || rec.Header().Get("X-RateLimit-Limit") != "100" {
		t.Errorf("alice under default: %d %v", rec.Code, rec.Header())
	}
	// The policy from X-Hotkey-Policy when the path names none.
	if rec := authDo(h, http.MethodGet, "/v1/auth", "", "X-Api-Key", "alice", PolicyHeader, "api"); rec.Code != http.StatusTooManyRequests {
		t.Errorf("policy by header: %d %s, want alice denied under api", rec.Code, rec.Body)
	}
	if rec := authDo(h, http.MethodGet, "/v1/auth", "", "X-Api-Key", "carol"); rec.Code != http.StatusOK || rec.Header().Get("X-RateLimit-Limit") != "100" {
		t.Errorf("no policy named: %d %v, want default", rec.Code, rec.Header())
	}

	for _, c := range []struct {
		name, method, path string
		headers            []string
		want               int
		msg                string
	}{
		{"missing key", http.MethodGet, "/v1/auth/api", nil, 400, "no rate-limit key: the request carries none of the headers X-Api-Key, X-Client"},
		{"missing key, HEAD", http.MethodHead, "/v1/auth/api", nil, 400, ""},
		{"missing key, status for nginx", http.MethodGet, "/v1/auth/api?missing_key_status=401", nil, 401, "no rate-limit key"},
		{"key header holding a list, status for nginx", http.MethodGet, "/v1/auth/api?missing_key_status=401", []string{"X-Api-Key", "alice, bob"}, 401, "no rate-limit key: X-Api-Key (--auth-key-header (HOTKEYD_AUTH_KEY_HEADER)) holds a list"},
		{"missing key, forwarded for", http.MethodGet, "/v1/auth/api?missing_key_status=403", []string{"X-Forwarded-For", "198.51.100.1"}, 403, "no rate-limit key"},
		{"unknown policy", http.MethodGet, "/v1/auth/nope", []string{"X-Api-Key", "alice"}, 404, `unknown policy "nope": this daemon has "api", "default"`},
		{"unknown policy by header", http.MethodGet, "/v1/auth", []string{"X-Api-Key", "alice", PolicyHeader, "nope"}, 404, `unknown policy "nope"`},
		{"unknown policy before the key", http.MethodGet, "/v1/auth/nope", nil, 404, `unknown policy "nope"`},
		{"bad deny_status", http.MethodGet, "/v1/auth/api?deny_status=200", []string{"X-Api-Key", "alice"}, 400, `deny_status="200": want 401, 403, 429`},
		{"bad missing_key_status", http.MethodGet, "/v1/auth/api?missing_key_status=x", []string{"X-Api-Key", "alice"}, 400, `missing_key_status="x": want 400, 401, 403`},
		{"key too long", http.MethodGet, "/v1/auth/api", []string{"X-Api-Key", strings.Repeat("k", 5000)}, 400, "key is"},
		{"policy path too deep", http.MethodGet, "/v1/auth/api/x", []string{"X-Api-Key", "alice"}, 404, "no such endpoint /v1/auth/api/x"},
	} {
		rec := authDo(h, c.method, c.path, "", c.headers...)
		var e ErrorResponse
		json.Unmarshal(rec.Body.Bytes(), &e)
		if rec.Code != c.want || !strings.Contains(e.Error, c.msg) {
			t.Errorf("%s: %d %s, want %d %q", c.name, rec.Code, rec.Body, c.want, c.msg)
		}
		if rec.Header().Get("Retry-After") != "" {
			t.Errorf("%s: Retry-After %q on an error", c.name, rec.Header().Get("Retry-After"))
		}
	}
}

// TestForwardAuthClientAddress: keyed by client address, a client that
// forges X-Forwarded-For from an untrusted peer is counted at its peer's
// address still; behind a trusted proxy, each forwarded client has its own
// count.
func TestForwardAuthClientAddress(t *testing.T) {
	_, h := authDaemon(t, "--auth-missing-key", "client-address", "--auth-trusted-proxies", "10.0.0.1")
	admitted := 0
	for i := range 6 {
		forged := "198.51.100." + string(rune('1'+i))
		if rec := authDo(h, http.MethodGet, "/v1/auth/api", "203.0.113.7:4000", "X-Forwarded-For", forged, "X-Real-IP", forged); rec.Code == http.StatusOK {
			admitted++
		}
	}
	t.Logf("untrusted peer forging 6 addresses: admitted %d, limit 3", admitted)
	if admitted != 3 {
		t.Errorf("untrusted peer forging X-Forwarded-For: admitted %d of 6, want 3", admitted)
	}
	for i := range 2 {
		client := "198.51.100." + string(rune('1'+i))
		for j := range 3 {
			if rec := authDo(h, http.MethodGet, "/v1/auth/api", "10.0.0.1:4000", "X-Forwarded-For", "6.6.6.6, "+client); rec.Code != http.StatusOK {
				t.Errorf("client %s behind the proxy, request %d: %d, want 200", client, j, rec.Code)
			}
		}
		if rec := authDo(h, http.MethodGet, "/v1/auth/api", "10.0.0.1:4000", "X-Forwarded-For", client); rec.Code != http.StatusTooManyRequests {
			t.Errorf("client %s behind the proxy, 4th request: %d, want 429", client, rec.Code)
		}
	}
	// A key header still wins over the address.
	if rec := authDo(h, http.MethodGet, "/v1/auth/api", "203.0.113.7:4000", "X-Api-Key", "alice"); rec.Code != http.StatusOK {
		t.Errorf("key header from a denied address: %d, want 200", rec.Code)
	}
}

// TestForwardAuthStoreDown: with Redis unreachable, forward auth decides
// by each policy's on_store_failure, as /v1/allow does: closed answers
// 503, which no gateway lets through; open and local answer 200, degraded.
func TestForwardAuthStoreDown(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := l.Addr().String()
	l.Close()
	policies := filepath.Join(t.TempDir(), "policies.yaml")
	writeTestFile(t, policies, "policies:\n  shut:\n    limit: 3\n    period: 24h\n    on_store_failure: closed\n  wide:\n    limit: 3\n    period: 24h\n    on_store_failure: open\n  near:\n    limit: 3\n    period: 24h\n")
	d, err := startLogged(t, nil, nil, "--nats", "none", "--policies", policies, "--redis", "redis://"+dead, "--auth-key-header", "X-Api-Key")
	if err != nil {
		t.Fatal(err)
	}
	defer shutdown(t, d)
	h := d.routes()
	for _, c := range []struct {
		policy string
		want   int
	}{{"shut", http.StatusServiceUnavailable}, {"wide", http.StatusOK}, {"near", http.StatusOK}} {
		rec := authDo(h, http.MethodGet, "/v1/auth/"+c.policy, "", "X-Api-Key", "alice")
		var e ErrorResponse
		json.Unmarshal(rec.Body.Bytes(), &e)
		if rec.Code != c.want || (c.want == http.StatusOK) != strings.Contains(rec.Body.String(), `"degraded":true`) ||
			(c.want == http.StatusServiceUnavailable) != strings.Contains(e.Error, "on_store_failure: closed") {
			t.Errorf("%s with the store down: %d %s, want %d", c.policy, rec.Code, rec.Body, c.want)
		}
	}
}

// FuzzAuthKey: whatever the headers and the peer, authKey never panics; it
// answers a key with its prefix or a 400 (the missing-key answer for a key
// header holding a list), and an untrusted peer's key is its own address.
func FuzzAuthKey(f *testing.F) {
	f.Add("127.0.0.1:1", "6.6.6.6, 198.51.100.1", "198.51.100.2", `for="[2001:db8::1]:80"`, "")
	f.Add("203.0.113.7:1", "x", "", "", "k")
	f.Add("[::1]:1", ",,", "[", "for=;for", "")
	f.Add("203.0.113.7:1", "", "", "", "victim, attacker")
	trusted := []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("::1/128")}
	f.Fuzz(func(t *testing.T, peer, xff, realIP, fwd, key string) {
		r := httptest.NewRequest(http.MethodGet, "/v1/auth/default", nil)
		r.RemoteAddr = peer
		for _, h := range [][2]string{{"X-Forwarded-For", xff}, {"X-Real-IP", realIP}, {"Forwarded", fwd}, {"X-Api-Key", key}} {
			if h[1] != "" {
				r.Header.Set(h[0], h[1])
			}
		}
		got, missing, ae := authKey(r, authConfig{headers: []string{"X-Api-Key"}, byAddress: true, trusted: trusted})
		switch {
		case missing:
			if !strings.Contains(key, ",") || got != "" || ae == nil || ae.Status != http.StatusBadRequest {
				t.Fatalf("missing with byAddress and key %q: %q, %v", key, got, ae)
			}
		case ae != nil:
			if ae.Status != http.StatusBadRequest || got != "" {
				t.Fatalf("%q, %d %q", got, ae.Status, ae.Msg)
			}
		case key != "":
			if got != authKeyPrefix+key {
				t.Fatalf("key %q, want the header's", got)
			}
		case !strings.HasPrefix(got, authAddrPrefix):
			t.Fatalf("key %q, want an address", got)
		}
		if p, err := netip.ParseAddrPort(peer); err == nil && key == "" && !isTrusted(p.Addr().Unmap(), trusted) && got != authAddrPrefix+p.Addr().Unmap().String() {
			t.Fatalf("untrusted peer %s keyed %q", peer, got)
		}
	})
}
