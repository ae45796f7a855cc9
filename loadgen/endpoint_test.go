package loadgen_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/hotkeyd/hotkey/loadgen"
)

// gateway is an HTTP service behind a limit of limit requests per key (the
// key in X-Api-Key, else the query's key), that fails every fifth request
// of a key with a 500 before counting it. It answers 200 while the key is
// within its limit, and 429 with the RateLimit headers past it.
type gateway struct {
	limit int
	mu    sync.Mutex // guards seen, admitted
	seen  map[string]int
	admit map[string]int
}

func newGateway(limit int) *gateway {
	return &gateway{limit: limit, seen: map[string]int{}, admit: map[string]int{}}
}

func (g *gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	key := r.Header.Get("X-Api-Key")
	if key == "" {
		key = r.URL.Query().Get("key")
	}
	g.mu.Lock()
	g.seen[key]++
	fail := g.seen[key]%5 == 0
	ok := !fail && g.admit[key] < g.limit
	if ok {
		g.admit[key]++
	}
	left := g.limit - g.admit[key]
	g.mu.Unlock()
	switch {
	case fail:
		http.Error(w, "upstream broke", http.StatusInternalServerError)
	case ok:
		w.Header().Set("X-RateLimit-Limit", strconv.Itoa(g.limit))
		w.Header().Set("X-RateLimit-Remaining", strconv.Itoa(left))
		w.Write([]byte("ok"))
	default:
		w.Header().Set("RateLimit-Policy", `"api";q=`+strconv.Itoa(g.limit)+";w=60")
		w.Header().Set("RateLimit", `"api";r=0;t=42`)
		w.Header().Set("Retry-After", "42")
		http.Error(w, "slow down", http.StatusTooManyRequests)
	}
}

// TestEndpointTarget: 200 requests of one key to a gateway of 30 per key
// that fails one in five: 40 errors, 30 admitted, 130 denied, by the key
// in a header or a query parameter, and the last 429's headers reported.
// A request meant 100th or later is answered 37th or later (at most 63
// other senders hold one not yet sent when it is taken), past the 30
// admitted; of the 50 meant last at least 10 are not answered 500, so the
// quota meant last is a 429's.
func TestEndpointTarget(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  loadgen.EndpointConfig
	}{
		{"header", loadgen.EndpointConfig{KeyHeader: "X-Api-Key"}},
		{"query", loadgen.EndpointConfig{Method: http.MethodPost, KeyParam: "key"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := httptest.NewServer(newGateway(30))
			defer srv.Close()
			target, err := loadgen.Endpoint(srv.URL+"/api/orders?page=1", tc.cfg)
			if err != nil {
				t.Fatal(err)
			}
			res, err := loadgen.Run(context.Background(), loadgen.Config{
				Target: target, Workload: loadgen.Fixed("acme"), Rate: 2000, Duration: 100 * time.Millisecond,
				Watch: "acme", Limit: loadgen.Limit{Units: 30, Period: time.Minute},
			}, nil, 0)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("%d sent: %d admitted, %d denied, %d errors (first %v); ideal %d; %d quotas, last %+v",
				res.Sent, res.Allowed, res.Denied, res.Errors, res.FirstError, res.Ideal, res.Quotas, res.Quota)
			if res.Sent != 200 || res.Allowed != 30 || res.Denied != 130 || res.Errors != 40 || res.Ideal != 30 {
				t.Errorf("%d sent: %d admitted, %d denied, %d errors, ideal %d; want 200: 30, 130, 40, 30", res.Sent, res.Allowed, res.Denied, res.Errors, res.Ideal)
			}
			want := loadgen.Quota{Reported: true, Limit: 30, Window: time.Minute, ResetAfter: 42 * time.Second, RetryAfter: 42 * time.Second}
			if res.Quotas != 160 || res.Quota != want {
				t.Errorf("%d quotas, last %+v; want 160, the last 429's %+v", res.Quotas, res.Quota, want)
			}
		})
	}
	if _, err := loadgen.Endpoint("localhost:8080/api", loadgen.EndpointConfig{}); err == nil {
		t.Error("a URL without a scheme: no error")
	}
}
