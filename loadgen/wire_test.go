package loadgen

import (
	"encoding/json"
	"testing"
)

// FuzzAppendRequest: the request body is what encoding/json writes.
func FuzzAppendRequest(f *testing.F) {
	for _, s := range [][2]string{{"", "user_1"}, {"api", "a<b>&c"}, {"p", "é\xff\"\\\n"}, {"", ""}} {
		f.Add(s[0], s[1], int64(1))
	}
	f.Fuzz(func(t *testing.T, policy, key string, cost int64) {
		r := request{Policy: policy, Key: key, Cost: cost}
		want, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		if got := appendRequest([]byte("x"), r); string(got) != "x"+string(want) {
			t.Fatalf("%+v:\n got %s\nwant %s", r, got[1:], want)
		}
	})
}

// FuzzParseDecision: an answer is read as encoding/json reads it: the same
// decision, or an error where it has one.
func FuzzParseDecision(f *testing.F) {
	for _, s := range []string{
		`{"allowed":true,"limit":100,"remaining":99,"reset_after_ms":10,"retry_after_ms":0,"shards":1,"degraded":false}` + "\n",
		`{"allowed":false,"limit":5,"remaining":0,"reset_after_ms":5000,"retry_after_ms":1234,"shards":64,"degraded":true,"shadow_denied":true}`,
		`{"Allowed":true}`,
		`{"allowed":1}`,
		`{"limit":true}`,
		`{"limit":01}`,
		`{"limit":-0,"shards":9223372036854775808}`,
		`{"limit":1e3}`,
		`{"limit":null}`,
		`{"error":"unknown policy"}`,
		`{"allowed":true,"allowed":false}`,
		`{}`,
		`[]`,
		``,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var want decision
		wantErr := json.Unmarshal(b, &want)
		got, err := parseDecision(b)
		if (err != nil) != (wantErr != nil) {
			t.Fatalf("%q: error %v, encoding/json's %v", b, err, wantErr)
		}
		if err == nil && got != want {
			t.Fatalf("%q: %+v, encoding/json %+v", b, got, want)
		}
	})
}
