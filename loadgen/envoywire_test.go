package loadgen

import (
	"net/http"
	"testing"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlpb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
)

// protoAnswer reads b as envoyAnswer.read should: a RateLimitResponse
// decoded by proto.Unmarshal, and its quota picked from the decoded
// statuses, else headers.
func protoAnswer(b []byte) (envoyAnswer, error) {
	var resp rlpb.RateLimitResponse
	if err := proto.Unmarshal(b, &resp); err != nil {
		return envoyAnswer{}, err
	}
	a := envoyAnswer{overall: resp.GetOverallCode()}
	var pick *rlpb.RateLimitResponse_DescriptorStatus
	for _, st := range resp.GetStatuses() {
		if st.GetCurrentLimit() == nil {
			continue
		}
		if st.GetCode() == rlpb.RateLimitResponse_OVER_LIMIT {
			pick = st
			break
		}
		if pick == nil || st.GetLimitRemaining() < pick.GetLimitRemaining() {
			pick = st
		}
	}
	if pick != nil {
		l := pick.GetCurrentLimit()
		a.quota = Quota{Reported: true, Limit: int64(l.GetRequestsPerUnit()), Window: unitWindow(l.GetUnit()),
			Remaining: int64(pick.GetLimitRemaining()), ResetAfter: pick.GetDurationUntilReset().AsDuration()}
	} else if len(resp.GetResponseHeadersToAdd()) > 0 {
		h := make(http.Header)
		for _, hv := range resp.GetResponseHeadersToAdd() {
			h.Add(hv.GetKey(), hv.GetValue())
		}
		a.quota = HeaderQuota(h)
	}
	return a, nil
}

var answerSeeds = []*rlpb.RateLimitResponse{
	{},
	{OverallCode: rlpb.RateLimitResponse_OK},
	{OverallCode: rlpb.RateLimitResponse_OVER_LIMIT, Statuses: []*rlpb.RateLimitResponse_DescriptorStatus{
		{Code: rlpb.RateLimitResponse_OK, LimitRemaining: 900, DurationUntilReset: durationpb.New(3 * time.Hour),
			CurrentLimit: &rlpb.RateLimitResponse_RateLimit{RequestsPerUnit: 1000, Unit: rlpb.RateLimitResponse_RateLimit_DAY}},
		{Code: rlpb.RateLimitResponse_OVER_LIMIT, DurationUntilReset: durationpb.New(-1500 * time.Millisecond),
			CurrentLimit: &rlpb.RateLimitResponse_RateLimit{Name: "user", RequestsPerUnit: 20, Unit: rlpb.RateLimitResponse_RateLimit_MINUTE}},
	}},
	{OverallCode: rlpb.RateLimitResponse_OK, Statuses: []*rlpb.RateLimitResponse_DescriptorStatus{
		{Code: rlpb.RateLimitResponse_OK, LimitRemaining: 9, CurrentLimit: &rlpb.RateLimitResponse_RateLimit{RequestsPerUnit: 10, Unit: rlpb.RateLimitResponse_RateLimit_SECOND}},
		{Code: rlpb.RateLimitResponse_OK, LimitRemaining: 3, CurrentLimit: &rlpb.RateLimitResponse_RateLimit{RequestsPerUnit: 5, Unit: rlpb.RateLimitResponse_RateLimit_HOUR}},
		{Code: rlpb.RateLimitResponse_OK},
	}},
	{OverallCode: rlpb.RateLimitResponse_OK, Statuses: []*rlpb.RateLimitResponse_DescriptorStatus{{Code: rlpb.RateLimitResponse_OK}},
		ResponseHeadersToAdd: []*core.HeaderValue{{Key: "ratelimit-policy", Value: "10;w=60"}, {Key: "ratelimit", Value: `"default";r=4;t=30`},
			{Key: "x-ratelimit-limit", Value: "10"}, {Key: "x-ratelimit-remaining", Value: "4"}, {Key: "x-ratelimit-reset", Value: "30"}}},
	{OverallCode: rlpb.RateLimitResponse_UNKNOWN, RawBody: []byte("no")},
}

// TestEnvoyAnswer: what read takes of a RateLimitResponse is what the
// message proto.Unmarshal decodes says.
func TestEnvoyAnswer(t *testing.T) {
	for i, resp := range answerSeeds {
		b, err := proto.Marshal(resp)
		if err != nil {
			t.Fatal(err)
		}
		var got envoyAnswer
		if err := got.read(b); err != nil {
			t.Fatalf("%d: %v", i, err)
		}
		if want, _ := protoAnswer(b); got != want {
			t.Errorf("%d: %+v; want %+v", i, got, want)
		}
	}
}

// FuzzEnvoyAnswer: read takes from any wire data proto.Unmarshal accepts
// what proto.Unmarshal's message says, and refuses only what proto.Unmarshal
// refuses too.
func FuzzEnvoyAnswer(f *testing.F) {
	for _, resp := range answerSeeds {
		b, err := proto.Marshal(resp)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var got envoyAnswer
		gotErr := got.read(b)
		want, wantErr := protoAnswer(b)
		switch {
		case wantErr != nil:
			return // proto.Unmarshal's refusal; read may be laxer
		case gotErr != nil:
			t.Fatalf("read: %v; proto.Unmarshal reads %+v", gotErr, want)
		case got != want:
			t.Fatalf("read: %+v; proto.Unmarshal's %+v", got, want)
		}
	})
}
