package rlswire

import (
	"testing"

	ratelimit "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlpb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// TestRequest: Request writes what proto.Marshal writes of the same
// message, in as many bytes as RequestSize says, and AppendRequest into a
// buffer with room allocates nothing.
func TestRequest(t *testing.T) {
	hits := uint64(7)
	tests := []struct {
		name   string
		domain string
		hits   uint32
		descs  []Descriptor
		want   *rlpb.RateLimitRequest
	}{
		{name: "plain", domain: "bench", hits: 1, descs: []Descriptor{{KV: []string{"tenant", "acme"}}, {KV: []string{"user", "alice", "path", "/x"}}},
			want: &rlpb.RateLimitRequest{Domain: "bench", HitsAddend: 1, Descriptors: []*ratelimit.RateLimitDescriptor{
				{Entries: []*ratelimit.RateLimitDescriptor_Entry{{Key: "tenant", Value: "acme"}}},
				{Entries: []*ratelimit.RateLimitDescriptor_Entry{{Key: "user", Value: "alice"}, {Key: "path", Value: "/x"}}},
			}}},
		{name: "no hits", domain: "d", descs: []Descriptor{{KV: []string{"k", "v"}}},
			want: &rlpb.RateLimitRequest{Domain: "d", Descriptors: []*ratelimit.RateLimitDescriptor{{Entries: []*ratelimit.RateLimitDescriptor_Entry{{Key: "k", Value: "v"}}}}}},
		{name: "own limit", domain: "d", hits: 300, descs: []Descriptor{{KV: []string{"k", "v"}, RequestsPerUnit: 5, Unit: 2, Multiplier: 3, Hits: &hits}},
			want: &rlpb.RateLimitRequest{Domain: "d", HitsAddend: 300, Descriptors: []*ratelimit.RateLimitDescriptor{{
				Entries:    []*ratelimit.RateLimitDescriptor_Entry{{Key: "k", Value: "v"}},
				Limit:      &ratelimit.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 5, Unit: typev3.RateLimitUnit(2), UnitMultiplier: wrapperspb.UInt32(3)},
				HitsAddend: wrapperspb.UInt64(7),
			}}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			want, err := proto.MarshalOptions{Deterministic: true}.Marshal(tt.want)
			if err != nil {
				t.Fatal(err)
			}
			if got := Request(tt.domain, tt.hits, tt.descs...); string(got) != string(want) {
				t.Errorf("Request: %x; want %x", got, want)
			}
			if n := RequestSize(tt.domain, tt.hits, tt.descs...); n != len(want) {
				t.Errorf("RequestSize: %d; want %d", n, len(want))
			}
			buf := make([]byte, 0, 256)
			if n := testing.AllocsPerRun(10, func() { buf = AppendRequest(buf[:0], tt.domain, tt.hits, tt.descs...) }); n != 0 {
				t.Errorf("AppendRequest: %.0f allocations; want 0", n)
			}
		})
	}
}
