package main

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	ratelimit "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlpb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/hotkeyd/hotkey/internal/testkit"
)

// gatewayConfig is an envoyproxy/ratelimit configuration with one rule of
// each kind the gRPC tests drive. Limits are per year or day, so that
// nothing refills within a test: the sliding windows (the rules' default)
// start at multiples of their unit from the Unix epoch, and a run across
// the start of one would be under the next window's allowance too.
const gatewayConfig = `domain: gateway
descriptors:
  # One counter per tenant: a hot tenant is split like any hot key. 600
  # a year gives 16 subcounters at most (10 per subcounter at least).
  - key: tenant
    rate_limit:
      unit: year
      requests_per_unit: 600
  # Nested: per user on one route.
  - key: route
    value: /login
    descriptors:
      - key: user
        rate_limit:
          unit: year
          requests_per_unit: 5
  - key: route
    value: /search
    descriptors:
      - key: user
        shadow_mode: true
        rate_limit:
          unit: year
          requests_per_unit: 3
  - key: internal
    rate_limit:
      unlimited: true
  - key: bulk
    rate_limit:
      unit: day
      requests_per_unit: 10
      algorithm: token_bucket
`

// rlsConn dials d's gRPC listener; the connection closes at cleanup.
func rlsConn(t *testing.T, d *proc) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(d.grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// desc builds a descriptor from key, value pairs.
func desc(kv ...string) *ratelimit.RateLimitDescriptor {
	d := &ratelimit.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &ratelimit.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

// should asks ShouldRateLimit of domain for descs with hits (0: unset).
func should(t *testing.T, c rlpb.RateLimitServiceClient, domain string, hits uint32, descs ...*ratelimit.RateLimitDescriptor) *rlpb.RateLimitResponse {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	resp, err := c.ShouldRateLimit(ctx, &rlpb.RateLimitRequest{Domain: domain, Descriptors: descs, HitsAddend: hits})
	if err != nil {
		t.Fatalf("ShouldRateLimit %s %v: %v", domain, descs, err)
	}
	if len(resp.Statuses) != len(descs) {
		t.Fatalf("%d statuses for %d descriptors", len(resp.Statuses), len(descs))
	}
	return resp
}

const (
	ok   = rlpb.RateLimitResponse_OK
	over = rlpb.RateLimitResponse_OVER_LIMIT
)

func headers(resp *rlpb.RateLimitResponse) map[string]string {
	h := map[string]string{}
	for _, hv := range resp.ResponseHeadersToAdd {
		h[hv.Key] = hv.Value
	}
	return h
}

// TestGRPCShouldRateLimit drives envoy.service.ratelimit.v3's
// ShouldRateLimit through go-control-plane's generated client over a real
// connection to the daemon, on the memory store and on Redis: nested
// descriptors, shadow mode, unlimited, hits_addend, several descriptors in
// one request, the headers, the health and reflection services, and a hot
// descriptor value split to 16 subcounters while its total stays within
// the limit.
func TestGRPCShouldRateLimit(t *testing.T) {
	t.Parallel()
	cfg := writeFile(t, "gateway.yaml", gatewayConfig)
	for _, store := range []string{"memory", "redis"} {
		t.Run(store, func(t *testing.T) {
			t.Parallel()
			args := []string{"--envoy-config", cfg, "--hot-threshold", "50"}
			var rc *redis.Client
			if store == "redis" {
				srv := startRedis(t)
				args = append(args, "--redis", "redis://"+srv.Addr)
				rc = redis.NewClient(&redis.Options{Addr: srv.Addr})
				t.Cleanup(func() { rc.Close() })
			}
			d := startDaemon(t, daemonOpts{args: args})
			conn := rlsConn(t, d)
			c := rlsClient(conn)

			t.Run("nested", func(t *testing.T) {
				for i := range 5 {
					resp := should(t, c, "gateway", 0, desc("route", "/login", "user", "bob"))
					st := resp.Statuses[0]
					if resp.OverallCode != ok || st.Code != ok || st.CurrentLimit.GetRequestsPerUnit() != 5 ||
						st.CurrentLimit.GetUnit() != rlpb.RateLimitResponse_RateLimit_YEAR || st.LimitRemaining != uint32(4-i) ||
						st.DurationUntilReset.AsDuration() <= 0 || st.DurationUntilReset.AsDuration() > 2*365*24*time.Hour {
						t.Fatalf("request %d: %v", i, resp)
					}
				}
				if resp := should(t, c, "gateway", 0, desc("route", "/login", "user", "bob")); resp.OverallCode != over || resp.Statuses[0].Code != over {
					t.Fatalf("6th request: %v", resp)
				}
				// Another user has his own counter; the route alone, at
				// another depth, matches no rule.
				if resp := should(t, c, "gateway", 0, desc("route", "/login", "user", "eve"), desc("route", "/login")); resp.OverallCode != ok ||
					resp.Statuses[0].LimitRemaining != 4 || resp.Statuses[1].CurrentLimit != nil {
					t.Fatalf("other user, and the route alone: %v", resp)
				}
			})

			t.Run("shadow", func(t *testing.T) {
				for i := range 6 {
					resp := should(t, c, "gateway", 0, desc("route", "/search", "user", "bob"))
					if resp.OverallCode != ok || resp.Statuses[0].Code != ok {
						t.Fatalf("shadow-mode request %d: %v", i, resp)
					}
					// Over its limit, it is answered OK, headers included.
					if h := headers(resp); h["retry-after"] != "" || h["x-ratelimit-remaining"] != "0" && i >= 3 {
						t.Errorf("shadow-mode request %d: headers %v", i, h)
					}
				}
				scrape := string(do(t, "GET", d.admin+"/metrics", "").body)
				labels := `{descriptor="gateway.route_/search.user",domain="gateway"}`
				if h, o, s := metric(scrape, "hotkeyd_descriptor_hits_total"+labels), metric(scrape, "hotkeyd_descriptor_over_limit_total"+labels),
					metric(scrape, "hotkeyd_descriptor_shadow_mode_total"+labels); h != 6 || o != 3 || s != 3 {
					t.Errorf("shadow-mode metrics: hits %v, over %v, shadow %v; want 6, 3, 3", h, o, s)
				}
			})

			t.Run("unlimited", func(t *testing.T) {
				for range 3 {
					resp := should(t, c, "gateway", 1000, desc("internal", "x"))
					if resp.OverallCode != ok || resp.Statuses[0].LimitRemaining != math.MaxUint32 {
						t.Fatalf("unlimited: %v", resp)
					}
				}
				// Unknown domains and descriptors have no limit.
				if resp := should(t, c, "nowhere", 0, desc("tenant", "a")); resp.OverallCode != ok || resp.Statuses[0].CurrentLimit != nil {
					t.Fatalf("unknown domain: %v", resp)
				}
			})

			t.Run("hits_addend", func(t *testing.T) {
				steps := []struct {
					reqHits  uint32
					descHits *wrapperspb.UInt64Value
					code     rlpb.RateLimitResponse_Code
					left     uint32
				}{
					{4, nil, ok, 6},
					{4, wrapperspb.UInt64(7), over, 6}, // 6 left: 7 does not fit
					{0, wrapperspb.UInt64(6), ok, 0},
					{1, nil, over, 0},
				}
				for i, s := range steps {
					dd := desc("bulk", "b")
					dd.HitsAddend = s.descHits
					resp := should(t, c, "gateway", s.reqHits, dd)
					if st := resp.Statuses[0]; st.Code != s.code || st.LimitRemaining != s.left {
						t.Fatalf("step %d: %v, want %v with %d left", i, resp, s.code, s.left)
					}
				}
				// A cost over the limit is over whatever the counter holds.
				if resp := should(t, c, "gateway", 11, desc("bulk", "fresh")); resp.Statuses[0].Code != over {
					t.Fatalf("11 hits on a limit of 10: %v", resp)
				}
				if resp := should(t, c, "gateway", 10, desc("bulk", "fresh")); resp.Statuses[0].Code != ok {
					t.Fatalf("10 hits on a fresh counter of 10: %v", resp)
				}
			})

			t.Run("own limit", func(t *testing.T) {
				// A descriptor may carry its own limit: it counts on a
				// counter of its keys and values, apart from the rules'.
				own := func(rpu uint32, kv ...string) *ratelimit.RateLimitDescriptor {
					d := desc(kv...)
					d.Limit = &ratelimit.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: rpu, Unit: typev3.RateLimitUnit_YEAR}
					return d
				}
				for i, want := range []rlpb.RateLimitResponse_Code{ok, ok, over} {
					resp := should(t, c, "gateway", 0, own(2, "tenant", "own"))
					if st := resp.Statuses[0]; st.Code != want || st.CurrentLimit.GetRequestsPerUnit() != 2 {
						t.Fatalf("own limit of 2, request %d: %v", i, resp)
					}
					if h := headers(resp); !strings.HasPrefix(h["ratelimit-policy"], `"envoy-override/gateway";q=2;`) {
						t.Errorf("own limit, request %d: headers %v", i, h)
					}
				}
				// The rule on the same keys has its own counter.
				if resp := should(t, c, "gateway", 0, desc("tenant", "own")); resp.Statuses[0].LimitRemaining != 599 {
					t.Errorf("the rule beside an own limit: %v", resp)
				}
				// Other keys with the same value count apart.
				if resp := should(t, c, "gateway", 0, own(2, "user", "own")); resp.Statuses[0].Code != ok || resp.Statuses[0].LimitRemaining != 1 {
					t.Errorf("own limit on other keys: %v", resp)
				}
				resp := should(t, c, "gateway", 0, own(0, "tenant", "banned"))
				if h := headers(resp); resp.OverallCode != over || !strings.HasPrefix(h["ratelimit-policy"], `"envoy-override/gateway";`) {
					t.Errorf("own limit of 0: %v", resp)
				}
				// A domain the configuration does not have limits nothing,
				// own limits included, as in envoyproxy/ratelimit.
				if resp := should(t, c, "elsewhere", 0, own(0, "tenant", "x")); resp.OverallCode != ok || resp.Statuses[0].CurrentLimit != nil {
					t.Errorf("own limit in an unknown domain: %v", resp)
				}
			})

			t.Run("descriptors and headers", func(t *testing.T) {
				// One over its limit makes the request over; the headers
				// describe it.
				resp := should(t, c, "gateway", 0, desc("internal", "y"), desc("route", "/login", "user", "bob"), desc("tenant", "quiet"))
				if resp.OverallCode != over || resp.Statuses[0].Code != ok || resp.Statuses[1].Code != over || resp.Statuses[2].Code != ok {
					t.Fatalf("mixed request: %v", resp)
				}
				h := headers(resp)
				if h["x-ratelimit-limit"] != "5" || h["x-ratelimit-remaining"] != "0" || h["retry-after"] == "" || h["x-ratelimit-reset"] == "" ||
					h["ratelimit-policy"] != `"envoy/gateway.route_/login.user";q=5;w=31536000` || !strings.HasPrefix(h["ratelimit"], `"envoy/gateway.route_/login.user";r=0;t=`) {
					t.Errorf("headers of the over-limit descriptor: %v", h)
				}
				// When all pass, the one closest to its limit.
				resp = should(t, c, "gateway", 0, desc("tenant", "quiet"), desc("route", "/login", "user", "zed"))
				h = headers(resp)
				if resp.OverallCode != ok || h["x-ratelimit-limit"] != "5" || h["x-ratelimit-remaining"] != "4" || h["retry-after"] != "" {
					t.Errorf("headers when all pass: %v %v", resp.OverallCode, h)
				}
			})

			t.Run("errors", func(t *testing.T) {
				ctx := context.Background()
				for _, req := range []*rlpb.RateLimitRequest{
					{Descriptors: []*ratelimit.RateLimitDescriptor{desc("tenant", "a")}},
					{Domain: "gateway"},
				} {
					if _, err := c.ShouldRateLimit(ctx, req); status.Code(err) != codes.InvalidArgument {
						t.Errorf("%v: %v, want InvalidArgument", req, err)
					}
				}
			})

			t.Run("health and reflection", func(t *testing.T) {
				hc := healthpb.NewHealthClient(conn)
				for _, svc := range []string{"", "envoy.service.ratelimit.v3.RateLimitService"} {
					testkit.For(t, time.Minute, "health SERVING", func() bool {
						r, err := hc.Check(context.Background(), &healthpb.HealthCheckRequest{Service: svc})
						return err == nil && r.Status == healthpb.HealthCheckResponse_SERVING
					})
				}
				stream, err := reflectionpb.NewServerReflectionClient(conn).ServerReflectionInfo(context.Background())
				if err != nil {
					t.Fatal(err)
				}
				defer stream.CloseSend()
				if err := stream.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}); err != nil {
					t.Fatal(err)
				}
				r, err := stream.Recv()
				if err != nil {
					t.Fatal(err)
				}
				var names []string
				for _, s := range r.GetListServicesResponse().GetService() {
					names = append(names, s.Name)
				}
				if !slices.Contains(names, "envoy.service.ratelimit.v3.RateLimitService") || !slices.Contains(names, "grpc.health.v1.Health") {
					t.Errorf("reflection lists %v", names)
				}
			})

			t.Run("hot value split", func(t *testing.T) {
				// 1,800 requests for tenant acme (3x its 600 a year) from
				// 16 clients, beside cold tenants: acme is split, and
				// admits its 600 as the unsplit counter would, never more
				// (less by what re-decided takes count twice, below).
				const clients = 16
				var admitted, cold, colds atomic.Int64
				var wg sync.WaitGroup
				start := time.Now()
				for w := range clients {
					wg.Go(func() {
						for i := range 1800 / clients {
							ds := []*ratelimit.RateLimitDescriptor{desc("tenant", "acme")}
							if i%10 == 0 {
								ds = append(ds, desc("tenant", "cold-"+strconv.Itoa(w)))
								colds.Add(1)
							}
							resp, err := c.ShouldRateLimit(context.Background(), &rlpb.RateLimitRequest{Domain: "gateway", Descriptors: ds})
							if err != nil {
								t.Error(err)
								return
							}
							if resp.Statuses[0].Code == ok {
								admitted.Add(1)
							}
							if len(ds) == 2 && resp.Statuses[1].Code == ok {
								cold.Add(1)
							}
						}
					})
				}
				wg.Wait()
				// Within one window, a split key admits its limit at most:
				// the moves of its usage (1 to 4, 4 to 16 counters) carry
				// the window's counts exactly, and takes in flight land
				// before a move. (After a window starts, each subcounter
				// would admit one more: see gatewayConfig.) It may admit
				// less: a take in flight on the unsplit counter when the
				// key's usage moves off it is decided again on the new
				// counters, and counted twice if it had landed in time
				// (the key admits less, never more): a unit per client at
				// most, each having one request in flight. A busy machine
				// has more of them in flight when the move comes (586 in
				// one loaded run).
				elapsed := time.Since(start)
				bound := int64(600)
				if year := 365 * 24 * time.Hour; window(start, year) != window(time.Now(), year) {
					bound += 16
				}
				least := int64(600 - clients)
				got := admitted.Load()
				t.Logf("acme admitted %d of 1800 in %v (%.2f%% of its limit; bound %d); cold tenants %d of %d", got, elapsed.Round(time.Millisecond), 100*float64(got)/600, bound, cold.Load(), colds.Load())
				if got > bound || got < least {
					t.Errorf("acme admitted %d: want %d to %d", got, least, bound)
				}
				if cold.Load() != colds.Load() {
					t.Errorf("cold tenants admitted %d of %d", cold.Load(), colds.Load())
				}
				level := 0
				for _, h := range d.hotKeys(t).HotKeys {
					if h.Policy == "envoy/gateway.tenant" && h.Key == "acme" {
						level = h.Level
					}
				}
				if level < 16 {
					t.Errorf("acme at level %d in /v1/hotkeys, want 16 or more", level)
				}
				if rc != nil {
					// Its usage is on its 16 subcounters (600/64 is under
					// the 10 a subcounter gets at least).
					for n, want := range map[int]int{16: 16, 64: 0} {
						keys, err := rc.Keys(context.Background(), fmt.Sprintf("hk:envoy/gateway.tenant|acme|%d|*", n)).Result()
						if err != nil {
							t.Fatal(err)
						}
						if len(keys) != want {
							t.Errorf("%d subcounters at level %d in Redis, want %d: %v", len(keys), n, want, keys)
						}
					}
				}
			})
		})
	}
}

// TestGRPCEnvoyExample loads envoyproxy/ratelimit's example configuration,
// copied as it is, and checks that the daemon behaves as that project's
// README says for its full test environment.
func TestGRPCEnvoyExample(t *testing.T) {
	t.Parallel()
	d := startDaemon(t, daemonOpts{args: []string{"--envoy-config", "../../internal/envoyconf/testdata/ratelimit-example"}})
	c := rlsClient(rlsConn(t, d))
	codes := func(n int, hits uint32, descs ...*ratelimit.RateLimitDescriptor) []rlpb.RateLimitResponse_Code {
		var out []rlpb.RateLimitResponse_Code
		for range n {
			out = append(out, should(t, c, "rl", hits, descs...).OverallCode)
		}
		return out
	}
	seq := func(oks, overs int) []rlpb.RateLimitResponse_Code {
		return append(slices.Repeat([]rlpb.RateLimitResponse_Code{ok}, oks), slices.Repeat([]rlpb.RateLimitResponse_Code{over}, overs)...)
	}
	for _, tt := range []struct {
		name  string
		descs []*ratelimit.RateLimitDescriptor
		n     int
		want  []rlpb.RateLimitResponse_Code
		unit  time.Duration // the limit's: a slower run proves nothing
	}{
		// curl localhost:8888/test: source_cluster and destination_cluster, 1 a minute.
		{"/test", []*ratelimit.RateLimitDescriptor{desc("source_cluster", "proxy", "destination_cluster", "mock")}, 3, seq(1, 2), time.Minute},
		// curl localhost:8888/header -H "foo: foo": 2 a minute.
		{"/header", []*ratelimit.RateLimitDescriptor{desc("foo", "foo")}, 3, seq(2, 1), time.Minute},
		// -H "foo: foo" -H "bar: bar": 3 a minute.
		{"/twoheader bar", []*ratelimit.RateLimitDescriptor{desc("foo", "foo", "bar", "bar")}, 4, seq(3, 1), time.Minute},
		// -H "foo: foo" -H "baz: baz": 1 a second, "will be rate limited".
		{"/twoheader baz", []*ratelimit.RateLimitDescriptor{desc("foo", "foo", "baz", "baz")}, 2, seq(1, 1), time.Second},
		// -H "bar: banned": 0 a minute, banned.
		{"/twoheader banned", []*ratelimit.RateLimitDescriptor{desc("foo", "foo", "bar", "banned")}, 2, seq(0, 2), 0},
		// -H "baz: shady": shadow mode, never limited.
		{"/twoheader shady", []*ratelimit.RateLimitDescriptor{desc("foo", "foo", "baz", "shady")}, 5, seq(5, 0), 0},
		// -H "baz: not-so-shady": 3 a minute.
		{"/twoheader not-so-shady", []*ratelimit.RateLimitDescriptor{desc("foo", "foo", "baz", "not-so-shady")}, 4, seq(3, 1), time.Minute},
		// bay under foo, and qux, are unlimited.
		{"unlimited", []*ratelimit.RateLimitDescriptor{desc("foo", "foo", "bay", "x"), desc("qux", "y")}, 5, seq(5, 0), 0},
		// category=account (4 a minute) replaces bkthomps (1 a minute):
		// together, only the 4 a minute applies.
		{"replaces", []*ratelimit.RateLimitDescriptor{desc("category", "account"), desc("foo", "foo", "bar", "bkthomps")}, 5, seq(4, 1), time.Minute},
		// bkthomps alone, not replaced: its own 1 a minute, which the
		// requests above left untouched.
		{"bkthomps", []*ratelimit.RateLimitDescriptor{desc("foo", "foo", "bar", "bkthomps")}, 2, seq(1, 1), time.Minute},
	} {
		if tt.unit > 0 {
			clearOfEdge(tt.unit)
		}
		start := time.Now()
		got := codes(tt.n, 0, tt.descs...)
		if end := time.Now(); tt.unit > 0 && window(start, tt.unit) != window(end, tt.unit) {
			// The rules' sliding windows start at multiples of the unit. A
			// run across the start of one is under the next window's
			// allowance too, and may admit more: not checked.
			t.Logf("%s: %v from %v to %v, across a window's start: not checked", tt.name, got, start, end)
			continue
		}
		if !slices.Equal(got, tt.want) {
			t.Errorf("%s: %v, want %v", tt.name, got, tt.want)
		}
	}
	// The second file's domain: 500 a second per database value.
	resp, err := c.ShouldRateLimit(context.Background(), &rlpb.RateLimitRequest{Domain: "mongo_cps", Descriptors: []*ratelimit.RateLimitDescriptor{desc("database", "users")}, HitsAddend: 500})
	if err != nil || resp.OverallCode != ok || resp.Statuses[0].CurrentLimit.GetRequestsPerUnit() != 500 {
		t.Errorf("mongo_cps: %v %v", resp, err)
	}
}

// window is the index of the window of the given length that t is in, as
// the counters count windows: from the Unix epoch.
func window(t time.Time, unit time.Duration) int64 { return t.UnixNano() / int64(unit) }

// clearOfEdge waits, when the next window of the given length starts within
// 300 ms, until it has started, so that a quick run of requests is likely to
// fall within one window.
func clearOfEdge(unit time.Duration) {
	now := time.Now()
	next := time.Unix(0, (window(now, unit)+1)*int64(unit))
	if left := next.Sub(now); left < 300*time.Millisecond {
		time.Sleep(left + time.Millisecond)
	}
}

func rlsClient(conn *grpc.ClientConn) rlpb.RateLimitServiceClient {
	return rlpb.NewRateLimitServiceClient(conn)
}

// TestGRPCHealthServesDegraded: the gRPC health service says SERVING, for
// the whole server and for the rate-limit service, while the daemon
// answers decisions, Redis down included: ShouldRateLimit answers
// meanwhile, by the rule's fallback (local: the instance's share of the
// limit). Under hotkeyd.strict it says NOT_SERVING while Redis is down, as
// /readyz?strict=true, and SERVING again once it is back.
func TestGRPCHealthServesDegraded(t *testing.T) {
	t.Parallel()
	srv := startRedis(t)
	cfg := writeFile(t, "gateway.yaml", gatewayConfig)
	d := startDaemon(t, daemonOpts{args: []string{"--envoy-config", cfg, "--redis", "redis://" + srv.Addr, "--breaker-probe", "200ms"}})
	conn := rlsConn(t, d)
	hc := healthpb.NewHealthClient(conn)
	c := rlsClient(conn)
	const strict = "hotkeyd.strict"
	services := []string{"", "envoy.service.ratelimit.v3.RateLimitService"}
	state := func(want healthpb.HealthCheckResponse_ServingStatus, svcs ...string) func() bool {
		return func() bool {
			for _, svc := range svcs {
				r, err := hc.Check(context.Background(), &healthpb.HealthCheckRequest{Service: svc})
				if err != nil || r.Status != want {
					return false
				}
			}
			return true
		}
	}
	testkit.For(t, time.Minute, "SERVING", state(healthpb.HealthCheckResponse_SERVING, append(services, strict)...))

	// Every change of the daemon's own statuses is watched.
	wctx, stopWatch := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var notServing atomic.Int64
	for _, svc := range services {
		w, err := hc.Watch(wctx, &healthpb.HealthCheckRequest{Service: svc})
		if err != nil {
			t.Fatal(err)
		}
		wg.Go(func() {
			for {
				r, err := w.Recv()
				if err != nil {
					return
				}
				if r.Status != healthpb.HealthCheckResponse_SERVING {
					notServing.Add(1)
				}
			}
		})
	}

	if err := srv.Kill(); err != nil {
		t.Fatal(err)
	}
	testkit.For(t, time.Minute, "the health service to see Redis down", func() bool {
		return notServing.Load() > 0 || state(healthpb.HealthCheckResponse_NOT_SERVING, strict)()
	})
	if !state(healthpb.HealthCheckResponse_SERVING, services...)() {
		t.Errorf("health with Redis down: not SERVING for %q", services)
	}
	if r := do(t, "GET", d.base+"/readyz", ""); r.status != 200 || !strings.Contains(string(r.body), `"status":"degraded"`) {
		t.Errorf("/readyz with Redis down: %d %s, want 200 degraded", r.status, r.body)
	}
	if r := do(t, "GET", d.base+"/readyz?strict=true", ""); r.status != 503 {
		t.Errorf("/readyz?strict=true with Redis down: %d %s, want 503", r.status, r.body)
	}
	for i := range 3 {
		if resp := should(t, c, "gateway", 0, desc("route", "/login", "user", "down")); resp.OverallCode != ok {
			t.Fatalf("request %d with Redis down (local fallback, 5 a year): %v", i, resp)
		}
	}
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	testkit.For(t, time.Minute, strict+" SERVING with Redis back", state(healthpb.HealthCheckResponse_SERVING, strict))
	stopWatch()
	wg.Wait()
	if n := notServing.Load(); n > 0 {
		t.Errorf("the health service said NOT_SERVING %d times while the daemon answered decisions", n)
	}
}
