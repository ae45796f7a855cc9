package daemon

import (
	"errors"
	"testing"

	ratelimit "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlpb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// rlsSeeds are wire data for FuzzDecodeRLSWire: every field, unknown fields, fields seen twice,
// a field of another wire type, strings that are not UTF-8, and malformed
// data.
func rlsSeeds(t testing.TB) [][]byte {
	full := &rlpb.RateLimitRequest{
		Domain:     "edge",
		HitsAddend: 3,
		Descriptors: []*ratelimit.RateLimitDescriptor{
			{
				Entries:        []*ratelimit.RateLimitDescriptor_Entry{{Key: "tenant", Value: "acme"}, {Key: "user", Value: "España"}},
				Limit:          &ratelimit.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 7, Unit: typev3.RateLimitUnit_HOUR, UnitMultiplier: wrapperspb.UInt32(2)},
				HitsAddend:     wrapperspb.UInt64(1 << 40),
				IsNegativeHits: true,
			},
			{Entries: []*ratelimit.RateLimitDescriptor_Entry{{Key: "remote_address"}}},
		},
	}
	b, err := proto.Marshal(full)
	if err != nil {
		t.Fatal(err)
	}
	seeds := [][]byte{b, nil, wireRequest("edge", []string{"tenant", "Espa\xf1a"}, []string{"\xff", "\xfe"})}
	// Unknown fields at every level, a varint where a message goes, a
	// group, and the limit twice (merged).
	d := protowire.AppendTag(nil, 9, protowire.Fixed64Type)
	d = protowire.AppendFixed64(d, 42)
	d = protowire.AppendTag(d, 2, protowire.BytesType)
	d = protowire.AppendBytes(d, protowire.AppendVarint(protowire.AppendTag(nil, 1, protowire.VarintType), 5))
	d = protowire.AppendTag(d, 2, protowire.BytesType)
	d = protowire.AppendBytes(d, protowire.AppendVarint(protowire.AppendTag(nil, 2, protowire.VarintType), 3))
	d = protowire.AppendTag(d, 1, protowire.VarintType) // entries as a varint: unknown
	d = protowire.AppendVarint(d, 1)
	r := protowire.AppendTag(nil, 2, protowire.BytesType)
	r = protowire.AppendBytes(r, d)
	r = protowire.AppendTag(r, 7, protowire.StartGroupType)
	r = protowire.AppendTag(r, 1, protowire.VarintType)
	r = protowire.AppendVarint(r, 1)
	r = protowire.AppendTag(r, 7, protowire.EndGroupType)
	r = protowire.AppendTag(r, 3, protowire.Fixed32Type) // hits_addend as fixed32: unknown
	r = protowire.AppendFixed32(r, 9)
	r = protowire.AppendTag(r, 3, protowire.VarintType)
	r = protowire.AppendVarint(r, 1<<33+4) // cut to 32 bits, as proto does
	seeds = append(seeds, r,
		[]byte{0x0a, 0x05, 'e'},        // a string longer than the data
		[]byte{0xff},                   // a tag cut short
		[]byte{0x12, 0x02, 0x0a, 0x7f}, // an entry longer than its descriptor
		[]byte{0x00},                   // field number 0
		[]byte{0x3c},                   // an end group without its start
		protowire.AppendFixed32(protowire.AppendVarint(nil, uint64(protowire.MaxValidNumber+1)<<3|uint64(protowire.Fixed32Type)), 0), // a field number over the maximum
	)
	return seeds
}

// TestDecodeRLSRequest: strings that are not UTF-8 come through as their
// bytes; malformed data is refused.
func TestDecodeRLSRequest(t *testing.T) {
	var req rlpb.RateLimitRequest
	if err := unmarshalRLSRequest(wireRequest("edge", []string{"tenant", "Espa\xf1a"}, []string{"\xff", "\xfe"}), &req); err != nil {
		t.Fatal(err)
	}
	ds := req.GetDescriptors()
	if req.GetDomain() != "edge" || len(ds) != 2 || len(ds[0].Entries) != 1 || ds[0].Entries[0].Value != "Espa\xf1a" ||
		len(ds[1].Entries) != 1 || ds[1].Entries[0].Key != "\xff" || ds[1].Entries[0].Value != "\xfe" {
		t.Errorf("decoded %q", &req)
	}
	for _, b := range [][]byte{{0x0a, 0x05, 'e'}, {0xff}, {0x12, 0x02, 0x0a, 0x7f}, {0x00}, {0x3c}} {
		if err := unmarshalRLSRequest(b, &req); !errors.Is(err, errWire) {
			t.Errorf("%x: %v, want errWire", b, err)
		}
	}
}

// FuzzDecodeRLSWire: decodeRLSWire never panics; what proto.Unmarshal
// decodes, it decodes with the same fields (unknown ones aside); what it
// refuses, with errWire, proto.Unmarshal refuses too; and what it decodes
// where proto.Unmarshal refuses holds a string that is not UTF-8, and
// reaches an interceptor as decodeRLSWire decodes it (unmarshalRLSRequest).
func FuzzDecodeRLSWire(f *testing.F) {
	for _, s := range rlsSeeds(f) {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var got rlsRequest
		err := decodeRLSWire(b, &got)
		var want rlpb.RateLimitRequest
		werr := proto.UnmarshalOptions{DiscardUnknown: true}.Unmarshal(b, &want)
		switch {
		case err != nil && !errors.Is(err, errWire):
			t.Fatalf("%x: error %v is not errWire", b, err)
		case err != nil && werr == nil:
			t.Fatalf("%x: proto.Unmarshal decodes it, decodeRLSWire: %v", b, err)
		case err != nil:
			return
		}
		m := protoRequest(&got)
		if werr == nil {
			if !proto.Equal(m, &want) {
				t.Fatalf("%x: decoded %v, proto.Unmarshal %v", b, m, &want)
			}
			return
		}
		if u := interface{ InvalidUTF8() bool }(nil); !errors.As(werr, &u) || !u.InvalidUTF8() {
			t.Fatalf("%x: decodeRLSWire decodes %v, proto.Unmarshal refuses it: %v", b, m, werr)
		}
		var req rlpb.RateLimitRequest
		if err := unmarshalRLSRequest(b, &req); err != nil || !proto.Equal(&req, m) {
			t.Fatalf("%x: unmarshalRLSRequest %v, %v; decodeRLSWire %v", b, &req, err, m)
		}
	})
}
