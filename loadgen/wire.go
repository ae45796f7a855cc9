package loadgen

import (
	"encoding/json"
	"strconv"
	"sync"
)

// appendRequest appends hotkeyd's request body for r, as json.Marshal
// encodes it.
func appendRequest(b []byte, r request) []byte {
	if !plainJSON(r.Policy) || !plainJSON(r.Key) {
		body, _ := json.Marshal(r)
		return append(b, body...)
	}
	b = append(b, '{')
	if r.Policy != "" {
		b = append(b, `"policy":"`...)
		b = append(b, r.Policy...)
		b = append(b, `",`...)
	}
	b = append(b, `"key":"`...)
	b = append(b, r.Key...)
	b = append(b, `","cost":`...)
	b = strconv.AppendInt(b, r.Cost, 10)
	return append(b, '}')
}

// plainJSON reports whether json.Marshal writes s as is between quotes:
// printable ASCII with nothing it escapes.
func plainJSON(s string) bool {
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c < 0x20 || c >= 0x7f, c == '"', c == '\\', c == '<', c == '>', c == '&':
			return false
		}
	}
	return true
}

// parseDecision decodes hotkeyd's answer b as json.Unmarshal into a zero
// decision would, without reflection for the answers hotkeyd gives: an
// object of numbers and booleans (others are left to json.Unmarshal).
func parseDecision(b []byte) (decision, error) {
	var d decision
	if parseFlat(b, &d) {
		return d, nil
	}
	return unmarshalDecision(b)
}

// unmarshalDecision is parseDecision by json.Unmarshal, apart so that
// the decision parseFlat fills stays on the stack.
func unmarshalDecision(b []byte) (decision, error) {
	var d decision
	err := json.Unmarshal(b, &d)
	return d, err
}

// parseFlat decodes b, an object of whole numbers and booleans with
// names spelled as decision's tags, each once, into d; it reports whether b
// was of that form.
func parseFlat(b []byte, d *decision) bool {
	i := skipWS(b, 0)
	if i == len(b) || b[i] != '{' {
		return false
	}
	var seen uint8
	i = skipWS(b, i+1)
	if i < len(b) && b[i] == '}' {
		return skipWS(b, i+1) == len(b)
	}
	for {
		if i == len(b) || b[i] != '"' {
			return false
		}
		end := i + 1
		for end < len(b) && b[end] != '"' && b[end] != '\\' {
			end++
		}
		if end == len(b) || b[end] != '"' {
			return false
		}
		name := b[i+1 : end]
		i = skipWS(b, end+1)
		if i == len(b) || b[i] != ':' {
			return false
		}
		i = skipWS(b, i+1)
		start := i
		for i < len(b) && (b[i] == '-' || b[i] >= '0' && b[i] <= '9' || b[i] >= 'a' && b[i] <= 'z') {
			i++
		}
		v := b[start:i]
		field := -1
		switch string(name) {
		case "allowed":
			field = 0
		case "shards":
			field = 1
		case "limit":
			field = 2
		case "remaining":
			field = 3
		case "reset_after_ms":
			field = 4
		case "retry_after_ms":
			field = 5
		case "degraded", "shadow_denied":
		default: // matched by json.Unmarshal ignoring case, or ignored
			return false
		}
		if field >= 0 {
			if seen&(1<<field) != 0 {
				return false
			}
			seen |= 1 << field
		}
		switch {
		case string(v) == "true" || string(v) == "false":
			if field > 0 {
				return false
			}
			if field == 0 {
				d.Allowed = string(v) == "true"
			}
		case field == 0:
			return false
		default:
			n, err := strconv.ParseInt(string(v), 10, 64)
			if err != nil || (len(v) > 1 && v[0] == '0') || (len(v) > 2 && v[0] == '-' && v[1] == '0') {
				return false
			}
			switch field {
			case 1:
				d.Shards = int(n)
			case 2:
				d.Limit = n
			case 3:
				d.Remaining = n
			case 4:
				d.ResetAfterMs = n
			case 5:
				d.RetryAfterMs = n
			}
		}
		i = skipWS(b, i)
		if i == len(b) {
			return false
		}
		switch b[i] {
		case ',':
			i = skipWS(b, i+1)
		case '}':
			return skipWS(b, i+1) == len(b)
		default:
			return false
		}
	}
}

func skipWS(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// bufPool holds the buffers answers are read into.
var bufPool = sync.Pool{New: func() any { b := make([]byte, 0, 512); return &b }}
