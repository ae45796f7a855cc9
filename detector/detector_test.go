package detector

import (
	"errors"
	"math"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/hotkeyd/hotkey/shard"
)

func TestConfig(t *testing.T) {
	def := DefaultConfig()
	rounded := def
	rounded.Width = 1024
	deep := def
	deep.Width, deep.Depth = 256, 8
	for _, tt := range []struct {
		name string
		give Config
		want Config // if no error
		err  bool
	}{
		{name: "zero is the defaults", give: Config{}, want: def},
		{name: "width rounds up", give: Config{Width: 1000}, want: rounded},
		{name: "eight rows of 256", give: Config{Width: 200, Depth: 8}, want: deep},
		{name: "negative threshold", give: Config{Threshold: -1}, err: true},
		{name: "NaN threshold", give: Config{Threshold: math.NaN()}, err: true},
		{name: "infinite threshold", give: Config{Threshold: math.Inf(1)}, err: true},
		{name: "negative steps", give: Config{Steps: -1}, err: true},
		{name: "sub-window shorter than steps", give: Config{SubWindow: 5, Steps: 10}, err: true},
		{name: "negative slots", give: Config{Slots: -1}, err: true},
		{name: "negative cool-down", give: Config{CoolDown: -time.Second}, err: true},
		{name: "negative width", give: Config{Width: -1}, err: true},
		{name: "depth not a power of two", give: Config{Depth: 3}, err: true},
		{name: "depth over 8", give: Config{Depth: 16}, err: true},
		{name: "sketch smaller than a block", give: Config{Width: 2, Depth: 4}, err: true},
		{name: "stripes not a power of two", give: Config{Stripes: 3}, err: true},
		{name: "stripes over 64", give: Config{Stripes: 128}, err: true},
		{name: "negative stripes", give: Config{Stripes: -2}, err: true},
		{name: "capacity over the index", give: Config{Capacity: 1 << 16}, err: true},
		{name: "negative queue", give: Config{QueueSize: -1}, err: true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, err := tt.give.withDefaults()
			if tt.err {
				if !errors.Is(err, ErrInvalidConfig) {
					t.Fatalf("error %v, want ErrInvalidConfig", err)
				}
				if _, err := New(tt.give, epoch); !errors.Is(err, ErrInvalidConfig) {
					t.Fatalf("New: error %v, want ErrInvalidConfig", err)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("got %+v, %v; want %+v", got, err, tt.want)
			}
		})
	}
}

func TestLevelFor(t *testing.T) {
	for _, tt := range []struct {
		give float64 // rate, with a local threshold of 100
		want shard.Level
	}{
		{0, 1}, {99.9, 1}, {100, 4}, {399, 4}, {400, 16}, {1599, 16}, {1600, 64}, {1e9, 64},
	} {
		if got := levelFor(tt.give, 100); got != tt.want {
			t.Errorf("levelFor(%v) = %d, want %d", tt.give, got, tt.want)
		}
	}
}

// TestStepUp: a key steps up on the first step over a threshold, to the
// level its rate calls for, and reports its local rate.
func TestStepUp(t *testing.T) {
	s := newSim(t, Config{Threshold: 1000, Width: 1024})
	k := newSource("k")
	for _, tt := range []struct {
		rate float64
		want shard.Level // level after one sub-window
	}{
		{900, 1}, {1200, 4}, {3900, 4}, {5000, 16}, {20000, 64}, {100, 64},
	} {
		k.rate = tt.rate
		for range s.cfg.Steps {
			s.run(k)
		}
		evs := s.eventsOf("k")
		got := shard.Level1
		if len(evs) > 0 {
			got = evs[len(evs)-1].Level
		}
		if got != tt.want {
			t.Fatalf("at %v/s: level %d, want %d (events %+v)", tt.rate, got, tt.want, evs)
		}
	}
	// From nothing to 20T: the rate is measured over at least a sub-window,
	// so the key climbs as its count does, and is at 64 within 0.8 of one.
	j := newSource("j")
	j.rate = 20000
	for range s.cfg.Steps * 8 / 10 {
		s.run(j)
	}
	evs := s.eventsOf("j")
	for i, ev := range evs {
		if ev.Hash != j.hash || i > 0 && ev.Level <= evs[i-1].Level || ev.Rate < upRate(ev.Level, 1000) {
			t.Fatalf("events %+v, want increasing levels, each at its threshold", evs)
		}
	}
	if len(evs) == 0 || evs[len(evs)-1].Level != 64 {
		t.Fatalf("events %+v, want the key at 64", evs)
	}
	// From 3.9T to 20T, within one step: straight to 64.
	i := newSource("i")
	i.rate = 3900
	for range s.cfg.Steps {
		s.run(i)
	}
	i.rate = 200000
	s.run(i)
	if evs := s.eventsOf("i"); len(evs) != 2 || evs[1].Level != 64 {
		t.Fatalf("events %+v, want up to 4, then straight to 64", evs)
	}
}

// TestSetInstances: the local threshold is T over the live instances, and
// changes at run time.
func TestSetInstances(t *testing.T) {
	s := newSim(t, Config{Threshold: 1000, Width: 1024})
	k := newSource("k")
	k.rate = 300 // local
	for range 20 {
		s.run(k)
	}
	if evs := s.eventsOf("k"); len(evs) != 0 {
		t.Fatalf("one instance: events %+v, want none", evs)
	}
	s.d.SetInstances(4) // local threshold 250
	for range 20 {
		s.run(k)
	}
	evs := s.eventsOf("k")
	if len(evs) != 1 || evs[0].Level != 4 || math.Abs(evs[0].Rate-300) > 10 {
		t.Fatalf("four instances: events %+v, want a step up to 4 at 300/s", evs)
	}
	s.d.SetInstances(0) // counts as one
	if got := s.d.localLocked(); got != 1000 {
		t.Fatalf("local threshold %v after SetInstances(0), want 1000", got)
	}
}

// TestFloor: among many instances the local threshold stops at Floor, so
// a key this instance sees at under Floor is not split however small T/N
// is; a Floor over T is capped at T.
func TestFloor(t *testing.T) {
	s := newSim(t, Config{Threshold: 10000, Floor: 1000, Width: 1024})
	s.d.SetInstances(20) // T/N = 500
	if got := s.d.localLocked(); got != 1000 {
		t.Fatalf("local threshold %v with 20 instances and a floor of 1000, want 1000", got)
	}
	k := newSource("k")
	k.rate = 700 // over T/N, under the floor
	for range 50 {
		s.run(k)
	}
	if evs := s.eventsOf("k"); len(evs) != 0 {
		t.Fatalf("a key at 700/s under a floor of 1000: events %+v, want none", evs)
	}
	k.rate = 1500
	for range 20 {
		s.run(k)
	}
	if evs := s.eventsOf("k"); len(evs) != 1 || evs[0].Level != 4 {
		t.Fatalf("a key at 1500/s over a floor of 1000: events %+v, want a step up to 4", evs)
	}
	s.d.SetInstances(2) // T/N = 5000, over the floor
	if got := s.d.localLocked(); got != 5000 {
		t.Fatalf("local threshold %v with 2 instances, want T/N = 5000", got)
	}

	capped := newSim(t, Config{Threshold: 50, Floor: 100, Width: 1024})
	capped.d.SetInstances(4)
	if got := capped.d.localLocked(); got != 50 {
		t.Fatalf("local threshold %v with T 50 and a floor of 100, want T", got)
	}
	if _, err := New(Config{Floor: -1}, epoch); err == nil {
		t.Error("a negative floor: no error")
	}
}

// TestTickTiming: ticks before the end of a step do nothing, and a late
// tick counts the time that really passed, so rates stay right when ticks
// are missed.
func TestTickTiming(t *testing.T) {
	s := newSim(t, Config{Threshold: 1000, Width: 1024})
	s.d.Tick(epoch.Add(s.step - 1))
	if s.d.step != 0 {
		t.Fatalf("a tick before the end of the step closed it")
	}
	warm, hot := newSource("warm"), newSource("hot")
	warm.rate, hot.rate = 900, 1200
	for range 200 { // tick every third step only
		for range 3 {
			warm.send(s.d, s.step)
			hot.send(s.d, s.step)
		}
		s.now = s.now.Add(2 * s.step)
		s.tick()
	}
	if evs := s.eventsOf("warm"); len(evs) != 0 {
		t.Errorf("key at 0.9T, late ticks: events %+v, want none", evs)
	}
	if evs := s.eventsOf("hot"); len(evs) != 1 || evs[0].Level != 4 {
		t.Errorf("key at 1.2T, late ticks: events %+v, want a step up to 4", evs)
	}
}

// TestEventsFull: a full queue drops events and counts them; it never
// blocks Tick.
func TestEventsFull(t *testing.T) {
	s := newSim(t, Config{Threshold: 1000, Width: 1024, QueueSize: 1})
	srcs := []*source{newSource("a"), newSource("b"), newSource("c")}
	for _, src := range srcs {
		src.rate = 5000
	}
	for range 5 {
		for _, src := range srcs {
			src.send(s.d, s.step)
		}
		s.now = s.now.Add(s.step)
		s.d.Tick(s.now) // nobody reads Events
	}
	if got := len(s.d.Events()); got != 1 {
		t.Errorf("%d events queued, want 1", got)
	}
	if got := s.d.Dropped(); got != 2 {
		t.Errorf("Dropped() = %d, want 2", got)
	}
}

// TestEviction: a key that stays cold at level 1 for the window leaves the
// exact table; a key that cools after a level-up stays until it is back at
// level 1 and cold.
func TestEviction(t *testing.T) {
	s := newSim(t, Config{Threshold: 1000, Width: 1024, CoolDown: time.Second})
	warm, hot := newSource("warm"), newSource("hot")
	warm.rate, hot.rate = 500, 2000
	for range s.cfg.Steps {
		s.run(warm, hot)
	}
	if n := len(s.d.live); n != 2 {
		t.Fatalf("%d keys in the table, want 2", n)
	}
	warm.rate, hot.rate = 0, 0
	for range (s.cfg.Slots + 1) * s.cfg.Steps {
		s.run(warm, hot)
	}
	if s.d.table.Load().find(warm.hash, s.d.hashes) >= 0 {
		t.Errorf("the cold key is still in the table")
	}
	if s.d.table.Load().find(hot.hash, s.d.hashes) < 0 {
		t.Errorf("the key at level 4 left the table")
	}
	for range 3 * s.cfg.Slots * s.cfg.Steps { // cool down, then cold for the window
		s.run(warm, hot)
	}
	if n := len(s.d.live); n != 0 {
		t.Errorf("%d keys left in the table, want 0", n)
	}
	if evs := s.eventsOf("hot"); len(evs) != 2 || evs[1].Level != 1 {
		t.Errorf("events %+v, want up to 4 and down to 1", evs)
	}
	if full := s.d.full.Load(); full {
		t.Errorf("table full after evictions")
	}
}

// TestTableFull: a key that finds the table full is counted as rejected;
// at the end of the sub-window the coldest level-1 keys make room, and the
// hot key gets in and steps up within the next sub-window.
func TestTableFull(t *testing.T) {
	const capacity = 16
	s := newSim(t, Config{Threshold: 1000, Width: 1024, Capacity: capacity})
	var srcs []*source
	for i := range capacity {
		src := newSource(keyName("warm", i))
		src.rate = 400 + 10*float64(i) // in the table at the first step
		srcs = append(srcs, src)
	}
	hot := newSource("hot")
	hot.rate = 2000
	srcs = append(srcs, hot) // sends after the others
	for range s.cfg.Steps {
		s.run(srcs...)
	}
	if s.d.Rejected() == 0 {
		t.Fatalf("Rejected() = 0 with a full table")
	}
	if evs := s.eventsOf("hot"); len(evs) != 0 {
		t.Fatalf("hot key stepped up while it could not get in: %+v", evs)
	}
	for i, src := range srcs[:capacity] {
		if in := s.d.table.Load().find(src.hash, s.d.hashes) >= 0; in != (i >= capacity/4) {
			t.Errorf("%s in the table: %v, want only the 3/4 warmest", src.key, in)
		}
	}
	for range s.cfg.Steps {
		s.run(srcs...)
	}
	if evs := s.eventsOf("hot"); len(evs) != 1 || evs[0].Level != 4 {
		t.Fatalf("hot key: events %+v, want a step up to 4", evs)
	}
	if n := len(s.d.live); n > capacity {
		t.Fatalf("%d keys in a table of %d", n, capacity)
	}
}

// TestConcurrent observes from several goroutines while another ticks: the
// exact table counts a hot key exactly (its entry credit aside), and the
// race detector sees the lock-free paths.
func TestConcurrent(t *testing.T) {
	const (
		workers = 4
		perStep = 15 // per worker: 1500/s each, 6000/s in all
	)
	s := newSim(t, Config{Threshold: 1000, Width: 4096})
	hot := newSource("hot")
	sent := 0
	for step := range 3 * s.cfg.Steps {
		var wg sync.WaitGroup
		for w := range workers {
			wg.Go(func() {
				for i := range perStep {
					s.d.Observe(hot.key, hot.hash)
					k := keyName("cold", (step*workers+w)*perStep+i)
					s.d.Observe(k, xxhash.Sum64String(k))
				}
			})
		}
		if step%2 == 0 { // a concurrent tick, a no-op before the end of the step
			wg.Go(func() { s.d.Tick(s.now.Add(s.step / 2)) })
		}
		wg.Wait()
		sent += workers * perStep
		s.tick()
	}
	n := s.d.table.Load().find(hot.hash, s.d.hashes)
	if n < 0 {
		t.Fatal("hot key not in the table")
	}
	s.d.mu.Lock()
	got := s.d.ents[n].stepSum
	s.d.mu.Unlock()
	want := uint64(s.cfg.Steps * workers * perStep)
	if got < want-workers || got > want+5 {
		t.Errorf("hot key counted %d over the last sub-window, want %d", got, want)
	}
	if evs := s.eventsOf("hot"); len(evs) == 0 || evs[len(evs)-1].Level != 16 {
		t.Errorf("events %+v, want the key up to 16", evs)
	}
}

// TestStart: Start ticks on the wall clock until Close, which closes Events.
func TestStart(t *testing.T) {
	d, err := New(Config{Threshold: 1000}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	d.Start()
	k := "k"
	h := xxhash.Sum64String(k)
	// A flood far over 16T per sub-window on the machine's clock: the key
	// steps up to 64, at once or (if the flood is slow to start) through
	// lower levels, however the wall-clock steps fall.
	start := time.Now()
	deadline := time.After(time.Minute)
	for level := shard.Level1; level < shard.Level64; {
		for range 1000 {
			d.Observe(k, h)
		}
		select {
		case ev := <-d.Events():
			if ev.Key != k || ev.Level <= level {
				t.Fatalf("event %+v at level %d, want %s stepping up", ev, level, k)
			}
			level = ev.Level
		case <-deadline:
			t.Fatalf("%s at level %d after a minute of wall-clock ticking, want 64", k, level)
		default:
		}
	}
	t.Logf("up to 64 %v after the flood began", time.Since(start))
	d.Close()
	d.Close() // idempotent
	if _, ok := <-d.Events(); ok {
		t.Error("Events not closed by Close")
	}
	d.Tick(time.Now().Add(time.Hour)) // a no-op after Close
	d.Observe(k, h)
	for _, start := range []func(){d.Start} {
		func() {
			defer func() {
				if recover() == nil {
					t.Error("Start after Close did not panic")
				}
			}()
			start()
		}()
	}
	d2, _ := New(Config{}, time.Now())
	d2.Start()
	func() {
		defer func() {
			if recover() == nil {
				t.Error("second Start did not panic")
			}
		}()
		d2.Start()
	}()
	d2.Close()
}

// TestConcurrentTick ticks while Observes run: sketches rotate, keys enter
// and leave the table and the index is rebuilt under lock-free lookups. The
// race detector checks the lock-free paths; the hot key is found. Each tick
// waits for the observers to make progress, yielding, so that the outcome
// does not depend on scheduling.
func TestConcurrentTick(t *testing.T) {
	s := newSim(t, Config{Threshold: 1000, Width: 1024, Capacity: 64})
	stop := make(chan struct{})
	var done atomic.Int64 // Observe pairs made
	var wg sync.WaitGroup
	for w := range 2 {
		wg.Go(func() {
			hot := newSource("hot")
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				s.d.Observe(hot.key, hot.hash)
				k := keyName("warm", w*100+i%100) // come and go from the table
				s.d.Observe(k, xxhash.Sum64String(k))
				done.Add(1)
			}
		})
	}
	for step := range int64(5 * s.cfg.Slots * s.cfg.Steps) {
		for done.Load() < 50*(step+1) { // ≥ 50 hot per step: ≥ 5T
			runtime.Gosched()
		}
		s.tick()
	}
	close(stop)
	wg.Wait()
	if evs := s.eventsOf("hot"); len(evs) == 0 {
		t.Error("hot key never stepped up")
	}
}

// TestStripes: a key's decisions may spread over the processors, and so
// over the stripes' sketches, however they like; a key over the local
// threshold still enters the table and steps up, one under it does not.
// With 10 instances and 8 stripes the local threshold is 10 counts per
// sub-window, under 2 per stripe: the stripe threshold must go that low.
func TestStripes(t *testing.T) {
	for _, spread := range []struct {
		name   string
		stripe func(i int) int
	}{
		{"round robin", func(i int) int { return i }},
		{"one stripe", func(int) int { return 5 }},
		{"two stripes", func(i int) int { return i % 2 * 3 }},
	} {
		t.Run(spread.name, func(t *testing.T) {
			s := newSim(t, Config{Threshold: 1000, Width: 1024, Stripes: 8})
			s.d.SetInstances(10) // local threshold 100/s
			hot, cold := newSource("hot"), newSource("cold")
			hot.rate, cold.rate = 120, 50
			noise := uint64(0)
			i := 0
			for range 3 * s.cfg.Steps {
				for _, src := range []*source{hot, cold} {
					src.acc += src.rate * s.step.Seconds()
					for ; src.acc >= 1; src.acc-- {
						s.d.observe(spread.stripe(i), src.key, src.hash)
						i++
					}
				}
				for range 200 { // distinct keys, so that the sketches are not empty
					noise++
					s.d.observe(int(noise), "noise", noise*0x9e3779b97f4a7c15)
				}
				s.tick()
			}
			if evs := s.eventsOf("hot"); len(evs) != 1 || evs[0].Level != 4 {
				t.Errorf("hot key at 1.2 times the local threshold: events %+v, want one step up to 4", evs)
			}
			if evs := s.eventsOf("cold"); len(evs) != 0 {
				t.Errorf("key at half the local threshold: events %+v, want none", evs)
			}
			if q, full := s.d.stripeAt.Load(), 10.0; float64(q) > math.Ceil(full/8) {
				t.Errorf("stripe threshold %d, want at most %v", q, math.Ceil(full/8))
			}
		})
	}
}
