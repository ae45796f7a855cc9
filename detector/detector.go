// Package detector finds, in fixed memory, the few keys whose request rate
// crosses the hot threshold, and says when each should be split a level
// further (1→4→16→64) or merged back a level.
//
// Every key the engine decides on is counted in a Count-Min sketch with
// conservative update for the current sub-window (default 100 ms). The
// sketch is only a filter: a key whose estimate for the sub-window reaches
// the promotion threshold P enters a small exact table, which counts it
// exactly from then on, in steps of a tenth of a sub-window. P is a small
// share of the local threshold (1/32), raised over the sketch's noise when a
// flood of distinct keys loads it. On entry a key is credited with its
// sketch estimates for the sub-window so far, in the current step, and for
// the previous sub-window, in its last step: upper bounds placed no earlier
// than the counts they stand for. So, while the table has room, the detector
// never counts a key lower than an exact counter would (but for races
// between concurrent Observes, a count or two), and higher by at most 2P
// plus the sketch's error, for one sub-window after entry.
//
// A key steps up on the first step at which its count over the last
// sub-window reaches a threshold, to the level that rate calls for: 4 at T,
// 16 at 4T, 64 at 16T, with T the global threshold over the live instances.
// A key going from 0 to 1.2T is up within 0.83 of a sub-window plus a step.
// This assumes counts per sub-window large enough for their noise not to
// matter: a key with Poisson arrivals at rate r shows r·SubWindow ±
// √(r·SubWindow), so at the default 100 counts per sub-window a key at 0.9T
// is split now and then, one at T/2 never. A key steps down one level once
// its rate over the window (default 10 sub-windows) has stayed under half of
// its level's up-threshold for CoolDown, and one more after each further
// CoolDown, so a key swinging around T does not flap.
//
// Memory is fixed at construction, 4.3 MiB by default on two cores: three
// sketches per stripe (the previous sub-window, the current one, and a
// spare being cleared ahead of use), 1.5 MiB a stripe, and a table of
// Capacity keys, however many distinct keys arrive. Only the previous and
// current sketches are read, so the memory one sketch per sub-window of the
// window would take goes into width instead, which keeps the noise, and so
// P, low. Observe counts into the stripe of the processor it runs on (see
// Config.Stripes), so that cores do not pass counters' cache lines back and
// forth; a key's count is the sum over the stripes.
package detector

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"math/bits"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hotkeyd/hotkey/shard"
)

const (
	// promoteShare sets the promotion threshold to at least 1/promoteShare of
	// the local threshold's count per sub-window. Small, so that a key enters
	// the table early in the step where it turns hot and the credit it gets
	// for its past, at most 2P, cannot by itself lift a key at 0.9T over T.
	promoteShare = 32
	// minPromote is the lowest promotion threshold: fewer counts than this
	// in a sub-window is no sign of anything.
	minPromote = 4
	// maxDepth bounds Config.Depth.
	maxDepth = 8
	// maxStripes bounds Config.Stripes.
	maxStripes = 64
)

// defaultStripes returns the default Config.Stripes: GOMAXPROCS rounded up
// to a power of two, at most 4.
func defaultStripes() int {
	return min(4, 1<<bits.Len(uint(runtime.GOMAXPROCS(0)-1)))
}

// ErrInvalidConfig is returned by New for a Config it cannot use.
var ErrInvalidConfig = errors.New("detector: invalid config")

// Config configures a Detector. A zero field takes its default, documented
// here and returned by DefaultConfig.
type Config struct {
	// Threshold is T, the global rate per key in requests per second at
	// which a key is split to level 4; 16 at 4T and 64 at 16T. Each instance
	// compares its local rate with T divided by the live instances (see
	// SetInstances), but never with less than Floor. Default 1000.
	Threshold float64
	// Floor is the lowest local threshold, in requests per second, however
	// many instances share T: a key is split only once this instance alone
	// sees it at Floor (capped at T), so that among many instances a
	// handful of requests in a sub-window does not split a key. 0: none
	// (the default).
	Floor float64
	// SubWindow is the span over which the rate deciding a level-up is
	// measured, and the life of one sketch. Default 100ms.
	SubWindow time.Duration
	// Steps divides a sub-window: the exact table counts per step, the rate
	// deciding a level-up slides by one step, and Tick is due once per step
	// (SubWindow/Steps). Default 10.
	Steps int
	// Slots is the number of sub-windows in the window over which the rate
	// deciding a level-down is measured, and for which a key must stay cold
	// at level 1 before it leaves the exact table. Default 10.
	Slots int
	// CoolDown is how long the window rate must stay under half of a level's
	// up-threshold before the key steps down from it. Default 60s.
	CoolDown time.Duration
	// Width is the number of counters in a sketch row, rounded up to a power
	// of two. Default 65536.
	Width int
	// Depth is the number of rows of a sketch: 1, 2, 4 or 8, with
	// Width·Depth at least 16. Default 4. With the default Width and Depth
	// the three sketches of a stripe take 1.5 MiB.
	Depth int
	// Stripes is the number of sets of sketches, a power of two up to 64.
	// An Observe counts into the set of the processor (the runtime's P) it
	// runs on, so that two cores rarely raise counters on one cache line:
	// on a shared set, moving the line between cores costs more than all
	// else Observe does. Each set takes the memory Width and Depth give.
	// Default: GOMAXPROCS at the time, rounded up to a power of two, at
	// most 4.
	Stripes int
	// Capacity is the number of keys the exact table holds, at most 65535,
	// about 350 bytes each. It should hold every key over the promotion
	// threshold, T/32 per instance or more: at an instance serving R
	// requests/s of n, at most 32·n·R/T keys (with the defaults, 4096 hold
	// any traffic up to 128,000 requests/s, and skewed traffic far beyond).
	// When the table is more than 7/8 full at the end of a sub-window, its
	// coldest level-1 keys make room; a key that finds it full is counted by
	// Rejected. Default 4096.
	Capacity int
	// QueueSize is the capacity of the Events channel. Default 1024.
	QueueSize int
}

// DefaultConfig returns the defaults documented on Config.
func DefaultConfig() Config {
	return Config{
		Threshold: 1000,
		SubWindow: 100 * time.Millisecond,
		Steps:     10,
		Slots:     10,
		CoolDown:  60 * time.Second,
		Width:     1 << 16,
		Depth:     4,
		Stripes:   defaultStripes(),
		Capacity:  4096,
		QueueSize: 1024,
	}
}

// withDefaults fills the zero fields of c and checks the others.
func (c Config) withDefaults() (Config, error) {
	def := DefaultConfig()
	c.Threshold = cmp.Or(c.Threshold, def.Threshold)
	c.SubWindow = cmp.Or(c.SubWindow, def.SubWindow)
	c.Steps = cmp.Or(c.Steps, def.Steps)
	c.Slots = cmp.Or(c.Slots, def.Slots)
	c.CoolDown = cmp.Or(c.CoolDown, def.CoolDown)
	c.Width = cmp.Or(c.Width, def.Width)
	c.Depth = cmp.Or(c.Depth, def.Depth)
	c.Stripes = cmp.Or(c.Stripes, def.Stripes)
	c.Capacity = cmp.Or(c.Capacity, def.Capacity)
	c.QueueSize = cmp.Or(c.QueueSize, def.QueueSize)
	switch {
	case !(c.Threshold > 0) || math.IsInf(c.Threshold, 0):
		return c, fmt.Errorf("%w: Threshold %v", ErrInvalidConfig, c.Threshold)
	case !(c.Floor >= 0) || math.IsInf(c.Floor, 0):
		return c, fmt.Errorf("%w: Floor %v", ErrInvalidConfig, c.Floor)
	case c.Steps < 1 || c.SubWindow < time.Duration(c.Steps):
		return c, fmt.Errorf("%w: SubWindow %v in %d steps", ErrInvalidConfig, c.SubWindow, c.Steps)
	case c.Slots < 1:
		return c, fmt.Errorf("%w: Slots %d", ErrInvalidConfig, c.Slots)
	case c.CoolDown < 0:
		return c, fmt.Errorf("%w: CoolDown %v", ErrInvalidConfig, c.CoolDown)
	case c.Width < 1 || c.Width > 1<<30:
		return c, fmt.Errorf("%w: Width %d", ErrInvalidConfig, c.Width)
	case c.Stripes < 1 || c.Stripes > maxStripes || c.Stripes&(c.Stripes-1) != 0:
		return c, fmt.Errorf("%w: Stripes %d", ErrInvalidConfig, c.Stripes)
	case c.Capacity < 1 || c.Capacity > maxCapacity:
		return c, fmt.Errorf("%w: Capacity %d", ErrInvalidConfig, c.Capacity)
	case c.QueueSize < 0:
		return c, fmt.Errorf("%w: QueueSize %d", ErrInvalidConfig, c.QueueSize)
	}
	c.Width = 1 << bits.Len(uint(c.Width-1))
	if c.Depth < 1 || c.Depth > maxDepth || c.Depth&(c.Depth-1) != 0 || c.Width*c.Depth < blockCells {
		return c, fmt.Errorf("%w: Depth %d with Width %d", ErrInvalidConfig, c.Depth, c.Width)
	}
	return c, nil
}

// Event says that a key should change level.
type Event struct {
	Key  string // as first passed to Observe, copied
	Hash uint64 // as passed to Observe
	// Level is the new level: higher than the old one for a level-up (it
	// may skip levels when a key surges), one level lower for a level-down.
	Level shard.Level
	// Rate is the local rate, in requests per second at this instance, that
	// decided: over the last sub-window for a level-up, over the window for
	// a level-down. Times the live instances, it estimates the global rate.
	Rate float64
}

// hit is an entry's exact counter for the current step, on a cache line of
// its own so that two hot keys counted on two cores do not share one.
type hit struct {
	n atomic.Uint32
	_ [60]byte
}

// entry is the state of a key in the exact table, owned by Tick under mu.
type entry struct {
	key     string
	hash    uint64
	level   shard.Level
	born    int64     // sub-window in which the key entered the table
	warm    int64     // last sub-window whose count reached the promotion threshold
	below   time.Time // since when the window rate has been under half the level's up-threshold; zero if it is not
	stepSum uint64    // count over the last Steps steps
	subAcc  uint64    // count in the current sub-window
	winSum  uint64    // count over the last Slots closed sub-windows
	pos     int       // index in Detector.live
}

// Detector finds hot keys. All its methods are safe for concurrent use.
// Observe takes no lock and does not allocate, except when a key enters the
// exact table: then it copies the key and briefly holds the mutex that Tick
// holds for its pass over the table. The zero value is not usable; call New.
type Detector struct {
	// Read on every Observe, written at most once per step.
	cur      atomic.Int32          // sketch counted into: 0, 1 or 2
	stripeAt atomic.Uint32         // Q, the promotion threshold of a stripe's sketch
	smask    int                   // Stripes-1
	full     atomic.Bool           // no free entry
	table    atomic.Pointer[index] // idx[act]
	sk       sketches
	hits     []hit           // per entry
	hashes   []atomic.Uint64 // per entry: its key's hash, 0 when free
	_        [64]byte

	rejected  atomic.Uint64
	dropped   atomic.Uint64
	promoteAt atomic.Uint32 // P, the promotion threshold in counts per sub-window

	mu        sync.Mutex // guards the fields below, and entries joining the table
	cfg       Config
	events    chan Event
	instances int
	noise     float64 // mean counter of the last closed sketches, or of the current ones if higher, summed over the stripes
	noiseMax  float64 // the same for the stripe with the highest
	pressure  uint32  // lowest promotion threshold after an eviction for room, or 0
	idx       [2]index
	act       int // idx[act] is the index in use
	ents      []entry
	stepCount []uint32 // entry n's counts of the last Steps steps at n·Steps + step%Steps
	subCount  []uint32 // entry n's counts of the last Slots sub-windows at n·Slots + sub%Slots
	live      []int    // entries in use
	free      []int    // entries not in use
	victims   []int    // scratch for Tick
	origin    time.Time
	next      time.Time   // end of the current step
	step      int64       // current step, counted from origin
	stepStart []time.Time // start of step s at s%Steps
	subStart  []time.Time // start of sub-window m at m%Slots
	closed    bool
	stop      chan struct{} // closed by Close to stop the goroutine Start started
	done      chan struct{} // closed when that goroutine returns
}

// New returns a detector configured by cfg, whose first sub-window starts at
// now. All its memory is allocated here.
func New(cfg Config, now time.Time) (*Detector, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	d := &Detector{
		sk:        newSketches(3*cfg.Stripes, cfg.Depth, cfg.Width),
		smask:     cfg.Stripes - 1,
		hits:      make([]hit, cfg.Capacity),
		hashes:    make([]atomic.Uint64, cfg.Capacity),
		cfg:       cfg,
		events:    make(chan Event, cfg.QueueSize),
		instances: 1,
		idx:       [2]index{newIndex(cfg.Capacity), newIndex(cfg.Capacity)},
		ents:      make([]entry, cfg.Capacity),
		stepCount: make([]uint32, cfg.Capacity*cfg.Steps),
		subCount:  make([]uint32, cfg.Capacity*cfg.Slots),
		live:      make([]int, 0, cfg.Capacity),
		free:      make([]int, cfg.Capacity),
		victims:   make([]int, 0, cfg.Capacity),
		origin:    now,
		next:      now.Add(cfg.SubWindow / time.Duration(cfg.Steps)),
		stepStart: make([]time.Time, cfg.Steps),
		subStart:  make([]time.Time, cfg.Slots),
	}
	for i := range d.free {
		d.free[i] = cfg.Capacity - 1 - i
	}
	for i := range d.stepStart {
		d.stepStart[i] = now
	}
	for i := range d.subStart {
		d.subStart[i] = now
	}
	d.table.Store(&d.idx[0])
	d.setPromoteLocked()
	return d, nil
}

// Observe counts one decision on key, whose hash is hash, a uniform 64-bit
// hash of key such as the engine's seeded counter.Hash(key): the detector never hashes the
// key itself, and keys with the same hash count as one. Observe does not keep
// key; a key entering the exact table is copied.
func (d *Detector) Observe(key string, hash uint64) {
	d.observe(procID(), key, hash)
}

// observe is Observe on the processor numbered p.
func (d *Detector) observe(p int, key string, hash uint64) {
	if n := d.table.Load().find(hash, d.hashes); n >= 0 {
		d.hits[n].n.Add(1)
		return
	}
	s := 3*(p&d.smask) + int(d.cur.Load())
	if est := d.sk.add(s, hash); est >= d.stripeAt.Load() {
		d.promote(key, hash, est)
	}
}

// estimate returns the count of hash in slot (0, 1 or 2) summed over the
// stripes.
func (d *Detector) estimate(slot int, hash uint64) uint32 {
	var sum uint64
	for st := range d.smask + 1 {
		sum += uint64(d.sk.estimate(3*st+slot, hash))
	}
	return uint32(min(sum, math.MaxUint32))
}

// promote enters key into the exact table, crediting it with its sketch
// estimates for the current and previous sub-windows.
func (d *Detector) promote(key string, hash uint64, est uint32) {
	if d.full.Load() {
		if est == d.stripeAt.Load() { // once per key, stripe and sub-window, about
			d.rejected.Add(1)
		}
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	ix := d.table.Load()
	if ix.find(hash, d.hashes) >= 0 {
		return // another Observe promoted it meanwhile
	}
	if len(d.free) == 0 {
		d.full.Store(true)
		d.rejected.Add(1)
		return
	}
	n := d.free[len(d.free)-1]
	d.free = d.free[:len(d.free)-1]
	cur := int(d.cur.Load())
	K := int64(d.cfg.Steps)
	sub := d.step / K
	e := &d.ents[n]
	*e = entry{key: strings.Clone(key), hash: hash, level: shard.Level1, born: sub, warm: sub, pos: len(d.live)}
	steps := d.stepCount[n*d.cfg.Steps : (n+1)*d.cfg.Steps]
	clear(steps)
	clear(d.subCount[n*d.cfg.Slots : (n+1)*d.cfg.Slots])
	if sub > 0 { // the previous sub-window's count, as if all in its last step
		prev := d.estimate((cur+2)%3, hash)
		steps[K-1] = prev
		e.stepSum = uint64(prev)
	}
	// The count so far in this sub-window, read again now that concurrent
	// adds of the key have landed, goes into the current step.
	d.hits[n].n.Store(d.estimate(cur, hash))
	d.hashes[n].Store(hash)
	ix.insert(hash, n)
	d.live = append(d.live, n)
	if len(d.free) == 0 {
		d.full.Store(true)
	}
}

// SetInstances sets the number of live instances, n ≥ 1 (less counts as 1):
// from the next step on, local rates are compared with Threshold/n.
func (d *Detector) SetInstances(n int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.instances = max(1, n)
	d.setPromoteLocked()
}

// localLocked returns the local threshold in requests per second: T over
// the live instances, at least the floor (at most T).
func (d *Detector) localLocked() float64 {
	return max(d.cfg.Threshold/float64(d.instances), min(d.cfg.Floor, d.cfg.Threshold))
}

// setPromoteLocked sets the promotion threshold P: a share of the local
// threshold's count per sub-window, or above the sketch's noise or the
// table's pressure if higher, but never above the threshold's count itself,
// so that every key at T still enters the table. It also sets Q, the
// threshold a stripe's sketch checks: P over the stripes, or the lowest
// threshold or above the noisiest stripe's noise if higher, but never above
// the threshold's count over the stripes. A key at T has that count in one stripe at least, so it
// still enters the table however its decisions spread over the processors.
func (d *Detector) setPromoteLocked() {
	full := d.localLocked() * d.cfg.SubWindow.Seconds()
	p := max(minPromote, math.Ceil(full/promoteShare), math.Ceil(2*d.noise)+2, float64(d.pressure))
	p = min(p, max(1, math.Ceil(full)), maxCount)
	n := float64(d.smask + 1)
	q := max(minPromote, math.Ceil(p/n), math.Ceil(2*d.noiseMax)+2)
	q = min(q, max(1, math.Ceil(full/n)), maxCount)
	d.promoteAt.Store(uint32(p))
	if uint32(q) != d.stripeAt.Load() { // every Observe reads this cache line
		d.stripeAt.Store(uint32(q))
	}
}

// Events returns the channel on which level changes are delivered, in the
// order Tick decided them. It holds QueueSize events; an event that finds it
// full is dropped and counted by Dropped, so a slow reader never blocks Tick,
// let alone Observe. Close closes it.
func (d *Detector) Events() <-chan Event { return d.events }

// Dropped returns the number of events dropped because Events was full.
func (d *Detector) Dropped() uint64 { return d.dropped.Load() }

// Rejected returns the number of times a key over the promotion threshold
// could not enter the exact table because it was full: about once per key
// and sub-window while the table stays full.
func (d *Detector) Rejected() uint64 { return d.rejected.Load() }

// Start calls Tick once per step (SubWindow/Steps) on a goroutine of its own,
// with the times a time.Ticker reports, until Close. It is shorthand for
// owners on the wall clock; the first tick is aligned with the end of a step
// when the origin passed to New is within a step of the wall clock. Start
// panics if called twice or after Close.
func (d *Detector) Start() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.stop != nil || d.closed {
		panic("detector: Start called twice or after Close")
	}
	d.stop, d.done = make(chan struct{}), make(chan struct{})
	go d.run(d.stop, d.done, time.Until(d.next))
}

func (d *Detector) run(stop <-chan struct{}, done chan<- struct{}, wait time.Duration) {
	defer close(done)
	step := d.cfg.SubWindow / time.Duration(d.cfg.Steps)
	if wait < 0 || wait > step {
		wait = 0
	}
	first := time.NewTimer(wait)
	defer first.Stop()
	select {
	case <-stop:
		return
	case now := <-first.C:
		d.Tick(now)
	}
	t := time.NewTicker(step)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case now := <-t.C:
			d.Tick(now)
		}
	}
}

// Close stops the goroutine Start started and waits for it, then closes the
// Events channel. Afterwards Tick does nothing and Observe only counts.
// Close is idempotent.
func (d *Detector) Close() {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return
	}
	d.closed = true
	stop, done := d.stop, d.done
	d.mu.Unlock()
	if stop != nil {
		close(stop)
		<-done
	}
	close(d.events)
}
