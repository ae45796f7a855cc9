package loadgen_test

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/hotkeyd/hotkey/loadgen"
)

// TestHTTPClosedIdle: a server that closes each connection after one
// answer, unannounced, as one closes a connection idle too long: every
// decision of HTTP (a POST) and of Endpoint (a GET) is sent again on a new
// connection and decided, none an error.
func TestHTTPClosedIdle(t *testing.T) {
	hk := cannedServer(t, canned("200 OK", "", hotkeydAnswer), true)
	gw := cannedServer(t, canned("200 OK", "", "ok"), true)
	endpoint, err := loadgen.Endpoint("http://"+gw+"/api", loadgen.EndpointConfig{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute) // only catches a hang
	defer cancel()
	for _, target := range []loadgen.Target{loadgen.HTTP("http://"+hk, "", nil), endpoint} {
		for i := range 20 {
			if out, err := target.Decide(ctx, "k", 1); err != nil || !out.Allowed {
				t.Fatalf("%T: decision %d: %+v, %v; want admitted", target, i, out, err)
			}
		}
	}
}

// TestEndpointRedirect: an Endpoint follows a redirect, as an http.Client
// does, and decides by the answer it leads to.
func TestEndpointRedirect(t *testing.T) {
	mux := http.NewServeMux()
	mux.Handle("/old", http.RedirectHandler("/api?page=2", http.StatusFound))
	mux.HandleFunc("/api", func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("page") != "2" || r.URL.Query().Get("key") != "" {
			http.Error(w, "wrong query "+r.URL.RawQuery, http.StatusBadRequest)
			return
		}
		w.Header().Set("Retry-After", "7")
		http.Error(w, "slow down", http.StatusTooManyRequests)
	})
	srv := httptest.NewServer(mux)
	defer srv.Close()
	target, err := loadgen.Endpoint(srv.URL+"/old?key=x", loadgen.EndpointConfig{KeyParam: "key"})
	if err != nil {
		t.Fatal(err)
	}
	out, err := target.Decide(context.Background(), "k", 1)
	if err != nil || out.Allowed || out.Quota.RetryAfter != 7*time.Second {
		t.Fatalf("%+v, %v; want denied, retry after 7s", out, err)
	}
}

// TestHTTPDeadline: a decision no answer comes to ends at its context's
// deadline, an error that wraps context.DeadlineExceeded, and one asked
// past its deadline is not sent.
func TestHTTPDeadline(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	endpoint, err := loadgen.Endpoint("http://"+l.Addr().String(), loadgen.EndpointConfig{})
	if err != nil {
		t.Fatal(err)
	}
	for _, target := range []loadgen.Target{loadgen.HTTP("http://"+l.Addr().String(), "", nil), endpoint} {
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		_, err := target.Decide(ctx, "k", 1)
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("%T: %v, want an error that wraps context.DeadlineExceeded", target, err)
		}
		ctx, cancel = context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
		_, err = target.Decide(ctx, "k", 1)
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("%T, deadline passed: %v, want an error that wraps context.DeadlineExceeded", target, err)
		}
	}
}
