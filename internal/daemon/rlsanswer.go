package daemon

import (
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlpb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/hotkeyd/hotkey"
	"github.com/hotkeyd/hotkey/internal/envoyconf"
	"github.com/hotkeyd/hotkey/internal/ratelimitheader"
	"github.com/hotkeyd/hotkey/internal/rlswire"
)

// rlsAnswer is a RateLimitResponse as decide writes it: the fields hotkeyd
// sets, nothing else. proto builds the message; rlsCodec writes its wire
// data by hand (appendWire), with no message built.
type rlsAnswer struct {
	overall   rlpb.RateLimitResponse_Code
	statuses  []rlsStatus
	headers   []rlsHeader // response_headers_to_add, ordered by key
	statusBuf [1]rlsStatus
	headerBuf [8]rlsHeader
}

// rlsStatus is one DescriptorStatus.
type rlsStatus struct {
	code      rlpb.RateLimitResponse_Code
	limit     *envoyconf.Rule // current_limit is its; nil: none
	remaining uint32
	reset     time.Duration // duration_until_reset, if hasReset
	hasReset  bool
}

// rlsHeader is one header of response_headers_to_add.
type rlsHeader struct{ key, value string }

// setHeaders sets a's headers to the RateLimit headers of res under p, the
// values hotkey.SetHeaders writes, with names in lower case, as HTTP/2 and
// Envoy write them, and ordered by name, so that answers read the same
// every time.
func (a *rlsAnswer) setHeaders(p *hotkey.Policy, res hotkey.Result, now time.Time) {
	var buf [160]byte
	var ends [ratelimitheader.N]int
	all := string(ratelimitheader.Append(buf[:0], &ends, ratelimitheader.Decision{
		Policy: p.Name, Period: p.Limit.Period,
		Limit: res.Limit, Remaining: res.Remaining, RetryAfter: res.RetryAfter, ResetAfter: res.ResetAfter,
		Allowed: res.Allowed, ShadowDenied: res.ShadowDenied,
	}, now))
	a.headers = a.headerBuf[:0]
	from := 0
	for i, name := range ratelimitheader.Lower {
		if ends[i] == 0 {
			continue
		}
		a.headers = append(a.headers, rlsHeader{name, all[from:ends[i]]})
		from = ends[i]
	}
}

// proto returns a as a RateLimitResponse.
func (a *rlsAnswer) proto() *rlpb.RateLimitResponse {
	resp := &rlpb.RateLimitResponse{OverallCode: a.overall, Statuses: make([]*rlpb.RateLimitResponse_DescriptorStatus, len(a.statuses))}
	for i, st := range a.statuses {
		ds := &rlpb.RateLimitResponse_DescriptorStatus{Code: st.code, LimitRemaining: st.remaining}
		if r := st.limit; r != nil {
			ds.CurrentLimit = &rlpb.RateLimitResponse_RateLimit{Name: r.Name, RequestsPerUnit: r.RequestsPerUnit, Unit: rlpb.RateLimitResponse_RateLimit_Unit(r.Unit)}
		}
		if st.hasReset {
			ds.DurationUntilReset = durationpb.New(st.reset)
		}
		resp.Statuses[i] = ds
	}
	for _, h := range a.headers {
		resp.ResponseHeadersToAdd = append(resp.ResponseHeadersToAdd, &core.HeaderValue{Key: h.key, Value: h.value})
	}
	return resp
}

// oneByteTagMaxSize is the size of every tag appendWire writes: of a field
// number under 16.
const oneByteTagMaxSize = 1

// appendWire appends a's wire data, as proto.Marshal writes a.proto():
// fields in number order, zero scalars left out.
func (a *rlsAnswer) appendWire(b []byte) []byte {
	b = appendVarintField(b, rlswire.ResponseOverallCode, uint64(a.overall))
	for i := range a.statuses {
		st := &a.statuses[i]
		b = protowire.AppendTag(b, rlswire.ResponseStatuses, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(st.size()))
		b = st.appendWire(b)
	}
	for _, h := range a.headers {
		b = protowire.AppendTag(b, rlswire.ResponseHeadersToAdd, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(stringFieldSize(h.key)+stringFieldSize(h.value)))
		b = appendStringField(b, rlswire.HeaderKey, h.key)
		b = appendStringField(b, rlswire.HeaderValue, h.value)
	}
	return b
}

// size is the length of a's wire data.
func (a *rlsAnswer) size() int {
	n := varintFieldSize(uint64(a.overall))
	for i := range a.statuses {
		n += messageFieldSize(a.statuses[i].size())
	}
	for _, h := range a.headers {
		n += messageFieldSize(stringFieldSize(h.key) + stringFieldSize(h.value))
	}
	return n
}

func (st *rlsStatus) appendWire(b []byte) []byte {
	b = appendVarintField(b, rlswire.StatusCode, uint64(st.code))
	if r := st.limit; r != nil {
		b = protowire.AppendTag(b, rlswire.StatusCurrentLimit, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(limitSize(r)))
		b = appendVarintField(b, rlswire.LimitRequestsPerUnit, uint64(r.RequestsPerUnit))
		b = appendVarintField(b, rlswire.LimitUnit, uint64(int64(r.Unit)))
		b = appendStringField(b, rlswire.LimitName, r.Name)
	}
	b = appendVarintField(b, rlswire.StatusLimitRemaining, uint64(st.remaining))
	if st.hasReset {
		secs, nanos := durationParts(st.reset)
		b = protowire.AppendTag(b, rlswire.StatusDurationUntilReset, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(varintFieldSize(uint64(secs))+varintFieldSize(uint64(nanos))))
		b = appendVarintField(b, rlswire.DurationSeconds, uint64(secs))
		b = appendVarintField(b, rlswire.DurationNanos, uint64(nanos))
	}
	return b
}

func (st *rlsStatus) size() int {
	n := varintFieldSize(uint64(st.code)) + varintFieldSize(uint64(st.remaining))
	if st.limit != nil {
		n += messageFieldSize(limitSize(st.limit))
	}
	if st.hasReset {
		secs, nanos := durationParts(st.reset)
		n += messageFieldSize(varintFieldSize(uint64(secs)) + varintFieldSize(uint64(nanos)))
	}
	return n
}

// limitSize is the length of the wire data of r's RateLimit.
func limitSize(r *envoyconf.Rule) int {
	return varintFieldSize(uint64(r.RequestsPerUnit)) + varintFieldSize(uint64(int64(r.Unit))) + stringFieldSize(r.Name)
}

// durationParts splits d as durationpb.New does: seconds, and nanoseconds
// of the same sign.
func durationParts(d time.Duration) (secs, nanos int64) {
	ns := d.Nanoseconds()
	secs = ns / 1e9
	return secs, ns - secs*1e9
}

// appendVarintField appends field num of varint v, unless v is 0. Negative
// int32 and int64 values are passed as uint64(int64(v)), as protobuf
// writes them.
func appendVarintField(b []byte, num protowire.Number, v uint64) []byte {
	if v == 0 {
		return b
	}
	return protowire.AppendVarint(protowire.AppendTag(b, num, protowire.VarintType), v)
}

// appendStringField appends field num of s, unless s is empty.
func appendStringField(b []byte, num protowire.Number, s string) []byte {
	if s == "" {
		return b
	}
	return protowire.AppendString(protowire.AppendTag(b, num, protowire.BytesType), s)
}

func varintFieldSize(v uint64) int {
	if v == 0 {
		return 0
	}
	return oneByteTagMaxSize + protowire.SizeVarint(v)
}

func stringFieldSize(s string) int {
	if s == "" {
		return 0
	}
	return oneByteTagMaxSize + protowire.SizeBytes(len(s))
}

// messageFieldSize is the length of a message field whose message is n
// bytes long: written even when n is 0, as a message set is.
func messageFieldSize(n int) int { return oneByteTagMaxSize + protowire.SizeBytes(n) }
