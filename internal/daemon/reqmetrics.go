package daemon

import (
	"context"
	"net/http"
	"time"

	rlpb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/stats"
)

// requestMetrics is hotkeyd_request_duration_seconds, by api: the time the
// daemon takes to serve one request of a decision API (POST /v1/allow,
// hotkey.allow over NATS, ShouldRateLimit over gRPC), a batch being one
// request.
type requestMetrics struct{ vec *prometheus.HistogramVec }

// The values of the api label.
const (
	apiHTTP = "http"
	apiNATS = "nats"
	apiGRPC = "grpc"
)

// newRequestMetrics registers hotkeyd_request_duration_seconds on reg.
func newRequestMetrics(reg prometheus.Registerer) requestMetrics {
	h := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "hotkeyd_request_duration_seconds",
		Help: "Time to serve one request of a decision API (a batch is one request), errors included, from the request read to the answer written, by api: " +
			"http (POST /v1/allow: from its headers read to its answer flushed), nats (hotkey.allow: from its message delivered, waiting for a --nats-concurrency slot included, to its reply published), " +
			"grpc (ShouldRateLimit: from its headers read to its status written).",
		Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5},
	}, []string{"api"})
	reg.MustRegister(h)
	return requestMetrics{h}
}

// api returns the histogram of api (apiHTTP, apiNATS, apiGRPC); it is
// exported, at 0, from then on.
func (m requestMetrics) api(api string) prometheus.Observer { return m.vec.WithLabelValues(api) }

// since observes on o the time since start.
func since(o prometheus.Observer, start time.Time) { o.Observe(time.Since(start).Seconds()) }

// timedHTTP serves requests with h, and observes on o the time from the
// call of h (the request's headers read) to its answer flushed to the
// connection (the server would flush it once h returns: flushing first
// costs no extra write).
func timedHTTP(o prometheus.Observer, h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		h(w, r)
		if f, ok := w.(http.Flusher); ok {
			f.Flush()
		}
		since(o, start)
	}
}

// rpcTimer is the gRPC server's stats handler: it observes on o the time
// of each ShouldRateLimit call, from its headers read to its status
// written (health checks and reflection are not counted).
type rpcTimer struct{ o prometheus.Observer }

// rlsCallKey marks the context of a ShouldRateLimit call.
type rlsCallKey struct{}

func (t rpcTimer) TagRPC(ctx context.Context, info *stats.RPCTagInfo) context.Context {
	if info.FullMethodName == rlpb.RateLimitService_ShouldRateLimit_FullMethodName {
		return context.WithValue(ctx, rlsCallKey{}, true)
	}
	return ctx
}

func (t rpcTimer) HandleRPC(ctx context.Context, s stats.RPCStats) {
	if end, ok := s.(*stats.End); ok && ctx.Value(rlsCallKey{}) != nil {
		t.o.Observe(end.EndTime.Sub(end.BeginTime).Seconds())
	}
}

func (rpcTimer) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context { return ctx }

func (rpcTimer) HandleConn(context.Context, stats.ConnStats) {}
