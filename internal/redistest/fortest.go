package redistest

import (
	"errors"
	"testing"
)

// ForTest starts a redis-server for one test, in a directory of t's, and
// stops it when t ends. It fails t if the server does not start, saying so
// when redis-server is not installed (make test installs it).
func ForTest(t testing.TB) *Server {
	t.Helper()
	srv, err := Start(t.TempDir())
	if errors.Is(err, ErrNotInstalled) {
		t.Fatal("redis-server is not installed (make test installs it)")
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	return srv
}
