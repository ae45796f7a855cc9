// Package deploy_test checks the deployment kit (docs/deploy.md) against the
// daemon itself: the Dockerfile's build runs and gives a static binary, every
// hotkeyd command line and HOTKEYD_* environment of compose.yaml and of the
// Kubernetes manifests is one the daemon accepts, the files they mount are
// where they say, and every metric the Grafana dashboard and the alert rules
// query is one that a real daemon's /metrics exposes. deploy/rulescheck runs
// Prometheus's own parser on the alert rules.
package deploy_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"debug/elf"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"gopkg.in/yaml.v3"

	"github.com/hotkeyd/hotkey/internal/daemon"
	"github.com/hotkeyd/hotkey/internal/faultproxy"
	"github.com/hotkeyd/hotkey/internal/redistest"
	"github.com/hotkeyd/hotkey/internal/testkit"
)

// The kit's files, relative to the repository root (the parent of this
// package's directory, where go test runs).
const (
	root           = ".."
	dockerfileName = "Dockerfile"
	composeFile    = "compose.yaml"
	k8sDir         = "deploy/kubernetes"
	dashboardFile  = "deploy/grafana/hotkey.json"
	alertsFile     = "deploy/prometheus/alerts.yaml"
	testVersion    = "v0.0.0-deploytest"
)

func rootPath(rel string) string { return filepath.Join(root, filepath.FromSlash(rel)) }

func readFile(t *testing.T, rel string) []byte {
	t.Helper()
	b, err := os.ReadFile(rootPath(rel))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// readYAML reads the YAML file at path (not relative to the root) into v.
func readYAML(t *testing.T, path string, v any) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

// ---------------------------------------------------------------- Dockerfile

// instruction is one Dockerfile instruction, continuation lines joined.
type instruction struct {
	line int
	cmd  string // upper case: FROM, RUN, ...
	args string
}

// stage is one FROM and what follows it.
type stage struct {
	image, name string
	ins         []instruction
	args        map[string]string // ARG name → default
	env         map[string]string
}

func (s *stage) all(cmd string) []instruction {
	var out []instruction
	for _, in := range s.ins {
		if in.cmd == cmd {
			out = append(out, in)
		}
	}
	return out
}

type dockerfile struct{ stages []*stage }

func (d *dockerfile) final() *stage { return d.stages[len(d.stages)-1] }

func (d *dockerfile) stage(name string) *stage {
	for i, s := range d.stages {
		if s.name == name || strconv.Itoa(i) == name {
			return s
		}
	}
	return nil
}

func parseDockerfile(t *testing.T) *dockerfile {
	t.Helper()
	var ins []instruction
	var cur strings.Builder
	start := 0
	for i, l := range strings.Split(string(readFile(t, dockerfileName)), "\n") {
		trimmed := strings.TrimSpace(l)
		if strings.HasPrefix(trimmed, "#") || trimmed == "" && cur.Len() == 0 {
			continue // comments, also inside continued lines, as Docker does
		}
		if cur.Len() == 0 {
			start = i + 1
		}
		if body, ok := strings.CutSuffix(strings.TrimRight(l, " \t"), `\`); ok {
			cur.WriteString(body)
			continue
		}
		cur.WriteString(l)
		cmd, args, _ := strings.Cut(strings.TrimSpace(cur.String()), " ")
		ins = append(ins, instruction{line: start, cmd: strings.ToUpper(cmd), args: strings.TrimSpace(args)})
		cur.Reset()
	}
	if cur.Len() > 0 {
		t.Fatalf("Dockerfile ends in a continued line")
	}
	d := &dockerfile{}
	for _, in := range ins {
		if in.cmd == "FROM" {
			f := strings.Fields(in.args)
			for len(f) > 0 && strings.HasPrefix(f[0], "--") {
				f = f[1:]
			}
			s := &stage{args: map[string]string{}, env: map[string]string{}}
			switch {
			case len(f) == 1:
				s.image = f[0]
			case len(f) == 3 && strings.EqualFold(f[1], "AS"):
				s.image, s.name = f[0], f[2]
			default:
				t.Fatalf("Dockerfile line %d: FROM %s: want FROM image [AS name]", in.line, in.args)
			}
			d.stages = append(d.stages, s)
			continue
		}
		if len(d.stages) == 0 {
			if in.cmd != "ARG" {
				t.Fatalf("Dockerfile line %d: %s before the first FROM", in.line, in.cmd)
			}
			continue
		}
		s := d.stages[len(d.stages)-1]
		s.ins = append(s.ins, in)
		switch in.cmd {
		case "ARG":
			name, def, _ := strings.Cut(in.args, "=")
			s.args[name] = def
		case "ENV":
			words, err := shellWords(in.args, nil)
			if err != nil {
				t.Fatalf("Dockerfile line %d: ENV: %v", in.line, err)
			}
			if len(words) == 2 && !strings.Contains(words[0], "=") { // ENV NAME value
				s.env[words[0]] = words[1]
				continue
			}
			for _, w := range words {
				k, v, ok := strings.Cut(w, "=")
				if !ok {
					t.Fatalf("Dockerfile line %d: ENV %s: want NAME=value", in.line, w)
				}
				s.env[k] = v
			}
		}
	}
	if len(d.stages) == 0 {
		t.Fatal("Dockerfile: no FROM")
	}
	return d
}

// shellWords splits s as sh would split a simple command: quotes, escapes,
// $VAR and ${VAR} expanded from vars (nil: a $ is an error). Operators other
// than && are refused, so that a RUN this cannot follow fails the test
// rather than being misread.
func shellWords(s string, vars map[string]string) ([]string, error) {
	var words []string
	var w strings.Builder
	inWord := false
	expand := func(i int) (int, error) { // s[i] == '$'
		if vars == nil {
			return 0, fmt.Errorf("$ in %q", s)
		}
		j := i + 1
		var name string
		if j < len(s) && s[j] == '{' {
			end := strings.IndexByte(s[j:], '}')
			if end < 0 {
				return 0, fmt.Errorf("unclosed ${ in %q", s)
			}
			name, j = s[j+1:j+end], j+end+1
		} else {
			for j < len(s) && (s[j] == '_' || 'A' <= s[j] && s[j] <= 'Z' || 'a' <= s[j] && s[j] <= 'z' || '0' <= s[j] && s[j] <= '9') {
				j++
			}
			name = s[i+1 : j]
		}
		v, ok := vars[name]
		if !ok {
			return 0, fmt.Errorf("variable %q is not an ARG or ENV of the stage (or is ${...:-...}, which this test does not follow)", name)
		}
		w.WriteString(v)
		return j, nil
	}
	for i := 0; i < len(s); {
		c := s[i]
		switch {
		case c == ' ' || c == '\t' || c == '\n':
			if inWord {
				words = append(words, w.String())
				w.Reset()
				inWord = false
			}
			i++
		case c == '\'':
			end := strings.IndexByte(s[i+1:], '\'')
			if end < 0 {
				return nil, fmt.Errorf("unclosed ' in %q", s)
			}
			w.WriteString(s[i+1 : i+1+end])
			inWord, i = true, i+end+2
		case c == '"':
			inWord = true
			i++
			for {
				if i >= len(s) {
					return nil, fmt.Errorf("unclosed \" in %q", s)
				}
				if s[i] == '"' {
					i++
					break
				}
				if s[i] == '\\' && i+1 < len(s) && strings.IndexByte("\\\"$`", s[i+1]) >= 0 {
					w.WriteByte(s[i+1])
					i += 2
					continue
				}
				if s[i] == '$' {
					j, err := expand(i)
					if err != nil {
						return nil, err
					}
					i = j
					continue
				}
				if s[i] == '`' {
					return nil, fmt.Errorf("command substitution in %q", s)
				}
				w.WriteByte(s[i])
				i++
			}
		case c == '\\' && i+1 < len(s):
			w.WriteByte(s[i+1])
			inWord, i = true, i+2
		case c == '$':
			if i+1 < len(s) && s[i+1] == '(' {
				return nil, fmt.Errorf("command substitution in %q", s)
			}
			j, err := expand(i)
			if err != nil {
				return nil, err
			}
			inWord, i = true, j
		case strings.IndexByte(";|&<>`()", c) >= 0:
			if c == '&' && strings.HasPrefix(s[i:], "&&") && !inWord {
				words = append(words, "&&")
				i += 2
				continue
			}
			return nil, fmt.Errorf("shell operator %q in %q: not followed by this test", c, s)
		default:
			w.WriteByte(c)
			inWord, i = true, i+1
		}
	}
	if inWord {
		words = append(words, w.String())
	}
	return words, nil
}

// goBuild is the Dockerfile's go build: its stage, environment and flags.
type goBuild struct {
	stage   *stage
	env     map[string]string // the stage's ENV and the command's own assignments
	args    []string          // after "go", with "build" first
	out     string            // the -o path
	version string            // what VERSION was set to
}

// findGoBuild finds the RUN with go build, expanding ARG VERSION to
// testVersion (other ARGs to their defaults).
func findGoBuild(t *testing.T, d *dockerfile) goBuild {
	t.Helper()
	var found []goBuild
	for _, s := range d.stages {
		for _, in := range s.all("RUN") {
			args := in.args
			for strings.HasPrefix(args, "--") { // RUN's own flags: --mount=..., --network=...
				_, args, _ = strings.Cut(args, " ")
				args = strings.TrimSpace(args)
			}
			if !strings.Contains(args, "go build") {
				continue
			}
			vars := maps.Clone(s.env)
			for k, v := range s.args {
				vars[k] = v
			}
			vars["VERSION"] = testVersion
			if _, ok := s.args["VERSION"]; !ok {
				t.Errorf("Dockerfile line %d: go build's stage has no ARG VERSION", in.line)
			}
			words, err := shellWords(args, vars)
			if err != nil {
				t.Fatalf("Dockerfile line %d: %v", in.line, err)
			}
			for cmd := range strings.SplitSeq(strings.Join(words, "\x00"), "\x00&&\x00") {
				ws := strings.Split(cmd, "\x00")
				env := maps.Clone(s.env)
				for len(ws) > 0 && strings.Contains(ws[0], "=") && !strings.HasPrefix(ws[0], "-") {
					k, v, _ := strings.Cut(ws[0], "=")
					env[k] = v
					ws = ws[1:]
				}
				if len(ws) < 2 || ws[0] != "go" || ws[1] != "build" {
					continue
				}
				b := goBuild{stage: s, env: env, args: ws[1:], version: testVersion}
				for i, a := range b.args {
					if a == "-o" && i+1 < len(b.args) {
						b.out = b.args[i+1]
					} else if v, ok := strings.CutPrefix(a, "-o="); ok {
						b.out = v
					}
				}
				found = append(found, b)
			}
		}
	}
	if len(found) != 1 {
		t.Fatalf("Dockerfile: want one go build, found %d", len(found))
	}
	return found[0]
}

// TestDockerfile: a multi-stage build whose builder is at least the
// go.mod's Go, that downloads the modules in a layer of their own, builds
// with CGO_ENABLED=0 and -trimpath, and copies the binary to the final
// stage, which is distroless static or scratch, runs as a numeric non-root
// user, exposes the daemon's ports, listens on every interface, and whose
// exec-form ENTRYPOINT is the binary copied.
func TestDockerfile(t *testing.T) {
	d := parseDockerfile(t)
	if len(d.stages) < 2 {
		t.Fatalf("Dockerfile: %d stage, want a multi-stage build", len(d.stages))
	}
	b := findGoBuild(t, d)
	fin := d.final()
	if b.stage == fin {
		t.Fatal("Dockerfile: go build runs in the final stage")
	}

	// The builder's Go is at least the module's.
	img, tag, _ := strings.Cut(b.stage.image, ":")
	if img != "golang" && img != "docker.io/library/golang" {
		t.Errorf("Dockerfile: builder image %s, want golang", b.stage.image)
	}
	goMod := regexp.MustCompile(`(?m)^go (\d+)\.(\d+)`).FindStringSubmatch(string(readFile(t, "go.mod")))
	imgGo := regexp.MustCompile(`^(\d+)\.(\d+)`).FindStringSubmatch(tag)
	if goMod == nil || imgGo == nil {
		t.Errorf("Dockerfile: builder %s: want a golang:MAJOR.MINOR tag to compare with go.mod's go line", b.stage.image)
	} else if a, _ := strconv.Atoi(imgGo[2]); imgGo[1] != goMod[1] || a < mustAtoi(goMod[2]) {
		t.Errorf("Dockerfile: builder %s is older than go.mod's go %s.%s", b.stage.image, goMod[1], goMod[2])
	}

	// go mod download after copying go.mod and go.sum alone, before the rest.
	mods, download, rest := -1, -1, -1
	for i, in := range b.stage.ins {
		switch {
		case in.cmd == "COPY" && mods < 0 && strings.Contains(in.args, "go.mod") && strings.Contains(in.args, "go.sum") && !regexp.MustCompile(`(^|\s)\.\s`).MatchString(in.args):
			mods = i
		case in.cmd == "RUN" && strings.Contains(in.args, "go mod download"):
			download = i
		case in.cmd == "COPY" && rest < 0 && regexp.MustCompile(`^\.\s`).MatchString(in.args):
			rest = i
		}
	}
	if mods < 0 || download < mods || rest < download {
		t.Errorf("Dockerfile: want COPY go.mod go.sum, then RUN go mod download, then COPY . . in the builder stage (found at %d, %d, %d)", mods, download, rest)
	}

	if b.env["CGO_ENABLED"] != "0" {
		t.Errorf("Dockerfile: go build runs with CGO_ENABLED=%q, want 0 (a static binary for %s)", b.env["CGO_ENABLED"], fin.image)
	}
	if !slices.Contains(b.args, "-trimpath") {
		t.Errorf("Dockerfile: go build %v without -trimpath", b.args)
	}
	if !strings.Contains(strings.Join(b.args, " "), "main.version="+testVersion) {
		t.Errorf("Dockerfile: go build %v does not set main.version from ARG VERSION", b.args)
	}
	if b.out == "" || !path.IsAbs(b.out) {
		t.Fatalf("Dockerfile: go build %v: want -o with an absolute path", b.args)
	}

	if !strings.HasPrefix(fin.image, "gcr.io/distroless/static") && fin.image != "scratch" {
		t.Errorf("Dockerfile: final image %s, want gcr.io/distroless/static* or scratch", fin.image)
	}
	users := fin.all("USER")
	if len(users) == 0 {
		t.Errorf("Dockerfile: the final stage has no USER: it runs as root")
	} else {
		u := users[len(users)-1].args
		m := regexp.MustCompile(`^(\d+)(:(\d+))?$`).FindStringSubmatch(u)
		if m == nil {
			t.Errorf("Dockerfile: USER %s: want numeric uid[:gid], which runAsNonRoot can check", u)
		} else if m[1] == "0" || m[3] == "0" {
			t.Errorf("Dockerfile: USER %s is root", u)
		}
	}

	// The binary copied from the builder is the ENTRYPOINT.
	var dst string
	for _, in := range fin.all("COPY") {
		f := strings.Fields(in.args)
		if len(f) == 3 && strings.HasPrefix(f[0], "--from=") {
			if from := d.stage(strings.TrimPrefix(f[0], "--from=")); from == b.stage && f[1] == b.out {
				dst = f[2]
				if strings.HasSuffix(dst, "/") {
					dst += path.Base(b.out)
				}
			}
		}
	}
	if dst == "" {
		t.Errorf("Dockerfile: the final stage does not COPY --from=%s %s", b.stage.name, b.out)
	}
	entry := entrypoint(t, fin)
	if len(entry) == 0 || entry[0] != dst || path.Base(dst) != "hotkeyd" {
		t.Errorf("Dockerfile: ENTRYPOINT %q, want [%q] (the binary copied from the builder)", entry, dst)
	}

	// Listening on every interface, on ports it exposes.
	cfg, err := daemon.ParseArgs(entry[min(1, len(entry)):], lookup(fin.env), io.Discard)
	if err != nil {
		t.Fatalf("Dockerfile: hotkeyd with ENV %v refuses to start: %v", fin.env, err)
	}
	var exposed []string
	for _, in := range fin.all("EXPOSE") {
		for _, p := range strings.Fields(in.args) {
			exposed = append(exposed, strings.TrimSuffix(p, "/tcp"))
		}
	}
	for _, want := range []string{"8080", "8081", "4222"} {
		if !slices.Contains(exposed, want) {
			t.Errorf("Dockerfile: EXPOSE %v lacks %s", exposed, want)
		}
	}
	for flag, addr := range map[string]string{"listen": cfg.Listen, "grpc-listen": cfg.GRPCListen} {
		port := checkAllInterfaces(t, "Dockerfile", flag, addr)
		if port != "" && !slices.Contains(exposed, port) {
			t.Errorf("Dockerfile: --%s %s: port not in EXPOSE %v", flag, addr, exposed)
		}
	}
}

func mustAtoi(s string) int {
	n, err := strconv.Atoi(s)
	if err != nil {
		panic(err)
	}
	return n
}

// entrypoint returns the final stage's exec-form ENTRYPOINT: distroless has
// no shell to run the other form.
func entrypoint(t *testing.T, s *stage) []string {
	t.Helper()
	e := s.all("ENTRYPOINT")
	if len(e) == 0 {
		t.Fatal("Dockerfile: the final stage has no ENTRYPOINT")
	}
	var entry []string
	if err := json.Unmarshal([]byte(e[len(e)-1].args), &entry); err != nil {
		t.Fatalf("Dockerfile line %d: ENTRYPOINT %s: want the exec form [\"...\"] (no shell in the image): %v", e[len(e)-1].line, e[len(e)-1].args, err)
	}
	return entry
}

// containerConfig is the configuration hotkeyd takes in container c of a
// manifest: the image's ENTRYPOINT arguments and ENV (fin, the final
// stage), then c's args and env. It fails t if hotkeyd refuses them.
func containerConfig(t *testing.T, where string, fin *stage, c *container) daemon.Config {
	t.Helper()
	env := maps.Clone(fin.env)
	for _, e := range c.Env {
		if e.ValueFrom != nil {
			t.Errorf("%s: env %s from valueFrom: not followed by this test", where, e.Name)
		}
		env[e.Name] = e.Value
	}
	args := append(slices.Clone(entrypoint(t, fin)[1:]), c.Args...)
	cfg, err := daemon.ParseArgs(args, lookup(env), io.Discard)
	if err != nil {
		t.Fatalf("%s: hotkeyd %q with %v refuses to start: %v", where, args, env, err)
	}
	return cfg
}

// checkAllInterfaces fails t unless addr (host:port) listens on every
// interface, as a server in a container must to be reached; it returns the
// port.
func checkAllInterfaces(t *testing.T, where, flag, addr string) string {
	t.Helper()
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		t.Errorf("%s: --%s %q: %v", where, flag, addr, err)
		return ""
	}
	if ip := net.ParseIP(host); host != "" && (ip == nil || !ip.IsUnspecified()) {
		t.Errorf("%s: --%s %s: in a container, listen on 0.0.0.0 (or :port), not %s", where, flag, addr, host)
	}
	return port
}

func lookup(env map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := env[k]; return v, ok }
}

// TestDockerBuild runs the Dockerfile's go build, with its environment and
// flags, on what .dockerignore leaves of the tree (so an ignore pattern
// that drops a needed file fails), then checks that the binary is static
// (no program interpreter, no shared library needed) and reports the
// version the build gave it.
func TestDockerBuild(t *testing.T) {
	if testing.Short() {
		t.Skip("builds hotkeyd: not with -short")
	}
	d := parseDockerfile(t)
	b := findGoBuild(t, d)
	if b.env["CGO_ENABLED"] != "0" {
		t.Fatalf("go build without CGO_ENABLED=0 (TestDockerfile)")
	}
	ctxDir := t.TempDir()
	n := copyContext(t, ctxDir)
	bin := filepath.Join(t.TempDir(), "hotkeyd")
	args := slices.Clone(b.args)
	for i, a := range args {
		if a == "-o" {
			args[i+1] = bin
		} else if strings.HasPrefix(a, "-o=") {
			args[i] = "-o=" + bin
		}
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command on PATH")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, goBin, args...)
	cmd.Dir = ctxDir
	cmd.Env = os.Environ()
	for k, v := range b.env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	start := time.Now()
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go %s in a copy of the build context (%d files left by .dockerignore): %v\n%s", strings.Join(args, " "), n, err, out)
	}
	t.Logf("go %s: %d files in the context, built in %v", strings.Join(args, " "), n, time.Since(start).Round(time.Millisecond))

	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Errorf("%s has a program interpreter (PT_INTERP): dynamically linked, it cannot run on %s", bin, d.final().image)
		}
	}
	if libs, err := f.ImportedLibraries(); err != nil {
		t.Errorf("reading DT_NEEDED: %v", err)
	} else if len(libs) > 0 {
		t.Errorf("%s needs shared libraries %v (DT_NEEDED)", bin, libs)
	}
	out, err := exec.CommandContext(ctx, bin, "--version").CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "hotkeyd "+testVersion {
		t.Errorf("hotkeyd --version: %q, %v; want \"hotkeyd %s\" (ARG VERSION through -ldflags)", out, err, testVersion)
	}
}

// dockerignore is .dockerignore's patterns (filepath.Match syntax, "!" to
// re-include, the last match deciding).
type dockerignore []string

func (ig dockerignore) ignored(rel string) bool {
	ign := false
	for _, p := range ig {
		neg := strings.HasPrefix(p, "!")
		p = strings.TrimPrefix(p, "!")
		// A pattern matches the path or a directory above it.
		for q := rel; q != "." && q != "/"; q = path.Dir(q) {
			if ok, _ := path.Match(p, q); ok {
				ign = !neg
				break
			}
		}
	}
	return ign
}

func readDockerignore(t *testing.T) dockerignore {
	t.Helper()
	var ig dockerignore
	for _, l := range strings.Split(string(readFile(t, ".dockerignore")), "\n") {
		l = strings.TrimSpace(l)
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		neg := strings.HasPrefix(l, "!")
		p := path.Clean(strings.TrimPrefix(strings.TrimPrefix(l, "!"), "/"))
		if strings.Contains(p, "**") {
			t.Fatalf(".dockerignore: %s: ** is not followed by this test", l)
		}
		if _, err := path.Match(p, ""); err != nil {
			t.Fatalf(".dockerignore: %s: %v", l, err)
		}
		if neg {
			p = "!" + p
		}
		ig = append(ig, p)
	}
	return ig
}

// copyContext copies the files of the tree that .dockerignore leaves into
// dir, and returns how many.
func copyContext(t *testing.T, dir string) int {
	t.Helper()
	ig := readDockerignore(t)
	if !ig.ignored(".git") {
		t.Errorf(".dockerignore does not leave out .git")
	}
	n := 0
	err := filepath.WalkDir(root, func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) { // removed while we walk: others edit the tree
				return nil
			}
			return err
		}
		rel, _ := filepath.Rel(root, p)
		rel = filepath.ToSlash(rel)
		if rel == "." {
			return nil
		}
		if ig.ignored(rel) {
			if e.IsDir() && !slices.ContainsFunc(ig, func(p string) bool { return strings.HasPrefix(p, "!") }) {
				return filepath.SkipDir
			}
			return nil
		}
		dst := filepath.Join(dir, filepath.FromSlash(rel))
		if e.IsDir() {
			return os.MkdirAll(dst, 0o755)
		}
		if !e.Type().IsRegular() {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		n++
		return os.WriteFile(dst, b, 0o644)
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// ---------------------------------------------------------------- compose

type composeService struct {
	Image       string         `yaml:"image"`
	Build       any            `yaml:"build"`
	Command     any            `yaml:"command"`
	Entrypoint  any            `yaml:"entrypoint"`
	Environment any            `yaml:"environment"`
	Volumes     []any          `yaml:"volumes"`
	Ports       []any          `yaml:"ports"`
	DependsOn   any            `yaml:"depends_on"`
	Extra       map[string]any `yaml:",inline"`
}

// mounts are a container's bind mounts: container path → host path
// (relative to the repository root, slashes).
type mounts map[string]string

// resolve maps a path in the container to the host path mounted there.
func (m mounts) resolve(p string) (string, bool) {
	best := ""
	for dst := range m {
		if (p == dst || strings.HasPrefix(p, strings.TrimSuffix(dst, "/")+"/")) && len(dst) > len(best) {
			best = dst
		}
	}
	if best == "" {
		return "", false
	}
	return path.Join(m[best], strings.TrimPrefix(p, best)), true
}

func composeMounts(t *testing.T, name string, s composeService) mounts {
	t.Helper()
	m := mounts{}
	for _, v := range s.Volumes {
		var src, dst string
		switch v := v.(type) {
		case string:
			f := strings.Split(v, ":")
			if len(f) < 2 {
				continue // a named volume without target: not a bind mount
			}
			src, dst = f[0], f[1]
		case map[string]any:
			src, _ = v["source"].(string)
			dst, _ = v["target"].(string)
		}
		if strings.HasPrefix(src, ".") || strings.HasPrefix(src, "/") {
			if strings.HasPrefix(src, "/") {
				t.Errorf("compose service %s: volume %v: a host path outside the repository", name, v)
				continue
			}
			m[dst] = path.Clean(src)
		}
	}
	return m
}

func stringList(t *testing.T, where string, v any) []string {
	t.Helper()
	if v == nil {
		return nil
	}
	l, ok := v.([]any)
	if !ok {
		t.Fatalf("%s: %v: want a YAML list (a string would be split by a shell this test does not follow)", where, v)
	}
	out := make([]string, len(l))
	for i, x := range l {
		switch x := x.(type) {
		case string:
			out[i] = x
		case int, float64, bool:
			out[i] = fmt.Sprint(x)
		default:
			t.Fatalf("%s: item %v: want a string", where, x)
		}
	}
	return out
}

func composeEnv(t *testing.T, where string, v any) map[string]string {
	t.Helper()
	env := map[string]string{}
	switch v := v.(type) {
	case nil:
	case map[string]any:
		for k, x := range v {
			if x == nil {
				t.Errorf("%s: environment %s without a value (taken from the host's)", where, k)
				continue
			}
			env[k] = fmt.Sprint(x)
		}
	case []any:
		for _, x := range v {
			k, val, ok := strings.Cut(fmt.Sprint(x), "=")
			if !ok {
				t.Errorf("%s: environment %s without a value (taken from the host's)", where, x)
			}
			env[k] = val
		}
	default:
		t.Fatalf("%s: environment %v: want a mapping or a list", where, v)
	}
	return env
}

type compose struct {
	services map[string]composeService
	secrets  map[string]any           // the top-level secrets, by name
	hotkeyd  map[string]daemon.Config // the services built from the Dockerfile
}

func loadCompose(t *testing.T) compose {
	t.Helper()
	var doc struct {
		Services map[string]composeService `yaml:"services"`
		Secrets  map[string]any            `yaml:"secrets"`
	}
	if err := yaml.Unmarshal(readFile(t, composeFile), &doc); err != nil {
		t.Fatalf("%s: %v", composeFile, err)
	}
	if len(doc.Services) == 0 {
		t.Fatalf("%s: no services", composeFile)
	}
	return compose{services: doc.Services, secrets: doc.Secrets, hotkeyd: map[string]daemon.Config{}}
}

// serviceByImage returns the one service whose image starts with prefix.
func (c compose) serviceByImage(t *testing.T, prefix string) (string, composeService) {
	t.Helper()
	var names []string
	for n, s := range c.services {
		if strings.HasPrefix(s.Image, prefix) {
			names = append(names, n)
		}
	}
	if len(names) != 1 {
		t.Fatalf("%s: want one service of image %s*, found %v", composeFile, prefix, names)
	}
	return names[0], c.services[names[0]]
}

// hostIsService checks that rawURL's host is the compose service want
// and returns its port.
func (c compose) hostIsService(t *testing.T, where, rawURL, want string) string {
	t.Helper()
	u, err := url.Parse(rawURL)
	if err != nil {
		t.Errorf("%s: %q: %v", where, rawURL, err)
		return ""
	}
	if u.Hostname() != want {
		t.Errorf("%s: %s: host %q, want the compose service %q", where, rawURL, u.Hostname(), want)
	}
	if _, ok := c.services[u.Hostname()]; !ok {
		t.Errorf("%s: %s: no compose service %q", where, rawURL, u.Hostname())
	}
	return u.Port()
}

// TestCompose: each service built from the Dockerfile runs hotkeyd with a
// command line and environment (the image's ENV, then the service's) that
// hotkeyd accepts, listening on every interface, with its policies file
// mounted and accepted, its counters in the redis service and its hot keys
// agreed over the nats service, all of them the same; Prometheus loads
// the alert rules and scrapes every daemon's /metrics on its admin port;
// Grafana's provisioning points at the Prometheus service and at the
// dashboard.
func TestCompose(t *testing.T) {
	c := loadCompose(t)
	d := parseDockerfile(t)
	fin := d.final()
	entry := entrypoint(t, fin)

	for name, s := range c.services {
		if s.Build == nil {
			continue
		}
		where := composeFile + ": service " + name
		ctx, file := ".", "Dockerfile"
		switch b := s.Build.(type) {
		case string:
			ctx = b
		case map[string]any:
			if v, ok := b["context"].(string); ok {
				ctx = v
			}
			if v, ok := b["dockerfile"].(string); ok {
				file = v
			}
		}
		if path.Clean(ctx) != "." || file != dockerfileName {
			t.Errorf("%s: builds %s/%s, want ./%s", where, ctx, file, dockerfileName)
		}
		if s.Entrypoint != nil {
			t.Errorf("%s: entrypoint overrides the image's", where)
		}
		env := maps.Clone(fin.env)
		maps.Copy(env, composeEnv(t, where, s.Environment))
		args := append(slices.Clone(entry[1:]), stringList(t, where+": command", s.Command)...)
		cfg, err := daemon.ParseArgs(args, lookup(env), io.Discard)
		if err != nil {
			t.Errorf("%s: hotkeyd %q with %v refuses to start: %v", where, args, env, err)
			continue
		}
		c.hotkeyd[name] = cfg
		checkAllInterfaces(t, where, "listen", cfg.Listen)
		if cfg.AdminListen == "" {
			t.Errorf("%s: no --admin-listen: Prometheus has no /metrics to scrape", where)
		} else {
			checkAllInterfaces(t, where, "admin-listen", cfg.AdminListen)
		}
		if cfg.GRPCListen != "" {
			checkAllInterfaces(t, where, "grpc-listen", cfg.GRPCListen)
		}
		if cfg.NATS == "" {
			t.Errorf("%s: no --nats: each daemon would embed its own NATS server and agree with no other", where)
		} else {
			for u := range strings.SplitSeq(cfg.NATS, ",") {
				if p := c.hostIsService(t, where+": --nats", u, "nats"); p != "4222" {
					t.Errorf("%s: --nats %s: port %q, want NATS's 4222", where, u, p)
				}
			}
		}
		if cfg.Redis == "" {
			t.Errorf("%s: no --redis: counters in memory, not shared", where)
		} else {
			c.hostIsService(t, where+": --redis", cfg.Redis, "redis")
		}
		c.checkSecret(t, where, s, cfg.NATSSecretFile)
		if cfg.Policies != "" {
			host, ok := composeMounts(t, name, s).resolve(cfg.Policies)
			if !ok {
				t.Errorf("%s: --policies %s: no volume mounts it", where, cfg.Policies)
			} else {
				checkPolicies(t, where+": "+host, readFile(t, host))
			}
		}
	}
	if len(c.hotkeyd) < 2 {
		t.Fatalf("%s: %d hotkeyd services (built from the Dockerfile), want 2", composeFile, len(c.hotkeyd))
	}
	var first *daemon.Config
	for name, cfg := range c.hotkeyd {
		if first == nil {
			first = &cfg
		} else if cfg.NATS != first.NATS || cfg.Redis != first.Redis {
			t.Errorf("%s: service %s: --nats %s --redis %s, unlike another daemon's %s, %s: they would not share counters and hot keys", composeFile, name, cfg.NATS, cfg.Redis, first.NATS, first.Redis)
		}
	}

	checkComposePrometheus(t, c)
	checkComposeGrafana(t, c)
}

// checkSecret: a daemon of the fleet signs its NATS messages with a secret
// file (--nats-secret-file), one of the compose file's secrets given to s.
func (c compose) checkSecret(t *testing.T, where string, s composeService, file string) {
	t.Helper()
	name, ok := strings.CutPrefix(file, "/run/secrets/")
	if !ok {
		t.Errorf("%s: --nats-secret-file %q, want a compose secret's /run/secrets/NAME: unsigned, anyone who reaches NATS can forge leases and gossip rounds", where, file)
		return
	}
	given := false
	if list, ok := s.Extra["secrets"].([]any); ok {
		for _, v := range list {
			if v == name {
				given = true
			}
		}
	}
	if _, defined := c.secrets[name]; !defined || !given {
		t.Errorf("%s: --nats-secret-file %s: secret %q defined %v, given to the service %v; want both", where, file, name, defined, given)
	}
}

func checkComposePrometheus(t *testing.T, c compose) {
	name, s := c.serviceByImage(t, "prom/prometheus")
	where := composeFile + ": service " + name
	conf := "/etc/prometheus/prometheus.yml"
	for _, a := range stringList(t, where+": command", s.Command) {
		if v, ok := strings.CutPrefix(a, "--config.file="); ok {
			conf = v
		}
	}
	m := composeMounts(t, name, s)
	host, ok := m.resolve(conf)
	if !ok {
		t.Fatalf("%s: %s is not mounted", where, conf)
	}
	if host != "deploy/compose/prometheus.yml" {
		t.Errorf("%s: %s is %s, want deploy/compose/prometheus.yml", where, conf, host)
	}
	var pc struct {
		RuleFiles     []string `yaml:"rule_files"`
		ScrapeConfigs []struct {
			JobName       string `yaml:"job_name"`
			MetricsPath   string `yaml:"metrics_path"`
			StaticConfigs []struct {
				Targets []string `yaml:"targets"`
			} `yaml:"static_configs"`
		} `yaml:"scrape_configs"`
	}
	dec := yaml.NewDecoder(bytes.NewReader(readFile(t, host)))
	if err := dec.Decode(&pc); err != nil {
		t.Fatalf("%s: %v", host, err)
	}
	var rules []string
	for _, r := range pc.RuleFiles {
		if strings.ContainsAny(r, "*?[") {
			t.Errorf("%s: rule_files %s: a glob, which this test does not follow", host, r)
			continue
		}
		h, ok := m.resolve(r)
		if !ok {
			t.Errorf("%s: rule_files %s: not mounted in service %s", host, r, name)
			continue
		}
		if _, err := os.Stat(rootPath(h)); err != nil {
			t.Errorf("%s: rule_files %s: %v", host, r, err)
		}
		rules = append(rules, h)
	}
	if !slices.Contains(rules, alertsFile) {
		t.Errorf("%s: rule_files %v (on the host %v) do not load %s", host, pc.RuleFiles, rules, alertsFile)
	}
	scraped := map[string]bool{}
	for _, sc := range pc.ScrapeConfigs {
		for _, st := range sc.StaticConfigs {
			for _, tg := range st.Targets {
				h, port, err := net.SplitHostPort(tg)
				if err != nil {
					t.Errorf("%s: job %s: target %q: %v", host, sc.JobName, tg, err)
					continue
				}
				cfg, ok := c.hotkeyd[h]
				if !ok {
					if _, svc := c.services[h]; !svc {
						t.Errorf("%s: job %s: target %s: no compose service %q", host, sc.JobName, tg, h)
					}
					continue
				}
				if _, lp, _ := net.SplitHostPort(cfg.AdminListen); lp != port {
					t.Errorf("%s: job %s: target %s: the daemon serves /metrics on --admin-listen %s", host, sc.JobName, tg, cfg.AdminListen)
				}
				routeAnswers(t, host+": job "+sc.JobName+": metrics_path", cmpOr(sc.MetricsPath, "/metrics"), true)
				scraped[h] = true
			}
		}
	}
	for h := range c.hotkeyd {
		if !scraped[h] {
			t.Errorf("%s: does not scrape the hotkeyd service %s", host, h)
		}
	}
}

func cmpOr(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

func checkComposeGrafana(t *testing.T, c compose) {
	name, s := c.serviceByImage(t, "grafana/grafana")
	where := composeFile + ": service " + name
	env := composeEnv(t, where, s.Environment)
	m := composeMounts(t, name, s)
	prov, ok := m.resolve(cmpOr(env["GF_PATHS_PROVISIONING"], "/etc/grafana/provisioning"))
	if !ok {
		t.Fatalf("%s: the provisioning directory is not mounted", where)
	}
	if p := env["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]; p != "" {
		if h, ok := m.resolve(p); !ok || h != dashboardFile {
			t.Errorf("%s: GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH %s is %q on the host, want %s", where, p, h, dashboardFile)
		}
	}

	promName, _ := c.serviceByImage(t, "prom/prometheus")
	dsFiles, _ := filepath.Glob(filepath.Join(rootPath(prov), "datasources", "*.y*ml"))
	promDS := 0
	for _, f := range dsFiles {
		var doc struct {
			Datasources []struct {
				Type, URL, UID string
			} `yaml:"datasources"`
		}
		readYAML(t, f, &doc)
		for _, ds := range doc.Datasources {
			if ds.Type == "prometheus" {
				promDS++
				if p := c.hostIsService(t, f, ds.URL, promName); p != "9090" {
					t.Errorf("%s: %s: port %q, want Prometheus's 9090", f, ds.URL, p)
				}
			}
		}
	}
	if promDS == 0 {
		t.Errorf("%s: no prometheus datasource in %s/datasources", where, prov)
	}

	dbFiles, _ := filepath.Glob(filepath.Join(rootPath(prov), "dashboards", "*.y*ml"))
	found := false
	for _, f := range dbFiles {
		var doc struct {
			Providers []struct {
				Type    string
				Options struct{ Path string }
			} `yaml:"providers"`
		}
		readYAML(t, f, &doc)
		for _, p := range doc.Providers {
			h, ok := m.resolve(p.Options.Path)
			if !ok {
				t.Errorf("%s: provider path %s is not mounted in service %s", f, p.Options.Path, name)
				continue
			}
			if path.Join(h, path.Base(dashboardFile)) == dashboardFile || h == dashboardFile {
				found = true
			}
		}
	}
	if !found {
		t.Errorf("%s: no dashboard provider (%s/dashboards) loads %s", where, prov, dashboardFile)
	}
}

func checkPolicies(t *testing.T, where string, data []byte) {
	t.Helper()
	ps, err := daemon.ParsePolicies(data)
	if err != nil {
		t.Errorf("%s: the daemon refuses the policies: %v", where, err)
		return
	}
	if len(ps.Names()) < 2 {
		t.Errorf("%s: policies %v: the example should show more than the default", where, ps.Names())
	}
}

// ---------------------------------------------------------------- Kubernetes

type k8sObject struct {
	Kind     string         `yaml:"kind"`
	Metadata map[string]any `yaml:"metadata"`
	Data     map[string]string
	Spec     yaml.Node `yaml:"spec"`
	file     string
}

func (o k8sObject) name() string { s, _ := o.Metadata["name"].(string); return s }

type container struct {
	Name    string
	Image   string
	Command []string
	Args    []string
	Env     []struct {
		Name      string
		Value     string
		ValueFrom any `yaml:"valueFrom"`
	}
	Ports []struct {
		Name          string
		ContainerPort int `yaml:"containerPort"`
	}
	ReadinessProbe *probe `yaml:"readinessProbe"`
	LivenessProbe  *probe `yaml:"livenessProbe"`
	Resources      struct {
		Requests map[string]string
		Limits   map[string]string
	}
	SecurityContext *securityContext `yaml:"securityContext"`
	VolumeMounts    []struct {
		Name      string
		MountPath string `yaml:"mountPath"`
		SubPath   string `yaml:"subPath"`
	} `yaml:"volumeMounts"`
}

type probe struct {
	HTTPGet *struct {
		Path string
		Port any
	} `yaml:"httpGet"`
}

type securityContext struct {
	RunAsNonRoot             *bool  `yaml:"runAsNonRoot"`
	RunAsUser                *int64 `yaml:"runAsUser"`
	ReadOnlyRootFilesystem   *bool  `yaml:"readOnlyRootFilesystem"`
	AllowPrivilegeEscalation *bool  `yaml:"allowPrivilegeEscalation"`
	Privileged               *bool  `yaml:"privileged"`
}

type deploymentSpec struct {
	Replicas int
	Selector struct {
		MatchLabels map[string]string `yaml:"matchLabels"`
	}
	Template struct {
		Metadata struct {
			Labels      map[string]string
			Annotations map[string]string
		}
		Spec struct {
			SecurityContext *securityContext `yaml:"securityContext"`
			Containers      []container
			Volumes         []struct {
				Name      string
				ConfigMap *struct {
					Name  string
					Items []struct{ Key, Path string }
				} `yaml:"configMap"`
				Secret *struct {
					SecretName string `yaml:"secretName"`
				} `yaml:"secret"`
			}
		}
	}
}

func loadK8s(t *testing.T) []k8sObject {
	t.Helper()
	var kust struct {
		Resources []string
	}
	if err := yaml.Unmarshal(readFile(t, k8sDir+"/kustomization.yaml"), &kust); err != nil {
		t.Fatalf("kustomization.yaml: %v", err)
	}
	files, _ := filepath.Glob(filepath.Join(rootPath(k8sDir), "*.yaml"))
	var objs []k8sObject
	for _, f := range files {
		base := filepath.Base(f)
		if base == "kustomization.yaml" {
			continue
		}
		if !slices.Contains(kust.Resources, base) {
			t.Errorf("%s/kustomization.yaml: resources %v leave out %s: kubectl apply -k would not apply it", k8sDir, kust.Resources, base)
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		dec := yaml.NewDecoder(bytes.NewReader(b))
		for {
			var o k8sObject
			if err := dec.Decode(&o); errors.Is(err, io.EOF) {
				break
			} else if err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			if o.Kind == "" {
				continue
			}
			o.file = k8sDir + "/" + base
			objs = append(objs, o)
		}
	}
	for _, r := range kust.Resources {
		if _, err := os.Stat(filepath.Join(rootPath(k8sDir), r)); err != nil {
			t.Errorf("%s/kustomization.yaml: resource %s: %v", k8sDir, r, err)
		}
	}
	return objs
}

func selects(sel, labels map[string]string) bool {
	if len(sel) == 0 {
		return false
	}
	for k, v := range sel {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// TestKubernetes: the Deployment runs 2+ replicas of hotkeyd with args and
// env (over the image's ENV) that hotkeyd accepts, listening on every
// interface on the ports it declares; its probes are the daemon's /readyz
// and /healthz on the HTTP port; it runs as non-root with a read-only root
// file system and no privilege escalation, with resources; its --policies
// file comes from a ConfigMap of the manifests that the daemon's parser
// accepts; the Service and the PodDisruptionBudget select its pods, the
// Service's ports reach the HTTP and gRPC listeners, and the budget lets a
// drain proceed.
func TestKubernetes(t *testing.T) {
	objs := loadK8s(t)
	fin := parseDockerfile(t).final()
	entry := entrypoint(t, fin)
	byKind := map[string][]k8sObject{}
	for _, o := range objs {
		byKind[o.Kind] = append(byKind[o.Kind], o)
	}
	for _, k := range []string{"Deployment", "PodDisruptionBudget", "ConfigMap"} {
		if len(byKind[k]) != 1 {
			t.Fatalf("%s: want one %s, found %d", k8sDir, k, len(byKind[k]))
		}
	}
	dep := byKind["Deployment"][0]
	var spec deploymentSpec
	if err := dep.Spec.Decode(&spec); err != nil {
		t.Fatalf("%s: Deployment: %v", dep.file, err)
	}
	where := dep.file + ": Deployment " + dep.name()
	if spec.Replicas < 2 {
		t.Errorf("%s: %d replicas, want 2 or more", where, spec.Replicas)
	}
	pod := spec.Template.Metadata.Labels
	if !selects(spec.Selector.MatchLabels, pod) {
		t.Errorf("%s: selector %v does not select its pods %v", where, spec.Selector.MatchLabels, pod)
	}
	var c *container
	for i := range spec.Template.Spec.Containers {
		if strings.Contains(spec.Template.Spec.Containers[i].Image, "hotkeyd") {
			c = &spec.Template.Spec.Containers[i]
		}
	}
	if c == nil {
		t.Fatalf("%s: no hotkeyd container", where)
	}
	where += ": container " + c.Name
	if len(c.Command) > 0 && !slices.Equal(c.Command, entry[:1]) {
		t.Errorf("%s: command %v overrides the image's ENTRYPOINT %v", where, c.Command, entry)
	}
	cfg := containerConfig(t, where, fin, c)
	if cfg.NATS == "" {
		t.Errorf("%s: no --nats: each pod would embed its own NATS server and agree with no other", where)
	}
	if cfg.Redis == "" && len(cfg.RedisCluster) == 0 {
		t.Errorf("%s: no --redis or --redis-cluster: counters in memory, not shared", where)
	}

	// Ports: the declared ones are the listeners'.
	ports := map[string]int{}
	for _, p := range c.Ports {
		ports[p.Name] = p.ContainerPort
	}
	for flag, want := range map[string]string{"listen": "http", "grpc-listen": "grpc", "admin-listen": "admin"} {
		addr := map[string]string{"listen": cfg.Listen, "grpc-listen": cfg.GRPCListen, "admin-listen": cfg.AdminListen}[flag]
		lp := checkAllInterfaces(t, where, flag, addr)
		if strconv.Itoa(ports[want]) != lp {
			t.Errorf("%s: port %s is %d, but --%s is %s", where, want, ports[want], flag, addr)
		}
	}
	portOf := func(v any) int {
		switch v := v.(type) {
		case int:
			return v
		case string:
			return ports[v]
		}
		return 0
	}
	_, httpPort, _ := net.SplitHostPort(cfg.Listen)
	_, adminPort, _ := net.SplitHostPort(cfg.AdminListen)
	// The probes ask the API listener: the one that must answer decisions.
	for _, p := range []struct {
		name, path string
		probe      *probe
	}{{"readinessProbe", "/readyz", c.ReadinessProbe}, {"livenessProbe", "/healthz", c.LivenessProbe}} {
		if p.probe == nil || p.probe.HTTPGet == nil {
			t.Errorf("%s: no %s httpGet", where, p.name)
			continue
		}
		if p.probe.HTTPGet.Path != p.path {
			t.Errorf("%s: %s on %s, want %s", where, p.name, p.probe.HTTPGet.Path, p.path)
		}
		if strconv.Itoa(portOf(p.probe.HTTPGet.Port)) != httpPort {
			t.Errorf("%s: %s on port %v, but the daemon's HTTP is --listen %s", where, p.name, p.probe.HTTPGet.Port, cfg.Listen)
		}
		routeAnswers(t, where+": "+p.name, p.probe.HTTPGet.Path, false)
	}
	if a := spec.Template.Metadata.Annotations; a["prometheus.io/scrape"] != "true" {
		t.Errorf("%s: no prometheus.io/scrape: \"true\": the pods' metrics are not scraped", where)
	} else {
		if a["prometheus.io/port"] != adminPort {
			t.Errorf("%s: prometheus.io/port %s, but /metrics is on --admin-listen %s", where, a["prometheus.io/port"], cfg.AdminListen)
		}
		routeAnswers(t, where+": prometheus.io/path", cmpOr(a["prometheus.io/path"], "/metrics"), true)
	}

	// Security and resources.
	podSC, sc := spec.Template.Spec.SecurityContext, c.SecurityContext
	if sc == nil {
		sc = &securityContext{}
	}
	if podSC == nil {
		podSC = &securityContext{}
	}
	isTrue := func(b *bool) bool { return b != nil && *b }
	if !isTrue(sc.RunAsNonRoot) && !isTrue(podSC.RunAsNonRoot) {
		t.Errorf("%s: no runAsNonRoot: true", where)
	}
	for _, u := range []*int64{sc.RunAsUser, podSC.RunAsUser} {
		if u != nil && *u == 0 {
			t.Errorf("%s: runAsUser 0", where)
		}
	}
	if !isTrue(sc.ReadOnlyRootFilesystem) {
		t.Errorf("%s: no readOnlyRootFilesystem: true", where)
	}
	if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
		t.Errorf("%s: no allowPrivilegeEscalation: false", where)
	}
	if isTrue(sc.Privileged) {
		t.Errorf("%s: privileged", where)
	}
	if c.Resources.Requests["cpu"] == "" || c.Resources.Requests["memory"] == "" || c.Resources.Limits["memory"] == "" {
		t.Errorf("%s: resources %+v: want cpu and memory requests and a memory limit", where, c.Resources)
	}

	// The policies file, from the ConfigMap.
	cm := byKind["ConfigMap"][0]
	if cfg.Policies == "" {
		t.Errorf("%s: no --policies", where)
	} else {
		var key, volName string
		for _, vm := range c.VolumeMounts {
			if rel, ok := strings.CutPrefix(cfg.Policies, strings.TrimSuffix(vm.MountPath, "/")+"/"); ok && vm.SubPath == "" {
				key, volName = rel, vm.Name
			} else if vm.MountPath == cfg.Policies && vm.SubPath != "" {
				t.Errorf("%s: --policies %s is mounted with subPath, which the kubelet never updates: a change of the ConfigMap would not reach the daemon", where, cfg.Policies)
			}
		}
		if volName == "" {
			t.Fatalf("%s: --policies %s: no volume mounted there", where, cfg.Policies)
		}
		var cmName string
		for _, v := range spec.Template.Spec.Volumes {
			if v.Name == volName && v.ConfigMap != nil {
				cmName = v.ConfigMap.Name
				if len(v.ConfigMap.Items) > 0 {
					mapped := ""
					for _, it := range v.ConfigMap.Items {
						if it.Path == key {
							mapped = it.Key
						}
					}
					key = mapped
				}
			}
		}
		if cmName != cm.name() {
			t.Errorf("%s: --policies %s: volume %s is ConfigMap %q, want %q", where, cfg.Policies, volName, cmName, cm.name())
		} else if data, ok := cm.Data[key]; !ok {
			t.Errorf("%s: ConfigMap %s has no key %q for --policies %s", cm.file, cm.name(), key, cfg.Policies)
		} else {
			checkPolicies(t, cm.file+": "+key, []byte(data))
		}
	}

	// The NATS secret, from a Secret.
	secretVol := ""
	for _, vm := range c.VolumeMounts {
		if cfg.NATSSecretFile != "" && strings.HasPrefix(cfg.NATSSecretFile, strings.TrimSuffix(vm.MountPath, "/")+"/") {
			secretVol = vm.Name
		}
	}
	fromSecret := false
	for _, v := range spec.Template.Spec.Volumes {
		fromSecret = fromSecret || v.Name == secretVol && v.Secret != nil && v.Secret.SecretName != ""
	}
	if !fromSecret {
		t.Errorf("%s: --nats-secret-file %q: want a file of a mounted Secret: unsigned, anyone who reaches NATS can forge leases and gossip rounds", where, cfg.NATSSecretFile)
	}

	// The Service and the budget.
	svc := k8sServices(t, byKind["Service"], false)
	var svcSpec struct {
		Selector map[string]string
		Ports    []struct {
			Name       string
			Port       int
			TargetPort any `yaml:"targetPort"`
		}
	}
	if err := svc.Spec.Decode(&svcSpec); err != nil {
		t.Fatal(err)
	}
	if !selects(svcSpec.Selector, pod) {
		t.Errorf("%s: Service selector %v does not select the pods %v", svc.file, svcSpec.Selector, pod)
	}
	svcPorts := map[string]int{}
	for _, p := range svcSpec.Ports {
		tp := p.TargetPort
		if tp == nil {
			tp = p.Port
		}
		svcPorts[p.Name] = portOf(tp)
		if p.Name == "http" && p.Port != 8080 || p.Name == "grpc" && p.Port != 8081 {
			t.Errorf("%s: Service port %s is %d, want http 8080, grpc 8081", svc.file, p.Name, p.Port)
		}
	}
	for name, addr := range map[string]string{"http": cfg.Listen, "grpc": cfg.GRPCListen} {
		_, lp, _ := net.SplitHostPort(addr)
		if strconv.Itoa(svcPorts[name]) != lp {
			t.Errorf("%s: Service port %s reaches container port %d, but the daemon listens on %s", svc.file, name, svcPorts[name], addr)
		}
	}
	// No Service reaches the admin listener: it lists raw keys.
	for _, s := range byKind["Service"] {
		var spec struct {
			Ports []struct {
				Name       string
				Port       int
				TargetPort any `yaml:"targetPort"`
			}
		}
		if err := s.Spec.Decode(&spec); err != nil {
			t.Fatal(err)
		}
		for _, p := range spec.Ports {
			tp := p.TargetPort
			if tp == nil {
				tp = p.Port
			}
			if strconv.Itoa(portOf(tp)) == adminPort {
				t.Errorf("%s: Service %s port %s reaches the admin listener (--admin-listen %s): /v1/hotkeys and /metrics list raw keys, for Prometheus only", s.file, s.name(), p.Name, cfg.AdminListen)
			}
		}
	}
	pdb := byKind["PodDisruptionBudget"][0]
	var pdbSpec struct {
		MinAvailable   any `yaml:"minAvailable"`
		MaxUnavailable any `yaml:"maxUnavailable"`
		Selector       struct {
			MatchLabels map[string]string `yaml:"matchLabels"`
		}
	}
	if err := pdb.Spec.Decode(&pdbSpec); err != nil {
		t.Fatal(err)
	}
	if !selects(pdbSpec.Selector.MatchLabels, pod) {
		t.Errorf("%s: selector %v does not select the pods %v", pdb.file, pdbSpec.Selector.MatchLabels, pod)
	}
	switch {
	case pdbSpec.MinAvailable != nil && pdbSpec.MaxUnavailable != nil:
		t.Errorf("%s: minAvailable and maxUnavailable: give one", pdb.file)
	case pdbSpec.MinAvailable != nil:
		if n, ok := pdbSpec.MinAvailable.(int); !ok || n < 1 || n >= spec.Replicas {
			t.Errorf("%s: minAvailable %v: want a number from 1 to replicas-1 (%d), so that a drain can evict a pod", pdb.file, pdbSpec.MinAvailable, spec.Replicas-1)
		}
	case pdbSpec.MaxUnavailable != nil:
		if n, ok := pdbSpec.MaxUnavailable.(int); !ok || n < 1 || n >= spec.Replicas {
			t.Errorf("%s: maxUnavailable %v: want a number from 1 to replicas-1 (%d)", pdb.file, pdbSpec.MaxUnavailable, spec.Replicas-1)
		}
	default:
		t.Errorf("%s: neither minAvailable nor maxUnavailable", pdb.file)
	}
}

// k8sServices returns the one Service of svcs that is headless
// (clusterIP: None) or the one that is not, and fails t unless there is
// exactly one.
func k8sServices(t *testing.T, svcs []k8sObject, headless bool) k8sObject {
	t.Helper()
	var found []k8sObject
	for _, s := range svcs {
		var spec struct {
			ClusterIP string `yaml:"clusterIP"`
		}
		if err := s.Spec.Decode(&spec); err != nil {
			t.Fatalf("%s: Service %s: %v", s.file, s.name(), err)
		}
		if (spec.ClusterIP == "None") == headless {
			found = append(found, s)
		}
	}
	if len(found) != 1 {
		t.Fatalf("%s: want one Service with headless %v, found %d", k8sDir, headless, len(found))
	}
	return found[0]
}

// TestKubernetesGRPC: a headless Service selects the Deployment's pods
// and reaches their gRPC listener, listing pods that are not ready too, so
// that Envoy, resolving its name, sees every pod and its health check
// decides; the daemons send gRPC connections a GOAWAY after an age
// (--grpc-max-connection-age, with a grace), so that clients of the
// ClusterIP Service spread over pods added since they connected.
func TestKubernetesGRPC(t *testing.T) {
	var dep, svc k8sObject
	var svcs []k8sObject
	for _, o := range loadK8s(t) {
		switch o.Kind {
		case "Deployment":
			dep = o
		case "Service":
			svcs = append(svcs, o)
		}
	}
	var spec deploymentSpec
	if err := dep.Spec.Decode(&spec); err != nil {
		t.Fatalf("%s: Deployment: %v", dep.file, err)
	}
	where := dep.file + ": Deployment " + dep.name()
	var c *container
	for i := range spec.Template.Spec.Containers {
		if strings.Contains(spec.Template.Spec.Containers[i].Image, "hotkeyd") {
			c = &spec.Template.Spec.Containers[i]
		}
	}
	if c == nil {
		t.Fatalf("%s: no hotkeyd container", where)
	}
	cfg := containerConfig(t, where, parseDockerfile(t).final(), c)
	if !slices.Contains(c.Args, "--grpc-max-connection-age") || cfg.GRPCMaxConnectionAge <= 0 {
		t.Errorf("%s: args %q: no --grpc-max-connection-age: a connection to the ClusterIP Service stays on its pod for ever, and pods added later get none", where, c.Args)
	}
	if cfg.GRPCMaxConnectionAgeGrace <= 0 {
		t.Errorf("%s: args %q: no --grpc-max-connection-age-grace: a connection past its age waits for ever for its requests", where, c.Args)
	}

	svc = k8sServices(t, svcs, true)
	var svcSpec struct {
		Selector                 map[string]string
		PublishNotReadyAddresses bool `yaml:"publishNotReadyAddresses"`
		Ports                    []struct {
			Name       string
			Port       int
			TargetPort any `yaml:"targetPort"`
		}
	}
	if err := svc.Spec.Decode(&svcSpec); err != nil {
		t.Fatal(err)
	}
	where = svc.file + ": Service " + svc.name()
	if !selects(svcSpec.Selector, spec.Template.Metadata.Labels) {
		t.Errorf("%s: selector %v does not select the pods %v", where, svcSpec.Selector, spec.Template.Metadata.Labels)
	}
	if !svcSpec.PublishNotReadyAddresses {
		t.Errorf("%s: no publishNotReadyAddresses: true: with every pod not ready, Envoy would resolve no host and let every request through", where)
	}
	ports := map[string]int{}
	for _, p := range c.Ports {
		ports[p.Name] = p.ContainerPort
	}
	_, grpcPort, _ := net.SplitHostPort(cfg.GRPCListen)
	found := false
	for _, p := range svcSpec.Ports {
		if p.Name != "grpc" {
			continue
		}
		found = true
		target := 0
		switch tp := p.TargetPort.(type) {
		case nil:
			target = p.Port
		case int:
			target = tp
		case string:
			target = ports[tp]
		}
		if strconv.Itoa(target) != grpcPort {
			t.Errorf("%s: port grpc reaches container port %d, but the daemon listens on --grpc-listen %s", where, target, cfg.GRPCListen)
		}
	}
	if !found {
		t.Errorf("%s: no port named grpc", where)
	}
}

// ---------------------------------------------------------------- a daemon

var (
	plainOnce   sync.Once
	plainDaemon *daemon.Daemon
	plainErr    error
)

// routeAnswers fails t unless GET p answers 200 on a daemon (in memory,
// started once for the package's tests): on its admin listener if admin,
// else on its API listener.
func routeAnswers(t *testing.T, where, p string, admin bool) {
	t.Helper()
	plainOnce.Do(func() {
		plainDaemon, plainErr = daemon.StartArgs(context.Background(), "--listen", "127.0.0.1:0", "--nats-listen", "127.0.0.1:0")
	})
	if plainErr != nil {
		t.Fatal(plainErr)
	}
	addr, listener := plainDaemon.Addr(), "API"
	if admin {
		addr, listener = plainDaemon.AdminAddr(), "admin"
	}
	resp, err := http.Get("http://" + addr + p)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("%s: GET %s on a running daemon's %s listener: %s", where, p, listener, resp.Status)
	}
}

func TestMain(m *testing.M) {
	code := m.Run()
	if plainDaemon != nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		plainDaemon.Shutdown(ctx)
		cancel()
	}
	os.Exit(code)
}

// ---------------------------------------------------------------- metrics

// query is a PromQL expression of the kit, and where it is.
type query struct{ where, expr string }

// walkDashboard calls visit on every JSON object of the dashboard, with
// where it is: the file, the titles of the objects around it and a
// template variable's $name.
func walkDashboard(t *testing.T, visit func(where string, obj map[string]any)) {
	t.Helper()
	var dash map[string]any
	if err := json.Unmarshal(readFile(t, dashboardFile), &dash); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	var walk func(where string, v any)
	walk = func(where string, v any) {
		switch v := v.(type) {
		case map[string]any:
			if title, ok := v["title"].(string); ok {
				where += " / " + title
			} else if name, ok := v["name"].(string); ok {
				where += " / $" + name
			}
			visit(where, v)
			for _, x := range v {
				walk(where, x)
			}
		case []any:
			for _, x := range v {
				walk(where, x)
			}
		}
	}
	walk(dashboardFile, dash)
}

// dashboardQueries returns the dashboard's PromQL: its panels' expr and
// its template variables' query.
func dashboardQueries(t *testing.T) []query {
	t.Helper()
	var qs []query
	walkDashboard(t, func(where string, obj map[string]any) {
		for k, x := range obj {
			if s, ok := x.(string); ok && (k == "expr" || k == "query" && strings.Contains(where, "$")) {
				qs = append(qs, query{where, s})
			}
		}
	})
	return qs
}

// alertQueries returns the expressions of the alert rules.
func alertQueries(t *testing.T) []query {
	t.Helper()
	var doc struct {
		Groups []struct {
			Name  string
			Rules []struct {
				Alert       string
				Expr        string
				For         string
				Labels      map[string]string
				Annotations map[string]string
			}
		}
	}
	dec := yaml.NewDecoder(bytes.NewReader(readFile(t, alertsFile)))
	dec.KnownFields(true)
	if err := dec.Decode(&doc); err != nil {
		t.Fatalf("%s: %v", alertsFile, err)
	}
	var qs []query
	for _, g := range doc.Groups {
		for _, r := range g.Rules {
			qs = append(qs, query{alertsFile + " / " + r.Alert, r.Expr})
		}
	}
	return qs
}

// TestDashboard: the dashboard has a datasource variable that every panel
// and query uses, job and instance variables, and every selector of a
// hotkey metric filters on both.
func TestDashboard(t *testing.T) {
	var dash struct {
		UID        string
		Templating struct {
			List []struct {
				Name, Type string
				Query      any
			}
		}
		Panels []map[string]any
	}
	if err := json.Unmarshal(readFile(t, dashboardFile), &dash); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	if dash.UID == "" {
		t.Errorf("%s: no uid: links to it would break on every import", dashboardFile)
	}
	vars := map[string]string{}
	for _, v := range dash.Templating.List {
		vars[v.Name] = v.Type
		if v.Type == "datasource" && v.Query != "prometheus" {
			t.Errorf("%s: variable %s: datasource of type %v, want prometheus", dashboardFile, v.Name, v.Query)
		}
	}
	dsVar := ""
	for n, typ := range vars {
		if typ == "datasource" {
			dsVar = n
		}
	}
	if dsVar == "" {
		t.Fatalf("%s: no datasource variable", dashboardFile)
	}
	for _, v := range []string{"job", "instance"} {
		if vars[v] != "query" {
			t.Errorf("%s: no query variable %s", dashboardFile, v)
		}
	}
	// Every datasource reference is the variable.
	walkDashboard(t, func(where string, obj map[string]any) {
		if ds, ok := obj["datasource"]; ok {
			uid := ""
			switch ds := ds.(type) {
			case string:
				uid = ds
			case map[string]any:
				uid, _ = ds["uid"].(string)
			}
			if uid != "$"+dsVar && uid != "${"+dsVar+"}" {
				t.Errorf("%s: datasource %v, want the variable $%s", where, ds, dsVar)
			}
		} else if _, ok := obj["targets"]; ok {
			t.Errorf("%s: a panel without datasource", where)
		}
	})

	qs := dashboardQueries(t)
	if len(qs) == 0 {
		t.Fatalf("%s: no queries", dashboardFile)
	}
	for _, q := range qs {
		if strings.HasPrefix(q.expr, "label_values(") {
			continue
		}
		for _, sel := range selectors(q.expr) {
			if !strings.Contains(sel.matchers, `job=~"$job"`) || !strings.Contains(sel.matchers, `instance=~"$instance"`) {
				t.Errorf("%s: %s{%s}: want job=~\"$job\" and instance=~\"$instance\"", q.where, sel.metric, sel.matchers)
			}
		}
	}
}

type selector struct{ metric, matchers string }

var (
	reString   = regexp.MustCompile(`"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|` + "`[^`]*`")
	reMetric   = regexp.MustCompile(`(?:^|[^A-Za-z0-9_:$.])(hotkeyd?_[A-Za-z0-9_:]*)`)
	reSelector = regexp.MustCompile(`(hotkeyd?_[A-Za-z0-9_:]*)\s*\{((?:[^}"]|"(?:[^"\\]|\\.)*")*)\}`)
	reMatcher  = regexp.MustCompile(`([A-Za-z_][A-Za-z0-9_]*)\s*(?:=~|!~|!=|=)\s*"(?:[^"\\]|\\.)*"`)
	reGrouping = regexp.MustCompile(`\b(?:by|without)\s*\(([^)]*)\)`)
	reLabelVal = regexp.MustCompile(`label_values\(\s*(hotkeyd?_[A-Za-z0-9_:]*)(?:\{[^}]*\})?\s*,\s*([A-Za-z_][A-Za-z0-9_]*)\s*\)`)
)

// metricNames returns the hotkey_* and hotkeyd_* names expr uses, outside
// string literals.
func metricNames(expr string) []string {
	var out []string
	for _, m := range reMetric.FindAllStringSubmatch(reString.ReplaceAllString(expr, `""`), -1) {
		if !slices.Contains(out, m[1]) {
			out = append(out, m[1])
		}
	}
	return out
}

func selectors(expr string) []selector {
	var out []selector
	for _, m := range reSelector.FindAllStringSubmatch(expr, -1) {
		out = append(out, selector{m[1], m[2]})
	}
	return out
}

// family is what a scrape says of one metric family.
type family struct {
	typ    dto.MetricType
	labels map[string]bool
}

// familyOf maps a name an expression uses to its family: itself, or for
// name_bucket, name_sum and name_count the histogram (or summary) name.
func familyOf(fams map[string]family, name string) (string, bool) {
	if _, ok := fams[name]; ok {
		return name, true
	}
	for _, suf := range []string{"_bucket", "_sum", "_count"} {
		base, ok := strings.CutSuffix(name, suf)
		if !ok {
			continue
		}
		if f, ok := fams[base]; ok && (f.typ == dto.MetricType_HISTOGRAM || f.typ == dto.MetricType_GAUGE_HISTOGRAM || suf != "_bucket" && f.typ == dto.MetricType_SUMMARY) {
			return base, true
		}
	}
	return "", false
}

// TestMetricNames: every metric the dashboard and the alert rules query,
// and every label their selectors, groupings and label_values use, is one
// that a real daemon's /metrics exposes. The daemon serves TLS, so that its
// TLS metrics are there, and decides over HTTPS on a Redis (behind a
// proxy): a hot key until it splits, denials, decisions near the limit;
// then the proxy cuts Redis off until the breaker opens, so that the
// families that appear only after those events are in the scrape too.
func TestMetricNames(t *testing.T) {
	qs := dashboardQueries(t)
	aq := alertQueries(t)
	qs = append(qs, aq...)

	srv := redistest.ForTest(t)
	proxy, err := faultproxy.New(srv.Addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { proxy.Close() })
	ca := testkit.NewCA(t, "deploy test CA")
	cert, key := ca.Server(t, "hotkeyd", "127.0.0.1")
	d, err := daemon.StartArgs(context.Background(), "--listen", "127.0.0.1:0", "--nats-listen", "127.0.0.1:0",
		"--hot-threshold", "50", "--redis", "redis://"+proxy.Addr(), "--tls-cert", cert, "--tls-key", key,
		"--region", "eu", "--regions", "eu,us") // us never sends: its rounds' age is on /metrics from the start
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		d.Shutdown(ctx)
	})
	base := "https://" + d.Addr()
	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert)
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}}
	t.Cleanup(tr.CloseIdleConnections)
	client := &http.Client{Transport: tr, Timeout: 30 * time.Second}
	allowN := func(key string, cost int) int {
		resp, err := client.Post(base+"/v1/allow", "application/json", strings.NewReader(fmt.Sprintf(`{"policy":"default","key":%q,"cost":%d}`, key, cost)))
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	allow := func(key string) int { return allowN(key, 1) }
	// allowMany asks for one unit of key n times in one request, so that
	// the detector sees them all within a sub-window however slow each
	// request is, and counts the answers in statuses.
	allowMany := func(key string, n int, statuses map[int]int) {
		one := fmt.Sprintf(`{"policy":"default","key":%q}`, key)
		body := `{"requests":[` + strings.Repeat(one+",", n-1) + one + `]}`
		resp, err := client.Post(base+"/v1/allow", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var br daemon.BatchResponse
		if err := json.NewDecoder(resp.Body).Decode(&br); err != nil || resp.StatusCode != http.StatusOK || len(br.Responses) != n {
			t.Fatalf("a batch of %d: %s, %d answers, %v", n, resp.Status, len(br.Responses), err)
		}
		for _, r := range br.Responses {
			statuses[r.Status]++
		}
	}
	scrape := func() map[string]*dto.MetricFamily {
		resp, err := client.Get("http://" + d.AdminAddr() + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("/metrics: %s", resp.Status)
		}
		p := expfmt.NewTextParser(model.UTF8Validation)
		fams, err := p.TextToMetricFamilies(resp.Body)
		if err != nil {
			t.Fatalf("/metrics: %v", err)
		}
		return fams
	}
	fams := map[string]family{}
	add := func(got map[string]*dto.MetricFamily) {
		for name, mf := range got {
			f, ok := fams[name]
			if !ok {
				f = family{typ: mf.GetType(), labels: map[string]bool{}}
				fams[name] = f
			}
			for _, m := range mf.GetMetric() {
				for _, l := range m.GetLabel() {
					f.labels[l.GetName()] = true
				}
			}
			if f.typ == dto.MetricType_HISTOGRAM {
				f.labels["le"] = true
			}
			if f.typ == dto.MetricType_SUMMARY {
				f.labels["quantile"] = true
			}
		}
	}

	// A hot key, allowed then denied, until it splits.
	statuses := map[int]int{}
	took := testkit.For(t, testkit.Patience, "a hot key split (hotkey_level_changes_total in /metrics)", func() bool {
		allowMany("deploy-hot", 300, statuses)
		statuses[allow(fmt.Sprintf("deploy-cold-%d", len(statuses)))]++
		got := scrape()
		add(got)
		return got["hotkey_level_changes_total"] != nil
	})
	// A key that asks for its whole burst (the default policy's 100) twice
	// within a second is denied once; on a machine so slow that a second
	// passed, try again.
	for try := 0; statuses[http.StatusTooManyRequests] == 0 && try < 10; try++ {
		allowN(fmt.Sprintf("deploy-deny-%d", try), 100)
		statuses[allowN(fmt.Sprintf("deploy-deny-%d", try), 100)]++
	}
	t.Logf("hot key split after %v; answers %v", took.Round(time.Millisecond), statuses)
	if statuses[http.StatusOK] == 0 || statuses[http.StatusTooManyRequests] == 0 {
		t.Errorf("answers %v: want allowed (200) and denied (429) decisions", statuses)
	}

	// Redis cut off: the breaker opens.
	proxy.Cut()
	took = testkit.For(t, testkit.Patience, "the breaker open (hotkey_breaker_changes_total in /metrics)", func() bool {
		for range 5 {
			allow(fmt.Sprintf("deploy-outage-%d", time.Now().UnixNano()))
		}
		got := scrape()
		add(got)
		return got["hotkey_breaker_changes_total"] != nil
	})
	t.Logf("breaker open after %v of outage", took.Round(time.Millisecond))

	names := slices.Sorted(maps.Keys(fams))
	var ours []string
	for _, n := range names {
		if strings.HasPrefix(n, "hotkey") {
			ours = append(ours, n)
		}
	}
	t.Logf("families on /metrics: %s", strings.Join(ours, " "))

	used := 0
	missing := map[string][]string{}
	for _, q := range qs {
		known := true
		var labels map[string]bool
		for _, n := range metricNames(q.expr) {
			used++
			fam, ok := familyOf(fams, n)
			if !ok {
				missing[n] = append(missing[n], q.where)
				known = false
				continue
			}
			if labels == nil {
				labels = map[string]bool{"job": true, "instance": true}
			}
			maps.Copy(labels, fams[fam].labels)
		}
		for _, sel := range selectors(q.expr) {
			fam, ok := familyOf(fams, sel.metric)
			if !ok {
				continue
			}
			for _, m := range reMatcher.FindAllStringSubmatch(sel.matchers, -1) {
				if l := m[1]; !fams[fam].labels[l] && l != "job" && l != "instance" && l != "__name__" {
					t.Errorf("%s: %s{%s}: %s has no label %q (it has %v)", q.where, sel.metric, sel.matchers, fam, l, slices.Sorted(maps.Keys(fams[fam].labels)))
				}
			}
		}
		for _, m := range reLabelVal.FindAllStringSubmatch(q.expr, -1) {
			if fam, ok := familyOf(fams, m[1]); ok && !fams[fam].labels[m[2]] && m[2] != "job" && m[2] != "instance" {
				t.Errorf("%s: %s: %s has no label %q", q.where, m[0], fam, m[2])
			}
		}
		if !known || labels == nil {
			continue
		}
		for _, g := range reGrouping.FindAllStringSubmatch(q.expr, -1) {
			for l := range strings.SplitSeq(g[1], ",") {
				if l = strings.TrimSpace(l); l != "" && !labels[l] {
					t.Errorf("%s: grouping by %q, a label none of its metrics has", q.where, l)
				}
			}
		}
	}
	if used == 0 {
		t.Fatal("no hotkey metric in the dashboard and the alert rules")
	}
	for _, n := range slices.Sorted(maps.Keys(missing)) {
		t.Errorf("%s: not on a daemon's /metrics, used by %s", n, strings.Join(slices.Compact(missing[n]), "; "))
	}
}
