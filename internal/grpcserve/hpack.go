package grpcserve

import (
	"encoding/base64"
	"errors"
	"strconv"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// The header blocks are written with the static table and literals that
// are never added to the dynamic one (RFC 7541 6.2.2), so that they can be
// encoded once and are the same on every connection.

// respHeaders is the header block of an answer: :status 200 and
// content-type application/grpc.
var respHeaders = appendLiteral(appendIndexed(nil, 8), 31, "", "application/grpc")

// okTrailers is the trailer block of a call that succeeded.
var okTrailers = appendLiteral(nil, 0, "grpc-status", "0")

// appendIndexed appends the static table's entry i (a name and value).
func appendIndexed(b []byte, i uint64) []byte { return appendInt(b, 7, 0x80, i) }

// appendLiteral appends a literal field not indexed: with the name of the
// static table's entry nameIdx, or name if nameIdx is 0.
func appendLiteral(b []byte, nameIdx uint64, name, value string) []byte {
	b = appendInt(b, 4, 0, nameIdx)
	if nameIdx == 0 {
		b = appendString(b, name)
	}
	return appendString(b, value)
}

func appendString(b []byte, s string) []byte {
	return append(appendInt(b, 7, 0, uint64(len(s))), s...)
}

// appendInt appends v as an HPACK integer of an n-bit prefix, the first
// byte's other bits being first.
func appendInt(b []byte, n uint, first byte, v uint64) []byte {
	max := uint64(1)<<n - 1
	if v < max {
		return append(b, first|byte(v))
	}
	b = append(b, first|byte(max))
	for v -= max; v >= 128; v >>= 7 {
		b = append(b, byte(v&0x7f|0x80))
	}
	return append(b, byte(v))
}

// appendStatus appends the trailer fields of s: grpc-status, grpc-message
// percent-encoded, and grpc-status-details-bin if it has details.
func appendStatus(b []byte, s *status.Status) []byte {
	if s.Code() == codes.OK {
		return append(b, okTrailers...)
	}
	b = appendLiteral(b, 0, "grpc-status", strconv.Itoa(int(s.Code())))
	if m := s.Message(); m != "" {
		b = appendLiteral(b, 0, "grpc-message", encodeMessage(m))
	}
	if p := s.Proto(); len(p.GetDetails()) > 0 {
		if d, err := proto.Marshal(p); err == nil {
			b = appendLiteral(b, 0, "grpc-status-details-bin", base64.RawStdEncoding.EncodeToString(d))
		}
	}
	return b
}

// encodeMessage percent-encodes m as the gRPC spec says of grpc-message:
// bytes outside printable ASCII, and '%'.
func encodeMessage(m string) string {
	i := 0
	for i < len(m) && m[i] >= ' ' && m[i] <= '~' && m[i] != '%' {
		i++
	}
	if i == len(m) {
		return m
	}
	const hex = "0123456789ABCDEF"
	b := make([]byte, 0, len(m)+16)
	b = append(b, m[:i]...)
	for ; i < len(m); i++ {
		if c := m[i]; c >= ' ' && c <= '~' && c != '%' {
			b = append(b, c)
		} else {
			b = append(b, '%', hex[c>>4], hex[c&15])
		}
	}
	return string(b)
}

var errTimeout = errors.New("malformed grpc-timeout")

// parseTimeout parses a grpc-timeout: at most 8 digits and a unit.
func parseTimeout(s string) (time.Duration, error) {
	if len(s) < 2 || len(s) > 9 {
		return 0, errTimeout
	}
	var unit time.Duration
	switch s[len(s)-1] {
	case 'H':
		unit = time.Hour
	case 'M':
		unit = time.Minute
	case 'S':
		unit = time.Second
	case 'm':
		unit = time.Millisecond
	case 'u':
		unit = time.Microsecond
	case 'n':
		unit = time.Nanosecond
	default:
		return 0, errTimeout
	}
	var v int64
	for _, c := range []byte(s[:len(s)-1]) {
		if c < '0' || c > '9' {
			return 0, errTimeout
		}
		v = v*10 + int64(c-'0')
	}
	if d := time.Duration(v) * unit; d/unit == time.Duration(v) {
		return d, nil
	}
	return time.Duration(1<<63 - 1), nil
}
