package hotkey

import (
	"errors"
	"net/http"
	"time"

	"github.com/hotkeyd/hotkey/internal/ratelimitheader"
)

// SetHeaders writes the rate-limit headers of a decision r under policy p
// (named policy, "default" if empty) at instant now:
//
//   - X-RateLimit-Limit: the limit's capacity (burst, or rate per period);
//   - X-RateLimit-Remaining: what the key would still admit now;
//   - X-RateLimit-Reset: the Unix second at which the key is full again;
//   - RateLimit-Policy and RateLimit, as in the IETF httpapi
//     ratelimit-headers draft: `"<policy>";q=<quota>;w=<window seconds>`
//     and `"<policy>";r=<remaining>;t=<seconds until full>`;
//   - Retry-After, in whole seconds rounded up (at least 1), if r denied;
//   - X-RateLimit-Shadow: denied, if r is ShadowDenied: the policy, in
//     shadow mode, would have denied it (no Retry-After: it is allowed).
//
// The daemon and the Middleware both use it.
func SetHeaders(h http.Header, p *Policy, r Result, now time.Time) {
	d := ratelimitheader.Decision{
		Limit: r.Limit, Remaining: r.Remaining, RetryAfter: r.RetryAfter, ResetAfter: r.ResetAfter,
		Allowed: r.Allowed, ShadowDenied: r.ShadowDenied,
	}
	if p != nil {
		d.Policy, d.Period = p.Name, p.Limit.Period
	}
	// The values are cut from one string and their slices from one array,
	// to allocate twice per answer rather than twice per header.
	var buf [160]byte
	var ends [ratelimitheader.N]int
	all := string(ratelimitheader.Append(buf[:0], &ends, d, now))
	vals := make([]string, ratelimitheader.N)
	from, j := 0, 0
	for i, key := range ratelimitheader.Canonical {
		if ends[i] == 0 {
			continue
		}
		vals[j] = all[from:ends[i]]
		h[key] = vals[j : j+1 : j+1] // cap 1: an Add copies rather than writes over the next value
		from = ends[i]
		j++
	}
}

// MiddlewareConfig configures Middleware.
type MiddlewareConfig struct {
	// Policy is the limit and its fallback while the store is down.
	Policy *Policy
	// Key names the rate-limited key of a request, such as its API key or
	// client address. An empty key lets the request through unlimited.
	Key func(*http.Request) string
	// Cost is the units a request takes (default: 1 for every request).
	Cost func(*http.Request) int64
	// OnError is called when the engine returns an error: bad input (a key
	// longer than the engine accepts, a cost over the burst) or, with
	// FallbackError, a store that cannot answer. It writes the response
	// itself. Default: 503 Service Unavailable for a store error (the
	// caller chose FallbackError, "the caller decides"), 400 for bad input.
	OnError func(w http.ResponseWriter, r *http.Request, err error)
}

// Middleware returns net/http middleware that rate-limits each request by
// cfg.Key under cfg.Policy. Every response it lets through, and every
// denial, carries the rate-limit headers (see SetHeaders). A denied request
// gets 429 Too Many Requests with Retry-After; under a Shadow policy it is
// let through, with X-RateLimit-Shadow: denied. While the store cannot
// answer, the policy's fallback decides (FallbackLocal by default); a
// request a FallbackClosed policy denies for that reason gets 503 Service
// Unavailable, since the store, not the client, is at fault.
func (e *Engine) Middleware(cfg MiddlewareConfig) func(http.Handler) http.Handler {
	if cfg.Policy == nil || cfg.Key == nil {
		panic("hotkey: Middleware needs a Policy and a Key function")
	}
	onError := cfg.OnError
	if onError == nil {
		onError = defaultOnError
	}
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
			key := cfg.Key(req)
			if key == "" {
				next.ServeHTTP(w, req)
				return
			}
			cost := int64(1)
			if cfg.Cost != nil {
				cost = cfg.Cost(req)
			}
			res, err := e.AllowN(req.Context(), key, cfg.Policy, cost)
			if err != nil {
				onError(w, req, err)
				return
			}
			SetHeaders(w.Header(), cfg.Policy, res, e.opt.clock())
			switch {
			case res.Allowed:
				next.ServeHTTP(w, req)
			case cfg.Policy.Unavailable(res):
				http.Error(w, "rate limiter unavailable", http.StatusServiceUnavailable)
			default:
				http.Error(w, "too many requests", http.StatusTooManyRequests)
			}
		})
	}
}

func defaultOnError(w http.ResponseWriter, _ *http.Request, err error) {
	if errors.Is(err, ErrStoreUnavailable) {
		http.Error(w, "rate limiter unavailable", http.StatusServiceUnavailable)
		return
	}
	http.Error(w, "bad request: "+err.Error(), http.StatusBadRequest)
}
