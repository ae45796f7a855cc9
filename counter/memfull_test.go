package counter

import (
	"errors"
	"fmt"
	"testing"
	"time"
)

// TestMemoryFloodKeepsLiveCounters: a key uses its 5 an hour, then a flood
// of one-off keys, each living longer than the key's counter, overfills a
// small table. The key's counter holds its usage through the flood, so the
// key admits 5 within the hour in all, however often it asks.
func TestMemoryFloodKeepsLiveCounters(t *testing.T) {
	for _, alg := range []Algorithm{TokenBucket, SlidingWindow, FixedWindow, SlidingLog} {
		t.Run(alg.String(), func(t *testing.T) {
			const maxKeys = 256
			s := NewMemoryStore(MemoryConfig{MaxKeys: maxKeys, Stripes: 4})
			lim := Limit{Algorithm: alg, Rate: 5, Period: time.Hour}
			flood := Limit{Algorithm: alg, Rate: 1, Period: 24 * time.Hour}
			admitted := 0
			take := func(at time.Time) {
				for range 10 {
					if s.TakeAt(at, "user", 0, lim, 1).Allowed {
						admitted++
					}
				}
			}
			take(t0)
			for i := range 20 * maxKeys {
				s.TakeAt(t0.Add(time.Minute), fmt.Sprintf("flood%d", i), 0, flood, 1)
			}
			take(t0.Add(2 * time.Minute))
			if admitted != 5 {
				t.Errorf("admitted %d of 20 within the hour, want 5 (the flood dropped the key's counter)", admitted)
			}
			if s.Len() > maxKeys {
				t.Errorf("store holds %d counters, max %d", s.Len(), maxKeys)
			}
			for i := range s.stripes {
				if tb := &s.stripes[i].t; len(tb.logs) > tb.limit {
					t.Errorf("stripe %d holds %d logs for at most %d counters", i, len(tb.logs), tb.limit)
				}
			}
		})
	}
}

// TestMemoryFullRefusesNewKeys: a stripe full of live counters refuses a
// new key until its soonest counter expires, with RetryAfter no later than
// that, and counts each refusal; the keys it holds decide as before, and an expired
// counter makes room.
func TestMemoryFullRefusesNewKeys(t *testing.T) {
	s := NewMemoryStore(MemoryConfig{MaxKeys: 4, Stripes: 1})
	hour := Limit{Rate: 2, Period: time.Hour}
	minute := Limit{Algorithm: SlidingLog, Rate: 2, Period: time.Minute}
	for i := range 3 {
		s.TakeAt(t0, fmt.Sprintf("k%d", i), 0, hour, 1)
	}
	s.TakeAt(t0, "short", 0, minute, 1)

	for _, tt := range []struct {
		give      time.Duration // since t0
		key       string
		lim       Limit
		want      bool
		wantRetry time.Duration
		wantFull  uint64
	}{
		{give: 10 * time.Second, key: "new", lim: hour, wantRetry: 50 * time.Second, wantFull: 1},
		{give: 20 * time.Second, key: "new", lim: minute, wantRetry: 40 * time.Second, wantFull: 2},
		{give: 20 * time.Second, key: "k0", lim: hour, want: true, wantFull: 2},
		{give: 20 * time.Second, key: "k0", lim: hour, wantRetry: 30*time.Minute - 20*time.Second, wantFull: 2},
		{give: 30 * time.Second, key: "short", lim: minute, want: true, wantFull: 2},
		// short lives on to 90 s, but no sweep looks before 60 s.
		{give: 40 * time.Second, key: "new", lim: hour, wantRetry: 20 * time.Second, wantFull: 3},
		{give: 60 * time.Second, key: "new", lim: hour, wantRetry: 30 * time.Second, wantFull: 4},
		{give: 90 * time.Second, key: "new", lim: hour, want: true, wantFull: 4},
		{give: 90 * time.Second, key: "new2", lim: hour, wantRetry: 30*time.Minute - 90*time.Second, wantFull: 5},
	} {
		r := s.TakeAt(t0.Add(tt.give), tt.key, 0, tt.lim, 1)
		if r.Allowed != tt.want || r.RetryAfter != tt.wantRetry || s.Full() != tt.wantFull {
			t.Errorf("%v: %s: %+v, full %d; want allowed %v, retry after %v, full %d",
				tt.give, tt.key, r, s.Full(), tt.want, tt.wantRetry, tt.wantFull)
		}
	}
	if n := s.Len(); n != 4 {
		t.Errorf("store holds %d counters, want 4", n)
	}
}

// TestMemoryReshardFullKeepsUsage: a move whose counters to seed find no
// room fails with ErrFull, drops no live counter, and leaves the usage on
// the counter it read, which keeps deciding on it.
func TestMemoryReshardFullKeepsUsage(t *testing.T) {
	for _, alg := range []Algorithm{TokenBucket, SlidingWindow, FixedWindow, SlidingLog} {
		t.Run(alg.String(), func(t *testing.T) {
			const maxKeys = 8
			s := NewMemoryStore(MemoryConfig{MaxKeys: maxKeys, Stripes: 1})
			lim := Limit{Algorithm: alg, Rate: 8, Period: time.Hour}
			for range 6 {
				s.TakeAt(t0, "hot", 0, lim, 1)
			}
			for i := range maxKeys - 1 {
				s.TakeAt(t0, fmt.Sprintf("k%d", i), 0, lim, lim.Rate)
			}
			var to []Shard
			for i := range 4 {
				to = append(to, Shard{Name: fmt.Sprintf("hot/4/%d", i), Limit: Limit{Algorithm: alg, Rate: 2, Period: time.Hour}})
			}
			err := s.ReshardAt(t0.Add(time.Minute), []Shard{{Name: "hot", Limit: lim}}, to)
			if !errors.Is(err, ErrFull) {
				t.Errorf("reshard into a full store: %v, want ErrFull", err)
			}
			if s.Full() != 1 {
				t.Errorf("full %d, want 1", s.Full())
			}
			admitted := 0
			at := t0.Add(2 * time.Minute)
			for range 10 {
				if s.TakeAt(at, "hot", 0, lim, 1).Allowed {
					admitted++
				}
			}
			for i := range maxKeys - 1 {
				if s.TakeAt(at, fmt.Sprintf("k%d", i), 0, lim, 1).Allowed {
					admitted++
				}
			}
			if admitted != 2 {
				t.Errorf("after the move, admitted %d, want 2 (what hot had left)", admitted)
			}
		})
	}
}
