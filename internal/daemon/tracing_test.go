package daemon

import (
	"bytes"
	"context"
	"encoding/hex"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	ratelimit "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlpb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/nats-io/nats.go"
	otelcodes "go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	collecttrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/hotkeyd/hotkey/counter"
	"github.com/hotkeyd/hotkey/internal/redistest"
)

func TestTracingFromEnv(t *testing.T) {
	grpcOn := Tracing{Exporters: []string{"otlp"}, Protocol: "grpc", Endpoint: "http://c:4317", Service: "hotkeyd"}
	tests := []struct {
		name string
		give map[string]string
		want Tracing
	}{
		{"nothing set: off", nil, Tracing{}},
		{"endpoint turns otlp on, gRPC by default", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317"}, grpcOn},
		{"traces endpoint too", map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4317"}, grpcOn},
		{"exporter none beats an endpoint", map[string]string{"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317"}, Tracing{}},
		{"none beside otlp: off", map[string]string{"OTEL_TRACES_EXPORTER": "otlp,none"}, Tracing{}},
		{"sdk disabled beats all", map[string]string{"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317"}, Tracing{}},
		{"sdk disabled false", map[string]string{"OTEL_SDK_DISABLED": "false", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317"}, grpcOn},
		{"otlp without endpoint: the exporter's default", map[string]string{"OTEL_TRACES_EXPORTER": "otlp"}, Tracing{Exporters: []string{"otlp"}, Protocol: "grpc", Service: "hotkeyd"}},
		{"console", map[string]string{"OTEL_TRACES_EXPORTER": " console ", "OTEL_SERVICE_NAME": "edge-rl", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317"}, Tracing{Exporters: []string{"console"}, Service: "edge-rl"}},
		{"http base endpoint gets /v1/traces", map[string]string{"OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf", "OTEL_EXPORTER_OTLP_ENDPOINT": "https://c:4318/otlp/", "OTEL_EXPORTER_OTLP_INSECURE": "false"},
			Tracing{Exporters: []string{"otlp"}, Protocol: "http/protobuf", Endpoint: "https://c:4318/otlp/v1/traces", Service: "hotkeyd"}},
		{"http traces endpoint as is, traces protocol first", map[string]string{"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/t", "OTEL_EXPORTER_OTLP_TRACES_INSECURE": "true"},
			Tracing{Exporters: []string{"otlp"}, Protocol: "http/protobuf", Endpoint: "http://c:4318/t", Insecure: true, Service: "hotkeyd"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := tracingFromEnv(env(tt.give))
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("got %+v, want %+v", got, tt.want)
			}
		})
	}
}

// TestTracingFromEnvErrors: a value hotkeyd cannot serve stops the start
// with the variable named.
func TestTracingFromEnvErrors(t *testing.T) {
	for _, give := range []map[string]string{
		{"OTEL_TRACES_EXPORTER": "zipkin"},
		{"OTEL_SDK_DISABLED": "yes please"},
		{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"},
		{"OTEL_EXPORTER_OTLP_ENDPOINT": "collector:4317"},
		{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4317", "OTEL_EXPORTER_OTLP_INSECURE": "maybe"},
	} {
		_, err := ParseArgs(nil, env(give), nil)
		var name string
		for k := range give {
			if err != nil && strings.Contains(err.Error(), k) {
				name = k
			}
		}
		if err == nil || name == "" {
			t.Errorf("%v: %v, want an error naming the variable", give, err)
		}
	}
}

// collector is an OTLP/gRPC trace collector on loopback that keeps what it
// is sent and counts the connections it accepts.
type collector struct {
	collecttrace.UnimplementedTraceServiceServer
	addr  string
	conns atomic.Int32
	srv   *grpc.Server

	mu    sync.Mutex // guards spans and attrs
	spans []*tracepb.Span
	attrs []*commonpb.KeyValue // the resources'
}

type countingListener struct {
	net.Listener
	n *atomic.Int32
}

func (l countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.n.Add(1)
	}
	return c, err
}

func startCollector(t *testing.T) *collector {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	c := &collector{addr: ln.Addr().String(), srv: grpc.NewServer()}
	collecttrace.RegisterTraceServiceServer(c.srv, c)
	go c.srv.Serve(countingListener{ln, &c.conns})
	t.Cleanup(c.srv.Stop)
	return c
}

func (c *collector) Export(_ context.Context, req *collecttrace.ExportTraceServiceRequest) (*collecttrace.ExportTraceServiceResponse, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, rs := range req.ResourceSpans {
		c.attrs = append(c.attrs, rs.GetResource().GetAttributes()...)
		for _, ss := range rs.ScopeSpans {
			c.spans = append(c.spans, ss.Spans...)
		}
	}
	return &collecttrace.ExportTraceServiceResponse{}, nil
}

func (c *collector) received() ([]*tracepb.Span, []*commonpb.KeyValue) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.spans, c.attrs
}

// tracingRules limit each user of the domain edge.
const tracingRules = `domain: edge
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 100}
`

// Keys of the traced requests: no attribute may hold them.
const (
	httpSecret = "alice-7f3a9c"
	grpcSecret = "bob-1e0d44"
	natsSecret = "carol-95b2e1"
)

// startTraced starts a daemon on a real redis-server with the environment
// environ, and asks it once over HTTP, gRPC and NATS (with a W3C
// traceparent header, returned); it returns the daemon, still running.
func startTraced(t *testing.T, environ map[string]string) (*Daemon, string) {
	t.Helper()
	srv := redistest.ForTest(t)
	rules := filepath.Join(t.TempDir(), "rules.yaml")
	if err := os.WriteFile(rules, []byte(tracingRules), 0o644); err != nil {
		t.Fatal(err)
	}
	d, err := startLogged(t, nil, environ, "--nats-listen", "127.0.0.1:0", "--redis", "redis://"+srv.Addr, "--require-store", "--envoy-config", rules)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { shutdown(t, d) }) // a no-op after the test's own

	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()
	resp, err := client.Post("http://"+d.Addr()+"/v1/allow", "application/json", strings.NewReader(`{"key":"`+httpSecret+`"}`))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("HTTP: %d %s", resp.StatusCode, body)
	}

	conn, err := grpc.NewClient(d.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute) // only catches a hang
	defer cancel()
	rr, err := rlpb.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx, &rlpb.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimit.RateLimitDescriptor{{Entries: []*ratelimit.RateLimitDescriptor_Entry{{Key: "user", Value: grpcSecret}}}}})
	if err != nil || rr.OverallCode != rlpb.RateLimitResponse_OK {
		t.Fatalf("gRPC: %v, %v", rr, err)
	}

	nc, err := nats.Connect(d.NATSURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	const parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	msg, err := nc.RequestMsg(&nats.Msg{Subject: natsSubject, Data: []byte(`{"key":"` + natsSecret + `"}`), Header: nats.Header{"traceparent": {parent}}}, time.Minute)
	if err != nil || !bytes.Contains(msg.Data, []byte(`"allowed":true`)) {
		t.Fatalf("NATS: %v, %v", msg, err)
	}
	return d, parent
}

// TestTracingOTLP runs a daemon with OTEL_EXPORTER_OTLP_ENDPOINT on an
// in-process collector: after a decision over each API and the shutdown,
// the collector holds a server span for each, a store span under each
// with its trace ID, the NATS span under the requester's traceparent, and
// no key in any attribute.
func TestTracingOTLP(t *testing.T) {
	c := startCollector(t)
	d, parent := startTraced(t, map[string]string{
		"OTEL_TRACES_EXPORTER":        "otlp",
		"OTEL_EXPORTER_OTLP_ENDPOINT": "http://" + c.addr,
		"OTEL_EXPORTER_OTLP_INSECURE": "true",
	})
	if _, ok := d.store.(*tracedStore); !ok {
		t.Errorf("store %T, want *tracedStore", d.store)
	}
	shutdown(t, d) // flushes the spans
	spans, res := c.received()

	byID := map[string]*tracepb.Span{}
	for _, s := range spans {
		byID[hex.EncodeToString(s.SpanId)] = s
	}
	server := map[string]*tracepb.Span{}
	for _, s := range spans {
		if s.Kind == tracepb.Span_SPAN_KIND_SERVER {
			server[s.Name] = s
		}
	}
	for _, name := range []string{"POST /v1/allow", rlsService + "/ShouldRateLimit", natsSubject} {
		srv, ok := server[name]
		if !ok {
			t.Errorf("no server span %q among %d spans", name, len(spans))
			continue
		}
		var store *tracepb.Span
		for _, s := range spans {
			if strings.HasPrefix(s.Name, "store.take") && bytes.Equal(s.ParentSpanId, srv.SpanId) {
				store = s
			}
		}
		if store == nil {
			t.Errorf("%s: no store span under it", name)
			continue
		}
		if !bytes.Equal(store.TraceId, srv.TraceId) || store.Kind != tracepb.Span_SPAN_KIND_CLIENT {
			t.Errorf("%s: store span %s of trace %x, kind %v; want trace %x, client", name, store.Name, store.TraceId, store.Kind, srv.TraceId)
		}
		if name == natsSubject {
			if got := hex.EncodeToString(srv.TraceId); got != parent[3:35] {
				t.Errorf("NATS span of trace %s, want the traceparent's %s", got, parent[3:35])
			}
			if got := hex.EncodeToString(srv.ParentSpanId); got != parent[36:52] {
				t.Errorf("NATS span's parent %s, want the traceparent's %s", got, parent[36:52])
			}
		}
		if name == "POST /v1/allow" && attr(store, "hotkey.policy") == "" {
			t.Errorf("HTTP store span without its policy: %v", store.Attributes)
		}
	}
	if got := attr(server[natsSubject], "messaging.system"); got != "nats" {
		t.Errorf("NATS span's messaging.system %q", got)
	}
	all := res
	for _, s := range spans {
		all = append(all, s.Attributes...)
		for _, e := range s.Events {
			all = append(all, e.Attributes...)
		}
	}
	for _, kv := range all {
		for _, k := range []string{httpSecret, grpcSecret, natsSecret} {
			if strings.Contains(kv.String(), k) {
				t.Errorf("attribute %s holds the key %q", kv.Key, k)
			}
		}
	}
	if got := attrOf(res, "service.name"); got != DefaultServiceName {
		t.Errorf("service.name %q, want %q", got, DefaultServiceName)
	}
}

// TestTracingOff: with no OTEL_* variable the daemon installs nothing on
// its decision paths (the plain HTTP handlers, no stats handler, the
// store itself) and sends nothing anywhere; with OTEL_SDK_DISABLED=true
// it does not either, whatever the other variables say.
func TestTracingOff(t *testing.T) {
	for _, tt := range []struct {
		name    string
		environ func(addr string) map[string]string
	}{
		{"unset", func(string) map[string]string { return nil }},
		{"sdk disabled", func(addr string) map[string]string {
			return map[string]string{"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://" + addr}
		}},
		{"exporter none", func(addr string) map[string]string {
			return map[string]string{"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://" + addr}
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := startCollector(t)
			d, _ := startTraced(t, tt.environ(c.addr))
			if d.tracer != nil {
				t.Error("tracer set")
			}
			if _, ok := d.store.(*counter.RedisStore); !ok {
				t.Errorf("store %T, want *counter.RedisStore", d.store)
			}
			mux := d.httpSrv.Handler.(*http.ServeMux)
			for _, path := range []string{"/v1/allow", "/v1/auth/x"} {
				h, _ := mux.Handler(httptest.NewRequest(http.MethodPost, path, nil))
				if _, ok := h.(http.HandlerFunc); !ok {
					t.Errorf("%s: handler %T, want the plain http.HandlerFunc", path, h)
				}
			}
			shutdown(t, d)
			if spans, _ := c.received(); len(spans) > 0 || c.conns.Load() > 0 {
				t.Errorf("collector got %d spans on %d connections, want none", len(spans), c.conns.Load())
			}
		})
	}
}

// TestTracingRedacts: no span leaves with a status description, where an
// error's text (a gRPC status message, say) may quote a key.
func TestTracingRedacts(t *testing.T) {
	mem := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(redacting{mem}))
	_, span := tp.Tracer("t").Start(context.Background(), "call")
	span.SetStatus(otelcodes.Error, `no decision: hotkey: moving "login|`+httpSecret+`" from 4 to 16 counters: i/o timeout`)
	span.End() // exported at once: a syncer
	got := mem.GetSpans()
	if err := tp.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].Status.Code != otelcodes.Error || got[0].Status.Description != "" {
		t.Errorf("exported %+v, want one span of status Error without description", got)
	}
}

// attr is the string value of s's attribute key; "" if none.
func attr(s *tracepb.Span, key string) string {
	if s == nil {
		return ""
	}
	return attrOf(s.Attributes, key)
}

func attrOf(kvs []*commonpb.KeyValue, key string) string {
	for _, kv := range kvs {
		if kv.Key == key {
			return kv.Value.GetStringValue()
		}
	}
	return ""
}
