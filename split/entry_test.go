package split

import (
	"slices"
	"testing"
	"time"

	"github.com/hotkeyd/hotkey/counter"
	"github.com/hotkeyd/hotkey/shard"
)

// TestEntryShards: Shards yields the subcounters of a level in index order,
// named and hashed as Sub names them, each with its Share of the limit,
// leaves out those whose share is nothing, and stops when the loop does;
// the bursts of all four sum to the limit's.
func TestEntryShards(t *testing.T) {
	e := NewEntry("k", shard.NameHash("k"), shard.Level4, shard.Level1, nil)
	for _, tt := range []struct {
		give counter.Limit
		want []int   // the indexes yielded
		rate []int64 // and their rates
	}{
		{counter.Limit{Rate: 6, Burst: 10, Period: time.Second}, []int{0, 1, 2, 3}, []int64{2, 2, 1, 1}},
		{counter.Limit{Rate: 2, Burst: 10, Period: time.Second}, []int{0, 1}, []int64{1, 1}},
		{counter.Limit{Algorithm: counter.FixedWindow, Rate: 3, Period: time.Second}, []int{0, 1, 2}, []int64{1, 1, 1}},
	} {
		var got []int
		var burst int64
		for i, c := range e.Shards(shard.Level4, nil, tt.give) {
			name, hash := e.Sub(shard.Level4, i, nil)
			if c.Name != name || c.Hash != hash || c.Limit != Share(tt.give, tt.give.Capacity(), shard.Level4, i) {
				t.Errorf("%+v: subcounter %d: %+v, want %s %x under its share", tt.give, i, c, name, hash)
			}
			if n := len(got); n < len(tt.rate) && c.Limit.Rate != tt.rate[n] {
				t.Errorf("%+v: subcounter %d: rate %d, want %d", tt.give, i, c.Limit.Rate, tt.rate[n])
			}
			got = append(got, i)
			burst += c.Limit.Burst
		}
		if !slices.Equal(got, tt.want) {
			t.Errorf("%+v: yielded %v, want %v", tt.give, got, tt.want)
		}
		if len(got) == 4 && tt.give.Algorithm == counter.TokenBucket && burst != tt.give.Burst {
			t.Errorf("%+v: bursts sum to %d, want %d", tt.give, burst, tt.give.Burst)
		}
	}
	n := 0
	for range e.Shards(shard.Level4, nil, counter.PerSecond(100)) {
		if n++; n == 2 {
			break
		}
	}
	if n != 2 {
		t.Errorf("a loop that stops at 2 ran %d times", n)
	}
}
