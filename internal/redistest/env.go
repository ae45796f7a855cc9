package redistest

import (
	"fmt"
	"os"
)

// Env is what a test binary shares: one standalone server and one cluster,
// under one temporary parent directory that Close removes.
type Env struct {
	Dir     string
	Server  *Server
	Cluster *Cluster
}

// StartEnv starts a standalone server and, if clusterNodes > 0, a cluster of
// that many masters. The caller must call Close.
func StartEnv(clusterNodes int) (*Env, error) {
	dir, err := os.MkdirTemp("", "hotkey-redis-")
	if err != nil {
		return nil, fmt.Errorf("redistest: env: %w", err)
	}
	e := &Env{Dir: dir}
	if e.Server, err = Start(dir); err != nil {
		e.Close()
		return nil, err
	}
	if clusterNodes > 0 {
		if e.Cluster, err = StartCluster(dir, clusterNodes); err != nil {
			e.Close()
			return nil, err
		}
	}
	return e, nil
}

// Close stops the servers and removes the directory.
func (e *Env) Close() {
	if e.Cluster != nil {
		e.Cluster.Close()
	}
	if e.Server != nil {
		e.Server.Close()
	}
	os.RemoveAll(e.Dir)
}

// Main runs a test binary's tests with an Env started first and closed after:
// call it from TestMain as os.Exit(redistest.Main(m, 3, &env)). Without
// redis-server it fails: the suite needs a real server, and make test installs
// one.
func Main(m interface{ Run() int }, clusterNodes int, env **Env) int {
	e, err := StartEnv(clusterNodes)
	if err != nil {
		fmt.Fprintf(os.Stderr, "redistest: %v (make test installs redis-server)\n", err)
		return 1
	}
	*env = e
	defer e.Close()
	return m.Run()
}
