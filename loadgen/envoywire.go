package loadgen

import (
	"errors"
	"net/http"

	rlpb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/hotkeyd/hotkey/internal/rlswire"
)

// envoyCodec is the Envoy target's gRPC codec: it writes an *envoyCall's
// RateLimitRequest by hand (rlswire) and reads of its RateLimitResponse
// only what a run reads (envoyAnswer), with no protobuf message built
// either way. It is safe for concurrent use.
type envoyCodec struct{}

// Name is the standard codec's: the wire format is the same.
func (envoyCodec) Name() string { return "proto" }

// Marshal writes v, an *envoyCall, as a RateLimitRequest.
func (envoyCodec) Marshal(v any) (mem.BufferSlice, error) {
	c := v.(*envoyCall)
	b := make([]byte, 0, rlswire.RequestSize(c.domain, c.hits, c.descs...))
	return mem.BufferSlice{mem.SliceBuffer(rlswire.AppendRequest(b, c.domain, c.hits, c.descs...))}, nil
}

// Unmarshal reads data, a RateLimitResponse, into v, an *envoyCall.
func (envoyCodec) Unmarshal(data mem.BufferSlice, v any) error {
	c := v.(*envoyCall)
	if len(data) == 1 {
		return c.answer.read(data[0].ReadOnlyData())
	}
	buf := data.MaterializeToBuffer(mem.DefaultBufferPool())
	defer buf.Free()
	return c.answer.read(buf.ReadOnlyData())
}

// envoyAnswer is what a run reads of a RateLimitResponse: its overall code,
// and the Quota of the status closest to its limit among those with a
// current_limit (the first over it, else the one with the least
// remaining), else of its response_headers_to_add (HeaderQuota).
type envoyAnswer struct {
	overall rlpb.RateLimitResponse_Code
	quota   Quota
}

// envoyStatus is what a run reads of a DescriptorStatus.
type envoyStatus struct {
	code            rlpb.RateLimitResponse_Code
	hasLimit        bool
	requestsPerUnit uint32
	unit            rlpb.RateLimitResponse_RateLimit_Unit
	remaining       uint32
	resetSecs       int64
	resetNanos      int32
	hasReset        bool
}

// errWire is the error of a RateLimitResponse that is not protobuf.
var errWire = errors.New("RateLimitResponse: malformed wire data")

// The field numbers read (rls.proto, base.proto, duration.proto).
const (
	respOverallCode  = 1
	respStatuses     = 2
	respHeadersToAdd = 3
	statusCode       = 1
	statusLimit      = 2
	statusRemaining  = 3
	statusReset      = 4
	limitRPU         = 1
	limitUnit        = 2
	headerKey        = 1
	headerValue      = 2
	durationSeconds  = 1
	durationNanos    = 2
)

// read sets a from b, a RateLimitResponse's wire data. Fields are read as
// proto.Unmarshal reads them: the last of a scalar wins, a message field
// met twice is merged, and a field of an unexpected wire type is skipped.
func (a *envoyAnswer) read(b []byte) error {
	*a = envoyAnswer{}
	var pick envoyStatus
	picked, over, headers := false, false, false
	err := eachField(b, func(num protowire.Number, typ protowire.Type, v uint64, m []byte) bool {
		switch {
		case num == respOverallCode && typ == protowire.VarintType:
			a.overall = rlpb.RateLimitResponse_Code(int32(v))
		case num == respStatuses && typ == protowire.BytesType:
			var st envoyStatus
			if !st.read(m) {
				return false
			}
			if !st.hasLimit || over {
				break
			}
			if st.code == rlpb.RateLimitResponse_OVER_LIMIT {
				pick, picked, over = st, true, true
			} else if !picked || st.remaining < pick.remaining {
				pick, picked = st, true
			}
		case num == respHeadersToAdd && typ == protowire.BytesType:
			headers = true
		}
		return true
	})
	if err != nil {
		return err
	}
	if picked {
		reset := durationpb.Duration{Seconds: pick.resetSecs, Nanos: pick.resetNanos}
		a.quota = Quota{
			Reported:   true,
			Limit:      int64(pick.requestsPerUnit),
			Window:     unitWindow(pick.unit),
			Remaining:  int64(pick.remaining),
			ResetAfter: reset.AsDuration(),
		}
		return nil
	}
	if headers {
		a.quota = HeaderQuota(readHeaders(b))
	}
	return nil
}

// read sets st from m, a DescriptorStatus's wire data, and reports whether
// m is well formed.
func (st *envoyStatus) read(m []byte) bool {
	err := eachField(m, func(num protowire.Number, typ protowire.Type, v uint64, m []byte) bool {
		switch {
		case num == statusCode && typ == protowire.VarintType:
			st.code = rlpb.RateLimitResponse_Code(int32(v))
		case num == statusRemaining && typ == protowire.VarintType:
			st.remaining = uint32(v)
		case num == statusLimit && typ == protowire.BytesType:
			st.hasLimit = true
			return eachField(m, func(num protowire.Number, typ protowire.Type, v uint64, _ []byte) bool {
				switch {
				case num == limitRPU && typ == protowire.VarintType:
					st.requestsPerUnit = uint32(v)
				case num == limitUnit && typ == protowire.VarintType:
					st.unit = rlpb.RateLimitResponse_RateLimit_Unit(int32(v))
				}
				return true
			}) == nil
		case num == statusReset && typ == protowire.BytesType:
			st.hasReset = true
			return eachField(m, func(num protowire.Number, typ protowire.Type, v uint64, _ []byte) bool {
				switch {
				case num == durationSeconds && typ == protowire.VarintType:
					st.resetSecs = int64(v)
				case num == durationNanos && typ == protowire.VarintType:
					st.resetNanos = int32(v)
				}
				return true
			}) == nil
		}
		return true
	})
	return err == nil
}

// readHeaders returns the response_headers_to_add of b, a well-formed
// RateLimitResponse's wire data.
func readHeaders(b []byte) http.Header {
	h := http.Header{}
	eachField(b, func(num protowire.Number, typ protowire.Type, _ uint64, m []byte) bool {
		if num != respHeadersToAdd || typ != protowire.BytesType {
			return true
		}
		var k, v []byte
		eachField(m, func(num protowire.Number, typ protowire.Type, _ uint64, s []byte) bool {
			switch {
			case num == headerKey && typ == protowire.BytesType:
				k = s
			case num == headerValue && typ == protowire.BytesType:
				v = s
			}
			return true
		})
		h.Add(string(k), string(v))
		return true
	})
	return h
}

// eachField calls f with each field of b, a message's wire data: its
// number and type, and its value, a varint's in v, a length-delimited
// field's in m (aliasing b); fixed-width fields and groups are skipped.
// It stops at f's false, and returns errWire if b is malformed or f said
// false.
func eachField(b []byte, f func(num protowire.Number, typ protowire.Type, v uint64, m []byte) bool) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return errWire
		}
		b = b[n:]
		var v uint64
		var m []byte
		switch typ {
		case protowire.VarintType:
			v, n = protowire.ConsumeVarint(b)
		case protowire.BytesType:
			m, n = protowire.ConsumeBytes(b)
		default:
			n = protowire.ConsumeFieldValue(num, typ, b)
		}
		if n < 0 {
			return errWire
		}
		b = b[n:]
		if !f(num, typ, v, m) {
			return errWire
		}
	}
	return nil
}
