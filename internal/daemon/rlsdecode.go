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
)

// rlsCodec is the gRPC server's codec: the standard proto codec, except
// that a ShouldRateLimit request reaches its handler undecoded (rlsWire),
// for unmarshalRLSRequest to decode. It is safe for concurrent use.
type rlsCodec struct{ std encoding.CodecV2 }

func newRLSCodec() rlsCodec { return rlsCodec{std: encoding.GetCodecV2(protocodec.Name)} }

// Name returns the standard codec's name: the wire format is the same.
func (c rlsCodec) Name() string { return protocodec.Name }

// Marshal marshals v as the standard proto codec does.
func (c rlsCodec) Marshal(v any) (mem.BufferSlice, error) { return c.std.Marshal(v) }

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
