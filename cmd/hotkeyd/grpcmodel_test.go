package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	rlpb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"

	"github.com/hotkeyd/hotkey/internal/rlswire"
)

// grpcModelConfig is the rules file of TestGRPCModel: limits small enough
// that no key is ever split (a subcounter enforces 10 a period at least),
// so that every answer is exact.
const grpcModelConfig = `domain: model
descriptors:
  - key: tenant
    rate_limit:
      unit: year
      requests_per_unit: 7
  - key: user
    rate_limit:
      unit: day
      requests_per_unit: 5
`

// shouldRaw asks ShouldRateLimit with a request encoded by hand.
func shouldRaw(t *testing.T, conn *grpc.ClientConn, req []byte) (*rlpb.RateLimitResponse, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	resp := &rlpb.RateLimitResponse{}
	err := conn.Invoke(ctx, rlpb.RateLimitService_ShouldRateLimit_FullMethodName, req, resp, grpc.ForceCodecV2(rlswire.Codec{}))
	return resp, err
}

// TestGRPCModel drives the daemon's ShouldRateLimit with random requests
// of one to three descriptors, on the memory store and on Redis, and holds
// every answer to an exact model of the counters: rules and descriptors'
// own limits in several units (and unit multipliers), own limits that
// change, values and keys that are not UTF-8 or that hold a subcounter's
// suffix, hits_addend of 0 (a check that charges nothing), and costs over
// the limit. A descriptor is admitted if and only if its counter has room,
// and the overall code is OVER_LIMIT if and only if one of them is over.
// Every counter starts empty and the limits are per hour at least, so
// within one window a sliding window's estimate is its count; a run that
// crosses the start of a window of some unit does not check that unit.
func TestGRPCModel(t *testing.T) {
	t.Parallel()
	cfg := writeFile(t, "model.yaml", grpcModelConfig)
	for _, store := range []string{"memory", "redis"} {
		t.Run(store, func(t *testing.T) {
			t.Parallel()
			args := []string{"--envoy-config", cfg}
			if store == "redis" {
				args = append(args, "--redis", "redis://"+startRedis(t).Addr)
			}
			d := startDaemon(t, daemonOpts{args: args})
			conn := rlsConn(t, d)
			runGRPCModel(t, d, conn, 7, 400)
		})
	}
}

// grpcModelUnits are the own limits' units of TestGRPCModel, with their
// lengths.
var grpcModelUnits = []struct {
	unit rlpb.RateLimitResponse_RateLimit_Unit
	d    time.Duration
}{
	{rlpb.RateLimitResponse_RateLimit_HOUR, time.Hour},
	{rlpb.RateLimitResponse_RateLimit_DAY, 24 * time.Hour},
	{rlpb.RateLimitResponse_RateLimit_YEAR, 365 * 24 * time.Hour},
}

func runGRPCModel(t *testing.T, d *proc, conn *grpc.ClientConn, seed uint64, requests int) {
	rng := rand.New(rand.NewPCG(seed, seed))
	values := []string{"acme", "Espa\xf1a", "Espa\xf1b", "\xff", "España", "a|4|0", "a"}
	keys := []string{"user", "tenant", "\xfeuser"}
	used := map[string]int64{}   // by counter
	units := map[string]string{} // the unit a counter counts in, by counter
	type miss struct {
		unit string
		what string
	}
	var misses []miss
	clearOfEdge(time.Hour)
	start := time.Now()
	for r := range requests {
		n := 1 + rng.IntN(3)
		descs := make([]rlswire.Descriptor, 0, n)
		seen := map[string]bool{}
		type want struct {
			counter string
			unit    string
			limit   int64 // 0: no limit applies
			hits    int64
		}
		wants := make([]want, 0, n)
		reqHits := []uint32{0, 0, 0, 1, 2}[rng.IntN(5)]
		for len(descs) < n {
			md := rlswire.Descriptor{}
			w := want{hits: max(1, int64(reqHits))}
			v := values[rng.IntN(len(values))]
			switch rng.IntN(3) {
			case 0: // a rule's descriptor
				k := keys[rng.IntN(len(keys))]
				md.KV = []string{k, v}
				switch k {
				case "tenant":
					w.counter, w.unit, w.limit = "rule tenant "+v, "year", 7
				case "user":
					w.counter, w.unit, w.limit = "rule user "+v, "day", 5
				}
			default: // a descriptor's own limit
				k := keys[rng.IntN(len(keys))]
				u := grpcModelUnits[rng.IntN(len(grpcModelUnits))]
				md.KV = []string{k, v}
				md.RequestsPerUnit, md.Unit = uint32(2+rng.IntN(2)), int32(u.unit)
				mult := uint32(1)
				if rng.IntN(4) == 0 {
					md.Multiplier = 2
					mult = 2
				}
				w.counter = fmt.Sprintf("own %q %q %v×%d", k, v, u.unit, mult)
				w.unit, w.limit = fmt.Sprintf("%v×%d", u.unit, mult), int64(md.RequestsPerUnit)
			}
			if w.counter != "" && seen[w.counter] {
				continue // one counter once a request, so that its answer is exact
			}
			seen[w.counter] = true
			switch rng.IntN(6) {
			case 0:
				h := uint64(0)
				md.Hits = &h
				w.hits = 0
			case 1:
				h := uint64(1 + rng.IntN(9))
				md.Hits = &h
				w.hits = int64(h)
			}
			descs = append(descs, md)
			wants = append(wants, w)
		}
		resp, err := shouldRaw(t, conn, rlswire.Request("model", reqHits, descs...))
		if err != nil {
			t.Fatalf("request %d %+v: %v", r, descs, err)
		}
		if len(resp.Statuses) != len(descs) {
			t.Fatalf("request %d: %d statuses for %d descriptors", r, len(resp.Statuses), len(descs))
		}
		anyOver := false
		for i, w := range wants {
			st := resp.Statuses[i]
			if w.limit == 0 {
				if st.Code != rlpb.RateLimitResponse_OK || st.CurrentLimit != nil {
					t.Errorf("request %d, descriptor %d %q: no rule applies, got %v", r, i, descs[i].KV, st)
				}
				continue
			}
			units[w.counter] = w.unit
			u := used[w.counter]
			wantOver := u+max(1, w.hits) > w.limit
			if !wantOver && w.hits > 0 {
				used[w.counter] = u + w.hits
			}
			anyOver = anyOver || wantOver
			if got := st.Code == rlpb.RateLimitResponse_OVER_LIMIT; got != wantOver {
				// The counter holds what the daemon admitted, whatever
				// the model says.
				if got {
					used[w.counter] = u
				} else if w.hits > 0 {
					used[w.counter] = u + w.hits
				}
				misses = append(misses, miss{w.unit, fmt.Sprintf("request %d, descriptor %d (%s, %d used of %d, hits %d): %v, want over=%v",
					r, i, w.counter, u, w.limit, w.hits, st.Code, wantOver)})
			}
			if want := uint32(max(0, w.limit-used[w.counter])); !wantOver && st.LimitRemaining != want {
				misses = append(misses, miss{w.unit, fmt.Sprintf("request %d, descriptor %d (%s): %d remaining, want %d", r, i, w.counter, st.LimitRemaining, want)})
			}
		}
		if got := resp.OverallCode == rlpb.RateLimitResponse_OVER_LIMIT; got != anyOver {
			misses = append(misses, miss{"", fmt.Sprintf("request %d: overall %v, want over=%v (%v)", r, resp.OverallCode, anyOver, resp.Statuses)})
		}
	}
	end := time.Now()
	crossed := map[string]bool{}
	for _, u := range grpcModelUnits {
		for _, mult := range []int{1, 2} {
			unit := time.Duration(mult) * u.d
			crossed[fmt.Sprintf("%v×%d", u.unit, mult)] = window(start, unit) != window(end, unit)
		}
	}
	crossed["day"] = window(start, 24*time.Hour) != window(end, 24*time.Hour)
	crossed["year"] = window(start, 365*24*time.Hour) != window(end, 365*24*time.Hour)
	checked := 0
	for _, m := range misses {
		if crossed[m.unit] {
			t.Logf("across a window's start of %s: not checked: %s", m.unit, m.what)
			continue
		}
		if checked++; checked <= 20 {
			t.Error(m.what)
		}
	}
	var full int
	for c, u := range used {
		if !crossed[units[c]] && u > 0 {
			full++
		}
	}
	t.Logf("%d requests, %d counters charged, %d answers off the model", requests, full, checked)
	// Keys and values that are not UTF-8 reach the metrics too: the scrape
	// must still answer.
	if scrape := string(do(t, "GET", d.admin+"/metrics", "").body); !strings.Contains(scrape, "hotkeyd_descriptor_hits_total") {
		t.Errorf("no descriptor metrics after the run")
	}
}
