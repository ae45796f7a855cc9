// Package coordinator agrees on the shard table: which keys are split, and
// to which level, across the instances of one deployment.
//
// Each instance's hot-key detector announces the level it wants for a key
// (Announce). A coordinator turns those announcements into the level in
// force for every key and tells its Handler when that level changes. Local
// applies the local detector alone; NATS shares leases between instances
// over NATS, so a key hot on one instance is split on all.
//
// Coordination is soft state. An announcement of level 4, 16 or 64 is a
// lease with a time to live, renewed while the key stays hot; the level in
// force is the highest over the unexpired leases of all instances, and a key
// no lease holds is merged back (level 1). Nobody announces "cold": leases
// lapse, so lost messages, restarts and partitions heal by themselves.
package coordinator

import "github.com/hotkeyd/hotkey/shard"

// Handler receives what a coordinator decides. Its methods may be called
// from any goroutine, but never concurrently for one Handler, and not after
// the coordinator's Close has returned. They should return quickly.
type Handler interface {
	// SetLevel says the level in force for key, whose hash is hash
	// (shard.NameHash of key, which differs from process to process), is
	// now level: 4, 16 or 64, or 1 when it is no longer split.
	SetLevel(key string, hash uint64, level shard.Level)
	// SetInstances says the number of live instances, at least 1, has
	// changed to n.
	SetInstances(n int)
}

// Coordinator agrees with other instances on the level in force of hot
// keys. Implementations are safe for concurrent use.
type Coordinator interface {
	// Start begins coordination, reporting to h. It is called once, before
	// any Announce.
	Start(h Handler) error
	// Announce says this instance's detector wants key (with hash) at
	// level: 4, 16 or 64, or 1 once the key has cooled here. The call does
	// not block on the network.
	Announce(key string, hash uint64, level shard.Level)
	// Close stops coordination and waits for the coordinator's goroutines.
	Close() error
}

// Reporter is implemented by coordinators that can say what they hold: the
// leases in force and their counters since Start. NATS is one; Local keeps
// nothing to report. Meant for status pages and metrics (see
// hotkey.Engine.HotKeys and Stats), not for the decision path.
type Reporter interface {
	Leases() []Lease
	Stats() Stats
}

// Local is the coordinator of a lone instance: the level in force of a key is
// the one its own detector last announced, and there is one instance. The
// zero value is ready to use.
type Local struct {
	h Handler
}

var _ Coordinator = (*Local)(nil)

// Start implements Coordinator.
func (l *Local) Start(h Handler) error {
	l.h = h
	h.SetInstances(1)
	return nil
}

// Announce implements Coordinator: the announced level is in force at once.
func (l *Local) Announce(key string, hash uint64, level shard.Level) {
	if level.Valid() {
		l.h.SetLevel(key, hash, level)
	}
}

// Close implements Coordinator.
func (l *Local) Close() error { return nil }
