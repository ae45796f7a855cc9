package split

import (
	"slices"

	"github.com/hotkeyd/hotkey/shard"
)

// Counters are a key's counters at one level, named under one placement (nil
// for one node). The unsplit counter (Level1) has one name whatever the
// placement.
type Counters struct {
	Level shard.Level
	P     shard.Placement
}

// same reports whether c and d name the same counters.
func (c Counters) same(d Counters) bool {
	return c.Level == d.Level && (c.Level == shard.Level1 || version(c.P) == version(d.P))
}

// Levels is a set of levels.
type Levels uint8

// LevelsOf returns the set of ls.
func LevelsOf(ls ...shard.Level) Levels {
	var s Levels
	for _, l := range ls {
		s |= bit(l)
	}
	return s
}

// Has reports whether s holds l.
func (s Levels) Has(l shard.Level) bool { return s&bit(l) != 0 }

// bit is l's bit in a Levels, 0 for an invalid level.
func bit(l shard.Level) Levels {
	if !l.Valid() {
		return 0
	}
	return 1 << l.Index()
}

// levels are the levels in the order a plan reads them.
var levels = [...]shard.Level{shard.Level1, shard.Level4, shard.Level16, shard.Level64}

// Plan returns the counters a move of a key's usage to the counters to reads,
// in order. held are the counters that hold the usage; visited the levels
// the key was set to since the usage last moved, whose counters other
// instances may have taken from; places the placements those may have been
// named under (to's is added). Held comes first, unless it is to; then each
// visited level under each placement, but to and held, and the unsplit
// counter only for a move between split levels. Seeding never lowers a
// counter, so reading a counter twice would cost nothing but a read; Plan
// reads each once. The plan is empty when to holds the usage already.
func Plan(held Counters, visited Levels, places []shard.Placement, to Counters) []Counters {
	if held.same(to) && visited&^bit(to.Level) == 0 {
		return nil
	}
	var out []Counters
	if !held.same(to) {
		out = append(out, held)
	}
	if !slices.ContainsFunc(places, func(q shard.Placement) bool { return version(q) == version(to.P) }) {
		places = append(places[:len(places):len(places)], to.P)
	}
	for _, l := range levels {
		if !visited.Has(l) {
			continue
		}
		if l == shard.Level1 {
			if to.Level != shard.Level1 && held.Level != shard.Level1 {
				out = append(out, Counters{l, to.P})
			}
			continue
		}
		for _, q := range places {
			c := Counters{l, q}
			if c.same(to) || c.same(held) {
				continue
			}
			out = append(out, c)
		}
	}
	return out
}

// version returns p's version, 0 for no placement.
func version(p shard.Placement) uint64 {
	if p == nil {
		return 0
	}
	return p.Version()
}
