package loadgen

import (
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Quota is what a target said of its limit alongside one decision: Envoy's
// current_limit, limit_remaining and duration_until_reset, an HTTP answer's
// RateLimit, RateLimit-*, X-RateLimit-* and Retry-After headers, or
// hotkeyd's JSON. A field the answer did not carry is zero.
type Quota struct {
	// Reported is whether the answer said anything of its limit.
	Reported bool
	// Limit is the units the limit admits per Window.
	Limit int64
	// Window is the limit's window, where the answer names it.
	Window time.Duration
	// Remaining is the units left after the decision.
	Remaining int64
	// ResetAfter is how long until the limit is whole again, or its window
	// ends.
	ResetAfter time.Duration
	// RetryAfter is how long a denied request is told to wait.
	RetryAfter time.Duration
}

// HeaderQuota reads the rate-limit headers of an HTTP answer: the IETF
// draft's RateLimit ("name";r=R;t=T, or limit=L, remaining=R, reset=T) and
// RateLimit-Policy ("name";q=Q;w=W), its earlier RateLimit-Limit,
// RateLimit-Remaining and RateLimit-Reset, the common X-RateLimit-Limit and
// X-RateLimit-Remaining, and Retry-After in seconds or as an HTTP date
// (against the answer's Date). X-RateLimit-Reset is left out: some
// gateways send it as a delay, others as an instant. A header that does
// not parse is ignored; Reported says whether any did.
func HeaderQuota(h http.Header) Quota {
	return quotaOf(h.Get)
}

// quotaOf is HeaderQuota of the headers get returns the first value of,
// by name.
func quotaOf(get func(name string) string) Quota {
	var q Quota
	num := func(v string, dst *int64) bool {
		v = strings.TrimSpace(v)
		if v == "" { // absent: ParseInt's error would allocate
			return false
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			return false
		}
		*dst, q.Reported = n, true
		return true
	}
	secs := func(v string, dst *time.Duration) {
		var n int64
		if num(v, &n) {
			*dst = time.Duration(min(n, math.MaxInt64/int64(time.Second))) * time.Second
		}
	}
	num(get("X-RateLimit-Limit"), &q.Limit)
	num(get("X-RateLimit-Remaining"), &q.Remaining)
	num(get("RateLimit-Limit"), &q.Limit)
	num(get("RateLimit-Remaining"), &q.Remaining)
	secs(get("RateLimit-Reset"), &q.ResetAfter)
	for _, p := range params(get("RateLimit-Policy")) {
		switch p[0] {
		case "q":
			num(p[1], &q.Limit)
		case "w":
			secs(p[1], &q.Window)
		}
	}
	for _, p := range params(get("RateLimit")) {
		switch p[0] {
		case "limit":
			num(p[1], &q.Limit)
		case "r", "remaining":
			num(p[1], &q.Remaining)
		case "t", "reset":
			secs(p[1], &q.ResetAfter)
		}
	}
	if v := strings.TrimSpace(get("Retry-After")); v != "" {
		if at, err := http.ParseTime(v); err == nil {
			if date, err := http.ParseTime(get("Date")); err == nil && at.After(date) {
				q.RetryAfter, q.Reported = at.Sub(date), true
			}
		} else {
			secs(v, &q.RetryAfter)
		}
	}
	return q
}

// params splits a structured header's value into its key=value parameters,
// lower case keys, unquoted values; items without = are left out.
func params(v string) [][2]string {
	var out [][2]string
	for _, item := range strings.FieldsFunc(v, func(r rune) bool { return r == ',' || r == ';' }) {
		k, val, ok := strings.Cut(item, "=")
		if !ok {
			continue
		}
		out = append(out, [2]string{strings.ToLower(strings.TrimSpace(k)), strings.Trim(strings.TrimSpace(val), `"`)})
	}
	return out
}
