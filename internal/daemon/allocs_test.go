package daemon

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"testing"

	"github.com/nats-io/nats.go/micro"
)

// The allocations of one decision in the daemon's own code, engine and
// memory store included, net/http's and nats.go's not: what
// TestDecisionAllocs holds them to.
const (
	maxHTTPDecisionAllocs = 10
	maxNATSDecisionAllocs = 8
)

// TestDecisionAllocs: a decision over HTTP (POST /v1/allow through the
// API's handler) and over NATS (a hotkey.allow request through
// handleNATS, its answer published) allocates at most a few times, the
// body decoded and the answer encoded without reflection.
func TestDecisionAllocs(t *testing.T) {
	d, err := StartArgs(context.Background(), "--listen", "127.0.0.1:0", "--nats-listen", "127.0.0.1:0", "--hot-threshold", "1e9")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { shutdown(t, d) })
	body := []byte(`{"key":"user_123","cost":1}`)

	h := d.httpSrv.Handler
	var w discardWriter
	r, err := http.NewRequest(http.MethodPost, "/v1/allow", nil)
	if err != nil {
		t.Fatal(err)
	}
	rd := bytes.NewReader(nil)
	r.Body = io.NopCloser(rd)
	httpAllocs := testing.AllocsPerRun(1000, func() {
		rd.Reset(body)
		clear(w.h)
		w.status = 0
		h.ServeHTTP(&w, r)
		if w.status != http.StatusOK && w.status != http.StatusTooManyRequests {
			t.Fatalf("status %d, want a decision: 200 or 429", w.status)
		}
	})

	req := &fakeMicroRequest{data: body, reply: "_INBOX.allocs"}
	natsAllocs := testing.AllocsPerRun(1000, func() {
		d.handleNATS(req)
		d.nats.wg.Wait()
	})
	t.Logf("allocations per decision: %.1f over HTTP, %.1f over NATS", httpAllocs, natsAllocs)
	if httpAllocs > maxHTTPDecisionAllocs {
		t.Errorf("%.1f allocations per decision over HTTP, want at most %d", httpAllocs, maxHTTPDecisionAllocs)
	}
	if natsAllocs > maxNATSDecisionAllocs {
		t.Errorf("%.1f allocations per decision over NATS, want at most %d", natsAllocs, maxNATSDecisionAllocs)
	}
}

// discardWriter is a ResponseWriter that keeps the status and the header.
type discardWriter struct {
	h      http.Header
	status int
}

func (w *discardWriter) Header() http.Header {
	if w.h == nil {
		w.h = make(http.Header)
	}
	return w.h
}

func (w *discardWriter) WriteHeader(status int) { w.status = status }

func (w *discardWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return len(b), nil
}

// fakeMicroRequest is a hotkey.allow request as micro hands it over.
type fakeMicroRequest struct {
	data  []byte
	reply string
}

func (r *fakeMicroRequest) Respond([]byte, ...micro.RespondOpt) error               { return nil }
func (r *fakeMicroRequest) RespondJSON(any, ...micro.RespondOpt) error              { return nil }
func (r *fakeMicroRequest) Error(string, string, []byte, ...micro.RespondOpt) error { return nil }
func (r *fakeMicroRequest) Data() []byte                                            { return r.data }
func (r *fakeMicroRequest) Headers() micro.Headers                                  { return nil }
func (r *fakeMicroRequest) Subject() string                                         { return "hotkey.allow" }
func (r *fakeMicroRequest) Reply() string                                           { return r.reply }
