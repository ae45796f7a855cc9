// Package ratelimitheader writes the rate-limit headers of a decision: the
// values hotkey.SetHeaders sets on an http.Header, and those the daemon's
// Envoy answers carry as response_headers_to_add, from one function.
package ratelimitheader

import (
	"math"
	"strconv"
	"time"
)

// N is the number of headers Append may write.
const N = 7

// Canonical holds the headers' names in canonical form, and Lower the same
// names in lower case, as HTTP/2 and Envoy write them; both are in the
// order of the lower-case names, the order of Append's values.
var (
	Canonical = [N]string{"Ratelimit", "Ratelimit-Policy", "Retry-After", "X-Ratelimit-Limit", "X-Ratelimit-Remaining", "X-Ratelimit-Reset", "X-Ratelimit-Shadow"}
	Lower     = [N]string{"ratelimit", "ratelimit-policy", "retry-after", "x-ratelimit-limit", "x-ratelimit-remaining", "x-ratelimit-reset", "x-ratelimit-shadow"}
)

// Decision is what the headers say of one decision.
type Decision struct {
	Policy                 string // the policy's name; "" is "default"
	Period                 time.Duration
	Limit, Remaining       int64
	RetryAfter, ResetAfter time.Duration
	Allowed, ShadowDenied  bool
}

// Append appends to b the values of d's headers at instant now, header i's
// named Canonical[i], one after the other, and sets ends[i] to where its
// value ends in the slice it returns, or to 0 when header i is not set
// (Retry-After of an admission; X-RateLimit-Shadow unless ShadowDenied).
// Every value set is at least one byte. The values are those hotkey's
// SetHeaders documents.
func Append(b []byte, ends *[N]int, d Decision, now time.Time) []byte {
	name := d.Policy
	if name == "" {
		name = "default"
	}
	// Reset instants to the ms, so that a nanosecond of rounding in the
	// store does not add a second.
	resetAfter := d.ResetAfter.Truncate(time.Millisecond)
	remaining := max(0, d.Remaining)
	b = strconv.AppendQuote(b, name) // RateLimit
	b = append(b, ";r="...)
	b = strconv.AppendInt(b, remaining, 10)
	b = append(b, ";t="...)
	b = strconv.AppendInt(b, ceilSeconds(resetAfter), 10)
	ends[0] = len(b)
	b = strconv.AppendQuote(b, name) // RateLimit-Policy
	b = append(b, ";q="...)
	b = strconv.AppendInt(b, d.Limit, 10)
	b = append(b, ";w="...)
	b = strconv.AppendInt(b, max(1, ceilSeconds(d.Period)), 10)
	ends[1] = len(b)
	ends[2] = 0 // Retry-After
	if !d.Allowed {
		b = strconv.AppendInt(b, max(1, ceilSeconds(d.RetryAfter)), 10)
		ends[2] = len(b)
	}
	b = strconv.AppendInt(b, d.Limit, 10) // X-RateLimit-Limit
	ends[3] = len(b)
	b = strconv.AppendInt(b, remaining, 10) // X-RateLimit-Remaining
	ends[4] = len(b)
	b = strconv.AppendInt(b, now.Add(resetAfter).Add(time.Second-1).Unix(), 10) // X-RateLimit-Reset
	ends[5] = len(b)
	ends[6] = 0 // X-RateLimit-Shadow
	if d.ShadowDenied {
		b = append(b, "denied"...)
		ends[6] = len(b)
	}
	return b
}

// ceilSeconds returns d in whole seconds, rounded up.
func ceilSeconds(d time.Duration) int64 {
	return int64(math.Ceil(d.Seconds()))
}
