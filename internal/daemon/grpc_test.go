package daemon

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	ratelimit "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlpb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/hotkeyd/hotkey/internal/redistest"
	"github.com/hotkeyd/hotkey/internal/rlswire"
)

// rlsEnv is an in-process daemon serving Envoy rules, on the memory store
// or a real redis-server, and a gRPC connection to it.
type rlsEnv struct {
	d    *Daemon
	conn *grpc.ClientConn
}

// startRLS starts a daemon with the Envoy rules rules on store ("memory"
// or "redis"); everything stops at cleanup.
func startRLS(t *testing.T, store, rules string, args ...string) *rlsEnv {
	t.Helper()
	path := filepath.Join(t.TempDir(), "rules.yaml")
	if err := os.WriteFile(path, []byte(rules), 0o644); err != nil {
		t.Fatal(err)
	}
	args = append([]string{"--listen", "127.0.0.1:0", "--nats-listen", "127.0.0.1:0", "--envoy-config", path}, args...)
	if store == "redis" {
		srv := redistest.ForTest(t)
		args = append(args, "--redis", "redis://"+srv.Addr)
	}
	d, err := StartArgs(context.Background(), args...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { shutdown(t, d) })
	conn, err := grpc.NewClient(d.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return &rlsEnv{d: d, conn: conn}
}

// wireRequest hand-encodes a RateLimitRequest of domain, one descriptor
// per list of key, value pairs; strings go on the wire as their bytes.
func wireRequest(domain string, descs ...[]string) []byte {
	ds := make([]rlswire.Descriptor, len(descs))
	for i, kv := range descs {
		ds[i].KV = kv
	}
	return rlswire.Request(domain, 0, ds...)
}

// raw sends the wire data b as a ShouldRateLimit request.
func (e *rlsEnv) raw(b []byte) (*rlpb.RateLimitResponse, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute) // only catches a hang
	defer cancel()
	resp := &rlpb.RateLimitResponse{}
	err := e.conn.Invoke(ctx, rlpb.RateLimitService_ShouldRateLimit_FullMethodName, b, resp, grpc.ForceCodecV2(rlswire.Codec{}))
	return resp, err
}

// invalidUTF8Rules limit client addresses to 1 a year, tenants to 100 and
// users to 2, each tenant and user with a label of its own.
const invalidUTF8Rules = `domain: edge
descriptors:
  - key: remote_address
    rate_limit: {unit: year, requests_per_unit: 1}
  - key: tenant
    detailed_metric: true
    rate_limit: {unit: year, requests_per_unit: 100}
  - key: user
    detailed_metric: true
    rate_limit: {unit: year, requests_per_unit: 2}
`

// TestGRPCInvalidUTF8 sends descriptor values that are not UTF-8, as
// Envoy copies them from headers, over a real connection: they are
// counted by their bytes like any value, the request's other descriptors
// with them, and their metrics labels are written with \x escapes.
func TestGRPCInvalidUTF8(t *testing.T) {
	for _, store := range []string{"memory", "redis"} {
		t.Run(store, func(t *testing.T) {
			e := startRLS(t, store, invalidUTF8Rules)
			const addr = "203.0.113.7"
			if resp, err := e.raw(wireRequest("edge", []string{"remote_address", addr})); err != nil || resp.OverallCode != rlpb.RateLimitResponse_OK {
				t.Fatalf("first request of the address: %v, %v", resp, err)
			}
			// The address is over its limit: so is every request of it,
			// whatever its other descriptors hold.
			over := 0
			for range 10 {
				resp, err := e.raw(wireRequest("edge", []string{"remote_address", addr}, []string{"tenant", "Espa\xf1a"}))
				if err == nil && resp.OverallCode == rlpb.RateLimitResponse_OVER_LIMIT && resp.Statuses[0].Code == rlpb.RateLimitResponse_OVER_LIMIT &&
					resp.Statuses[1].Code == rlpb.RateLimitResponse_OK {
					over++
				} else if over == 0 {
					t.Logf("request over the address's limit with tenant Espa\\xf1a: %v, %v", resp, err)
				}
			}
			if over != 10 {
				t.Errorf("%d of 10 requests over the address's limit answered OVER_LIMIT, want 10", over)
			}

			// Values count by their bytes: "\xff" and "\xfe" are two
			// counters, "Espa\xf1a" (Latin-1) and "España" (UTF-8) two
			// more; the same bytes share one.
			for _, v := range []string{"\xff", "\xfe", "Espa\xf1a", "España"} {
				for i, want := range []rlpb.RateLimitResponse_Code{rlpb.RateLimitResponse_OK, rlpb.RateLimitResponse_OK, rlpb.RateLimitResponse_OVER_LIMIT} {
					resp, err := e.raw(wireRequest("edge", []string{"user", v}))
					if err != nil || resp.Statuses[0].Code != want {
						t.Errorf("user %q, request %d: %v, %v; want %v", v, i, resp, err, want)
					}
				}
			}

			// Keys too, and a descriptor's own limit on them, whose label
			// holds its keys; a domain that is not UTF-8 is one the rules
			// do not have.
			own := rlswire.Descriptor{KV: []string{"\xff", "x"}, RequestsPerUnit: 1, Unit: int32(typev3.RateLimitUnit_YEAR)}
			for i, want := range []rlpb.RateLimitResponse_Code{rlpb.RateLimitResponse_OK, rlpb.RateLimitResponse_OVER_LIMIT} {
				resp, err := e.raw(rlswire.Request("edge", 0, own))
				if err != nil || resp.OverallCode != want {
					t.Errorf("own limit of 1 on key \xff, request %d: %v, %v; want %v", i, resp, err, want)
				}
			}
			if resp, err := e.raw(wireRequest("ed\xffge", []string{"remote_address", addr})); err != nil || resp.OverallCode != rlpb.RateLimitResponse_OK || resp.Statuses[0].CurrentLimit != nil {
				t.Errorf("domain ed\xffge: %v, %v; want OK without a limit", resp, err)
			}

			// Wire data that is not protobuf is refused, not admitted.
			for _, b := range [][]byte{{0x0a, 0x05, 'e'}, {0xff}, {0x12, 0x02, 0x0a, 0x7f}} {
				if _, err := e.raw(b); status.Code(err) != codes.InvalidArgument {
					t.Errorf("wire data %x: %v, want InvalidArgument", b, err)
				}
			}

			scrape := scrapeMetrics(t, e.d)
			for _, want := range []string{
				`hotkeyd_descriptor_hits_total{descriptor="edge.tenant_Espa\\xf1a",domain="edge"} 10`,
				`hotkeyd_descriptor_over_limit_total{descriptor="edge.user_\\xff",domain="edge"} 1`,
				`hotkeyd_descriptor_within_limit_total{descriptor="edge.user_España",domain="edge"} 2`,
				`hotkeyd_descriptor_hits_total{descriptor="edge.\\xff",domain="edge"} 2`,
			} {
				if !strings.Contains(scrape, want) {
					t.Errorf("/metrics has no %s", want)
				}
			}
		})
	}
}

// scrapeMetrics returns what d's /metrics (on the admin listener) serves.
func scrapeMetrics(t *testing.T, d *Daemon) string {
	t.Helper()
	resp, err := (&http.Client{}).Get("http://" + d.AdminAddr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestGRPCOverrideUnits: a descriptor's own limit counts per unit, each
// unit on its own counter, and a change of requests_per_unit within a
// unit keeps the usage.
func TestGRPCOverrideUnits(t *testing.T) {
	for _, store := range []string{"memory", "redis"} {
		t.Run(store, func(t *testing.T) {
			e := startRLS(t, store, invalidUTF8Rules)
			c := rlpb.NewRateLimitServiceClient(e.conn)
			ask := func(rpu uint32, unit typev3.RateLimitUnit, value string) rlpb.RateLimitResponse_Code {
				t.Helper()
				d := &ratelimit.RateLimitDescriptor{
					Entries: []*ratelimit.RateLimitDescriptor_Entry{{Key: "user", Value: value}},
					Limit:   &ratelimit.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: rpu, Unit: unit},
				}
				resp, err := c.ShouldRateLimit(context.Background(), &rlpb.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimit.RateLimitDescriptor{d}})
				if err != nil {
					t.Fatal(err)
				}
				return resp.Statuses[0].Code
			}
			// Months and years: no window of either starts within a test.
			admitted := map[typev3.RateLimitUnit]int{}
			for range 20 {
				for _, unit := range []typev3.RateLimitUnit{typev3.RateLimitUnit_MONTH, typev3.RateLimitUnit_YEAR} {
					if ask(2, unit, "bob") == rlpb.RateLimitResponse_OK {
						admitted[unit]++
					}
				}
			}
			for unit, n := range admitted {
				if n != 2 {
					t.Errorf("2 a %v, asked alternately with another unit: admitted %d of 20, want 2", unit, n)
				}
			}
			// Within one unit, the limit changes and the usage stays.
			for i, s := range []struct {
				rpu  uint32
				want rlpb.RateLimitResponse_Code
			}{{2, ok}, {2, ok}, {2, over}, {3, ok}, {3, over}, {5, ok}, {5, ok}, {5, over}} {
				if got := ask(s.rpu, typev3.RateLimitUnit_YEAR, "carol"); got != s.want {
					t.Errorf("carol, request %d, %d a year: %v, want %v", i, s.rpu, got, s.want)
				}
			}
		})
	}
}

// TestGRPCOverrideMultiplier: a descriptor's own limit counts over
// unit_multiplier units, on a counter of that period; an own limit that
// cannot be enforced (a unit of UNKNOWN, a multiplier of 0, a period of
// 1000 years) answers that descriptor OVER_LIMIT, and the request's other
// descriptors are still counted.
func TestGRPCOverrideMultiplier(t *testing.T) {
	for _, store := range []string{"memory", "redis"} {
		t.Run(store, func(t *testing.T) {
			e := startRLS(t, store, invalidUTF8Rules)
			c := rlpb.NewRateLimitServiceClient(e.conn)
			own := func(unit typev3.RateLimitUnit, mult *wrapperspb.UInt32Value, user string) *ratelimit.RateLimitDescriptor {
				return &ratelimit.RateLimitDescriptor{
					Entries: []*ratelimit.RateLimitDescriptor_Entry{{Key: "user", Value: user}},
					Limit:   &ratelimit.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 2, Unit: unit, UnitMultiplier: mult},
				}
			}
			ask := func(ds ...*ratelimit.RateLimitDescriptor) *rlpb.RateLimitResponse {
				t.Helper()
				resp, err := c.ShouldRateLimit(context.Background(), &rlpb.RateLimitRequest{Domain: "edge", Descriptors: ds})
				if err != nil {
					t.Fatal(err)
				}
				return resp
			}
			// 2 a year and 2 every 2 years, asked alternately: each its own
			// counter.
			admitted := map[uint32]int{}
			for range 10 {
				for _, m := range []uint32{1, 2} {
					if ask(own(typev3.RateLimitUnit_YEAR, wrapperspb.UInt32(m), "bob")).Statuses[0].Code == ok {
						admitted[m]++
					}
				}
			}
			if admitted[1] != 2 || admitted[2] != 2 {
				t.Errorf("2 a year and 2 every 2 years, asked alternately: admitted %d and %d of 10, want 2 and 2", admitted[1], admitted[2])
			}
			// A multiplier of 1 is no multiplier.
			if st := ask(own(typev3.RateLimitUnit_YEAR, nil, "bob")).Statuses[0]; st.Code != over {
				t.Errorf("2 a year, no multiplier, after 2 with a multiplier of 1: %v", st)
			}
			// What cannot be enforced is over; the address beside it is
			// counted all the same (1 a year).
			for i, d := range []*ratelimit.RateLimitDescriptor{
				own(typev3.RateLimitUnit_UNKNOWN, nil, "carol"),
				own(typev3.RateLimitUnit_HOUR, wrapperspb.UInt32(0), "carol"),
				own(typev3.RateLimitUnit_YEAR, wrapperspb.UInt32(1000), "carol"),
			} {
				addr := fmt.Sprintf("10.0.0.%d", i)
				for j, want := range []rlpb.RateLimitResponse_Code{ok, over} {
					resp := ask(d, &ratelimit.RateLimitDescriptor{Entries: []*ratelimit.RateLimitDescriptor_Entry{{Key: "remote_address", Value: addr}}})
					if resp.OverallCode != over || resp.Statuses[0].Code != over || resp.Statuses[1].Code != want {
						t.Errorf("own limit %v, request %d: %v, want OVER_LIMIT and the address %v", d.Limit, j, resp, want)
					}
				}
			}
		})
	}
}

// TestGRPCHitsAddendZero: a descriptor of hits_addend 0 is answered
// OVER_LIMIT when one unit would be refused now, as envoyproxy/ratelimit
// answers it (it adds 0 and compares), and charges nothing.
func TestGRPCHitsAddendZero(t *testing.T) {
	for _, store := range []string{"memory", "redis"} {
		t.Run(store, func(t *testing.T) {
			e := startRLS(t, store, invalidUTF8Rules)
			c := rlpb.NewRateLimitServiceClient(e.conn)
			ask := func(hits uint64, value string) *rlpb.RateLimitResponse_DescriptorStatus {
				t.Helper()
				d := &ratelimit.RateLimitDescriptor{Entries: []*ratelimit.RateLimitDescriptor_Entry{{Key: "user", Value: value}}, HitsAddend: wrapperspb.UInt64(hits)}
				resp, err := c.ShouldRateLimit(context.Background(), &rlpb.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimit.RateLimitDescriptor{d}})
				if err != nil {
					t.Fatal(err)
				}
				if resp.OverallCode != resp.Statuses[0].Code {
					t.Errorf("overall %v, descriptor %v", resp.OverallCode, resp.Statuses[0].Code)
				}
				return resp.Statuses[0]
			}
			// Peeks charge nothing: 2 a year still admits 2.
			for i := range 10 {
				if st := ask(0, "bob"); st.Code != ok || st.LimitRemaining != 2 {
					t.Errorf("hits 0 on a fresh counter, request %d: %v, want OK with 2 left", i, st)
					break
				}
			}
			for i, want := range []rlpb.RateLimitResponse_Code{ok, ok, over} {
				if st := ask(1, "bob"); st.Code != want {
					t.Fatalf("hit %d after peeks: %v, want %v", i, st, want)
				}
			}
			overs := 0
			for range 10 {
				if st := ask(0, "bob"); st.Code == over && st.LimitRemaining == 0 {
					overs++
				}
			}
			if overs != 10 {
				t.Errorf("hits 0 on a counter over its limit: %d of 10 answered OVER_LIMIT, want 10", overs)
			}
			// A limit of 0 refuses one hit: hits 0 too. A refund is
			// answered OK.
			zero := &ratelimit.RateLimitDescriptor{
				Entries:    []*ratelimit.RateLimitDescriptor_Entry{{Key: "user", Value: "bob"}},
				Limit:      &ratelimit.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 0, Unit: typev3.RateLimitUnit_YEAR},
				HitsAddend: wrapperspb.UInt64(0),
			}
			refund := &ratelimit.RateLimitDescriptor{Entries: zero.Entries, HitsAddend: wrapperspb.UInt64(1), IsNegativeHits: true}
			resp, err := c.ShouldRateLimit(context.Background(), &rlpb.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimit.RateLimitDescriptor{zero, refund}})
			if err != nil || resp.Statuses[0].Code != over || resp.Statuses[1].Code != ok || resp.OverallCode != over {
				t.Errorf("hits 0 under a limit of 0, and a refund: %v, %v; want OVER_LIMIT, OK", resp, err)
			}
		})
	}
}

const (
	ok   = rlpb.RateLimitResponse_OK
	over = rlpb.RateLimitResponse_OVER_LIMIT
)

// TestGRPCServers: both --grpc-server choices decide ShouldRateLimit
// alike (a limit of 1 a year admits one of three), answer the health
// service, and refuse a malformed request InvalidArgument.
func TestGRPCServers(t *testing.T) {
	for _, server := range []string{GRPCServerLean, GRPCServerGRPCGo} {
		t.Run(server, func(t *testing.T) {
			e := startRLS(t, "memory", invalidUTF8Rules, "--grpc-server", server)
			c := rlpb.NewRateLimitServiceClient(e.conn)
			req := &rlpb.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimit.RateLimitDescriptor{{Entries: []*ratelimit.RateLimitDescriptor_Entry{{Key: "remote_address", Value: "10.0.0.9"}}}}}
			var got []rlpb.RateLimitResponse_Code
			for range 3 {
				resp, err := c.ShouldRateLimit(context.Background(), req)
				if err != nil {
					t.Fatal(err)
				}
				got = append(got, resp.GetOverallCode())
			}
			if want := []rlpb.RateLimitResponse_Code{ok, over, over}; fmt.Sprint(got) != fmt.Sprint(want) {
				t.Errorf("answered %v, want %v", got, want)
			}
			hc, err := healthpb.NewHealthClient(e.conn).Check(context.Background(), &healthpb.HealthCheckRequest{Service: rlsService})
			if err != nil || hc.GetStatus() != healthpb.HealthCheckResponse_SERVING {
				t.Errorf("health of %s: %v, %v; want SERVING", rlsService, hc, err)
			}
			if _, err := e.raw([]byte{0xff}); status.Code(err) != codes.InvalidArgument {
				t.Errorf("malformed request: %v, want InvalidArgument", err)
			}
		})
	}
}
