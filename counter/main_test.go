package counter

import (
	"errors"
	"fmt"
	"os"
	"testing"

	"github.com/hotkeyd/hotkey/internal/redistest"
)

// Servers shared by the package's tests, started once by TestMain. Tests
// sharing them use unique key names. Tests that kill, pause or reconfigure a
// server start their own under testDir.
var (
	testDir          string   // parent of every server directory; removed after the run
	testRedisAddr    string   // a standalone redis-server
	testClusterAddrs []string // the masters of a 3-node Redis Cluster
)

func TestMain(m *testing.M) {
	os.Exit(runTests(m))
}

func runTests(m *testing.M) int {
	var err error
	if testDir, err = os.MkdirTemp("", "counter-test-"); err != nil {
		fmt.Fprintln(os.Stderr, "counter tests:", err)
		return 1
	}
	defer os.RemoveAll(testDir)
	srv, err := redistest.Start(testDir)
	if errors.Is(err, redistest.ErrNotInstalled) {
		fmt.Fprintln(os.Stderr, "counter tests need redis-server (Redis ≥ 7) on PATH: apt-get install redis-server")
		return 1
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "counter tests:", err)
		return 1
	}
	defer srv.Close()
	cluster, err := redistest.StartCluster(testDir, 3)
	if err != nil {
		fmt.Fprintln(os.Stderr, "counter tests:", err)
		return 1
	}
	defer cluster.Close()
	testRedisAddr, testClusterAddrs = srv.Addr, cluster.Addrs
	return m.Run()
}
