package loadgen

import (
	"net/http"
	"testing"
	"time"
)

func TestHeaderQuota(t *testing.T) {
	s := time.Second
	for _, tc := range []struct {
		name string
		give map[string]string
		want Quota
	}{
		{"none", nil, Quota{}},
		{"x-ratelimit", map[string]string{"X-RateLimit-Limit": "100", "X-RateLimit-Remaining": "7", "X-RateLimit-Reset": "1767225600"},
			Quota{Reported: true, Limit: 100, Remaining: 7}},
		{"draft, separate", map[string]string{"RateLimit-Limit": "10", "RateLimit-Remaining": "0", "RateLimit-Reset": "3", "Retry-After": "3"},
			Quota{Reported: true, Limit: 10, ResetAfter: 3 * s, RetryAfter: 3 * s}},
		{"draft, one field", map[string]string{"RateLimit": "limit=10, remaining=4, reset=2"},
			Quota{Reported: true, Limit: 10, Remaining: 4, ResetAfter: 2 * s}},
		{"draft, structured", map[string]string{"RateLimit-Policy": `"default";q=100;w=60`, "RateLimit": `"default";r=42;t=9`},
			Quota{Reported: true, Limit: 100, Window: 60 * s, Remaining: 42, ResetAfter: 9 * s}},
		{"retry-after as a date", map[string]string{"Retry-After": "Wed, 21 Oct 2026 07:28:05 GMT", "Date": "Wed, 21 Oct 2026 07:28:00 GMT"},
			Quota{Reported: true, RetryAfter: 5 * s}},
		{"garbage", map[string]string{"X-RateLimit-Limit": "many", "RateLimit": "r=-1;t=soon", "Retry-After": "later"}, Quota{}},
	} {
		h := http.Header{}
		for k, v := range tc.give {
			h.Set(k, v)
		}
		if got := HeaderQuota(h); got != tc.want {
			t.Errorf("%s: %+v, want %+v", tc.name, got, tc.want)
		}
	}
}
