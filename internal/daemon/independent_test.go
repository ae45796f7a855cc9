package daemon

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestPoliciesIndependentHTTP: two policies on one key, asked over HTTP,
// have a counter each. Five login attempts a minute stay five, however
// default requests for the same key come between them, and the default
// policy's 100 a second are not used up by the login attempts.
func TestPoliciesIndependentHTTP(t *testing.T) {
	policies := filepath.Join(t.TempDir(), "policies.yaml")
	if err := os.WriteFile(policies, []byte(`policies:
  default:
    algorithm: token_bucket
    limit: 100
    period: 1s
  login:
    algorithm: sliding_log
    limit: 5
    period: 1m
`), 0o600); err != nil {
		t.Fatal(err)
	}
	d, err := startLogged(t, nil, nil, "--nats-listen", "127.0.0.1:0", "--policies", policies)
	if err != nil {
		t.Fatal(err)
	}
	defer shutdown(t, d)
	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()
	allow := func(body string) AllowResponse {
		t.Helper()
		resp, err := client.Post("http://"+d.Addr()+"/v1/allow", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		var ar AllowResponse
		if err := json.Unmarshal(b, &ar); err != nil || (resp.StatusCode != 200 && resp.StatusCode != 429) {
			t.Fatalf("%s: %d %s", body, resp.StatusCode, b)
		}
		return ar
	}
	start := time.Now()
	login, other := 0, 0
	for range 10 {
		for range 5 {
			if allow(`{"policy":"login","key":"user_1"}`).Allowed {
				login++
			}
		}
		if allow(`{"key":"user_1"}`).Allowed {
			other++
		}
		time.Sleep(30 * time.Millisecond)
	}
	// A minute's 5, plus what refilled meanwhile: none unless the machine
	// took over 12 s.
	bound := 5 + int(5*time.Since(start)/time.Minute)
	t.Logf("login admitted %d of 50 over %v (bound %d), default %d of 10", login, time.Since(start).Round(time.Millisecond), bound, other)
	if login < 5 || login > bound || other != 10 {
		t.Errorf("login admitted %d, default %d; want 5 (at most %d) and 10", login, other, bound)
	}
	if r := allow(`{"key":"user_1"}`); !r.Allowed || r.Limit != 100 || r.Remaining < 100-11 {
		t.Errorf("default after the run: %+v, want its own 100 less at most its 11", r)
	}
}

// shutdown shuts d down within ShutdownTimeout, failing t if it cannot.
func shutdown(t *testing.T, d *Daemon) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), ShutdownTimeout)
	defer cancel()
	if err := d.Shutdown(ctx); err != nil {
		t.Errorf("shutdown: %v", err)
	}
}
