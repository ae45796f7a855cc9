package daemon

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
)

// TestCostZero: a request of cost 0, over HTTP and NATS, alone and in a
// batch, answers as a decision of one unit would (200 with what would be
// left after it, 429 once the key is full) and charges nothing: the key
// still admits its whole limit. A negative cost is refused.
func TestCostZero(t *testing.T) {
	e := startBatchEnv(t)
	for _, policy := range []string{"tb", "sw", "sl"} {
		for _, via := range []string{"http", "nats", "http-batch", "nats-batch"} {
			t.Run(policy+"/"+via, func(t *testing.T) {
				key := fmt.Sprintf("zero-%s-%s", policy, via)
				ask := func(cost int) (int, AllowResponse, string) {
					t.Helper()
					body := fmt.Sprintf(`{"policy":%q,"key":%q,"cost":%d}`, policy, key, cost)
					switch via {
					case "http-batch", "nats-batch":
						its := e.mustBatch(via == "nats-batch", `{"requests":[`+body+`]}`, 1)
						if its[0].AllowResponse == nil {
							return its[0].Status, AllowResponse{}, its[0].Error
						}
						return its[0].Status, *its[0].AllowResponse, ""
					case "nats":
						msg, err := e.request(body)
						if err != nil {
							t.Fatal(err)
						}
						if code := msg.Header.Get("Nats-Service-Error-Code"); code != "" {
							var status int
							fmt.Sscan(code, &status)
							return status, AllowResponse{}, string(msg.Data)
						}
						var r AllowResponse
						if err := json.Unmarshal(msg.Data, &r); err != nil {
							t.Fatalf("%v: %s", err, msg.Data)
						}
						status := 200
						if !r.Allowed {
							status = 429
						}
						return status, r, ""
					}
					status, _, b, err := e.post(body)
					if err != nil {
						t.Fatal(err)
					}
					var r AllowResponse
					if status == 200 || status == 429 {
						if err := json.Unmarshal(b, &r); err != nil {
							t.Fatalf("%v: %s", err, b)
						}
					}
					return status, r, string(b)
				}
				for range 5 {
					if status, r, msg := ask(0); status != 200 || !r.Allowed || r.Remaining != 9 || r.Limit != 10 {
						t.Fatalf("cost 0 on a fresh key: %d %+v %s; want 200, 9 left of 10", status, r, msg)
					}
				}
				admitted := 0
				for range 15 {
					if status, _, _ := ask(1); status == 200 {
						admitted++
					}
				}
				if admitted != 10 {
					t.Errorf("after 5 requests of cost 0: admitted %d of 15, want the limit, 10", admitted)
				}
				if status, r, msg := ask(0); status != 429 || r.Allowed || r.Remaining != 0 || r.RetryAfterMs <= 0 {
					t.Errorf("cost 0 on a full key: %d %+v %s; want 429 with a retry", status, r, msg)
				}
				if status, _, msg := ask(-1); status != 400 || !strings.Contains(msg, "must not be negative") {
					t.Errorf("cost -1: %d %s; want 400, not negative", status, msg)
				}
			})
		}
	}
}
