package daemon

import (
	"slices"

	ratelimit "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlpb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/encoding"
	protocodec "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/hotkeyd/hotkey/internal/envoyconf"
	"github.com/hotkeyd/hotkey/internal/grpcserve"
	"github.com/hotkeyd/hotkey/internal/rlswire"
)

// rlsCodec is the gRPC server's codec: the standard proto codec, except
// that a ShouldRateLimit request reaches its handler undecoded (rlsWire),
// for its handler to decode, and its answer (an *rlsAnswer) is written by
// hand. It is safe for concurrent use.
type rlsCodec struct{ std encoding.CodecV2 }

func newRLSCodec() rlsCodec { return rlsCodec{std: encoding.GetCodecV2(protocodec.Name)} }

// Name returns the standard codec's name: the wire format is the same.
func (c rlsCodec) Name() string { return protocodec.Name }

// Marshal writes an *rlsAnswer's wire data (appendWire), and marshals
// anything else as the standard proto codec does.
func (c rlsCodec) Marshal(v any) (mem.BufferSlice, error) {
	if a, ok := v.(*rlsAnswer); ok {
		return mem.BufferSlice{mem.SliceBuffer(a.appendWire(make([]byte, 0, a.size())))}, nil
	}
	return c.std.Marshal(v)
}

// AppendMarshal appends an *rlsAnswer's wire data to b, the lean gRPC
// server's fast path (grpcserve.AppendMarshaler); it leaves anything else
// to Marshal.
func (c rlsCodec) AppendMarshal(b []byte, v any) ([]byte, bool, error) {
	if a, ok := v.(*rlsAnswer); ok {
		return a.appendWire(slices.Grow(b, a.size())), true, nil
	}
	return b, false, nil
}

// UnmarshalBorrowed points an *rlsWire at b, the lean gRPC server's fast
// path (grpcserve.BorrowUnmarshaler): b is the server's until the handler
// returns, and shouldRateLimitHandler keeps nothing of it. It leaves
// anything else to Unmarshal.
func (c rlsCodec) UnmarshalBorrowed(b []byte, v any) (bool, error) {
	if w, ok := v.(*rlsWire); ok {
		w.b = b
		return true, nil
	}
	return false, nil
}

var (
	_ grpcserve.AppendMarshaler   = rlsCodec{}
	_ grpcserve.BorrowUnmarshaler = rlsCodec{}
)

// Unmarshal copies data into v if v is an *rlsWire, else decodes it as the
// standard proto codec does.
func (c rlsCodec) Unmarshal(data mem.BufferSlice, v any) error {
	if w, ok := v.(*rlsWire); ok {
		w.b = data.Materialize()
		return nil
	}
	return c.std.Unmarshal(data, v)
}

// rlsWire is the wire data of a RateLimitRequest.
type rlsWire struct{ b []byte }

// errWire is the error of a RateLimitRequest whose wire data is malformed.
var errWire = rlswire.ErrMalformed

// unmarshalRLSRequest decodes b into req: as proto.Unmarshal does, but
// with string fields that need not be UTF-8. Envoy copies header bytes
// into descriptor values unchecked, and a request refused for one such
// value would be admitted whole by Envoy's default failure_mode_deny:
// false. Such a request is decoded by decodeRLSWire, which keeps every
// field the messages know and drops unknown ones. b is not kept.
func unmarshalRLSRequest(b []byte, req *rlpb.RateLimitRequest) error {
	if proto.Unmarshal(b, req) == nil {
		return nil
	}
	var r rlsRequest
	if err := decodeRLSWire(b, &r); err != nil {
		return err
	}
	m := protoRequest(&r)
	proto.Reset(req)
	req.Domain, req.Descriptors, req.HitsAddend = m.Domain, m.Descriptors, m.HitsAddend
	return nil
}

// rlsRequest is a RateLimitRequest as decide reads it: the fields hotkeyd
// acts on, nothing else.
type rlsRequest struct {
	domain string
	hits   uint32 // hits_addend; 0: unset
	descs  []rlsDescriptor
}

// rlsDescriptor is a RateLimitDescriptor as decide reads it.
type rlsDescriptor struct {
	entries  []envoyconf.Entry
	limit    *rlsOverride // the descriptor's own limit; nil: none
	hits     uint64       // hits_addend, if hasHits
	hasHits  bool
	negative bool // is_negative_hits
}

// rlsOverride is a descriptor's own limit: rpu per multiplier units, where
// multiplier is unit_multiplier's value if multSet, else 1.
type rlsOverride struct {
	rpu        uint32
	unit       envoyconf.Unit
	multiplier uint32
	multSet    bool
}

// units is the count of units o's period is.
func (o *rlsOverride) units() uint32 {
	if !o.multSet {
		return 1
	}
	return o.multiplier
}

// rlsRequestOf is req as decide reads it. It shares req's strings.
func rlsRequestOf(req *rlpb.RateLimitRequest) *rlsRequest {
	r := &rlsRequest{domain: req.GetDomain(), hits: req.GetHitsAddend(), descs: make([]rlsDescriptor, len(req.GetDescriptors()))}
	for i, d := range req.GetDescriptors() {
		rd := &r.descs[i]
		for _, e := range d.GetEntries() {
			rd.entries = append(rd.entries, envoyconf.Entry{Key: e.GetKey(), Value: e.GetValue()})
		}
		if ov := d.GetLimit(); ov != nil {
			rd.limit = &rlsOverride{rpu: ov.GetRequestsPerUnit(), unit: envoyconf.Unit(ov.GetUnit())}
			if m := ov.GetUnitMultiplier(); m != nil {
				rd.limit.multiplier, rd.limit.multSet = m.GetValue(), true
			}
		}
		if h := d.GetHitsAddend(); h != nil {
			rd.hits, rd.hasHits = h.GetValue(), true
		}
		rd.negative = d.GetIsNegativeHits()
	}
	return r
}

// protoRequest is r as a RateLimitRequest, the inverse of rlsRequestOf.
// It shares r's strings.
func protoRequest(r *rlsRequest) *rlpb.RateLimitRequest {
	req := &rlpb.RateLimitRequest{Domain: r.domain, HitsAddend: r.hits}
	for i := range r.descs {
		rd := &r.descs[i]
		d := &ratelimit.RateLimitDescriptor{IsNegativeHits: rd.negative}
		for _, e := range rd.entries {
			d.Entries = append(d.Entries, &ratelimit.RateLimitDescriptor_Entry{Key: e.Key, Value: e.Value})
		}
		if o := rd.limit; o != nil {
			d.Limit = &ratelimit.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: o.rpu, Unit: typev3.RateLimitUnit(int32(o.unit))}
			if o.multSet {
				d.Limit.UnitMultiplier = wrapperspb.UInt32(o.multiplier)
			}
		}
		if rd.hasHits {
			d.HitsAddend = wrapperspb.UInt64(rd.hits)
		}
		req.Descriptors = append(req.Descriptors, d)
	}
	return req
}

// decodeRLSWire decodes the wire data b of a RateLimitRequest into req, as
// rlsRequestOf reads proto.Unmarshal's message, except that string fields
// need not be UTF-8: a Go string holds their bytes as they came. Fields it
// does not know, or of a wire type other than their own, are skipped, and
// malformed wire data is refused with errWire. b is not kept.
func decodeRLSWire(b []byte, req *rlsRequest) error {
	for f, err := range rlswire.Fields(b) {
		if err != nil {
			return err
		}
		switch {
		case f.Num == rlswire.RequestDomain && f.Typ == protowire.BytesType:
			req.domain = string(f.V)
		case f.Num == rlswire.RequestDescriptors && f.Typ == protowire.BytesType:
			req.descs = append(req.descs, rlsDescriptor{})
			if err := decodeDescriptorWire(f.V, &req.descs[len(req.descs)-1]); err != nil {
				return err
			}
		case f.Num == rlswire.RequestHitsAddend && f.Typ == protowire.VarintType:
			req.hits = uint32(f.X)
		}
	}
	return nil
}

func decodeDescriptorWire(b []byte, d *rlsDescriptor) error {
	for f, err := range rlswire.Fields(b) {
		if err != nil {
			return err
		}
		switch {
		case f.Num == rlswire.DescriptorEntries && f.Typ == protowire.BytesType:
			var e envoyconf.Entry
			for g, err := range rlswire.Fields(f.V) {
				if err != nil {
					return err
				}
				switch {
				case g.Num == rlswire.EntryKey && g.Typ == protowire.BytesType:
					e.Key = string(g.V)
				case g.Num == rlswire.EntryValue && g.Typ == protowire.BytesType:
					e.Value = string(g.V)
				}
			}
			d.entries = append(d.entries, e)
		case f.Num == rlswire.DescriptorLimit && f.Typ == protowire.BytesType:
			if d.limit == nil { // a message field seen twice is merged
				d.limit = &rlsOverride{}
			}
			if err := decodeOverrideWire(f.V, d.limit); err != nil {
				return err
			}
		case f.Num == rlswire.DescriptorHitsAddend && f.Typ == protowire.BytesType:
			x, err := wrapperValue(f.V, d.hits)
			if err != nil {
				return err
			}
			d.hits, d.hasHits = x, true
		case f.Num == rlswire.DescriptorIsNegativeHits && f.Typ == protowire.VarintType:
			d.negative = protowire.DecodeBool(f.X)
		}
	}
	return nil
}

func decodeOverrideWire(b []byte, o *rlsOverride) error {
	for f, err := range rlswire.Fields(b) {
		if err != nil {
			return err
		}
		switch {
		case f.Num == rlswire.OverrideRequestsPerUnit && f.Typ == protowire.VarintType:
			o.rpu = uint32(f.X)
		case f.Num == rlswire.OverrideUnit && f.Typ == protowire.VarintType:
			o.unit = envoyconf.Unit(int32(f.X))
		case f.Num == rlswire.OverrideUnitMultiplier && f.Typ == protowire.BytesType:
			x, err := wrapperValue(f.V, uint64(o.multiplier))
			if err != nil {
				return err
			}
			o.multiplier, o.multSet = uint32(x), true
		}
	}
	return nil
}

// wrapperValue is the value of a google.protobuf.UInt64Value or
// UInt32Value whose wire data is b, merged into one whose value was x.
func wrapperValue(b []byte, x uint64) (uint64, error) {
	for f, err := range rlswire.Fields(b) {
		if err != nil {
			return 0, err
		}
		if f.Num == rlswire.WrapperValue && f.Typ == protowire.VarintType {
			x = f.X
		}
	}
	return x, nil
}
