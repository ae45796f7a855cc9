package daemon

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nats.go"
)

// batchPolicies: limits with a period of 1000 hours, so that nothing
// refills while a test runs and no window starts (windows start at
// multiples of their period from the Unix epoch): what a key admits is
// exact.
const batchPolicies = `policies:
  default:
    algorithm: token_bucket
    limit: 100
    period: 1s
  tb:
    algorithm: token_bucket
    limit: 10
    period: 1000h
  sw:
    algorithm: sliding_window
    limit: 10
    period: 1000h
  sl:
    algorithm: sliding_log
    limit: 10
    period: 1000h
  tb50:
    algorithm: token_bucket
    limit: 50
    period: 1000h
  sw50:
    algorithm: sliding_window
    limit: 50
    period: 1000h
  sl50:
    algorithm: sliding_log
    limit: 50
    period: 1000h
`

// batchEnv is a daemon (memory store, embedded NATS) with an HTTP client
// and a NATS connection to ask it.
type batchEnv struct {
	t      *testing.T
	d      *Daemon
	client *http.Client
	nc     *nats.Conn
}

func startBatchEnv(t *testing.T) *batchEnv {
	t.Helper()
	policies := filepath.Join(t.TempDir(), "policies.yaml")
	if err := os.WriteFile(policies, []byte(batchPolicies), 0o600); err != nil {
		t.Fatal(err)
	}
	// No key is split (a split key's count is an estimate): the threshold
	// is out of reach.
	d, err := StartArgs(context.Background(), "--listen", "127.0.0.1:0", "--nats-listen", "127.0.0.1:0", "--policies", policies, "--hot-threshold", "1e9")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { shutdown(t, d) })
	nc, err := nats.Connect(d.NATSURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	client := &http.Client{Transport: &http.Transport{}}
	t.Cleanup(client.CloseIdleConnections)
	return &batchEnv{t: t, d: d, client: client, nc: nc}
}

// post sends body to POST /v1/allow. It may run on any goroutine.
func (e *batchEnv) post(body string) (int, http.Header, []byte, error) {
	resp, err := e.client.Post("http://"+e.d.Addr()+"/v1/allow", "application/json", strings.NewReader(body))
	if err != nil {
		return 0, nil, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, b, err
}

// request sends body on hotkey.allow. It may run on any goroutine.
func (e *batchEnv) request(body string) (*nats.Msg, error) {
	return e.nc.Request("hotkey.allow", []byte(body), time.Minute)
}

// batch sends a batch over HTTP or NATS and returns its answer, which must
// be a success with an item per request. It may run on any goroutine.
func (e *batchEnv) batch(overNATS bool, body string) (BatchResponse, error) {
	var data []byte
	if overNATS {
		msg, err := e.request(body)
		if err != nil {
			return BatchResponse{}, err
		}
		if code := msg.Header.Get("Nats-Service-Error-Code"); code != "" {
			return BatchResponse{}, fmt.Errorf("NATS error %s: %s", code, msg.Data)
		}
		data = msg.Data
	} else {
		status, h, b, err := e.post(body)
		if err != nil {
			return BatchResponse{}, err
		}
		if status != 200 || h.Get("Content-Type") != "application/json" {
			return BatchResponse{}, fmt.Errorf("HTTP %d (%s): %s", status, h.Get("Content-Type"), b)
		}
		for name := range h {
			if n := strings.ToLower(name); strings.Contains(n, "ratelimit") || n == "retry-after" {
				return BatchResponse{}, fmt.Errorf("header %s on a batch answer", name)
			}
		}
		data = b
	}
	var br BatchResponse
	if err := json.Unmarshal(data, &br); err != nil {
		return BatchResponse{}, fmt.Errorf("%v: %s", err, data)
	}
	return br, nil
}

func (e *batchEnv) mustBatch(overNATS bool, body string, n int) []BatchItem {
	e.t.Helper()
	br, err := e.batch(overNATS, body)
	if err != nil {
		e.t.Fatal(err)
	}
	if len(br.Responses) != n {
		e.t.Fatalf("%d responses to %d requests: %+v", len(br.Responses), n, br)
	}
	return br.Responses
}

// single asks body alone over HTTP: its status and, for an error, its
// message.
func (e *batchEnv) single(body string) (int, string) {
	e.t.Helper()
	status, _, b, err := e.post(body)
	if err != nil {
		e.t.Fatal(err)
	}
	var er ErrorResponse
	if status != 200 && status != 429 {
		if err := json.Unmarshal(b, &er); err != nil {
			e.t.Fatalf("%s: %d %s", body, status, b)
		}
	}
	return status, er.Error
}

type item struct {
	Policy string `json:"policy,omitempty"`
	Key    string `json:"key"`
	Cost   int64  `json:"cost,omitempty"`
}

func batchBody(t testing.TB, items []item) string {
	t.Helper()
	b, err := json.Marshal(struct {
		Requests []item `json:"requests"`
	}{items})
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// admit is the sequential model: costs asked in order of a key with
// capacity limit and nothing refilling. It returns which are admitted and
// what remains after each.
func admit(limit int64, costs []int64) (allowed []bool, remaining []int64) {
	left := limit
	for _, c := range costs {
		ok := c <= left
		if ok {
			left -= c
		}
		allowed, remaining = append(allowed, ok), append(remaining, left)
	}
	return allowed, remaining
}

// TestBatchOrder: one batch mixing allowed, denied, unknown-policy,
// empty-key, bad-cost and too-long-key requests gets an answer per request,
// in order, over HTTP and over NATS: the decisions with status 200 or 429,
// the others with the status and message each would get alone.
func TestBatchOrder(t *testing.T) {
	e := startBatchEnv(t)
	for _, overNATS := range []bool{false, true} {
		name := map[bool]string{false: "HTTP", true: "NATS"}[overNATS]
		t.Run(name, func(t *testing.T) {
			k := "order-" + name
			items := []item{
				{Policy: "tb", Key: k, Cost: 4},               // 200, 6 left
				{Policy: "nope", Key: k},                      // 404
				{Policy: "tb", Key: k, Cost: 7},               // 429, 6 left
				{Policy: "tb", Key: ""},                       // 400 empty key
				{Policy: "tb", Key: k, Cost: 11},              // 400 over the burst
				{Key: k},                                      // default policy: 200
				{Policy: "tb", Key: k, Cost: 6},               // 200, 0 left
				{Policy: "tb", Key: k},                        // 429
				{Policy: "tb", Key: k, Cost: -2},              // 400 cost
				{Policy: "tb", Key: strings.Repeat("k", 513)}, // 400 too long
				{Policy: "sl", Key: k, Cost: 10},              // 200: another policy
			}
			got := e.mustBatch(overNATS, batchBody(t, items), len(items))
			type want struct {
				status           int
				limit, remaining int64
			}
			decisions := map[int]want{0: {200, 10, 6}, 2: {429, 10, 6}, 5: {200, 100, 99}, 6: {200, 10, 0}, 7: {429, 10, 0}, 10: {200, 10, 0}}
			for i, it := range got {
				w, decided := decisions[i]
				if !decided {
					// The same status and message as the request alone
					// (none of these is charged).
					b, _ := json.Marshal(items[i])
					status, msg := e.single(string(b))
					if it.Status != status || it.Error != msg || msg == "" || it.AllowResponse != nil {
						t.Errorf("item %d: %+v; alone: %d %q", i, it, status, msg)
					}
					continue
				}
				ar := it.AllowResponse
				if it.Status != w.status || it.Error != "" || ar == nil || ar.Allowed != (w.status == 200) || ar.Limit != w.limit || ar.Remaining != w.remaining || ar.Shards != 1 {
					t.Errorf("item %d: %+v %+v, want %+v", i, it, ar, w)
					continue
				}
				if (ar.RetryAfterMs > 0) != (w.status == 429) {
					t.Errorf("item %d: retry_after_ms %d with status %d", i, ar.RetryAfterMs, it.Status)
				}
			}
		})
	}
}

// TestBatchJSON: the shapes of an answer: an item with the fields of
// AllowResponse and its status, or the status and error alone.
func TestBatchJSON(t *testing.T) {
	e := startBatchEnv(t)
	status, _, b, err := e.post(`{"requests":[{"policy":"tb","key":"json","cost":10},{"policy":"tb","key":"json"},{"policy":"nope","key":"json"}]}`)
	if err != nil {
		t.Fatal(err)
	}
	var raw struct {
		Responses []map[string]any `json:"responses"`
	}
	if err := json.Unmarshal(b, &raw); status != 200 || err != nil || len(raw.Responses) != 3 {
		t.Fatalf("%d %s", status, b)
	}
	keys := func(m map[string]any) string {
		var ks []string
		for _, k := range []string{"status", "allowed", "limit", "remaining", "reset_after_ms", "retry_after_ms", "shards", "degraded", "error"} {
			if _, ok := m[k]; ok {
				ks = append(ks, k)
			}
		}
		return fmt.Sprintf("%d fields: %s", len(m), strings.Join(ks, ","))
	}
	decision := "8 fields: status,allowed,limit,remaining,reset_after_ms,retry_after_ms,shards,degraded"
	for i, want := range []string{decision, decision, "2 fields: status,error"} {
		if got := keys(raw.Responses[i]); got != want {
			t.Errorf("item %d: %s, want %s (%s)", i, got, want, b)
		}
	}
	if !strings.HasPrefix(string(b), `{"responses":[{"status":200,"allowed":true,"limit":10,"remaining":0,`) ||
		!strings.Contains(string(b), `{"status":429,"allowed":false,"limit":10,"remaining":0,`) ||
		!strings.HasSuffix(string(b), `{"status":404,"error":"unknown policy \"nope\": this daemon has \"default\", \"sl\", \"sl50\", \"sw\", \"sw50\", \"tb\", \"tb50\""}]}`+"\n") {
		t.Errorf("body %s", b)
	}
}

// TestBatchExact: a batch of mixed costs on one key admits what the
// sequential model admits, in order, under each algorithm; two policies on
// one key in one batch count apart.
func TestBatchExact(t *testing.T) {
	e := startBatchEnv(t)
	costs := []int64{1, 3, 2, 5, 1, 2, 4, 1, 1, 3, 1}
	for _, overNATS := range []bool{false, true} {
		for _, policy := range []string{"tb", "sw", "sl"} {
			key := fmt.Sprintf("exact-%s-%v", policy, overNATS)
			items := make([]item, len(costs))
			for i, c := range costs {
				items[i] = item{Policy: policy, Key: key, Cost: c}
			}
			got := e.mustBatch(overNATS, batchBody(t, items), len(items))
			allowed, remaining := admit(10, costs)
			var sum int64
			for i, it := range got {
				if it.AllowResponse == nil || it.Allowed != allowed[i] || it.Remaining != remaining[i] || it.Status != allowStatus(allowed[i]) {
					t.Errorf("%s over NATS %v, item %d (cost %d): %+v %+v; want allowed %v, remaining %d", policy, overNATS, i, costs[i], it, it.AllowResponse, allowed[i], remaining[i])
					continue
				}
				if it.Allowed {
					sum += costs[i]
				}
			}
			if sum != 10 {
				t.Errorf("%s over NATS %v: admitted %d, want the limit, 10", policy, overNATS, sum)
			}
		}
	}

	// Two policies on one key: each has its own counter.
	var items []item
	var tbCosts, slCosts []int64
	for i, c := range costs {
		p := []string{"tb", "sl"}[i%2]
		items = append(items, item{Policy: p, Key: "two", Cost: c})
		if p == "tb" {
			tbCosts = append(tbCosts, c)
		} else {
			slCosts = append(slCosts, c)
		}
	}
	got := e.mustBatch(false, batchBody(t, items), len(items))
	tbAllowed, _ := admit(10, tbCosts)
	slAllowed, _ := admit(10, slCosts)
	for i, it := range got {
		want := tbAllowed
		if i%2 == 1 {
			want = slAllowed
		}
		if it.AllowResponse == nil || it.Allowed != want[i/2] {
			t.Errorf("two policies, item %d (%s, cost %d): %+v %+v, want allowed %v", i, items[i].Policy, items[i].Cost, it, it.AllowResponse, want[i/2])
		}
	}
}

// outcome gathers what a key admitted over concurrent askers.
type outcome struct {
	mu       sync.Mutex
	admitted int64
	denied   []int64 // the costs denied
}

func (o *outcome) add(allowed bool, cost int64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if allowed {
		o.admitted += cost
	} else {
		o.denied = append(o.denied, cost)
	}
}

// check: never more than the limit, and each denial was right in some
// order of the decisions (a count only grows: a cost denied was more than
// what is left at the end).
func (o *outcome) check(t *testing.T, what string, limit int64) {
	t.Helper()
	left := limit - o.admitted
	if o.admitted > limit || o.admitted <= 0 {
		t.Errorf("%s: admitted %d of a limit of %d", what, o.admitted, limit)
	}
	for _, c := range o.denied {
		if c <= left {
			t.Errorf("%s: cost %d denied while %d was left at the end (admitted %d)", what, c, left, o.admitted)
			return
		}
	}
}

// TestBatchConcurrent: batches on one key at once, over HTTP and NATS, and
// batches mixed with single requests on the same key, never admit more
// than the limit, under each algorithm.
func TestBatchConcurrent(t *testing.T) {
	e := startBatchEnv(t)
	costs := []int64{1, 3, 2, 5, 1, 2, 4, 1, 1, 3}
	for _, policy := range []string{"tb50", "sw50", "sl50"} {
		for _, withSingles := range []bool{false, true} {
			key := fmt.Sprintf("conc-%s-%v", policy, withSingles)
			what := fmt.Sprintf("%s, singles %v", policy, withSingles)
			var o outcome
			var wg sync.WaitGroup
			for g := range 8 {
				wg.Go(func() {
					items := make([]item, len(costs))
					for i, c := range costs {
						items[i] = item{Policy: policy, Key: key, Cost: c}
					}
					br, err := e.batch(g%2 == 1, batchBody(t, items))
					if err != nil || len(br.Responses) != len(items) {
						t.Errorf("%s: %v %+v", what, err, br)
						return
					}
					for i, it := range br.Responses {
						if it.AllowResponse == nil || it.Status != allowStatus(it.Allowed) {
							t.Errorf("%s: item %d: %+v", what, i, it)
							return
						}
						o.add(it.Allowed, costs[i])
					}
				})
			}
			if withSingles {
				for g := range 16 {
					wg.Go(func() {
						cost := costs[g%len(costs)]
						status, _, b, err := e.post(fmt.Sprintf(`{"policy":%q,"key":%q,"cost":%d}`, policy, key, cost))
						var ar AllowResponse
						if err != nil || (status != 200 && status != 429) || json.Unmarshal(b, &ar) != nil || ar.Allowed != (status == 200) {
							t.Errorf("%s: single: %v %d %s", what, err, status, b)
							return
						}
						o.add(ar.Allowed, cost)
					})
				}
			}
			wg.Wait()
			o.check(t, what, 50)
		}
	}
}

// TestBatchFull: a batch of MaxBatch requests with the longest keys fits
// in MaxBody and is answered whole.
func TestBatchFull(t *testing.T) {
	e := startBatchEnv(t)
	items := make([]item, MaxBatch)
	for i := range items {
		k := fmt.Sprintf("%04d", i)
		items[i] = item{Key: k + strings.Repeat("x", 512-len(k))}
	}
	body := batchBody(t, items)
	if len(body) > MaxBody {
		t.Fatalf("a full batch of 512-byte keys is %d bytes, over MaxBody", len(body))
	}
	for _, overNATS := range []bool{false, true} {
		for i, it := range e.mustBatch(overNATS, body, MaxBatch) {
			if it.Status != 200 || it.AllowResponse == nil || !it.Allowed || it.Remaining < 98 {
				t.Fatalf("NATS %v, item %d: %+v %+v", overNATS, i, it, it.AllowResponse)
			}
		}
	}
}

// TestDecodeAllowBodyRefused: bodies refused whole, with the index of the
// item at fault.
func TestDecodeAllowBodyRefused(t *testing.T) {
	n := func(count int) string {
		return `{"requests":[` + strings.TrimSuffix(strings.Repeat(`{"key":"k"},`, count), ",") + `]}`
	}
	cases := []struct {
		name, body string
		status     int
		msg        string
	}{
		{"mixed, requests first", `{"requests":[{"key":"a"}],"key":"b"}`, 400, `body mixes a batch ("requests") with the fields of one request ("key")`},
		{"mixed, requests last", `{"key":"b","cost":2,"requests":[{"key":"a"}]}`, 400, `with the fields of one request ("key", "cost")`},
		{"mixed, null key", `{"requests":[{"key":"a"}],"key":null}`, 400, "body mixes"},
		{"mixed and empty", `{"policy":"tb","requests":[]}`, 400, "body mixes"},
		{"empty list", `{"requests":[]}`, 400, `empty batch: "requests" must hold 1 to 1000 requests`},
		{"null list", ` { "requests" : null } `, 400, "empty batch"},
		{"too many", n(MaxBatch + 1), 400, "batch of 1001 requests, over the 1000 allowed"},
		{"not a list", `{"requests":{"key":"a"}}`, 400, `field "requests" must be a list of requests, not a JSON object`},
		{"unknown field", `{"requests":[{"key":"a"}],"keys":1}`, 400, `unknown field "keys" (a batch has the one field "requests")`},
		{"data after", `{"requests":[{"key":"a"}]} {}`, 400, "data after the object"},
		{"unknown item field", `{"requests":[{"key":"a"},{"key":"b"},{"key":"c"},{"key":"d","cots":1}]}`, 400, `requests[3]: malformed JSON body: unknown field "cots"`},
		{"item cost type", `{"requests":[{"key":"a"},{"key":"b","cost":1.5}]}`, 400, `requests[1]: malformed JSON body: field "cost" must be a whole number`},
		{"item not an object", `{"requests":[5]}`, 400, "requests[0]: malformed JSON body: want an object, not a JSON number"},
		{"item key type", `{"requests":[{"key":"a"},{"key":["b"]}]}`, 400, `requests[1]: malformed JSON body: field "key" must be a string`},
		{"item invalid UTF-8", "{\"requests\":[{\"key\":\"a\"},{\"key\":\"b\"},{\"key\":\"\xff\"}]}", 400, "requests[2]: request body is not valid UTF-8"},
		{"item lone surrogate", `{"requests":[{"key":"\ud800"}]}`, 400, `requests[0]: key holds a \u escape of a lone UTF-16 surrogate`},
		{"batch in a batch", `{"requests":[{"key":"a"},{"requests":[{"key":"b"}]}]}`, 400, "requests[1]: a batch cannot hold a batch"},
		{"too large", `{"requests":[{"key":"` + strings.Repeat("k", MaxBody) + `"}]}`, 413, "over the 1048576 allowed"},
	}
	for _, c := range cases {
		_, batch, ae := DecodeAllowBody([]byte(c.body))
		if ae == nil || ae.Status != c.status || !strings.Contains(ae.Msg, c.msg) || batch != nil {
			t.Errorf("%s: got %v (%d requests), want %d with %q", c.name, ae, len(batch), c.status, c.msg)
		}
	}

	// Accepted: the most requests, the defaults, either case and spacing.
	for _, c := range []struct {
		body string
		n    int
	}{
		{n(MaxBatch), MaxBatch},
		{"\n { \"requests\" :[ {\"key\":\"a\"} , {} , null ] }\n", 3},
		{`{"Requests":[{"key":"a","policy":"tb","cost":3}]}`, 1},
	} {
		req, batch, err := DecodeAllowBody([]byte(c.body))
		if err != nil || len(batch) != c.n || req != (AllowRequest{}) {
			t.Errorf("%.60s: %v, %d requests", c.body, err, len(batch))
			continue
		}
		for i, r := range batch {
			if r.Policy == "" || r.Cost == nil {
				t.Errorf("%.60s: request %d without defaults: %+v", c.body, i, r)
			}
		}
	}
	if _, batch, _ := DecodeAllowBody([]byte(`{"Requests":[{"key":"a","policy":"tb","cost":3}]}`)); batch[0].Key != "a" || batch[0].Policy != "tb" || *batch[0].Cost != 3 {
		t.Errorf("fields not read: %+v", batch[0])
	}
	// The single form is unchanged, and DecodeAllow takes it only.
	if req, batch, err := DecodeAllowBody([]byte(`{"key":"a"}`)); err != nil || batch != nil || req.Key != "a" || req.Policy != DefaultPolicy || *req.Cost != 1 {
		t.Errorf("single form: %+v %v %v", req, batch, err)
	}
	if _, err := DecodeAllow([]byte(`{"requests":[{"key":"a"}]}`)); err == nil || !strings.Contains(err.Error(), `unknown field "requests"`) {
		t.Errorf("DecodeAllow took a batch: %v", err)
	}
}

// TestBatchRefusedOverTheWire: a refused batch is one error, 400 over HTTP
// and a micro error over NATS, and nothing of it is decided.
func TestBatchRefusedOverTheWire(t *testing.T) {
	e := startBatchEnv(t)
	body := `{"requests":[{"policy":"tb","key":"refused","cost":10},{"key":"x","cots":1}]}`
	status, _, b, err := e.post(body)
	if err != nil || status != 400 || !strings.Contains(string(b), `requests[1]: malformed JSON body: unknown field \"cots\"`) {
		t.Errorf("HTTP: %v %d %s", err, status, b)
	}
	msg, err := e.request(body)
	if err != nil {
		t.Fatal(err)
	}
	if code, m := msg.Header.Get("Nats-Service-Error-Code"), msg.Header.Get("Nats-Service-Error"); code != "400" || !strings.HasPrefix(m, "requests[1]: ") || !strings.Contains(string(msg.Data), `"error":"requests[1]: `) {
		t.Errorf("NATS: %q %q %s", code, m, msg.Data)
	}
	msg, err = e.request(`{"requests":[]}`)
	if err != nil || msg.Header.Get("Nats-Service-Error-Code") != "400" {
		t.Errorf("NATS, empty batch: %v %+v", err, msg)
	}
	// Neither was charged: the whole limit is still there.
	if got := e.mustBatch(false, `{"requests":[{"policy":"tb","key":"refused","cost":10}]}`, 1); got[0].Status != 200 {
		t.Errorf("after the refusals: %+v", got[0])
	}
}

// TestDecodeAllowBodySingleAllocs: the single form costs what it did
// before batches: DecodeAllowBody allocates as DecodeAllow does.
func TestDecodeAllowBodySingleAllocs(t *testing.T) {
	body := []byte(`{"policy":"default","key":"user_123","cost":1}`)
	single := testing.AllocsPerRun(100, func() {
		if _, err := DecodeAllow(body); err != nil {
			t.Fatal(err)
		}
	})
	both := testing.AllocsPerRun(100, func() {
		if _, batch, err := DecodeAllowBody(body); err != nil || batch != nil {
			t.Fatal(err)
		}
	})
	if both > single {
		t.Errorf("DecodeAllowBody: %v allocations for one request, DecodeAllow %v", both, single)
	}
}

// TestBodyLimitHTTP: a body of MaxBody is read, one byte more is refused
// with 413 before it is decoded.
func TestBodyLimitHTTP(t *testing.T) {
	e := startBatchEnv(t)
	key := strings.Repeat("k", MaxBody-len(`{"key":""}`))
	status, _, b, err := e.post(`{"key":"` + key + `"}`)
	if err != nil || status != 400 || !strings.Contains(string(b), "longer than the 512 allowed") {
		t.Errorf("body of exactly MaxBody: %v %d %.200s", err, status, b)
	}
	status, _, b, err = e.post(`{"key":"` + key + `k"}`)
	if err != nil || status != 413 || !strings.Contains(string(b), "request body over the 1048576 bytes allowed") {
		t.Errorf("body of MaxBody+1: %v %d %.200s", err, status, b)
	}
}

// TestBatchAnswerOverNATSPayload: a batch whose answer would be over the
// NATS max payload (here: a thousand unknown-policy errors, each listing
// 40 policies) gets an error saying so rather than no answer; over HTTP
// the same batch is answered whole.
func TestBatchAnswerOverNATSPayload(t *testing.T) {
	var f strings.Builder
	f.WriteString("policies:\n")
	for i := range 40 {
		fmt.Fprintf(&f, "  p%03d%s:\n    limit: 10\n    period: 1s\n", i, strings.Repeat("x", 60))
	}
	policies := filepath.Join(t.TempDir(), "policies.yaml")
	if err := os.WriteFile(policies, []byte(f.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	d, err := StartArgs(context.Background(), "--listen", "127.0.0.1:0", "--nats-listen", "127.0.0.1:0", "--policies", policies)
	if err != nil {
		t.Fatal(err)
	}
	defer shutdown(t, d)
	nc, err := nats.Connect(d.NATSURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	body := `{"requests":[` + strings.TrimSuffix(strings.Repeat(`{"policy":"nope","key":"k"},`, MaxBatch), ",") + `]}`
	msg, err := nc.Request("hotkey.allow", []byte(body), time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if code, m := msg.Header.Get("Nats-Service-Error-Code"), msg.Header.Get("Nats-Service-Error"); code != "500" || !strings.Contains(m, "over the NATS max payload") || !strings.Contains(m, "send smaller batches") {
		t.Errorf("NATS: %q %q", code, m)
	}
	e := &batchEnv{t: t, d: d, client: &http.Client{Transport: &http.Transport{}}}
	defer e.client.CloseIdleConnections()
	for i, it := range e.mustBatch(false, body, MaxBatch) {
		if it.Status != 404 || !strings.Contains(it.Error, `unknown policy "nope"`) {
			t.Fatalf("HTTP, item %d: %+v", i, it)
		}
	}
}

func FuzzDecodeAllowBody(f *testing.F) {
	for _, s := range []string{
		`{"key":"k"}`,
		`{"requests":[{"key":"k"},{"policy":"tb","key":"j","cost":3}]}`,
		`{"requests":[]}`,
		`{"key":"k","requests":[{"key":"k"}]}`,
		`{"requests":[{"requests":[]}]}`,
		`{"requests":[null,{"key":"\ud800"}]}`,
		` {"REQUESTS":[{}]} `,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		req, batch, ae := DecodeAllowBody(body)
		if ae != nil {
			if (ae.Status != http.StatusBadRequest && ae.Status != http.StatusRequestEntityTooLarge) || ae.Msg == "" || batch != nil {
				t.Fatalf("refused with %d %q, %d requests: want 400 or 413, a message and none", ae.Status, ae.Msg, len(batch))
			}
			return
		}
		if batch == nil {
			// One request: as DecodeAllow takes it.
			one, err := DecodeAllow(body)
			if err != nil || one.Key != req.Key || one.Policy != req.Policy || *one.Cost != *req.Cost {
				t.Fatalf("single form %+v, DecodeAllow %+v %v", req, one, err)
			}
			return
		}
		if len(batch) < 1 || len(batch) > MaxBatch || req != (AllowRequest{}) {
			t.Fatalf("%d requests and %+v", len(batch), req)
		}
		for i, r := range batch {
			if r.Policy == "" || r.Cost == nil || !utf8.ValidString(r.Key) {
				t.Fatalf("request %d: %+v", i, r)
			}
		}
	})
}
