package daemon

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
)

func TestDecodeAllow(t *testing.T) {
	ok := []struct {
		body   string
		policy string
		key    string
		cost   int64
	}{
		{`{"policy":"default","key":"user_123","cost":1}`, "default", "user_123", 1},
		{`{"key":"k"}`, "default", "k", 1},
		{` {"key":"k","cost":7,"policy":"login"} ` + "\n", "login", "k", 7},
		{`{"key":"k","cost":0}`, "default", "k", 0}, // the decision refuses it
		{`{"key":"k","cost":-3}`, "default", "k", -3},
		{`{"key":"","policy":""}`, "default", "", 1},
		{`{"key":"k","cost":null}`, "default", "k", 1},
	}
	for _, c := range ok {
		req, err := DecodeAllow([]byte(c.body))
		if err != nil {
			t.Errorf("%s: %v", c.body, err)
			continue
		}
		if req.Policy != c.policy || req.Key != c.key || req.Cost == nil || *req.Cost != c.cost {
			t.Errorf("%s: got %+v cost %v", c.body, req, req.Cost)
		}
	}
	bad := []struct {
		body   string
		status int
		msg    string
	}{
		{``, 400, "empty body"},
		{`   `, 400, "empty body"},
		{`{`, 400, "unexpected end of input"},
		{`{"key":"k"`, 400, "malformed JSON"},
		{`{"key":5}`, 400, `field "key" must be a string`},
		{`{"key":"k","cost":1.5}`, 400, `field "cost" must be a whole number`},
		{`{"key":"k","cost":"1"}`, 400, `field "cost" must be a whole number`},
		{`{"key":"k","cost":99999999999999999999}`, 400, "cost"},
		{`{"key":"k","cots":1}`, 400, `unknown field "cots"`},
		{`[1,2]`, 400, "want an object"},
		{`"k"`, 400, "want an object"},
		{`{"key":"k"}{"key":"j"}`, 400, "data after the object"},
		{`{"key":"k"} x`, 400, "data after the object"},
		{strings.Repeat(" ", MaxBody+1), 413, "over the 65536 allowed"},
	}
	for _, c := range bad {
		_, err := DecodeAllow([]byte(c.body))
		ae, _ := err.(*apiError)
		if ae == nil || ae.Status != c.status || !strings.Contains(ae.Msg, c.msg) {
			t.Errorf("%.40q: got %v, want %d with %q", c.body, err, c.status, c.msg)
		}
	}
}

func FuzzDecodeAllow(f *testing.F) {
	for _, s := range []string{
		`{"policy":"default","key":"user_123","cost":1}`,
		`{"key":"k"}`,
		`{"key":"k","cost":-1}`,
		`{"key":"\u0000\ud800","policy":"\"x\""}`,
		`{"key":"k","cost":1e3}`,
		`{"key":"k","Key":"j"}`,
		`null`,
		`{}`,
		`{"key":"k"} {}`,
		"\xff\xfe",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		req, err := DecodeAllow(body)
		if err != nil {
			ae, ok := err.(*apiError)
			if !ok || (ae.Status != http.StatusBadRequest && ae.Status != http.StatusRequestEntityTooLarge) || ae.Msg == "" {
				t.Fatalf("error %v (%T): want an *apiError 400 or 413", err, err)
			}
			return
		}
		if req.Policy == "" || req.Cost == nil {
			t.Fatalf("defaults not applied: %+v", req)
		}
		// What was accepted encodes and decodes to itself.
		b, err := json.Marshal(req)
		if err != nil {
			t.Fatal(err)
		}
		again, err := DecodeAllow(b)
		if err != nil || again.Policy != req.Policy || again.Key != req.Key || *again.Cost != *req.Cost {
			t.Fatalf("round trip of %s: %+v, %v", b, again, err)
		}
	})
}
