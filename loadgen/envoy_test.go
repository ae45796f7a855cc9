package loadgen_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/hotkeyd/hotkey/internal/daemon"
	"github.com/hotkeyd/hotkey/loadgen"
)

// envoyRules limit each user to 20 a day, and each tenant to 1,000.
const envoyRules = `domain: bench
descriptors:
  - key: user
    rate_limit: {unit: day, requests_per_unit: 20}
  - key: tenant
    rate_limit: {unit: day, requests_per_unit: 1000}
`

// startRLS runs a hotkeyd in this process serving envoyRules on its gRPC
// listener, and returns a connection to it.
func startRLS(t testing.TB) *grpc.ClientConn {
	t.Helper()
	path := filepath.Join(t.TempDir(), "rules.yaml")
	if err := os.WriteFile(path, []byte(envoyRules), 0o644); err != nil {
		t.Fatal(err)
	}
	d, err := daemon.StartArgs(context.Background(), "--listen", "127.0.0.1:0", "--nats-listen", "127.0.0.1:0",
		"--grpc-listen", "127.0.0.1:0", "--envoy-config", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute) // only catches a hang
		defer cancel()
		if err := d.Shutdown(ctx); err != nil {
			t.Errorf("shutdown: %v", err)
		}
	})
	conn, err := grpc.NewClient(d.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// TestEnvoyTarget: 50 requests of one user at 20 a day, each with the
// user's descriptor and a tenant's, over ShouldRateLimit: 20 admitted, as
// a perfect limiter would, 30 denied, and each answer's status reports the
// user's limit.
func TestEnvoyTarget(t *testing.T) {
	conn := startRLS(t)
	target := loadgen.Envoy(conn, "bench", [][]loadgen.Entry{{{Key: "tenant", Value: "acme"}}, {{Key: "user", Value: "{key}"}}})
	res, err := loadgen.Run(context.Background(), loadgen.Config{
		Target: target, Workload: loadgen.Fixed("alice"), Rate: 500, Duration: 100 * time.Millisecond,
		Watch: "alice", Limit: loadgen.Limit{Units: 20, Period: 24 * time.Hour},
	}, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d sent: %d admitted, %d denied, %d errors (first %v); ideal %d; %d quotas, last %+v",
		res.Sent, res.Allowed, res.Denied, res.Errors, res.FirstError, res.Ideal, res.Quotas, res.Quota)
	if res.Sent != 50 || res.Allowed != 20 || res.Denied != 30 || res.Errors != 0 || res.Ideal != 20 || res.OfIdeal() != 1 {
		t.Errorf("%d sent: %d admitted, %d denied, %d errors, ideal %d; want 50: 20, 30, 0, 20", res.Sent, res.Allowed, res.Denied, res.Errors, res.Ideal)
	}
	// The request meant last may be answered before others still in
	// flight (up to 64 of them on a loaded machine): what it saw left is
	// anything a decision leaves, not necessarily 0.
	if q := res.Quota; res.Quotas != 50 || q.Limit != 20 || q.Window != 24*time.Hour || q.Remaining < 0 || q.Remaining > 19 || q.ResetAfter <= 0 {
		t.Errorf("%d quotas, last %+v; want 50, the user's 20 a day with 0 to 19 remaining", res.Quotas, q)
	}
	// A domain the service does not know has no limit: all admitted.
	other := loadgen.Envoy(conn, "elsewhere", [][]loadgen.Entry{{{Key: "user", Value: "{key}"}}})
	for range 30 {
		if out, err := other.Decide(context.Background(), "alice", 1); err != nil || !out.Allowed {
			t.Fatalf("unknown domain: %+v, %v; want admitted", out, err)
		}
	}
}
