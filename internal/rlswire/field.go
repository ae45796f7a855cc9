package rlswire

import (
	"errors"
	"fmt"
	"iter"

	"google.golang.org/protobuf/encoding/protowire"
)

// The field numbers of the messages of Envoy's rate-limit service
// (rls.proto, ratelimit.proto, base.proto, duration.proto, wrappers.proto).
const (
	// RateLimitRequest.
	RequestDomain      protowire.Number = 1
	RequestDescriptors protowire.Number = 2
	RequestHitsAddend  protowire.Number = 3
	// RateLimitDescriptor, its Entry and its RateLimitOverride.
	DescriptorEntries        protowire.Number = 1
	DescriptorLimit          protowire.Number = 2
	DescriptorHitsAddend     protowire.Number = 3
	DescriptorIsNegativeHits protowire.Number = 4
	EntryKey                 protowire.Number = 1
	EntryValue               protowire.Number = 2
	OverrideRequestsPerUnit  protowire.Number = 1
	OverrideUnit             protowire.Number = 2
	OverrideUnitMultiplier   protowire.Number = 3
	// google.protobuf.UInt64Value and UInt32Value.
	WrapperValue protowire.Number = 1

	// RateLimitResponse, its DescriptorStatus and its RateLimit.
	ResponseOverallCode      protowire.Number = 1
	ResponseStatuses         protowire.Number = 2
	ResponseHeadersToAdd     protowire.Number = 3
	StatusCode               protowire.Number = 1
	StatusCurrentLimit       protowire.Number = 2
	StatusLimitRemaining     protowire.Number = 3
	StatusDurationUntilReset protowire.Number = 4
	LimitRequestsPerUnit     protowire.Number = 1
	LimitUnit                protowire.Number = 2
	LimitName                protowire.Number = 3
	// envoy.config.core.v3.HeaderValue and google.protobuf.Duration.
	HeaderKey       protowire.Number = 1
	HeaderValue     protowire.Number = 2
	DurationSeconds protowire.Number = 1
	DurationNanos   protowire.Number = 2
)

// ErrMalformed is the error of wire data that is not protobuf.
var ErrMalformed = errors.New("malformed protobuf wire data")

// Field is one field of a message's wire data: its number and wire type,
// a varint's value in X, a length-delimited field's bytes in V.
type Field struct {
	Num protowire.Number
	Typ protowire.Type
	V   []byte
	X   uint64
}

// Next reads the first field of b, a message's wire data, and returns it
// and the rest of b; fixed-width fields and groups are skipped over, their
// value in neither V nor X. V aliases b. Malformed data, and a field
// number proto.Unmarshal refuses, are refused with an error wrapping
// ErrMalformed. Next allocates nothing but its error.
func Next(b []byte) (Field, []byte, error) {
	num, typ, n := protowire.ConsumeTag(b)
	if n < 0 {
		return Field{}, nil, fmt.Errorf("%w: %w", ErrMalformed, protowire.ParseError(n))
	}
	if !num.IsValid() { // over protowire.MaxValidNumber, as proto.Unmarshal refuses
		return Field{}, nil, fmt.Errorf("%w: field number %d", ErrMalformed, num)
	}
	f := Field{Num: num, Typ: typ}
	rest := b[n:]
	switch typ {
	case protowire.BytesType:
		f.V, n = protowire.ConsumeBytes(rest)
	case protowire.VarintType:
		f.X, n = protowire.ConsumeVarint(rest)
	default:
		n = protowire.ConsumeFieldValue(num, typ, rest)
	}
	if n < 0 {
		return Field{}, nil, fmt.Errorf("%w: field %d: %w", ErrMalformed, num, protowire.ParseError(n))
	}
	return f, rest[n:], nil
}

// Fields yields the fields of b, a message's wire data, in order, as Next
// reads them, each with a nil error. Malformed data ends it: the last pair
// yielded is a zero Field and Next's error. Each V aliases b.
func Fields(b []byte) iter.Seq2[Field, error] {
	return func(yield func(Field, error) bool) {
		for m := b; len(m) > 0; {
			f, rest, err := Next(m)
			if !yield(f, err) || err != nil {
				return
			}
			m = rest
		}
	}
}
