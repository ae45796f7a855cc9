package daemon

import (
	"context"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/hotkeyd/hotkey/internal/redistest"
)

// post sends body to POST path on addr: the status and the body.
func post(t *testing.T, client *http.Client, addr, path, body string) (int, string) {
	t.Helper()
	resp, err := client.Post("http://"+addr+path, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestResetEndpoint: POST /v1/reset on the admin listener empties one key
// of one policy, which admits its whole limit again, and leaves its other
// keys and policies as they were; bad input gets a 4xx saying why, and the
// API listener does not serve it.
func TestResetEndpoint(t *testing.T) {
	e := startBatchEnv(t)
	admin := e.d.AdminAddr()
	fill := func(policy, key string) (admitted int) {
		t.Helper()
		for range 15 {
			if status, _ := post(t, e.client, e.d.Addr(), "/v1/allow", `{"policy":"`+policy+`","key":"`+key+`"}`); status == 200 {
				admitted++
			}
		}
		return admitted
	}
	for _, c := range []struct{ policy, key string }{{"tb", "r"}, {"tb", "other"}, {"sw", "r"}} {
		if got := fill(c.policy, c.key); got != 10 {
			t.Fatalf("%s %s: admitted %d of 15, want 10", c.policy, c.key, got)
		}
	}
	if status, body := post(t, e.client, admin, "/v1/reset", `{"policy":"tb","key":"r"}`); status != 200 || !strings.Contains(body, `"reset":true`) {
		t.Fatalf("reset: %d %s, want 200", status, body)
	}
	for _, c := range []struct {
		policy, key string
		want        int
	}{{"tb", "r", 10}, {"tb", "other", 0}, {"sw", "r", 0}} {
		if got := fill(c.policy, c.key); got != c.want {
			t.Errorf("after the reset of tb r: %s %s admitted %d of 15, want %d", c.policy, c.key, got, c.want)
		}
	}
	for _, c := range []struct {
		body   string
		status int
		msg    string
	}{
		{`{"policy":"nope","key":"r"}`, 404, `unknown policy \"nope\"`},
		{`{"policy":"tb","key":""}`, 400, "empty key"},
		{`{"policy":"tb","key":"` + strings.Repeat("x", 513) + `"}`, 400, "longer than the 512 allowed"},
		{`{"key":"r"}`, 400, "no policy"},
		{`{"policy":"tb","key":"r","cost":1}`, 400, `unknown field \"cost\" (the fields are policy and key)`},
		{`["tb","r"]`, 400, "want an object, not a JSON array"},
		{`{"policy":"tb"`, 400, "malformed JSON"},
		{``, 400, "empty body"},
		{`{"policy":"tb","key":"r"} {}`, 400, "data after the object"},
		{"{\"policy\":\"tb\",\"key\":\"\xff\"}", 400, "not valid UTF-8"},
	} {
		if status, body := post(t, e.client, admin, "/v1/reset", c.body); status != c.status || !strings.Contains(body, c.msg) {
			t.Errorf("reset %.40q: %d %s, want %d with %q", c.body, status, body, c.status, c.msg)
		}
	}
	resp, err := e.client.Get("http://" + admin + "/v1/reset")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 405 || resp.Header.Get("Allow") != "POST" {
		t.Errorf("GET /v1/reset: %d, Allow %q; want 405, POST", resp.StatusCode, resp.Header.Get("Allow"))
	}
	if status, body := post(t, e.client, e.d.Addr(), "/v1/reset", `{"policy":"tb","key":"r"}`); status != 404 || !strings.Contains(body, "admin listener") {
		t.Errorf("reset on the API listener: %d %s, want 404 pointing at the admin listener", status, body)
	}
}

// TestResetEndpointRedis: on Redis, a reset empties the key; with the
// server down it answers 503 with the store's error.
func TestResetEndpointRedis(t *testing.T) {
	srv := redistest.ForTest(t)
	policies := filepath.Join(t.TempDir(), "policies.yaml")
	writeTestFile(t, policies, "policies:\n  p:\n    algorithm: sliding_log\n    limit: 10\n    period: 1000h\n")
	d, err := StartArgs(context.Background(), "--listen", "127.0.0.1:0", "--nats-listen", "127.0.0.1:0", "--redis", "redis://"+srv.Addr,
		"--policies", policies, "--hot-threshold", "1e9", "--reload-interval", "0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { shutdown(t, d) })
	client := &http.Client{Transport: &http.Transport{}}
	t.Cleanup(client.CloseIdleConnections)
	fill := func() (admitted int) {
		for range 15 {
			if status, _ := post(t, client, d.Addr(), "/v1/allow", `{"policy":"p","key":"k"}`); status == 200 {
				admitted++
			}
		}
		return admitted
	}
	if got := fill(); got != 10 {
		t.Fatalf("admitted %d of 15, want 10", got)
	}
	if status, body := post(t, client, d.AdminAddr(), "/v1/reset", `{"policy":"p","key":"k"}`); status != 200 {
		t.Fatalf("reset: %d %s", status, body)
	}
	if got := fill(); got != 10 {
		t.Errorf("after the reset: admitted %d of 15, want 10", got)
	}
	if err := srv.Kill(); err != nil {
		t.Fatal(err)
	}
	if status, body := post(t, client, d.AdminAddr(), "/v1/reset", `{"policy":"p","key":"k"}`); status != 503 || !strings.Contains(body, "reset failed") || !strings.Contains(body, "redis delete") {
		t.Errorf("reset with the server down: %d %s, want 503 with the store's error", status, body)
	}
}

func FuzzDecodeReset(f *testing.F) {
	for _, s := range []string{`{"policy":"p","key":"k"}`, `{"key":"k"}`, `{"policy":"p","key":"\ud800"}`, `null`, `{}`, "\xff", `{"policy":"p","key":"k"} x`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		req, ae := DecodeReset(body)
		if ae != nil {
			if ae.Status != http.StatusBadRequest || ae.Msg == "" {
				t.Fatalf("refused with %d %q: want 400 and a message", ae.Status, ae.Msg)
			}
			return
		}
		if req.Policy == "" || !utf8.ValidString(req.Key) || !utf8.ValidString(req.Policy) {
			t.Fatalf("accepted %+v from %q", req, body)
		}
	})
}
