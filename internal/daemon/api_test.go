package daemon

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"unicode/utf8"
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
		{`{"key":"k","cost":0}`, "default", "k", 0},   // a peek
		{`{"key":"k","cost":-3}`, "default", "k", -3}, // the decision refuses it
		{`{"key":"","policy":""}`, "default", "", 1},
		{`{"key":"k","cost":null}`, "default", "k", 1},
		{`{"key":"\ud83d\ude00"}`, "default", "\U0001F600", 1}, // a surrogate pair is one character
		{`{"key":"\ufffd"}`, "default", "\uFFFD", 1},           // U+FFFD itself is a character
		{"{\"key\":\"\uFFFD\"}", "default", "\uFFFD", 1},
		{`{"key":"\\ud800"}`, "default", `\ud800`, 1}, // an escaped backslash, then text
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
		{strings.Repeat(" ", MaxBody+1), 413, "over the 1048576 allowed"},
		// Each of these would decode to U+FFFD and share its counter.
		{"{\"key\":\"\xff\"}", 400, "not valid UTF-8"},
		{"{\"key\":\"\xfe\"}", 400, "not valid UTF-8"},
		{`{"key":"\ud800"}`, 400, "lone UTF-16 surrogate"},
		{`{"key":"a\udc00b"}`, 400, "lone UTF-16 surrogate"},
		{`{"key":"\ud800\u0041"}`, 400, "lone UTF-16 surrogate"},
		{`{"key":"\ud800\ud800"}`, 400, "lone UTF-16 surrogate"},
		{`{"key":"\ufffd\ud800"}`, 400, "lone UTF-16 surrogate"},
	}
	for _, c := range bad {
		_, ae := DecodeAllow([]byte(c.body))
		if ae == nil || ae.Status != c.status || !strings.Contains(ae.Msg, c.msg) {
			t.Errorf("%.40q: got %v, want %d with %q", c.body, ae, c.status, c.msg)
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
		req, ae := DecodeAllow(body)
		if ae != nil {
			if (ae.Status != http.StatusBadRequest && ae.Status != http.StatusRequestEntityTooLarge) || ae.Msg == "" {
				t.Fatalf("refused with %d %q: want 400 or 413 and a message", ae.Status, ae.Msg)
			}
			return
		}
		if req.Policy == "" || req.Cost == nil {
			t.Fatalf("defaults not applied: %+v", req)
		}
		// An accepted key is the text sent: no byte of it was replaced.
		if !utf8.ValidString(req.Key) || strings.Count(req.Key, "\uFFFD") > strings.Count(string(body), "\uFFFD")+strings.Count(strings.ToLower(string(body)), `\ufffd`) {
			t.Fatalf("key %q accepted from %q: a replacement character the body did not hold", req.Key, body)
		}
		// What was accepted encodes and decodes to itself.
		b, err := json.Marshal(req)
		if err != nil {
			t.Fatal(err)
		}
		again, ae := DecodeAllow(b)
		if ae != nil || again.Policy != req.Policy || again.Key != req.Key || *again.Cost != *req.Cost {
			t.Fatalf("round trip of %s: %+v, %v", b, again, ae)
		}
	})
}
