// Decoding the bodies of POST /v1/allow and hotkey.allow: one request or a
// batch, refused whole with the answer to give.

package daemon

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"unicode/utf8"
)

const (
	exampleBody  = `{"policy":"default","key":"user_123","cost":1}`
	exampleBatch = `{"requests":[{"policy":"default","key":"user_123","cost":1},{"key":"user_456"}]}`
)

// errBatchField is decodeRequest's error for a request with a "requests"
// field: a batch, or a body mixing the two forms. Callers tell it by
// identity and answer in its stead.
var errBatchField = &apiError{Status: http.StatusBadRequest, Msg: `malformed JSON body: unknown field "requests"`}

// DecodeAllow parses a request body: one JSON object with the fields of
// AllowRequest and nothing else. policy defaults to "default", cost to 1.
// It checks the JSON only; the key and cost are checked by the decision.
// A refusal is the answer to give: a status, 400 or 413, and a message.
func DecodeAllow(body []byte) (AllowRequest, *apiError) {
	if ae := checkBody(body); ae != nil {
		return AllowRequest{}, ae
	}
	req, ae := decodeRequest(body)
	if ae == errBatchField {
		return AllowRequest{}, errorf(http.StatusBadRequest, "malformed JSON body: unknown field \"requests\" (the fields are policy, key and cost); send an object like %s", exampleBody)
	}
	return req, ae
}

// DecodeAllowBody parses a body of POST /v1/allow or hotkey.allow: one
// request, as DecodeAllow, or a batch, {"requests":[...]} with 1 to
// MaxBatch items, each decoded as DecodeAllow decodes a body. batch is nil
// for one request. A refusal is of the whole body, as DecodeAllow's.
func DecodeAllowBody(body []byte) (req AllowRequest, batch []AllowRequest, ae *apiError) {
	if ae := checkBody(body); ae != nil {
		return AllowRequest{}, nil, ae
	}
	if !opensBatch(body) {
		req, ae := decodeRequest(body)
		if ae != errBatchField {
			return req, nil, ae
		}
	}
	batch, ae = decodeBatch(body)
	return AllowRequest{}, batch, ae
}

// checkBody refuses a body over MaxBody, or empty.
func checkBody(body []byte) *apiError {
	if len(body) > MaxBody {
		return errorf(http.StatusRequestEntityTooLarge, "request body is %d bytes, over the %d allowed", len(body), MaxBody)
	}
	if len(bytes.TrimSpace(body)) == 0 {
		return errorf(http.StatusBadRequest, "empty body: send a JSON object like %s", exampleBody)
	}
	return nil
}

// opensBatch reports whether body is an object whose first field is
// "requests": a batch, decoded as one without trying the single form
// first. Other batches are found by that try.
func opensBatch(body []byte) bool {
	const field = `"requests"`
	i := skipSpace(body, 0)
	if i == len(body) || body[i] != '{' {
		return false
	}
	i = skipSpace(body, i+1)
	return len(body)-i >= len(field) && bytes.EqualFold(body[i:i+len(field)], []byte(field))
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// decodeRequest decodes one request, the whole body or an item of a batch:
// the request with its defaults, an *apiError, or errBatchField.
func decodeRequest(data []byte) (AllowRequest, *apiError) {
	if req, ok := decodePlain(data); ok {
		return withDefaults(req), nil
	}
	return decodeJSON(data)
}

// decodeJSON is decodeRequest by encoding/json, for any body.
func decodeJSON(data []byte) (AllowRequest, *apiError) {
	var req AllowRequest
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		if isUnknownField(err, "requests") {
			return AllowRequest{}, errBatchField
		}
		return AllowRequest{}, errorf(http.StatusBadRequest, "malformed JSON body: %s; send an object like %s", jsonErrText(err), exampleBody)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return AllowRequest{}, errorf(http.StatusBadRequest, "malformed JSON body: data after the object; send one object like %s", exampleBody)
	}
	// encoding/json turns invalid UTF-8 and lone surrogate escapes into
	// U+FFFD, so that "\xff", "\xfe" and "\ud800" would all name one
	// counter: refuse them.
	if !utf8.Valid(data) {
		return AllowRequest{}, errorf(http.StatusBadRequest, "request body is not valid UTF-8: keys and policy names are text")
	}
	if strings.ContainsRune(req.Key, utf8.RuneError) && !validStrings(data) {
		return AllowRequest{}, errorf(http.StatusBadRequest, "key holds a \\u escape of a lone UTF-16 surrogate, which is no character: send the key as valid UTF-8")
	}
	return withDefaults(req), nil
}

// withDefaults is req with the default policy and cost where absent.
func withDefaults(req AllowRequest) AllowRequest {
	if req.Policy == "" {
		req.Policy = DefaultPolicy
	}
	if req.Cost == nil {
		one := int64(1)
		req.Cost = &one
	}
	return req
}

// isUnknownField reports whether err is encoding/json's refusal of the
// field name (matched as encoding/json matches names: ignoring case).
func isUnknownField(err error, name string) bool {
	s, ok := strings.CutPrefix(err.Error(), "json: unknown field ")
	if !ok {
		return false
	}
	got, uerr := strconv.Unquote(s)
	return uerr == nil && strings.EqualFold(got, name)
}

// decodeBatch decodes a body holding a "requests" field: a batch of 1 to
// MaxBatch requests and nothing else.
func decodeBatch(body []byte) ([]AllowRequest, *apiError) {
	var b struct {
		Requests []json.RawMessage `json:"requests"`
		// The fields of the single form, to refuse a body mixing both.
		Policy json.RawMessage `json:"policy"`
		Key    json.RawMessage `json:"key"`
		Cost   json.RawMessage `json:"cost"`
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&b); err != nil {
		msg := jsonErrText(err)
		if strings.HasPrefix(msg, "unknown field ") {
			msg = strings.TrimPrefix(err.Error(), "json: ") + ` (a batch has the one field "requests")`
		}
		return nil, errorf(http.StatusBadRequest, "malformed JSON body: %s; send a batch like %s", msg, exampleBatch)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, errorf(http.StatusBadRequest, "malformed JSON body: data after the object; send one object like %s", exampleBatch)
	}
	var mixed []string
	for _, f := range []struct {
		name string
		v    json.RawMessage
	}{{"policy", b.Policy}, {"key", b.Key}, {"cost", b.Cost}} {
		if f.v != nil {
			mixed = append(mixed, `"`+f.name+`"`)
		}
	}
	if len(mixed) > 0 {
		return nil, errorf(http.StatusBadRequest, `body mixes a batch ("requests") with the fields of one request (%s): send either one request like %s or a batch like %s`, strings.Join(mixed, ", "), exampleBody, exampleBatch)
	}
	switch n := len(b.Requests); {
	case n == 0:
		return nil, errorf(http.StatusBadRequest, `empty batch: "requests" must hold 1 to %d requests, like %s`, MaxBatch, exampleBatch)
	case n > MaxBatch:
		return nil, errorf(http.StatusBadRequest, "batch of %d requests, over the %d allowed: split it into batches of at most %d", n, MaxBatch, MaxBatch)
	}
	reqs := make([]AllowRequest, len(b.Requests))
	for i, raw := range b.Requests {
		req, ae := decodeRequest(raw)
		switch {
		case ae == errBatchField:
			return nil, errorf(http.StatusBadRequest, "requests[%d]: a batch cannot hold a batch: send requests like %s", i, exampleBody)
		case ae != nil:
			return nil, errorf(ae.Status, "requests[%d]: %s", i, ae.Msg)
		}
		reqs[i] = req
	}
	// The items are valid UTF-8: the rest must be too.
	if !utf8.Valid(body) {
		return nil, errorf(http.StatusBadRequest, "request body is not valid UTF-8: keys and policy names are text")
	}
	return reqs, nil
}

// validStrings reports whether no string of the JSON document body (valid
// UTF-8) holds a \u escape of a UTF-16 surrogate that is not half of a
// pair: encoding/json decodes such an escape as U+FFFD, so two keys that
// differ only there would name one counter.
func validStrings(body []byte) bool {
	hex4 := func(b []byte) (rune, bool) {
		if len(b) < 4 {
			return 0, false
		}
		var r rune
		for _, c := range b[:4] {
			switch {
			case '0' <= c && c <= '9':
				r = r<<4 | rune(c-'0')
			case 'a' <= c && c <= 'f':
				r = r<<4 | rune(c-'a'+10)
			case 'A' <= c && c <= 'F':
				r = r<<4 | rune(c-'A'+10)
			default:
				return 0, false
			}
		}
		return r, true
	}
	inString := false
	for i := 0; i < len(body); i++ {
		switch c := body[i]; {
		case c == '"':
			inString = !inString
		case c == '\\' && inString && i+1 < len(body):
			if body[i+1] != 'u' {
				i++ // a one-character escape
				continue
			}
			r, ok := hex4(body[i+2:])
			if !ok {
				return false
			}
			i += 5
			switch {
			case r >= 0xDC00 && r <= 0xDFFF:
				return false // a low surrogate with no high one before it
			case r >= 0xD800 && r <= 0xDBFF:
				if i+6 >= len(body) || body[i+1] != '\\' || body[i+2] != 'u' {
					return false
				}
				lo, ok := hex4(body[i+3:])
				if !ok || lo < 0xDC00 || lo > 0xDFFF {
					return false
				}
				i += 6
			}
		}
	}
	return true
}

// jsonErrText makes encoding/json's errors read well after "malformed JSON
// body: ".
func jsonErrText(err error) string {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		want := te.Type.String()
		switch want {
		case "int64", "*int64":
			want = "a whole number"
		case "string":
			want = "a string"
		case "daemon.AllowRequest":
			want = "an object"
		case "[]json.RawMessage":
			want = "a list of requests"
		}
		if te.Field != "" {
			return fmt.Sprintf("field %q must be %s, not a JSON %s", te.Field, want, te.Value)
		}
		return fmt.Sprintf("want %s, not a JSON %s", want, te.Value)
	}
	if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
		return "unexpected end of input"
	}
	s := strings.TrimPrefix(err.Error(), "json: ")
	if strings.HasPrefix(s, "unknown field ") {
		return s + " (the fields are policy, key and cost)"
	}
	return s
}
