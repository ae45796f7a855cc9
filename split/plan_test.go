package split

import (
	"fmt"
	"slices"
	"testing"

	"github.com/hotkeyd/hotkey/shard"
)

// versioned is a placement that differs from another only by its version.
type versioned uint64

func (versioned) Nodes() int        { return 1 }
func (versioned) Node(string) int   { return 0 }
func (v versioned) Version() uint64 { return uint64(v) }

func TestPlan(t *testing.T) {
	v1, v2 := versioned(1), versioned(2)
	at := func(l shard.Level, p shard.Placement) Counters { return Counters{l, p} }
	tests := []struct {
		name    string
		held    Counters
		visited Levels
		places  []shard.Placement
		to      Counters
		want    []Counters
	}{
		{
			name: "held at the target",
			held: at(16, nil), visited: LevelsOf(16), to: at(16, nil),
		},
		{
			name: "held at the target, noted under another placement",
			held: at(16, v2), visited: LevelsOf(16), places: []shard.Placement{v1, v2}, to: at(16, v2),
		},
		{
			name: "unsplit under any placement",
			held: at(1, v1), visited: LevelsOf(1), to: at(1, v2),
		},
		{
			name: "split",
			held: at(1, nil), visited: LevelsOf(16), to: at(16, nil),
			want: []Counters{at(1, nil)},
		},
		{
			name: "merge",
			held: at(16, nil), visited: LevelsOf(1), to: at(1, nil),
			want: []Counters{at(16, nil)},
		},
		{
			name: "new placement",
			held: at(16, v1), visited: LevelsOf(16), places: []shard.Placement{v1}, to: at(16, v2),
			want: []Counters{at(16, v1)},
		},
		{
			name: "a level visited between",
			held: at(1, nil), visited: LevelsOf(4, 16), to: at(16, nil),
			want: []Counters{at(1, nil), at(4, nil)},
		},
		{
			name: "the unsplit counter visited between split levels",
			held: at(4, nil), visited: LevelsOf(1, 16), to: at(16, nil),
			want: []Counters{at(4, nil), at(1, nil)},
		},
		{
			name: "the unsplit counter visited, merging",
			held: at(4, nil), visited: LevelsOf(1, 4), to: at(1, nil),
			want: []Counters{at(4, nil)},
		},
		{
			name: "visited levels under each placement noted",
			held: at(16, v1), visited: LevelsOf(4, 16), places: []shard.Placement{v1, v2}, to: at(16, v2),
			want: []Counters{at(16, v1), at(4, v1), at(4, v2)},
		},
		{
			name: "the target under an older placement",
			held: at(4, v2), visited: LevelsOf(16), places: []shard.Placement{v1, v2}, to: at(16, v2),
			want: []Counters{at(4, v2), at(16, v1)},
		},
		{
			name: "the target's placement not noted",
			held: at(1, nil), visited: LevelsOf(4, 16), places: []shard.Placement{v1}, to: at(16, v2),
			want: []Counters{at(1, nil), at(4, v1), at(4, v2), at(16, v1)},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			places := slices.Clone(tt.places)
			got := Plan(tt.held, tt.visited, tt.places, tt.to)
			if !slices.EqualFunc(got, tt.want, Counters.same) {
				t.Errorf("Plan = %v, want %v", show(got), show(tt.want))
			}
			if !slices.Equal(places, tt.places) {
				t.Errorf("Plan changed its places: %v", tt.places)
			}
		})
	}
}

func show(cs []Counters) []string {
	out := make([]string, len(cs))
	for i, c := range cs {
		out[i] = fmt.Sprintf("%d@v%d", c.Level, version(c.P))
	}
	return out
}
