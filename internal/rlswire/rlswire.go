// Package rlswire hand-encodes Envoy's RateLimitRequest for tests, as raw
// bytes go on the wire: keys and values need not be UTF-8, as Envoy sends
// them and as proto.Marshal refuses them. Codec sends such bytes over a
// gRPC connection and decodes the answers as protobuf.
package rlswire

import (
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// Descriptor is one descriptor of a request.
type Descriptor struct {
	// KV is the entries' keys and values, in pairs.
	KV []string
	// RequestsPerUnit per Unit (an envoy.type.v3.RateLimitUnit) is the
	// descriptor's own limit; none when Unit is 0.
	RequestsPerUnit uint32
	Unit            int32
	// Multiplier is the own limit's unit_multiplier; 0: unset.
	Multiplier uint32
	// Hits is the descriptor's hits_addend; nil: unset.
	Hits *uint64
}

// Request encodes a RateLimitRequest of domain, hits (the request's
// hits_addend; 0: unset) and descs.
func Request(domain string, hits uint32, descs ...Descriptor) []byte {
	var b []byte
	b = protowire.AppendTag(b, 1, protowire.BytesType)
	b = protowire.AppendString(b, domain)
	for _, d := range descs {
		b = protowire.AppendTag(b, 2, protowire.BytesType)
		b = protowire.AppendBytes(b, d.encode())
	}
	if hits > 0 {
		b = protowire.AppendTag(b, 3, protowire.VarintType)
		b = protowire.AppendVarint(b, uint64(hits))
	}
	return b
}

// encode is d as a RateLimitDescriptor message.
func (d Descriptor) encode() []byte {
	var m []byte
	for i := 0; i+1 < len(d.KV); i += 2 {
		var e []byte
		e = protowire.AppendTag(e, 1, protowire.BytesType)
		e = protowire.AppendString(e, d.KV[i])
		e = protowire.AppendTag(e, 2, protowire.BytesType)
		e = protowire.AppendString(e, d.KV[i+1])
		m = protowire.AppendTag(m, 1, protowire.BytesType)
		m = protowire.AppendBytes(m, e)
	}
	if d.Unit != 0 {
		var o []byte
		o = protowire.AppendTag(o, 1, protowire.VarintType)
		o = protowire.AppendVarint(o, uint64(d.RequestsPerUnit))
		o = protowire.AppendTag(o, 2, protowire.VarintType)
		o = protowire.AppendVarint(o, uint64(d.Unit))
		if d.Multiplier > 0 {
			o = protowire.AppendTag(o, 3, protowire.BytesType)
			o = protowire.AppendBytes(o, uint64Value(uint64(d.Multiplier)))
		}
		m = protowire.AppendTag(m, 2, protowire.BytesType)
		m = protowire.AppendBytes(m, o)
	}
	if d.Hits != nil {
		m = protowire.AppendTag(m, 3, protowire.BytesType)
		m = protowire.AppendBytes(m, uint64Value(*d.Hits))
	}
	return m
}

// uint64Value is a google.protobuf.UInt64Value (or UInt32Value) of v: its
// field 1, left out when 0.
func uint64Value(v uint64) []byte {
	if v == 0 {
		return nil
	}
	return protowire.AppendVarint(protowire.AppendTag(nil, 1, protowire.VarintType), v)
}

// Codec is a gRPC codec that sends a []byte as a message's wire data as it
// is and decodes answers as protobuf, for grpc.ForceCodecV2.
type Codec struct{}

// Name is the standard codec's: the wire format is the same.
func (Codec) Name() string { return "proto" }

// Marshal sends v, a []byte, as it is.
func (Codec) Marshal(v any) (mem.BufferSlice, error) {
	return mem.BufferSlice{mem.SliceBuffer(v.([]byte))}, nil
}

// Unmarshal decodes data into v, a proto.Message.
func (Codec) Unmarshal(data mem.BufferSlice, v any) error {
	return proto.Unmarshal(data.Materialize(), v.(proto.Message))
}
