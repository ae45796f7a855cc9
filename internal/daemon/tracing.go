// Tracing: OpenTelemetry spans for the APIs and the store, off unless the
// standard OTEL_* variables turn them on.

package daemon

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/micro"
	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/exporters/stdout/stdouttrace"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/stats"

	"github.com/hotkeyd/hotkey/counter"
)

// Values of OTEL_TRACES_EXPORTER and OTEL_EXPORTER_OTLP_PROTOCOL that
// hotkeyd serves.
const (
	traceOTLP, traceConsole, traceNone = "otlp", "console", "none"
	protoGRPC, protoHTTP               = "grpc", "http/protobuf"
	// DefaultServiceName is the service.name of the spans without
	// OTEL_SERVICE_NAME.
	DefaultServiceName = "hotkeyd"
	// traceFlushTimeout bounds the flush of the spans left at shutdown.
	traceFlushTimeout = 2 * time.Second
	tracerName        = "github.com/hotkeyd/hotkey/internal/daemon"
)

// Tracing is what the OTEL_* variables say of traces. Its zero value is
// off. The exporters read the variables not held here (headers,
// certificates, timeout, compression, OTEL_TRACES_SAMPLER, batching,
// OTEL_RESOURCE_ATTRIBUTES) from the process environment themselves.
type Tracing struct {
	// Exporters are "otlp" and "console" (stdout), each at most once;
	// none: tracing is off.
	Exporters []string
	Protocol  string // "grpc" or "http/protobuf"
	// Endpoint is the OTLP URL of traces; empty: the exporter's default
	// (localhost:4317 over gRPC, localhost:4318/v1/traces over HTTP).
	Endpoint string
	Insecure bool // plaintext to the collector
	Service  string
}

// On reports whether spans are recorded.
func (t Tracing) On() bool { return len(t.Exporters) > 0 }

// tracingFromEnv reads the OTEL_* variables through lookup. Tracing is on
// when OTEL_TRACES_EXPORTER names exporters (none: off), or, without it,
// when an OTLP endpoint is set; OTEL_SDK_DISABLED=true turns it off
// whatever the others say. Values it cannot serve are errors naming the
// variable.
func tracingFromEnv(lookup func(string) (string, bool)) (Tracing, error) {
	get := func(k string) string { v, _ := lookup(k); return strings.TrimSpace(v) }
	var t Tracing
	if v := get("OTEL_SDK_DISABLED"); v != "" {
		off, err := strconv.ParseBool(v)
		if err != nil {
			return t, fmt.Errorf("environment variable OTEL_SDK_DISABLED=%q: want true or false", v)
		}
		if off {
			return t, nil
		}
	}
	t.Endpoint = get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
	signal := t.Endpoint != ""
	if !signal {
		t.Endpoint = get("OTEL_EXPORTER_OTLP_ENDPOINT")
	}
	exp := get("OTEL_TRACES_EXPORTER")
	if exp == "" && t.Endpoint != "" {
		exp = traceOTLP
	}
	none := false
	for e := range strings.SplitSeq(exp, ",") {
		switch e = strings.TrimSpace(e); e {
		case "":
		case traceNone:
			none = true
		case traceOTLP, traceConsole:
			if !slices.Contains(t.Exporters, e) {
				t.Exporters = append(t.Exporters, e)
			}
		default:
			return Tracing{}, fmt.Errorf("environment variable OTEL_TRACES_EXPORTER=%q: want otlp, console or none", truncate(exp, 100))
		}
	}
	if none || !t.On() { // none beside others is off too, as the specification says
		return Tracing{}, nil
	}
	t.Service = get("OTEL_SERVICE_NAME")
	if t.Service == "" {
		t.Service = DefaultServiceName
	}
	if !slices.Contains(t.Exporters, traceOTLP) {
		t.Endpoint = ""
		return t, nil
	}
	name := "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
	if t.Protocol = get(name); t.Protocol == "" {
		name = "OTEL_EXPORTER_OTLP_PROTOCOL"
		t.Protocol = get(name)
	}
	switch t.Protocol {
	case "":
		t.Protocol = protoGRPC
	case protoGRPC, protoHTTP:
	default:
		return Tracing{}, fmt.Errorf("environment variable %s=%q: want grpc or http/protobuf", name, truncate(t.Protocol, 100))
	}
	if t.Endpoint != "" {
		name = "OTEL_EXPORTER_OTLP_ENDPOINT"
		if signal {
			name = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
		}
		u, err := url.Parse(t.Endpoint)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return Tracing{}, fmt.Errorf("environment variable %s=%q: want a URL such as http://collector:4317", name, truncate(t.Endpoint, 100))
		}
		if !signal && t.Protocol == protoHTTP {
			// The base endpoint's traces are under /v1/traces; the
			// signal's endpoint is used as it is.
			u.Path = strings.TrimSuffix(u.Path, "/") + "/v1/traces"
			t.Endpoint = u.String()
		}
	}
	name = "OTEL_EXPORTER_OTLP_TRACES_INSECURE"
	v := get(name)
	if v == "" {
		name = "OTEL_EXPORTER_OTLP_INSECURE"
		v = get(name)
	}
	if v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return Tracing{}, fmt.Errorf("environment variable %s=%q: want true or false", name, truncate(v, 100))
		}
		t.Insecure = b
	}
	return t, nil
}

// tracer records the daemon's spans. A nil *tracer is tracing off: http,
// grpcOptions and store then return what they are given (or nothing), so
// that nothing is added to the decision paths, and shutdown does nothing;
// natsSpan needs a tracer.
type tracer struct {
	tp     *sdktrace.TracerProvider
	tr     trace.Tracer
	prop   propagation.TextMapPropagator
	meters metricnoop.MeterProvider
}

// newTracer starts the exporters cfg names; nil when tracing is off. The
// OTLP exporter connects when it first sends, so a collector that is down
// delays no start: its spans are dropped.
func newTracer(ctx context.Context, cfg Tracing, version, instance string) (*tracer, error) {
	if !cfg.On() {
		return nil, nil
	}
	var exps []sdktrace.SpanExporter
	for _, e := range cfg.Exporters {
		var exp sdktrace.SpanExporter
		var err error
		switch {
		case e == traceConsole:
			exp, err = stdouttrace.New(stdouttrace.WithWriter(os.Stdout))
		case cfg.Protocol == protoHTTP:
			var o []otlptracehttp.Option
			if cfg.Endpoint != "" {
				o = append(o, otlptracehttp.WithEndpointURL(cfg.Endpoint))
			}
			if cfg.Insecure {
				o = append(o, otlptracehttp.WithInsecure())
			}
			exp, err = otlptracehttp.New(ctx, o...)
		default:
			var o []otlptracegrpc.Option
			if cfg.Endpoint != "" {
				o = append(o, otlptracegrpc.WithEndpointURL(cfg.Endpoint))
			}
			if cfg.Insecure {
				o = append(o, otlptracegrpc.WithInsecure())
			}
			exp, err = otlptracegrpc.New(ctx, o...)
		}
		if err != nil {
			for _, made := range exps {
				made.Shutdown(ctx)
			}
			return nil, fmt.Errorf("tracing: %s exporter: %w", e, err)
		}
		exps = append(exps, redacting{exp})
	}
	res, err := resource.Merge(resource.Default(), resource.NewSchemaless(
		attribute.String("service.name", cfg.Service),
		attribute.String("service.version", version),
		attribute.String("service.instance.id", instance),
	))
	if err != nil { // schemas of the SDK's and OTEL_RESOURCE_ATTRIBUTES' apart: ours alone
		res = resource.NewSchemaless(attribute.String("service.name", cfg.Service), attribute.String("service.version", version), attribute.String("service.instance.id", instance))
	}
	opts := []sdktrace.TracerProviderOption{sdktrace.WithResource(res)}
	for _, exp := range exps {
		opts = append(opts, sdktrace.WithBatcher(exp))
	}
	tp := sdktrace.NewTracerProvider(opts...)
	return &tracer{
		tp:     tp,
		meters: metricnoop.NewMeterProvider(),
		tr:     tp.Tracer(tracerName),
		prop:   propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}),
	}, nil
}

// redacting exports spans without their status descriptions: otelgrpc
// copies a failed call's gRPC message there, and an engine error's may
// quote the key.
type redacting struct{ sdktrace.SpanExporter }

func (r redacting) ExportSpans(ctx context.Context, spans []sdktrace.ReadOnlySpan) error {
	out := make([]sdktrace.ReadOnlySpan, len(spans))
	for i, s := range spans {
		out[i] = s
		if s.Status().Description != "" {
			out[i] = noDescription{s}
		}
	}
	return r.SpanExporter.ExportSpans(ctx, out)
}

// noDescription is a span whose status has no description.
type noDescription struct{ sdktrace.ReadOnlySpan }

func (s noDescription) Status() sdktrace.Status {
	st := s.ReadOnlySpan.Status()
	st.Description = ""
	return st
}

// shutdown flushes the spans left and stops the exporters, within ctx and
// at most traceFlushTimeout; nil at once when t is nil.
func (t *tracer) shutdown(ctx context.Context) error {
	if t == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, traceFlushTimeout)
	defer cancel()
	if err := t.tp.Shutdown(ctx); err != nil {
		return fmt.Errorf("tracing: flushing spans: %w", err)
	}
	return nil
}

// http wraps h, the handler of route, in a server span; h itself when t
// is nil.
func (t *tracer) http(route string, h http.Handler) http.Handler {
	if t == nil {
		return h
	}
	return otelhttp.NewHandler(h, route,
		otelhttp.WithTracerProvider(t.tp), otelhttp.WithPropagators(t.prop), otelhttp.WithMeterProvider(t.meters),
		otelhttp.WithSpanNameFormatter(func(op string, r *http.Request) string {
			if r.Pattern != "" {
				return r.Method + " " + strings.TrimPrefix(r.Pattern, r.Method+" ")
			}
			return r.Method + " " + op
		}))
}

// grpcOptions are the gRPC server options that give each call of the
// rate-limit service a server span (not health checks or reflection);
// none when t is nil.
func (t *tracer) grpcOptions() []grpc.ServerOption {
	if t == nil {
		return nil
	}
	only := func(info *stats.RPCTagInfo) bool { return strings.HasPrefix(info.FullMethodName, "/"+rlsService+"/") }
	return []grpc.ServerOption{grpc.StatsHandler(otelgrpc.NewServerHandler(
		otelgrpc.WithTracerProvider(t.tp), otelgrpc.WithPropagators(t.prop), otelgrpc.WithMeterProvider(t.meters), otelgrpc.WithFilter(only)))}
}

// natsSpan starts the server span of a request on subject, the child of
// the W3C trace context in its headers (traceparent, tracestate) if any.
// end ends it with the answer's outcome (natsOK or natsError).
func (t *tracer) natsSpan(subject string, h micro.Headers) (ctx context.Context, end func(code string)) {
	ctx = t.prop.Extract(context.Background(), natsCarrier(h))
	ctx, span := t.tr.Start(ctx, subject, trace.WithSpanKind(trace.SpanKindServer), trace.WithAttributes(
		attribute.String("messaging.system", "nats"),
		attribute.String("messaging.destination.name", subject),
		attribute.String("messaging.operation.type", "process"),
	))
	return ctx, func(code string) {
		span.SetAttributes(attribute.String("hotkey.nats.result", code))
		span.End()
	}
}

// natsCarrier reads a NATS request's headers as a TextMapCarrier; keys
// match whatever their case. It is never written.
type natsCarrier micro.Headers

func (c natsCarrier) Get(key string) string {
	if v := c[key]; len(v) > 0 {
		return v[0]
	}
	for k, v := range c {
		if len(v) > 0 && strings.EqualFold(k, key) {
			return v[0]
		}
	}
	return ""
}

func (c natsCarrier) Set(string, string) {}

func (c natsCarrier) Keys() []string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	return keys
}

// store returns s with a span per Take and TakeBatch when t is on and s is
// the Redis store; s itself otherwise. A memory store's call is a lookup
// in this process, cheaper than its span would be.
func (t *tracer) store(s counter.Store) counter.Store {
	rs, ok := s.(*counter.RedisStore)
	if t == nil || !ok {
		return s
	}
	return &tracedStore{RedisStore: rs, tr: t.tr}
}

// tracedStore is a RedisStore whose Take and TakeBatch open a client span
// each, the child of the request's; calls outside a traced request (the
// engine's own, /readyz's probe) open none. The span says the policy (the counter
// name's part before '|'), the algorithm, cost and outcome, never the key,
// which may be a user's identity. Embedding keeps every other method, and
// so every interface the engine looks for, the RedisStore's.
type tracedStore struct {
	*counter.RedisStore
	tr trace.Tracer
}

var (
	_ counter.Store   = (*tracedStore)(nil)
	_ counter.Batcher = (*tracedStore)(nil)
)

// Take is RedisStore.Take in a span.
func (s *tracedStore) Take(ctx context.Context, key string, hash uint64, lim counter.Limit, n int64) (counter.Result, error) {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return s.RedisStore.Take(ctx, key, hash, lim, n)
	}
	ctx, span := s.tr.Start(ctx, "store.take", trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(
		attribute.String("db.system.name", "redis"),
		attribute.String("hotkey.policy", policyOf(key)),
		attribute.String("hotkey.algorithm", lim.Algorithm.String()),
		attribute.Int64("hotkey.cost", n),
	))
	res, err := s.RedisStore.Take(ctx, key, hash, lim, n)
	endStoreSpan(span, res.Allowed, err)
	return res, err
}

// TakeBatch is RedisStore.TakeBatch in a span, which counts the Takes and
// those admitted.
func (s *tracedStore) TakeBatch(ctx context.Context, ops []counter.Op) {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		s.RedisStore.TakeBatch(ctx, ops)
		return
	}
	ctx, span := s.tr.Start(ctx, "store.take_batch", trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(
		attribute.String("db.system.name", "redis"),
		attribute.Int("hotkey.batch.size", len(ops)),
	))
	s.RedisStore.TakeBatch(ctx, ops)
	allowed, failed := 0, 0
	var policies []string
	for i := range ops {
		if ops[i].Err != nil {
			failed++
		} else if ops[i].Result.Allowed {
			allowed++
		}
		if p := policyOf(ops[i].Key); len(policies) < 8 && !slices.Contains(policies, p) {
			policies = append(policies, p)
		}
	}
	span.SetAttributes(attribute.StringSlice("hotkey.policies", policies), attribute.Int("hotkey.batch.allowed", allowed), attribute.Int("hotkey.batch.errors", failed))
	if failed > 0 {
		span.SetStatus(codes.Error, "")
	}
	span.End()
}

// endStoreSpan records a Take's outcome on span and ends it. The error is
// not recorded as an event: its text may quote the key.
func endStoreSpan(span trace.Span, allowed bool, err error) {
	if err != nil {
		span.SetStatus(codes.Error, "")
	} else {
		span.SetAttributes(attribute.Bool("hotkey.allowed", allowed))
	}
	span.End()
}

// policyOf is the policy of a counter name (the counter name, policy|key),
// "" for an unnamed policy's.
func policyOf(name string) string {
	if i := strings.IndexByte(name, '|'); i >= 0 {
		return name[:i]
	}
	return ""
}
