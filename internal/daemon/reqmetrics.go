package daemon

import (
	"context"
	"net/http"
	"slices"
	"strconv"
	"sync/atomic"
	"time"

	rlpb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/stats"
	"google.golang.org/grpc/status"
)

// requestMetrics is hotkeyd_request_duration_seconds, by api and code:
// the time the daemon takes to serve one request of a decision API (POST
// /v1/allow, hotkey.allow over NATS, ShouldRateLimit over gRPC), a batch
// being one request, and how it was answered.
type requestMetrics struct{ vec *prometheus.HistogramVec }

// The values of the api label.
const (
	apiHTTP = "http"
	apiAuth = "auth"
	apiNATS = "nats"
	apiGRPC = "grpc"
)

// The values of the code label of api nats: a reply with a decision (or a
// batch's decisions), or an error reply (or none published).
const (
	natsOK    = "ok"
	natsError = "error"
)

// okCode is the code label of each api's answer with a decision.
var okCode = map[string]string{apiHTTP: "200", apiAuth: "200", apiNATS: natsOK, apiGRPC: codes.OK.String()}

// newRequestMetrics registers hotkeyd_request_duration_seconds on reg.
func newRequestMetrics(reg prometheus.Registerer) requestMetrics {
	h := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "hotkeyd_request_duration_seconds",
		Help: "Time to serve one request of a decision API (a batch is one request), errors included, from the request read to the answer written, by api: " +
			"http (POST /v1/allow: from its headers read to its answer flushed), auth (/v1/auth/{policy}, forward auth: the same), nats (hotkey.allow: from its message delivered, waiting for a --nats-concurrency slot included, to its reply published), " +
			"grpc (ShouldRateLimit: from its headers read to its status written); and by code: for http and auth the status (200, 429, 400, 401, 403, 404, 405, 413, 500, 503; any other as its class, 2xx to 5xx), " +
			"for nats ok or error (an error reply), for grpc the status code's name (OK, InvalidArgument, ...).",
		Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5},
	}, []string{"api", "code"})
	reg.MustRegister(h)
	return requestMetrics{h}
}

// api returns the histograms of api (apiHTTP, apiAuth, apiNATS, apiGRPC), by code;
// the one of its answers with a decision is exported, at 0, from then on.
func (m requestMetrics) api(api string) prometheus.ObserverVec {
	v := m.vec.MustCurryWith(prometheus.Labels{"api": api})
	v.WithLabelValues(okCode[api])
	return v
}

// httpCodes are the statuses POST /v1/allow and forward auth answer: each
// its own code label.
var httpCodes = []int{http.StatusOK, http.StatusTooManyRequests, http.StatusBadRequest, http.StatusUnauthorized, http.StatusForbidden, http.StatusNotFound, http.StatusMethodNotAllowed,
	http.StatusRequestEntityTooLarge, http.StatusInternalServerError, http.StatusServiceUnavailable}

// httpCode returns the code label of an HTTP status: the status itself
// for those POST /v1/allow and forward auth answer, its class (4xx) for
// any other.
func httpCode(status int) string {
	if slices.Contains(httpCodes, status) {
		return strconv.Itoa(status)
	}
	if status < 200 || status > 599 {
		return "other"
	}
	return strconv.Itoa(status/100) + "xx"
}

// grpcCodes are the code labels of api grpc, indexed by status code.
func grpcCodes() []string {
	labels := make([]string, codes.Unauthenticated+1)
	for c := range labels {
		labels[c] = codes.Code(c).String()
	}
	return labels
}

// grpcCode returns the code label of a gRPC call that ended with err: its
// status code's name, Unknown for a code outside the 17 gRPC defines.
func grpcCode(err error) string { return grpcStatus(err).String() }

// grpcStatus is the status code of a gRPC call that ended with err,
// Unknown for a code outside the 17 gRPC defines.
func grpcStatus(err error) codes.Code {
	c := status.Code(err)
	if c > codes.Unauthenticated {
		c = codes.Unknown
	}
	return c
}

// since observes on o the time since start.
func since(o prometheus.Observer, start time.Time) { o.Observe(time.Since(start).Seconds()) }

// timedHTTP serves requests with h, which returns the status it wrote,
// and observes on o, by code, the time from the call of h (the request's
// headers read) to its answer flushed to the connection (the server would
// flush it once h returns: flushing first costs no extra write).
func timedHTTP(o prometheus.ObserverVec, h func(http.ResponseWriter, *http.Request) int) http.HandlerFunc {
	labels := make([]string, len(httpCodes))
	for i, status := range httpCodes {
		labels[i] = httpCode(status)
	}
	byStatus := newObservers(o, labels)
	return func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		status := h(w, r)
		if f, ok := w.(http.Flusher); ok {
			f.Flush()
		}
		var obs prometheus.Observer
		if i := slices.Index(httpCodes, status); i >= 0 {
			obs = byStatus.get(i)
		} else {
			obs = o.WithLabelValues(httpCode(status))
		}
		since(obs, start)
	}
}

// observers keeps the observers of an ObserverVec for a list of code
// labels, each looked up once, on its first use: a code's series appears
// on /metrics once observed, as with WithLabelValues. Safe for concurrent
// use.
type observers struct {
	vec    prometheus.ObserverVec
	labels []string
	by     []atomic.Pointer[prometheus.Observer] // by[i]: labels[i]'s
}

func newObservers(vec prometheus.ObserverVec, labels []string) *observers {
	return &observers{vec: vec, labels: labels, by: make([]atomic.Pointer[prometheus.Observer], len(labels))}
}

// get returns the observer of code labels[i].
func (o *observers) get(i int) prometheus.Observer {
	if p := o.by[i].Load(); p != nil {
		return *p
	}
	obs := o.vec.WithLabelValues(o.labels[i])
	o.by[i].Store(&obs)
	return obs
}

// rpcTimer is the gRPC server's stats handler: it observes on o, by code,
// the time of each ShouldRateLimit call, from its headers read to its
// status written (health checks and reflection are not counted).
type rpcTimer struct{ o *observers }

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
		t.o.get(int(grpcStatus(end.Error))).Observe(end.EndTime.Sub(end.BeginTime).Seconds())
	}
}

func (rpcTimer) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context { return ctx }

func (rpcTimer) HandleConn(context.Context, stats.ConnStats) {}
