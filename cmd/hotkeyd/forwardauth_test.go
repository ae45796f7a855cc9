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

// gatewaysDoc holds the nginx snippet that TestForwardAuthNginx runs.
const gatewaysDoc = "../../docs/gateways.md"

// nginxSnippet returns the nginx configuration of docs/gateways.md: the
// fenced block between its begin and end markers.
func nginxSnippet(t *testing.T) string {
	t.Helper()
	doc, err := os.ReadFile(gatewaysDoc)
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(doc), "<!-- begin nginx snippet")
	block, _, ok2 := strings.Cut(rest, "<!-- end nginx snippet -->")
	_, block, ok3 := strings.Cut(block, "```nginx\n")
	block, _, ok4 := strings.Cut(block, "```")
	if !ok || !ok2 || !ok3 || !ok4 {
		t.Fatalf("%s: no ```nginx block between the nginx snippet's begin and end markers", gatewaysDoc)
	}
	return block
}

// nginx is an nginx process the test started, stopped by its PID.
type nginx struct {
	cmd    *exec.Cmd
	base   string // http://127.0.0.1:PORT
	stderr *testkit.Buffer
	done   chan struct{}
}

// startNginx runs nginx in dir with the http-block configuration conf, its
// "listen 80;" moved to a free loopback port, and waits until it answers.
// Without nginx it fails: the test needs a real server, which make test
// installs.
func startNginx(t *testing.T, dir, conf string) *nginx {
	t.Helper()
	path, err := exec.LookPath("nginx")
	if err != nil {
		if _, serr := os.Stat("/usr/sbin/nginx"); serr != nil {
			t.Fatalf("nginx not found (%v): make test installs it (apt-get install nginx)", err)
		}
		path = "/usr/sbin/nginx"
	}
	for attempt := 0; ; attempt++ {
		n, err := tryNginx(t, path, dir, conf)
		if err == nil {
			return n
		}
		if attempt < 4 && strings.Contains(err.Error(), "Address already in use") {
			t.Logf("port race, retrying: %v", err)
			continue
		}
		t.Fatal(err)
	}
}

func tryNginx(t *testing.T, path, dir, conf string) (*nginx, error) {
	addr := freeAddr(t)
	if !strings.Contains(conf, "listen 80;") {
		t.Fatal("the nginx snippet has no \"listen 80;\" to move to a free port")
	}
	conf = strings.Replace(conf, "listen 80;", "listen "+addr+";", 1)
	user := ""
	if os.Geteuid() == 0 { // workers would run as nobody, who cannot enter dir
		user = "user root;\n"
	}
	var temps strings.Builder
	for _, d := range []string{"client_body", "proxy", "fastcgi", "uwsgi", "scgi"} {
		fmt.Fprintf(&temps, "    %s_temp_path %s;\n", d, filepath.Join(dir, d))
	}
	full := user + "worker_processes 1;\nevents { worker_connections 64; }\nhttp {\n    access_log off;\n" + temps.String() + conf + "}\n"
	cfgPath := filepath.Join(dir, "nginx.conf")
	if err := os.WriteFile(cfgPath, []byte(full), 0o600); err != nil {
		t.Fatal(err)
	}
	n := &nginx{base: "http://" + addr, stderr: &testkit.Buffer{}, done: make(chan struct{})}
	n.cmd = exec.Command(path, "-e", "stderr", "-p", dir, "-c", cfgPath, "-g", "daemon off; pid "+filepath.Join(dir, "nginx.pid")+"; error_log stderr;")
	n.cmd.Stdout, n.cmd.Stderr = n.stderr, n.stderr
	n.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := n.cmd.Start(); err != nil {
		return nil, err
	}
	go func() {
		n.cmd.Wait()
		close(n.done)
	}()
	deadline := time.Now().Add(time.Minute)
	for {
		select {
		case <-n.done:
			return nil, fmt.Errorf("nginx exited: %s\nconfiguration:\n%s", n.stderr, full)
		default:
		}
		// /_hotkey is internal: 404 without asking hotkeyd or the backend.
		if resp, err := client.Get(n.base + "/_hotkey"); err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			break
		}
		if time.Now().After(deadline) {
			n.stop(t)
			return nil, fmt.Errorf("nginx not serving after a minute: %s", n.stderr)
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Cleanup(func() { n.stop(t) })
	return n, nil
}

// stop asks nginx to quit (SIGTERM to its master, by PID) and waits; it
// kills it if it lingers.
func (n *nginx) stop(t *testing.T) {
	select {
	case <-n.done:
		return
	default:
	}
	n.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-n.done:
	case <-time.After(30 * time.Second):
		t.Errorf("nginx did not stop on SIGTERM; killing it: %s", n.stderr)
		n.cmd.Process.Kill()
		<-n.done
	}
}

// TestForwardAuthNginx: the nginx snippet of docs/gateways.md, run by a
// real nginx in front of a backend, with hotkeyd answering its
// auth_request. Of N requests for one key over the policy's limit L,
// exactly L reach the backend and N-L get nginx's 429 with Retry-After and
// the RateLimit headers; another key is unaffected; a request without the
// key header gets 400 without reaching the backend.
func TestForwardAuthNginx(t *testing.T) {
	const n, limit = 12, 5
	dir := t.TempDir()
	policies := filepath.Join(dir, "policies.yaml")
	if err := os.WriteFile(policies, fmt.Appendf(nil, "policies:\n  api:\n    limit: %d\n    period: 24h\n", limit), 0o600); err != nil {
		t.Fatal(err)
	}
	var reached atomic.Int64
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reached.Add(1)
		io.WriteString(w, "hello from the backend\n")
	}))
	defer backend.Close()
	d := startDaemon(t, daemonOpts{args: []string{"--policies", policies, "--auth-key-header", "X-Api-Key", "--hot-threshold", "1e9"}})

	conf := nginxSnippet(t)
	for _, r := range []struct{ old, new string }{{"127.0.0.1:8080", strings.TrimPrefix(d.base, "http://")}, {"127.0.0.1:3000", strings.TrimPrefix(backend.URL, "http://")}} {
		if !strings.Contains(conf, r.old) {
			t.Fatalf("the nginx snippet has no %s to replace", r.old)
		}
		conf = strings.ReplaceAll(conf, r.old, r.new)
	}
	ngx := startNginx(t, dir, conf)

	get := func(key string) (*http.Response, string) {
		t.Helper()
		req, err := http.NewRequest(http.MethodGet, ngx.base+"/some/page", nil)
		if err != nil {
			t.Fatal(err)
		}
		if key != "" {
			req.Header.Set("X-Api-Key", key)
		}
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
			if body != "hello from the backend\n" || resp.Header.Get("RateLimit-Policy") != fmt.Sprintf(`"api";q=%d;w=86400`, limit) ||
				resp.Header.Get("X-RateLimit-Remaining") != fmt.Sprint(limit-1-i) || resp.Header.Get("Retry-After") != "" {
				t.Errorf("request %d allowed: %v %q, want the backend's answer with the RateLimit headers", i, resp.Header, body)
			}
		case http.StatusTooManyRequests:
			limited++
			for _, h := range append(rateHeaders, "Retry-After") {
				if resp.Header.Get(h) == "" {
					t.Errorf("request %d denied without %s: %v", i, h, resp.Header)
				}
			}
			if resp.Header.Get("RateLimit") != `"api";r=0;t=86400` && !strings.HasPrefix(resp.Header.Get("RateLimit"), `"api";r=0;t=`) {
				t.Errorf("request %d denied: RateLimit %q", i, resp.Header.Get("RateLimit"))
			}
			if body != "too many requests\n" {
				t.Errorf("request %d denied: body %q", i, body)
			}
		default:
			t.Errorf("request %d: %d %v %q, want 200 or 429\nnginx: %s", i, resp.StatusCode, resp.Header, body, ngx.stderr)
		}
	}
	t.Logf("key alice: %d of %d requests reached the backend (limit %d), %d got 429", reached.Load(), n, limit, limited)
	if ok != limit || limited != n-limit || reached.Load() != limit {
		t.Errorf("key alice: %d allowed, %d limited, %d reached the backend; want %d, %d, %d", ok, limited, reached.Load(), limit, n-limit, limit)
	}

	if resp, body := get("bob"); resp.StatusCode != http.StatusOK || resp.Header.Get("X-RateLimit-Remaining") != fmt.Sprint(limit-1) {
		t.Errorf("key bob: %d %v %q, want 200 with %d remaining", resp.StatusCode, resp.Header, body, limit-1)
	}
	if resp, body := get(""); resp.StatusCode != http.StatusBadRequest || body != "missing X-Api-Key header\n" {
		t.Errorf("no key: %d %q, want 400", resp.StatusCode, body)
	}
	if got := reached.Load(); got != limit+1 {
		t.Errorf("the backend was reached %d times, want %d: alice's %d and bob's 1", got, limit+1, limit)
	}
}
