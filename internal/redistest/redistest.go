// Package redistest starts real redis-server processes on loopback for tests.
//
// Every server listens on 127.0.0.1 only, keeps no data on disk (no RDB
// snapshots, no AOF) and runs with Pdeathsig set to SIGKILL, so a test binary
// that dies does not leave redis-server processes behind. Processes are only
// ever stopped through their own PID.
package redistest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
)

// ErrNotInstalled is returned when redis-server is not on PATH.
var ErrNotInstalled = errors.New("redistest: redis-server not found on PATH")

const (
	startAttempts = 10               // ports tried before Start gives up
	readyTimeout  = 30 * time.Second // how long a new process may take to answer PING, on a loaded machine too
	clusterWait   = time.Minute      // how long a cluster may take to converge, on a loaded machine too
	cmdTimeout    = 30 * time.Second // how long one setup command may take
	busOffset     = 10000            // cluster bus port = port + busOffset
	maxPort       = 55000            // highest cluster port, so the bus port stays valid
	tailSize      = 2048             // bytes of process output kept for errors
)

// Server is one redis-server process.
//
// Its methods are safe for concurrent use. Addr never changes after Start
// returns, including across Kill and Restart.
type Server struct {
	Addr    string // "127.0.0.1:PORT"
	TLSAddr string // "127.0.0.1:PORT" of the TLS port; empty without TLS

	mu     sync.Mutex
	dir    string   // the server's own working directory, removed by Close
	port   int      // TCP port; fixed for the server's lifetime
	conf   string   // config file, the first argument; "" for none
	extra  []string // extra redis-server arguments (cluster, replica, TLS, Sentinel)
	cmd    *exec.Cmd
	done   chan struct{} // closed once cmd has been waited for
	out    *tail
	closed bool
}

// Start starts a standalone redis-server in a fresh sub-directory of dir (dir
// must exist) and waits until it answers PING. It returns ErrNotInstalled if
// redis-server is not on PATH. The caller must call Close.
func Start(dir string) (*Server, error) {
	if _, err := exec.LookPath("redis-server"); err != nil {
		return nil, ErrNotInstalled
	}
	s, err := start(dir, nil, false)
	if err != nil {
		return nil, fmt.Errorf("redistest: start: %w", err)
	}
	return s, nil
}

// TLS names the PEM files of a server that also listens for TLS.
type TLS struct {
	Cert, Key string // the server's certificate and key
	CA        string // the CA that signs clients' certificates
	// AuthClients makes the server refuse clients without a certificate
	// signed by CA (tls-auth-clients yes).
	AuthClients bool
}

// StartTLS is Start with a TLS port too, at TLSAddr, besides the plain
// one at Addr (for the test's own checks).
func StartTLS(dir string, files TLS) (*Server, error) {
	if _, err := exec.LookPath("redis-server"); err != nil {
		return nil, ErrNotInstalled
	}
	auth := "no"
	if files.AuthClients {
		auth = "yes"
	}
	s, err := startWith(dir, func(s *Server) error {
		p, err := freePort(false)
		if err != nil {
			return err
		}
		s.TLSAddr = net.JoinHostPort("127.0.0.1", strconv.Itoa(p))
		s.extra = []string{"--tls-port", strconv.Itoa(p), "--tls-cert-file", files.Cert, "--tls-key-file", files.Key,
			"--tls-ca-cert-file", files.CA, "--tls-auth-clients", auth}
		return nil
	}, false)
	if err != nil {
		return nil, fmt.Errorf("redistest: start TLS: %w", err)
	}
	return s, nil
}

// StartReplica is Start for a replica of the server at master.
func StartReplica(dir, master string) (*Server, error) {
	host, port, err := net.SplitHostPort(master)
	if err != nil {
		return nil, fmt.Errorf("redistest: start replica: %w", err)
	}
	if _, err := exec.LookPath("redis-server"); err != nil {
		return nil, ErrNotInstalled
	}
	s, err := start(dir, []string{"--replicaof", host, port}, false)
	if err != nil {
		return nil, fmt.Errorf("redistest: start replica: %w", err)
	}
	return s, nil
}

// StartSentinel starts a Redis Sentinel that monitors the master at
// master under name, with a quorum of 1, on a port free a moment ago
// (Sentinel takes no port 0). Its config file, which Sentinel rewrites,
// is in its own directory.
func StartSentinel(dir, name, master string) (*Server, error) {
	host, port, err := net.SplitHostPort(master)
	if err != nil {
		return nil, fmt.Errorf("redistest: start sentinel: %w", err)
	}
	if _, err := exec.LookPath("redis-server"); err != nil {
		return nil, ErrNotInstalled
	}
	s, err := startWith(dir, func(s *Server) error {
		s.conf = filepath.Join(s.dir, "sentinel.conf")
		s.extra = []string{"--sentinel"}
		conf := fmt.Sprintf("sentinel monitor %s %s %s 1\nsentinel down-after-milliseconds %s 5000\n", name, host, port, name)
		return os.WriteFile(s.conf, []byte(conf), 0o600)
	}, false)
	if err != nil {
		return nil, fmt.Errorf("redistest: start sentinel: %w", err)
	}
	return s, nil
}

// start creates the server directory and tries up to startAttempts fresh
// ports, since a port found free may be taken before redis binds it.
func start(dir string, extra []string, cluster bool) (*Server, error) {
	return startWith(dir, func(s *Server) error { s.extra = extra; return nil }, cluster)
}

// startWith is start with setup run before each attempt, once s.dir
// exists, to set the arguments (and pick any other port).
func startWith(dir string, setup func(*Server) error, cluster bool) (*Server, error) {
	sdir, err := os.MkdirTemp(dir, "redis-")
	if err != nil {
		return nil, err
	}
	s := &Server{dir: sdir}
	for range startAttempts {
		if s.port, err = freePort(cluster); err != nil {
			break
		}
		if err = setup(s); err != nil {
			break
		}
		s.Addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port))
		if err = s.run(); err == nil {
			return s, nil
		}
	}
	os.RemoveAll(sdir)
	return nil, err
}

// run starts the process on s.port in s.dir and waits until it answers as
// itself (INFO reports its PID), which implies it answers PING.
// On failure the process is stopped again. The caller holds s.mu or owns s.
func (s *Server) run() error {
	var args []string
	if s.conf != "" {
		args = append(args, s.conf)
	}
	args = append(append(args,
		"--port", strconv.Itoa(s.port),
		"--bind", "127.0.0.1",
		"--save", "",
		"--appendonly", "no",
		"--dir", s.dir,
		"--daemonize", "no",
	), s.extra...)
	cmd := exec.Command("redis-server", args...)
	cmd.Dir = s.dir
	s.out = &tail{}
	cmd.Stdout, cmd.Stderr = s.out, s.out
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	cmd.WaitDelay = time.Second // don't hang on output pipes if something holds them
	if err := cmd.Start(); err != nil {
		return err
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	s.cmd, s.done = cmd, done

	deadline := time.Now().Add(readyTimeout)
	for {
		err := s.ping(cmd.Process.Pid)
		if err == nil {
			return nil
		}
		select {
		case <-done:
			return fmt.Errorf("%s exited early: %s", s.Addr, s.out)
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			s.stop()
			return fmt.Errorf("%s not answering PING: %w: %s", s.Addr, err, s.out)
		}
	}
}

// ping checks that the process listening on s.Addr answers and is pid, not
// some other process that won a race for the port.
func (s *Server) ping(pid int) error {
	// Probe the port first so go-redis does not log every refused dial.
	conn, err := net.DialTimeout("tcp", s.Addr, time.Second)
	if err != nil {
		return err
	}
	conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	cl := client(s.Addr)
	defer cl.Close()
	info, err := cl.Info(ctx, "server").Result()
	if err != nil {
		return err
	}
	if !strings.Contains(info, fmt.Sprintf("process_id:%d\r\n", pid)) {
		return errors.New("another process answers on the port")
	}
	return nil
}

// stop SIGKILLs the process, if it is running, and waits for it to exit.
func (s *Server) stop() error {
	if s.cmd == nil {
		return nil
	}
	select {
	case <-s.done:
		return nil
	default:
	}
	if err := s.cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return err
	}
	<-s.done
	return nil
}

// Pid returns the process ID of the running redis-server, or 0 when it is
// not running.
func (s *Server) Pid() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil || s.cmd.Process == nil {
		return 0
	}
	select {
	case <-s.done:
		return 0
	default:
		return s.cmd.Process.Pid
	}
}

// Close kills the process by PID, waits for it, and removes its directory.
// Safe to call twice; later calls return nil and do nothing.
func (s *Server) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	if err := s.stop(); err != nil {
		return fmt.Errorf("redistest: close: %w", err)
	}
	if err := os.RemoveAll(s.dir); err != nil {
		return fmt.Errorf("redistest: close: %w", err)
	}
	return nil
}

// Kill stops the process abruptly (SIGKILL) and waits for it, without
// removing its dir, for failure tests. Killing a server that is not running
// is a no-op.
func (s *Server) Kill() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.stop(); err != nil {
		return fmt.Errorf("redistest: kill: %w", err)
	}
	return nil
}

// Restart starts the process again on the same port and dir, after Kill or
// an unexpected exit, and waits until it answers PING. Cluster nodes keep
// their nodes.conf and so rejoin their cluster. Restart fails if the server
// is running or closed.
func (s *Server) Restart() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return errors.New("redistest: restart: server closed")
	}
	select {
	case <-s.done:
	default:
		return errors.New("redistest: restart: server still running")
	}
	if err := s.run(); err != nil {
		return fmt.Errorf("redistest: restart: %w", err)
	}
	return nil
}

// Cluster is a Redis Cluster of n masters (no replicas) formed without redis-cli.
type Cluster struct {
	Addrs   []string // Addrs[i] == Servers[i].Addr
	Servers []*Server
}

// StartCluster starts n nodes with --cluster-enabled yes, each in its own
// sub-directory of dir, assigns slots evenly (CLUSTER ADDSLOTSRANGE), sets
// config epochs (CLUSTER SET-CONFIG-EPOCH i+1), meets them (CLUSTER MEET from
// node 0), and waits until every node reports cluster_state:ok and
// cluster_known_nodes:n, and every node's CLUSTER SLOTS covers all 16384
// slots. n must be between 1 and 16384. The caller must call Close.
func StartCluster(dir string, n int) (*Cluster, error) {
	if n < 1 || n > 16384 {
		return nil, fmt.Errorf("redistest: start cluster: bad node count %d", n)
	}
	if _, err := exec.LookPath("redis-server"); err != nil {
		return nil, ErrNotInstalled
	}
	c := &Cluster{}
	if err := c.start(dir, n); err != nil {
		c.Close()
		return nil, fmt.Errorf("redistest: start cluster: %w", err)
	}
	return c, nil
}

func (c *Cluster) start(dir string, n int) error {
	extra := []string{
		"--cluster-enabled", "yes",
		"--cluster-config-file", "nodes.conf",
		"--cluster-node-timeout", "5000",
	}
	for range n {
		s, err := start(dir, extra, true)
		if err != nil {
			return err
		}
		c.Servers = append(c.Servers, s)
		c.Addrs = append(c.Addrs, s.Addr)
	}
	for i, s := range c.Servers {
		lo, hi := i*16384/n, (i+1)*16384/n-1
		if err := do(s.Addr, "CLUSTER", "SET-CONFIG-EPOCH", i+1); err != nil {
			return fmt.Errorf("%s: %w", s.Addr, err)
		}
		if err := do(s.Addr, "CLUSTER", "ADDSLOTSRANGE", lo, hi); err != nil {
			return fmt.Errorf("%s: %w", s.Addr, err)
		}
	}
	for _, s := range c.Servers[1:] {
		if err := do(c.Addrs[0], "CLUSTER", "MEET", "127.0.0.1", s.port); err != nil {
			return fmt.Errorf("%s: meet %s: %w", c.Addrs[0], s.Addr, err)
		}
	}
	deadline := time.Now().Add(clusterWait)
	for {
		err := c.ready()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not ready after %v: %w", clusterWait, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// ready reports nil once every node sees a healthy cluster of all nodes
// whose slots cover the whole key space.
func (c *Cluster) ready() error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	for _, addr := range c.Addrs {
		cl := client(addr)
		defer cl.Close()
		info, err := cl.ClusterInfo(ctx).Result()
		if err != nil {
			return fmt.Errorf("%s: %w", addr, err)
		}
		if !strings.Contains(info, "cluster_state:ok\r\n") ||
			!strings.Contains(info, fmt.Sprintf("cluster_known_nodes:%d\r\n", len(c.Addrs))) {
			return fmt.Errorf("%s: cluster not formed", addr)
		}
		slots, err := cl.ClusterSlots(ctx).Result()
		if err != nil {
			return fmt.Errorf("%s: %w", addr, err)
		}
		covered := 0
		for _, r := range slots {
			covered += r.End - r.Start + 1
		}
		if covered != 16384 {
			return fmt.Errorf("%s: %d of 16384 slots covered", addr, covered)
		}
	}
	return nil
}

// Close closes every node and returns the first error. Safe to call twice.
func (c *Cluster) Close() error {
	var first error
	for _, s := range c.Servers {
		if err := s.Close(); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// freePort returns a loopback TCP port that was free a moment ago. For
// cluster nodes the port is at most maxPort and port+busOffset is free too.
func freePort(cluster bool) (int, error) {
	for range 100 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, err
		}
		port := l.Addr().(*net.TCPAddr).Port
		if !cluster {
			l.Close()
			return port, nil
		}
		if port <= maxPort {
			bus, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port+busOffset)))
			if err == nil {
				bus.Close()
				l.Close()
				return port, nil
			}
		}
		l.Close()
	}
	return 0, errors.New("no free port pair found")
}

// client returns a minimal go-redis client for addr that does not retry, so
// polling loops stay in control of timing, and whose reads and writes end
// with the ctx of the call, not the default 3 s. The default pool size
// matters: a pool with as many failed dials as its size starts a background
// redial goroutine that outlives Close. The caller must close it.
func client(addr string) *redis.Client {
	return redis.NewClient(&redis.Options{
		Addr:                     addr,
		ContextTimeoutEnabled:    true,
		ReadTimeout:              cmdTimeout,
		WriteTimeout:             cmdTimeout,
		Protocol:                 2,
		DisableIdentity:          true,
		MaxRetries:               -1,
		DialerRetries:            1,
		MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
	})
}

// do runs one command on addr, for up to cmdTimeout.
func do(addr string, args ...any) error {
	ctx, cancel := context.WithTimeout(context.Background(), cmdTimeout)
	defer cancel()
	cl := client(addr)
	defer cl.Close()
	return cl.Do(ctx, args...).Err()
}

// tail is an io.Writer that keeps the last tailSize bytes written to it.
type tail struct {
	mu  sync.Mutex
	buf []byte
}

func (t *tail) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, p...)
	if len(t.buf) > tailSize {
		t.buf = append(t.buf[:0], t.buf[len(t.buf)-tailSize:]...)
	}
	return len(p), nil
}

func (t *tail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return strings.TrimSpace(string(t.buf))
}

// ScriptCalls returns how many scripts the server c talks to has run since
// its stats were last reset (CONFIG RESETSTAT), from INFO commandstats:
// EVAL, EVALSHA, their read-only forms and FCALL. The commands a script
// runs count under their own names, not here. Every decision of hotkey's
// Redis store is a script, so this counts its store calls.
func ScriptCalls(ctx context.Context, c *redis.Client) (int64, error) {
	info, err := c.Info(ctx, "commandstats").Result()
	if err != nil {
		return 0, err
	}
	var n int64
	for line := range strings.Lines(info) {
		name, stats, _ := strings.Cut(strings.TrimSpace(line), ":")
		switch name {
		case "cmdstat_eval", "cmdstat_evalsha", "cmdstat_eval_ro", "cmdstat_evalsha_ro", "cmdstat_fcall", "cmdstat_fcall_ro":
		default:
			continue
		}
		for field := range strings.SplitSeq(stats, ",") {
			if v, ok := strings.CutPrefix(field, "calls="); ok {
				calls, err := strconv.ParseInt(v, 10, 64)
				if err != nil {
					return 0, fmt.Errorf("commandstats %q: %w", line, err)
				}
				n += calls
			}
		}
	}
	return n, nil
}
