package daemon

import "unicode/utf8"

// decodePlain decodes the common form of one request without reflection:
// an object with at most the fields "policy", "key" and "cost", each once
// and spelled so, strings without escapes and a cost of at most 18 digits.
// ok is false for any other body, valid or not, which decodeRequest then
// decodes with encoding/json; a body decodePlain takes decodes there to the
// same request (FuzzDecodePlain). It allocates the strings and the cost.
func decodePlain(data []byte) (req AllowRequest, ok bool) {
	i := skipSpace(data, 0)
	if i == len(data) || data[i] != '{' {
		return AllowRequest{}, false
	}
	i = skipSpace(data, i+1)
	var seen [3]bool
	if i < len(data) && data[i] == '}' {
		return req, skipSpace(data, i+1) == len(data)
	}
	for {
		name, j, ok := plainString(data, i)
		if !ok {
			return AllowRequest{}, false
		}
		i = skipSpace(data, j)
		if i == len(data) || data[i] != ':' {
			return AllowRequest{}, false
		}
		i = skipSpace(data, i+1)
		var field int
		switch string(name) {
		case "policy":
			field = 0
		case "key":
			field = 1
		case "cost":
			field = 2
		default:
			return AllowRequest{}, false
		}
		if seen[field] {
			return AllowRequest{}, false
		}
		seen[field] = true
		if field == 2 {
			n, j, ok := plainInt(data, i)
			if !ok {
				return AllowRequest{}, false
			}
			req.Cost = &n
			i = j
		} else {
			v, j, ok := plainString(data, i)
			if !ok {
				return AllowRequest{}, false
			}
			if field == 0 {
				if string(v) == DefaultPolicy {
					req.Policy = DefaultPolicy
				} else {
					req.Policy = string(v)
				}
			} else {
				req.Key = string(v)
			}
			i = j
		}
		i = skipSpace(data, i)
		if i == len(data) {
			return AllowRequest{}, false
		}
		switch data[i] {
		case ',':
			i = skipSpace(data, i+1)
		case '}':
			return req, skipSpace(data, i+1) == len(data)
		default:
			return AllowRequest{}, false
		}
	}
}

// plainString is the JSON string at data[i] if it holds no escape, no
// control character and only valid UTF-8: its content and the index after
// its closing quote.
func plainString(data []byte, i int) (s []byte, next int, ok bool) {
	if i == len(data) || data[i] != '"' {
		return nil, 0, false
	}
	start := i + 1
	ascii := true
	for j := start; j < len(data); j++ {
		switch c := data[j]; {
		case c == '"':
			s = data[start:j]
			if !ascii && !utf8.Valid(s) {
				return nil, 0, false
			}
			return s, j + 1, true
		case c == '\\' || c < 0x20:
			return nil, 0, false
		case c >= utf8.RuneSelf:
			ascii = false
		}
	}
	return nil, 0, false
}

// plainInt is the JSON integer at data[i], optionally negative, of 1 to 18
// digits with no leading zero: its value and the index after it.
func plainInt(data []byte, i int) (n int64, next int, ok bool) {
	neg := i < len(data) && data[i] == '-'
	if neg {
		i++
	}
	start := i
	for i < len(data) && '0' <= data[i] && data[i] <= '9' {
		n = n*10 + int64(data[i]-'0')
		i++
	}
	digits := i - start
	if digits == 0 || digits > 18 || (digits > 1 && data[start] == '0') {
		return 0, 0, false
	}
	// A fraction or an exponent is not a whole number here.
	if i < len(data) && (data[i] == '.' || data[i] == 'e' || data[i] == 'E') {
		return 0, 0, false
	}
	if neg {
		n = -n
	}
	return n, i, true
}
