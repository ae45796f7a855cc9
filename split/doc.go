// Package split owns the life of a split key: its level, which counters hold
// its usage, the gate between the decisions that take from those counters
// and the moves that carry the usage to others, the plan of which counters a
// move reads, and which keys a full table keeps.
//
// A key's usage is held by the counters of one level under one placement
// (Counters). When the key's level or the store's node map changes, the
// first decision moves the usage (Plan says from where; a Mover given to the
// Table does the store's side) before any decision takes from the new
// counters, and no decision takes from the old ones while they are read:
// a unit a decision took is never left behind by a move.
package split
