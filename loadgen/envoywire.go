package loadgen

import (
	"fmt"
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

// read sets a from b, a RateLimitResponse's wire data. Fields are read as
// proto.Unmarshal reads them: the last of a scalar wins, a message field
// met twice is merged, and a field of an unexpected wire type is skipped.
// Malformed data is refused with an error wrapping rlswire.ErrMalformed.
func (a *envoyAnswer) read(b []byte) error {
	*a = envoyAnswer{}
	var pick envoyStatus
	picked, over, headers := false, false, false
	for f, err := range rlswire.Fields(b) {
		if err != nil {
			return fmt.Errorf("RateLimitResponse: %w", err)
		}
		switch {
		case f.Num == rlswire.ResponseOverallCode && f.Typ == protowire.VarintType:
			a.overall = rlpb.RateLimitResponse_Code(int32(f.X))
		case f.Num == rlswire.ResponseStatuses && f.Typ == protowire.BytesType:
			var st envoyStatus
			if err := st.read(f.V); err != nil {
				return fmt.Errorf("RateLimitResponse: %w", err)
			}
			if !st.hasLimit || over {
				break
			}
			if st.code == rlpb.RateLimitResponse_OVER_LIMIT {
				pick, picked, over = st, true, true
			} else if !picked || st.remaining < pick.remaining {
				pick, picked = st, true
			}
		case f.Num == rlswire.ResponseHeadersToAdd && f.Typ == protowire.BytesType:
			headers = true
		}
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

// read sets st from m, a DescriptorStatus's wire data, and refuses
// malformed data.
func (st *envoyStatus) read(m []byte) error {
	for f, err := range rlswire.Fields(m) {
		if err != nil {
			return err
		}
		switch {
		case f.Num == rlswire.StatusCode && f.Typ == protowire.VarintType:
			st.code = rlpb.RateLimitResponse_Code(int32(f.X))
		case f.Num == rlswire.StatusLimitRemaining && f.Typ == protowire.VarintType:
			st.remaining = uint32(f.X)
		case f.Num == rlswire.StatusCurrentLimit && f.Typ == protowire.BytesType:
			st.hasLimit = true
			for g, err := range rlswire.Fields(f.V) {
				if err != nil {
					return err
				}
				switch {
				case g.Num == rlswire.LimitRequestsPerUnit && g.Typ == protowire.VarintType:
					st.requestsPerUnit = uint32(g.X)
				case g.Num == rlswire.LimitUnit && g.Typ == protowire.VarintType:
					st.unit = rlpb.RateLimitResponse_RateLimit_Unit(int32(g.X))
				}
			}
		case f.Num == rlswire.StatusDurationUntilReset && f.Typ == protowire.BytesType:
			st.hasReset = true
			for g, err := range rlswire.Fields(f.V) {
				if err != nil {
					return err
				}
				switch {
				case g.Num == rlswire.DurationSeconds && g.Typ == protowire.VarintType:
					st.resetSecs = int64(g.X)
				case g.Num == rlswire.DurationNanos && g.Typ == protowire.VarintType:
					st.resetNanos = int32(g.X)
				}
			}
		}
	}
	return nil
}

// readHeaders returns the response_headers_to_add of b, a well-formed
// RateLimitResponse's wire data.
func readHeaders(b []byte) http.Header {
	h := http.Header{}
	for f, err := range rlswire.Fields(b) {
		if err != nil {
			break
		}
		if f.Num != rlswire.ResponseHeadersToAdd || f.Typ != protowire.BytesType {
			continue
		}
		var k, v []byte
		for g, err := range rlswire.Fields(f.V) {
			if err != nil {
				break
			}
			switch {
			case g.Num == rlswire.HeaderKey && g.Typ == protowire.BytesType:
				k = g.V
			case g.Num == rlswire.HeaderValue && g.Typ == protowire.BytesType:
				v = g.V
			}
		}
		h.Add(string(k), string(v))
	}
	return h
}
