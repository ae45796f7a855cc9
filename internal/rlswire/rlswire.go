// Package rlswire is the wire format of Envoy's rate-limit service, by
// hand: the messages' field numbers, a reader of one field at a time (Next)
// and of a message's fields in a loop (Fields), and an encoder of
// RateLimitRequest as raw bytes go on the wire: keys and values need not be
// UTF-8, as Envoy sends them and as proto.Marshal refuses them, and a
// request is written into a buffer the caller reuses (AppendRequest), with
// no message built. Codec sends such bytes over a gRPC connection and
// decodes the answers as protobuf.
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
	return AppendRequest(make([]byte, 0, RequestSize(domain, hits, descs...)), domain, hits, descs...)
}

// AppendRequest appends Request(domain, hits, descs...) to b. It allocates
// nothing where b has RequestSize bytes to spare.
func AppendRequest(b []byte, domain string, hits uint32, descs ...Descriptor) []byte {
	b = protowire.AppendTag(b, RequestDomain, protowire.BytesType)
	b = protowire.AppendString(b, domain)
	for i := range descs {
		b = protowire.AppendTag(b, RequestDescriptors, protowire.BytesType)
		b = descs[i].append(b)
	}
	if hits > 0 {
		b = protowire.AppendTag(b, RequestHitsAddend, protowire.VarintType)
		b = protowire.AppendVarint(b, uint64(hits))
	}
	return b
}

// RequestSize is the length of Request(domain, hits, descs...).
func RequestSize(domain string, hits uint32, descs ...Descriptor) int {
	n := 1 + protowire.SizeBytes(len(domain))
	for i := range descs {
		n += 1 + protowire.SizeBytes(descs[i].size())
	}
	if hits > 0 {
		n += 1 + protowire.SizeVarint(uint64(hits))
	}
	return n
}

// append appends d as a length-prefixed RateLimitDescriptor message.
func (d *Descriptor) append(b []byte) []byte {
	b = protowire.AppendVarint(b, uint64(d.size()))
	for i := 0; i+1 < len(d.KV); i += 2 {
		b = protowire.AppendTag(b, DescriptorEntries, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(entrySize(d.KV[i], d.KV[i+1])))
		b = protowire.AppendTag(b, EntryKey, protowire.BytesType)
		b = protowire.AppendString(b, d.KV[i])
		b = protowire.AppendTag(b, EntryValue, protowire.BytesType)
		b = protowire.AppendString(b, d.KV[i+1])
	}
	if d.Unit != 0 {
		b = protowire.AppendTag(b, DescriptorLimit, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(d.limitSize()))
		b = protowire.AppendTag(b, OverrideRequestsPerUnit, protowire.VarintType)
		b = protowire.AppendVarint(b, uint64(d.RequestsPerUnit))
		b = protowire.AppendTag(b, OverrideUnit, protowire.VarintType)
		b = protowire.AppendVarint(b, uint64(d.Unit))
		if d.Multiplier > 0 {
			b = protowire.AppendTag(b, OverrideUnitMultiplier, protowire.BytesType)
			b = appendUint64Value(b, uint64(d.Multiplier))
		}
	}
	if d.Hits != nil {
		b = protowire.AppendTag(b, DescriptorHitsAddend, protowire.BytesType)
		b = appendUint64Value(b, *d.Hits)
	}
	return b
}

// size is the length of d's RateLimitDescriptor message.
func (d *Descriptor) size() int {
	n := 0
	for i := 0; i+1 < len(d.KV); i += 2 {
		n += 1 + protowire.SizeBytes(entrySize(d.KV[i], d.KV[i+1]))
	}
	if d.Unit != 0 {
		n += 1 + protowire.SizeBytes(d.limitSize())
	}
	if d.Hits != nil {
		n += 1 + protowire.SizeBytes(uint64ValueSize(*d.Hits))
	}
	return n
}

// limitSize is the length of d's own limit's message.
func (d *Descriptor) limitSize() int {
	n := 2 + protowire.SizeVarint(uint64(d.RequestsPerUnit)) + protowire.SizeVarint(uint64(d.Unit))
	if d.Multiplier > 0 {
		n += 1 + protowire.SizeBytes(uint64ValueSize(uint64(d.Multiplier)))
	}
	return n
}

// entrySize is the length of an Entry message of k and v.
func entrySize(k, v string) int {
	return 2 + protowire.SizeBytes(len(k)) + protowire.SizeBytes(len(v))
}

// appendUint64Value appends a length-prefixed google.protobuf.UInt64Value
// (or UInt32Value) of v: its field 1, left out when 0.
func appendUint64Value(b []byte, v uint64) []byte {
	if v == 0 {
		return protowire.AppendVarint(b, 0)
	}
	b = protowire.AppendVarint(b, uint64(uint64ValueSize(v)))
	return protowire.AppendVarint(protowire.AppendTag(b, WrapperValue, protowire.VarintType), v)
}

func uint64ValueSize(v uint64) int {
	if v == 0 {
		return 0
	}
	return 1 + protowire.SizeVarint(v)
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
