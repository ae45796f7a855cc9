package daemon

import (
	"encoding/json"
	"math"
	"reflect"
	"testing"
)

// TestAppendAllowResponse: the answer is encoded byte for byte as
// encoding/json encodes it, with the newline POST /v1/allow ends it with.
func TestAppendAllowResponse(t *testing.T) {
	for _, give := range []AllowResponse{
		{},
		{Allowed: true, Limit: 100, Remaining: 99, ResetAfterMs: 10, Shards: 1},
		{Limit: 5, RetryAfterMs: 1234, ResetAfterMs: 5000, Shards: 64, Degraded: true},
		{Allowed: true, Limit: math.MaxInt64, Remaining: math.MaxInt64, ResetAfterMs: math.MaxInt64, RetryAfterMs: math.MaxInt64, Shards: math.MaxInt32, ShadowDenied: true},
		{Limit: math.MinInt64, Remaining: -1, ResetAfterMs: -2, RetryAfterMs: -3, Shards: -4},
	} {
		want, err := json.Marshal(give)
		if err != nil {
			t.Fatal(err)
		}
		if got := appendAllowResponse([]byte("x"), give); string(got) != "x"+string(want)+"\n" {
			t.Errorf("%+v:\n got %s\nwant %s", give, got[1:], want)
		}
	}
}

// FuzzDecodePlain: a body decodePlain takes, encoding/json decodes to the
// same request.
func FuzzDecodePlain(f *testing.F) {
	for _, s := range []string{
		`{"policy":"default","key":"user_123","cost":1}`,
		` { "key" : "k" , "cost" : -0 } `,
		`{"key":"k","cost":999999999999999999}`,
		`{"key":"k","cost":01}`,
		`{"key":"k","key":"j"}`,
		`{"Key":"k"}`,
		`{"key":"é\u00e9"}`,
		`{"key":"\xff"}`,
		`{"policy":"","key":""}`,
		`{}`,
		`{"key":"k"}x`,
		`{"key":"k",}`,
		`{"cost":1.0}`,
		`{"cost":1e2}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		got, ok := decodePlain(body)
		if !ok {
			return
		}
		got = withDefaults(got)
		want, ae := decodeJSON(body)
		if ae != nil {
			t.Fatalf("%q: decodePlain took %+v, encoding/json refused: %s", body, got, ae.Msg)
		}
		if got.Policy != want.Policy || got.Key != want.Key || !reflect.DeepEqual(got.Cost, want.Cost) {
			t.Fatalf("%q: decodePlain %+v (cost %d), encoding/json %+v (cost %d)", body, got, *got.Cost, want, *want.Cost)
		}
	})
}
