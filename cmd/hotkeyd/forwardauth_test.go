package main

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/hotkeyd/hotkey/internal/testkit"
)

// gatewaysDoc holds the nginx and Caddy snippets that TestForwardAuthNginx
// and TestForwardAuthCaddy run.
const gatewaysDoc = "../../docs/gateways.md"

// docSnippet returns the ```lang block of docs/gateways.md between the
// markers "<!-- begin name snippet" and "<!-- end name snippet -->".
func docSnippet(t *testing.T, name, lang string) string {
	t.Helper()
	doc, err := os.ReadFile(gatewaysDoc)
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(doc), "<!-- begin "+name+" snippet")
	block, _, ok2 := strings.Cut(rest, "<!-- end "+name+" snippet -->")
	_, block, ok3 := strings.Cut(block, "```"+lang+"\n")
	block, _, ok4 := strings.Cut(block, "```")
	if !ok || !ok2 || !ok3 || !ok4 {
		t.Fatalf("%s: no ```%s block between the %s snippet's begin and end markers", gatewaysDoc, lang, name)
	}
	return block
}

// replaceAll returns the name snippet conf with old, which it must hold,
// replaced by new everywhere.
func replaceAll(t *testing.T, name, conf, old, new string) string {
	t.Helper()
	if !strings.Contains(conf, old) {
		t.Fatalf("the %s snippet has no %s to replace", name, old)
	}
	return strings.ReplaceAll(conf, old, new)
}

// gatewayBinary is the path of the gateway's binary. Without it the test
// fails: it needs a real server, which make test installs.
func gatewayBinary(t *testing.T, name string) string {
	t.Helper()
	path, err := exec.LookPath(name)
	if err != nil {
		if _, serr := os.Stat("/usr/sbin/" + name); serr != nil {
			t.Fatalf("%s not found (%v): make test installs it (apt-get install %s)", name, err, name)
		}
		path = "/usr/sbin/" + name
	}
	return path
}

// gateway is a gateway process (nginx, caddy) the test started, stopped by
// its PID.
type gateway struct {
	name   string
	cmd    *exec.Cmd
	base   string // http://127.0.0.1:PORT
	stderr *testkit.Buffer
	done   chan struct{}
}

// startGateway starts the process that command builds for a free loopback
// address (writing its configuration, whose text it returns for error
// messages) and waits until it answers GET probe with its name in the
// Server header. A port
// taken between choosing and binding it is retried on a new one. The
// gateway is stopped at cleanup.
func startGateway(t *testing.T, name, probe string, command func(addr string) (cmd *exec.Cmd, conf string)) *gateway {
	t.Helper()
	for attempt := 0; ; attempt++ {
		g, err := tryGateway(t, name, probe, command)
		if err == nil {
			return g
		}
		if attempt < 4 && strings.Contains(strings.ToLower(err.Error()), "address already in use") {
			t.Logf("port race, retrying: %v", err)
			continue
		}
		t.Fatal(err)
	}
}

func tryGateway(t *testing.T, name, probe string, command func(addr string) (*exec.Cmd, string)) (*gateway, error) {
	addr := freeAddr(t)
	cmd, conf := command(addr)
	g := &gateway{name: name, cmd: cmd, base: "http://" + addr, stderr: &testkit.Buffer{}, done: make(chan struct{})}
	g.cmd.Stdout, g.cmd.Stderr = g.stderr, g.stderr
	g.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := g.cmd.Start(); err != nil {
		return nil, err
	}
	go func() {
		g.cmd.Wait()
		close(g.done)
	}()
	deadline := time.Now().Add(time.Minute)
	for {
		select {
		case <-g.done:
			return nil, fmt.Errorf("%s exited: %s\nconfiguration:\n%s", name, g.stderr, conf)
		default:
		}
		// Server names the gateway: a process that took the port
		// meanwhile is not taken for it.
		if resp, err := client.Get(g.base + probe); err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if strings.HasPrefix(strings.ToLower(resp.Header.Get("Server")), name) {
				break
			}
		}
		if time.Now().After(deadline) {
			g.stop(t)
			return nil, fmt.Errorf("%s not serving after a minute: %s", name, g.stderr)
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Cleanup(func() { g.stop(t) })
	return g, nil
}

// stop asks the gateway to quit (SIGTERM, by PID) and waits; it kills it if
// it lingers.
func (g *gateway) stop(t *testing.T) {
	select {
	case <-g.done:
		return
	default:
	}
	g.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-g.done:
	case <-time.After(30 * time.Second):
		t.Errorf("%s did not stop on SIGTERM; killing it: %s", g.name, g.stderr)
		g.cmd.Process.Kill()
		<-g.done
	}
}

// startNginx runs nginx in dir with the http-block configuration conf, its
// "listen 80;" moved to a free loopback port, and waits until it answers.
func startNginx(t *testing.T, dir, conf string) *gateway {
	t.Helper()
	path := gatewayBinary(t, "nginx")
	if !strings.Contains(conf, "listen 80;") {
		t.Fatal("the nginx snippet has no \"listen 80;\" to move to a free port")
	}
	user := ""
	if os.Geteuid() == 0 { // workers would run as nobody, who cannot enter dir
		user = "user root;\n"
	}
	var temps strings.Builder
	for _, d := range []string{"client_body", "proxy", "fastcgi", "uwsgi", "scgi"} {
		fmt.Fprintf(&temps, "    %s_temp_path %s;\n", d, filepath.Join(dir, d))
	}
	// /_hotkey is internal: 404 without asking hotkeyd or the backend.
	return startGateway(t, "nginx", "/_hotkey", func(addr string) (*exec.Cmd, string) {
		full := user + "worker_processes 1;\nevents { worker_connections 64; }\nhttp {\n    access_log off;\n" + temps.String() +
			strings.Replace(conf, "listen 80;", "listen "+addr+";", 1) + "}\n"
		cfgPath := filepath.Join(dir, "nginx.conf")
		if err := os.WriteFile(cfgPath, []byte(full), 0o600); err != nil {
			t.Fatal(err)
		}
		return exec.Command(path, "-e", "stderr", "-p", dir, "-c", cfgPath, "-g", "daemon off; pid "+filepath.Join(dir, "nginx.pid")+"; error_log stderr;"), full
	})
}

// startCaddy runs caddy with the Caddyfile site conf, its site address
// "example.com" made plain HTTP on a free loopback port, with no admin
// endpoint and its home, data and config directories in dir, and waits
// until it answers.
func startCaddy(t *testing.T, dir, conf string) *gateway {
	t.Helper()
	path := gatewayBinary(t, "caddy")
	if !strings.HasPrefix(conf, "example.com {") {
		t.Fatal("the Caddy snippet has no site \"example.com {\" to move to a free port")
	}
	env := append(os.Environ(), "HOME="+filepath.Join(dir, "home"), "XDG_DATA_HOME="+filepath.Join(dir, "data"), "XDG_CONFIG_HOME="+filepath.Join(dir, "config"))
	// A request without the key header gets hotkeyd's 400 without reaching
	// the backend or taking a unit.
	return startGateway(t, "caddy", "/", func(addr string) (*exec.Cmd, string) {
		full := "{\n    admin off\n}\n\n" + strings.Replace(conf, "example.com {", "http://"+addr+" {", 1)
		cfgPath := filepath.Join(dir, "Caddyfile")
		if err := os.WriteFile(cfgPath, []byte(full), 0o600); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(path, "run", "--config", cfgPath, "--adapter", "caddyfile")
		cmd.Env = env
		return cmd, full
	})
}

// forwardAuthSetup starts, for a gateway in front of them, a backend that
// counts the requests it gets and a daemon keying forward auth by
// X-Api-Key, whose policy "api" admits limit a day. It returns the
// gateway's snippet of docs/gateways.md with their addresses in place of
// the doc's, a directory for the gateway's files, and the backend's count.
func forwardAuthSetup(t *testing.T, name, lang string, limit int) (conf, dir string, reached *atomic.Int64) {
	t.Helper()
	dir = t.TempDir()
	policies := filepath.Join(dir, "policies.yaml")
	if err := os.WriteFile(policies, fmt.Appendf(nil, "policies:\n  api:\n    limit: %d\n    period: 24h\n", limit), 0o600); err != nil {
		t.Fatal(err)
	}
	reached = new(atomic.Int64)
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reached.Add(1)
		io.WriteString(w, "hello from the backend\n")
	}))
	t.Cleanup(backend.Close)
	d := startDaemon(t, daemonOpts{args: []string{"--policies", policies, "--auth-key-header", "X-Api-Key", "--hot-threshold", "1e9"}})

	conf = docSnippet(t, name, lang)
	conf = replaceAll(t, name, conf, "127.0.0.1:8080", strings.TrimPrefix(d.base, "http://"))
	conf = replaceAll(t, name, conf, "127.0.0.1:3000", strings.TrimPrefix(backend.URL, "http://"))
	return conf, dir, reached
}

// forwardAuthWant is what a gateway's client gets besides the status and
// the headers: the body of a denial and of a request without a key.
type forwardAuthWant struct {
	denied, noKey func(body string) bool
}

// checkForwardAuth sends n requests for one key through g, over the
// policy's limit; exactly limit must reach the backend, with the RateLimit
// headers on their answers, and the others get 429 with Retry-After and the
// RateLimit headers. Another key is unaffected; a request without the key
// header gets 400 with want's body without reaching the backend. Each request
// carries an X-RateLimit-Remaining of its own, which the client must never
// get back.
func checkForwardAuth(t *testing.T, g *gateway, reached *atomic.Int64, n, limit int, want forwardAuthWant) {
	t.Helper()
	get := func(key string) (*http.Response, string) {
		t.Helper()
		req, err := http.NewRequest(http.MethodGet, g.base+"/some/page", nil)
		if err != nil {
			t.Fatal(err)
		}
		if key != "" {
			req.Header.Set("X-Api-Key", key)
		}
		req.Header.Set("X-RateLimit-Remaining", "999")
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp, string(body)
	}
	rateHeaders := []string{"X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset", "RateLimit-Policy", "RateLimit"}
	var ok, limited int
	for i := range n {
		resp, body := get("alice")
		switch resp.StatusCode {
		case http.StatusOK:
			ok++
			for _, h := range rateHeaders {
				if len(resp.Header.Values(h)) != 1 {
					t.Errorf("request %d allowed with %s %q, want one", i, h, resp.Header.Values(h))
				}
			}
			if body != "hello from the backend\n" || resp.Header.Get("RateLimit-Policy") != fmt.Sprintf(`"api";q=%d;w=86400`, limit) ||
				resp.Header.Get("X-RateLimit-Remaining") != fmt.Sprint(limit-1-i) || resp.Header.Get("Retry-After") != "" {
				t.Errorf("request %d allowed: %v %q, want the backend's answer with the RateLimit headers", i, resp.Header, body)
			}
		case http.StatusTooManyRequests:
			limited++
			for _, h := range append(rateHeaders, "Retry-After") {
				if len(resp.Header.Values(h)) != 1 {
					t.Errorf("request %d denied with %s %q, want one: %v", i, h, resp.Header.Values(h), resp.Header)
				}
			}
			if resp.Header.Get("X-RateLimit-Remaining") != "0" || !strings.HasPrefix(resp.Header.Get("RateLimit"), `"api";r=0;t=`) {
				t.Errorf("request %d denied: X-RateLimit-Remaining %q, RateLimit %q", i, resp.Header.Get("X-RateLimit-Remaining"), resp.Header.Get("RateLimit"))
			}
			if !want.denied(body) {
				t.Errorf("request %d denied: body %q", i, body)
			}
		default:
			t.Errorf("request %d: %d %v %q, want 200 or 429\n%s: %s", i, resp.StatusCode, resp.Header, body, g.name, g.stderr)
		}
	}
	t.Logf("key alice: %d of %d requests reached the backend (limit %d), %d got 429", reached.Load(), n, limit, limited)
	if ok != limit || limited != n-limit || reached.Load() != int64(limit) {
		t.Errorf("key alice: %d allowed, %d limited, %d reached the backend; want %d, %d, %d", ok, limited, reached.Load(), limit, n-limit, limit)
	}

	if resp, body := get("bob"); resp.StatusCode != http.StatusOK || resp.Header.Get("X-RateLimit-Remaining") != fmt.Sprint(limit-1) {
		t.Errorf("key bob: %d %v %q, want 200 with %d remaining", resp.StatusCode, resp.Header, body, limit-1)
	}
	if resp, body := get(""); resp.StatusCode != http.StatusBadRequest || !want.noKey(body) {
		t.Errorf("no key: %d %q, want 400", resp.StatusCode, body)
	}
	if got := reached.Load(); got != int64(limit)+1 {
		t.Errorf("the backend was reached %d times, want %d: alice's %d and bob's 1", got, limit+1, limit)
	}
}

// checkForwardAuthOneKey sends requests through g whose X-Api-Key names
// two keys, "victim" and "attacker": as two header lines, either way
// round, or as one line holding both. Each must get 400 with want's body,
// without reaching the backend or charging either key; each key alone is
// then admitted with its whole limit left.
func checkForwardAuthOneKey(t *testing.T, g *gateway, reached *atomic.Int64, limit int, want forwardAuthWant) {
	t.Helper()
	get := func(values ...string) (*http.Response, string) {
		t.Helper()
		req, err := http.NewRequest(http.MethodGet, g.base+"/some/page", nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, v := range values {
			req.Header.Add("X-Api-Key", v)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp, string(body)
	}
	before := reached.Load()
	refused := 0
	for i := range limit {
		for _, values := range [][]string{{"victim", "attacker"}, {"attacker", "victim"}, {"victim, attacker"}, {"victim,attacker"}} {
			resp, body := get(values...)
			if resp.StatusCode == http.StatusBadRequest && want.noKey(body) {
				refused++
			} else {
				t.Errorf("round %d, X-Api-Key %q: %d %q, want 400", i, values, resp.StatusCode, body)
			}
		}
	}
	t.Logf("X-Api-Key naming two keys: %d of %d requests refused, %d reached the backend", refused, 4*limit, reached.Load()-before)
	if got := reached.Load() - before; got != 0 {
		t.Errorf("%d requests with X-Api-Key naming two keys reached the backend, want none", got)
	}
	for _, key := range []string{"victim", "attacker"} {
		if resp, body := get(key); resp.StatusCode != http.StatusOK || resp.Header.Get("X-RateLimit-Remaining") != fmt.Sprint(limit-1) {
			t.Errorf("key %s alone afterwards: %d %s %q, want 200 with %d remaining: charged by the requests naming two keys", key, resp.StatusCode, resp.Header.Get("X-RateLimit-Remaining"), body, limit-1)
		}
	}
}

// TestForwardAuthNginx: the nginx snippet of docs/gateways.md, run by a
// real nginx in front of a backend, with hotkeyd answering its
// auth_request. Of N requests for one key over the policy's limit L,
// exactly L reach the backend and N-L get nginx's 429 with Retry-After and
// the RateLimit headers; another key is unaffected; a request without the
// key header gets 400 without reaching the backend, and so does one whose
// X-Api-Key names two keys, charging neither.
func TestForwardAuthNginx(t *testing.T) {
	const n, limit = 12, 5
	conf, dir, reached := forwardAuthSetup(t, "nginx", "nginx", limit)
	g := startNginx(t, dir, conf)
	want := forwardAuthWant{
		denied: func(body string) bool { return body == "too many requests\n" },
		noKey:  func(body string) bool { return body == "want one X-Api-Key header with one key\n" },
	}
	checkForwardAuth(t, g, reached, n, limit, want)
	checkForwardAuthOneKey(t, g, reached, limit, want)
}

// TestForwardAuthCaddy: the Caddy snippet of docs/gateways.md, run by a
// real caddy in front of a backend, with hotkeyd answering its
// forward_auth. Of N requests for one key over the policy's limit L,
// exactly L reach the backend, with the RateLimit headers, and N-L get
// hotkeyd's 429 with Retry-After and the RateLimit headers; another key is
// unaffected; a request without the key header gets hotkeyd's 400 without
// reaching the backend, and so does one whose X-Api-Key names two keys,
// charging neither.
func TestForwardAuthCaddy(t *testing.T) {
	const n, limit = 12, 5
	conf, dir, reached := forwardAuthSetup(t, "caddy", "caddyfile", limit)
	g := startCaddy(t, dir, conf)
	want := forwardAuthWant{
		denied: func(body string) bool { return strings.Contains(body, `"allowed":false`) },
		noKey:  func(body string) bool { return strings.Contains(body, "no rate-limit key") },
	}
	checkForwardAuth(t, g, reached, n, limit, want)
	checkForwardAuthOneKey(t, g, reached, limit, want)
}
