package daemon

import (
	"errors"
	"fmt"

	ratelimit "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlpb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/encoding"
	protocodec "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/hotkeyd/hotkey/internal/envoyconf"
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
var errWire = errors.New("malformed protobuf wire data")

// unmarshalRLSRequest decodes b into req: as proto.Unmarshal does, but
// with string fields that need not be UTF-8 (decodeRLSRequest). Envoy
// copies header bytes into descriptor values unchecked, and a request
// refused for one such value would be admitted whole by Envoy's default
// failure_mode_deny: false. b is not kept.
func unmarshalRLSRequest(b []byte, req *rlpb.RateLimitRequest) error {
	if proto.Unmarshal(b, req) == nil {
		return nil
	}
	return decodeRLSRequest(b, req)
}

// decodeRLSRequest decodes b into req, reset first, as proto.Unmarshal
// would, except that string fields need not be UTF-8: a Go string holds
// their bytes as they came. Fields it does not know are kept as unknown
// fields; a field of a wire type other than its own is one of those, as
// in proto.Unmarshal. Malformed wire data is refused with errWire. b is
// not kept.
func decodeRLSRequest(b []byte, req *rlpb.RateLimitRequest) error {
	proto.Reset(req)
	return decodeFields(b, req, func(num protowire.Number, typ protowire.Type, v []byte, x uint64) (bool, error) {
		switch {
		case num == 1 && typ == protowire.BytesType:
			req.Domain = string(v)
		case num == 2 && typ == protowire.BytesType:
			d := &ratelimit.RateLimitDescriptor{}
			req.Descriptors = append(req.Descriptors, d)
			return true, decodeDescriptor(v, d)
		case num == 3 && typ == protowire.VarintType:
			req.HitsAddend = uint32(x)
		default:
			return false, nil
		}
		return true, nil
	})
}

func decodeDescriptor(b []byte, d *ratelimit.RateLimitDescriptor) error {
	return decodeFields(b, d, func(num protowire.Number, typ protowire.Type, v []byte, x uint64) (bool, error) {
		switch {
		case num == 1 && typ == protowire.BytesType:
			e := &ratelimit.RateLimitDescriptor_Entry{}
			d.Entries = append(d.Entries, e)
			return true, decodeFields(v, e, func(num protowire.Number, typ protowire.Type, v []byte, _ uint64) (bool, error) {
				switch {
				case num == 1 && typ == protowire.BytesType:
					e.Key = string(v)
				case num == 2 && typ == protowire.BytesType:
					e.Value = string(v)
				default:
					return false, nil
				}
				return true, nil
			})
		case num == 2 && typ == protowire.BytesType:
			if d.Limit == nil { // a message field seen twice is merged
				d.Limit = &ratelimit.RateLimitDescriptor_RateLimitOverride{}
			}
			return true, decodeOverride(v, d.Limit)
		case num == 3 && typ == protowire.BytesType:
			if d.HitsAddend == nil {
				d.HitsAddend = &wrapperspb.UInt64Value{}
			}
			h := d.HitsAddend
			return true, decodeFields(v, h, func(num protowire.Number, typ protowire.Type, _ []byte, x uint64) (bool, error) {
				if num != 1 || typ != protowire.VarintType {
					return false, nil
				}
				h.Value = x
				return true, nil
			})
		case num == 4 && typ == protowire.VarintType:
			d.IsNegativeHits = protowire.DecodeBool(x)
		default:
			return false, nil
		}
		return true, nil
	})
}

func decodeOverride(b []byte, o *ratelimit.RateLimitDescriptor_RateLimitOverride) error {
	return decodeFields(b, o, func(num protowire.Number, typ protowire.Type, v []byte, x uint64) (bool, error) {
		switch {
		case num == 1 && typ == protowire.VarintType:
			o.RequestsPerUnit = uint32(x)
		case num == 2 && typ == protowire.VarintType:
			o.Unit = typev3.RateLimitUnit(int32(x))
		case num == 3 && typ == protowire.BytesType:
			if o.UnitMultiplier == nil {
				o.UnitMultiplier = &wrapperspb.UInt32Value{}
			}
			m := o.UnitMultiplier
			return true, decodeFields(v, m, func(num protowire.Number, typ protowire.Type, _ []byte, x uint64) (bool, error) {
				if num != 1 || typ != protowire.VarintType {
					return false, nil
				}
				m.Value = uint32(x)
				return true, nil
			})
		default:
			return false, nil
		}
		return true, nil
	})
}

// decodeFields walks the fields of one message's wire data b, handing each
// to field: v is a length-delimited field's bytes, x a varint's value.
// field reports whether it knew the field; the ones it did not know are
// kept as m's unknown fields.
func decodeFields(b []byte, m proto.Message, field func(num protowire.Number, typ protowire.Type, v []byte, x uint64) (bool, error)) error {
	var unknown protoreflect.RawFields
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return fmt.Errorf("%w: %w", errWire, protowire.ParseError(n))
		}
		rest := b[n:]
		var (
			v []byte
			x uint64
		)
		switch typ {
		case protowire.BytesType:
			v, n = protowire.ConsumeBytes(rest)
		case protowire.VarintType:
			x, n = protowire.ConsumeVarint(rest)
		default:
			n = protowire.ConsumeFieldValue(num, typ, rest)
		}
		if n < 0 {
			return fmt.Errorf("%w: field %d: %w", errWire, num, protowire.ParseError(n))
		}
		known, err := field(num, typ, v, x)
		if err != nil {
			return err
		}
		if !known { // the tag written anew, as proto.Unmarshal keeps it
			unknown = protowire.AppendTag(unknown, num, typ)
			unknown = append(unknown, rest[:n]...)
		}
		b = rest[n:]
	}
	if len(unknown) > 0 { // appended: a message field seen twice is merged
		r := m.ProtoReflect()
		r.SetUnknown(append(r.GetUnknown(), unknown...))
	}
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

// decodeRLSWire decodes the wire data b of a RateLimitRequest into req, as
// decodeRLSRequest and rlsRequestOf would: string fields need not be
// UTF-8, fields it does not act on are skipped, and malformed wire data is
// refused with errWire. b is not kept.
func decodeRLSWire(b []byte, req *rlsRequest) error {
	for len(b) > 0 {
		f, rest, err := nextField(b)
		if err != nil {
			return err
		}
		b = rest
		switch {
		case f.num == 1 && f.typ == protowire.BytesType:
			req.domain = string(f.v)
		case f.num == 2 && f.typ == protowire.BytesType:
			req.descs = append(req.descs, rlsDescriptor{})
			if err := decodeDescriptorWire(f.v, &req.descs[len(req.descs)-1]); err != nil {
				return err
			}
		case f.num == 3 && f.typ == protowire.VarintType:
			req.hits = uint32(f.x)
		}
	}
	return nil
}

func decodeDescriptorWire(b []byte, d *rlsDescriptor) error {
	for len(b) > 0 {
		f, rest, err := nextField(b)
		if err != nil {
			return err
		}
		b = rest
		switch {
		case f.num == 1 && f.typ == protowire.BytesType:
			var e envoyconf.Entry
			for v := f.v; len(v) > 0; {
				g, rest, err := nextField(v)
				if err != nil {
					return err
				}
				v = rest
				switch {
				case g.num == 1 && g.typ == protowire.BytesType:
					e.Key = string(g.v)
				case g.num == 2 && g.typ == protowire.BytesType:
					e.Value = string(g.v)
				}
			}
			d.entries = append(d.entries, e)
		case f.num == 2 && f.typ == protowire.BytesType:
			if d.limit == nil { // a message field seen twice is merged
				d.limit = &rlsOverride{}
			}
			if err := decodeOverrideWire(f.v, d.limit); err != nil {
				return err
			}
		case f.num == 3 && f.typ == protowire.BytesType:
			x, err := wrapperValue(f.v, d.hits)
			if err != nil {
				return err
			}
			d.hits, d.hasHits = x, true
		case f.num == 4 && f.typ == protowire.VarintType:
			d.negative = protowire.DecodeBool(f.x)
		}
	}
	return nil
}

func decodeOverrideWire(b []byte, o *rlsOverride) error {
	for len(b) > 0 {
		f, rest, err := nextField(b)
		if err != nil {
			return err
		}
		b = rest
		switch {
		case f.num == 1 && f.typ == protowire.VarintType:
			o.rpu = uint32(f.x)
		case f.num == 2 && f.typ == protowire.VarintType:
			o.unit = envoyconf.Unit(int32(f.x))
		case f.num == 3 && f.typ == protowire.BytesType:
			x, err := wrapperValue(f.v, uint64(o.multiplier))
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
	for len(b) > 0 {
		f, rest, err := nextField(b)
		if err != nil {
			return 0, err
		}
		b = rest
		if f.num == 1 && f.typ == protowire.VarintType {
			x = f.x
		}
	}
	return x, nil
}

// wireField is one field of a message's wire data: v is a length-delimited
// field's bytes, x a varint's value.
type wireField struct {
	num protowire.Number
	typ protowire.Type
	v   []byte
	x   uint64
}

// nextField reads the first field of the wire data b, and returns it and
// the rest of b; malformed data is refused with errWire.
func nextField(b []byte) (wireField, []byte, error) {
	num, typ, n := protowire.ConsumeTag(b)
	if n < 0 {
		return wireField{}, nil, fmt.Errorf("%w: %w", errWire, protowire.ParseError(n))
	}
	f := wireField{num: num, typ: typ}
	rest := b[n:]
	switch typ {
	case protowire.BytesType:
		f.v, n = protowire.ConsumeBytes(rest)
	case protowire.VarintType:
		f.x, n = protowire.ConsumeVarint(rest)
	default:
		n = protowire.ConsumeFieldValue(num, typ, rest)
	}
	if n < 0 {
		return wireField{}, nil, fmt.Errorf("%w: field %d: %w", errWire, num, protowire.ParseError(n))
	}
	return f, rest[n:], nil
}
