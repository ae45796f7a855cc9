package detector

import (
	"strconv"
	"testing"
	"time"

	"github.com/cespare/xxhash/v2"
)

// epoch is the fixed instant simulated clocks start at.
var epoch = time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)

// sim drives a detector on a simulated clock, one step at a time, and
// records the events with the time of the tick that emitted them.
type sim struct {
	t      testing.TB
	d      *Detector
	cfg    Config
	now    time.Time
	step   time.Duration
	events []simEvent
}

type simEvent struct {
	Event
	At time.Time
}

func newSim(t testing.TB, cfg Config) *sim {
	t.Helper()
	d, err := New(cfg, epoch)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Close)
	cfg, _ = cfg.withDefaults()
	return &sim{t: t, d: d, cfg: cfg, now: epoch, step: cfg.SubWindow / time.Duration(cfg.Steps)}
}

// tick advances the clock by one step, ticks, and collects events.
func (s *sim) tick() {
	s.now = s.now.Add(s.step)
	s.d.Tick(s.now)
	for {
		select {
		case ev := <-s.d.Events():
			s.events = append(s.events, simEvent{ev, s.now})
		default:
			return
		}
	}
}

// source is a key sending at a rate set by the test, with evenly spaced
// arrivals: each step it sends the whole arrivals that fall in it.
type source struct {
	key  string
	hash uint64
	rate float64 // requests per second
	acc  float64 // arrivals owed, fractional
}

func newSource(key string) *source {
	return &source{key: key, hash: xxhash.Sum64String(key)}
}

// send observes the source's arrivals in a step of length dt.
func (src *source) send(d *Detector, dt time.Duration) {
	src.acc += src.rate * dt.Seconds()
	n := int(src.acc)
	src.acc -= float64(n)
	for range n {
		d.Observe(src.key, src.hash)
	}
}

// run sends every source for one step, then ticks.
func (s *sim) run(srcs ...*source) {
	for _, src := range srcs {
		src.send(s.d, s.step)
	}
	s.tick()
}

// eventsOf returns the events of key.
func (s *sim) eventsOf(key string) []simEvent {
	var out []simEvent
	for _, ev := range s.events {
		if ev.Key == key {
			out = append(out, ev)
		}
	}
	return out
}

func keyName(prefix string, i int) string { return prefix + strconv.Itoa(i) }
