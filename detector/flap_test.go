package detector

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/hotkeyd/hotkey/shard"
)

// poisson returns a Poisson variate of mean lambda (small: Knuth's method).
func poisson(r *rand.Rand, lambda float64) int {
	l, k, p := math.Exp(-lambda), 0, 1.0
	for {
		if p *= r.Float64(); p <= l {
			return k
		}
		k++
	}
}

// The flapping tests run 14 simulated minutes, 84,000 steps, and are about
// one key: they use a tiny sketch, so that clearing it is cheap under the
// race detector.

// TestNoFlapping swings a key between 0.8T and 1.2T every 5s for 10
// minutes: it steps up once and never down, since 0.8T is far over half of
// T. Then it drops to 0.3T, under T/2: it steps down once, CoolDown after
// its window rate fell under T/2, and no more.
func TestNoFlapping(t *testing.T) {
	for _, tt := range []struct {
		name    string
		poisson bool // Poisson arrivals, 80 to 120 per sub-window: some 0.8T sub-windows read over T
	}{
		{"even", false},
		{"poisson", true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s := newSim(t, Config{Threshold: 1000, Width: 64})
			r := rand.New(rand.NewPCG(5, 6))
			k := newSource("k")
			send := func(rate float64) {
				if !tt.poisson {
					k.rate = rate
					k.send(s.d, s.step)
				} else {
					for range poisson(r, rate*s.step.Seconds()) {
						s.d.Observe(k.key, k.hash)
					}
				}
				s.tick()
			}
			for s.now.Before(epoch.Add(10 * time.Minute)) {
				rate := 800.0
				if s.now.Sub(epoch)/(5*time.Second)%2 == 1 {
					rate = 1200
				}
				send(rate)
			}
			ups := s.eventsOf("k")
			t.Logf("10 minutes swinging between 0.8T and 1.2T every 5s: %d events %+v", len(ups), ups)
			if len(ups) != 1 || ups[0].Level != 4 {
				t.Fatalf("events %+v, want one step up to 4", ups)
			}
			if !tt.poisson && ups[0].At.Sub(epoch) > 5*time.Second+s.cfg.SubWindow {
				t.Errorf("stepped up at %v, want within a sub-window of the first 1.2T phase", ups[0].At.Sub(epoch))
			}
			drop := s.now
			for s.now.Before(drop.Add(4 * s.cfg.CoolDown)) {
				send(300)
			}
			downs := s.eventsOf("k")[1:]
			t.Logf("after the drop to 0.3T: events %+v", downs)
			if len(downs) != 1 || downs[0].Level != 1 {
				t.Fatalf("events after the drop %+v, want one step down to 1", downs)
			}
			window := time.Duration(s.cfg.Slots) * s.cfg.SubWindow
			if at := downs[0].At.Sub(drop); at < s.cfg.CoolDown || at > s.cfg.CoolDown+window {
				t.Errorf("stepped down %v after the drop, want CoolDown (%v) plus at most a window", at, s.cfg.CoolDown)
			}
		})
	}
}

// TestCoolDownPerLevel: a key at 64 that drops under T/2 steps down one
// level per CoolDown: 16, 4, 1, exactly CoolDown apart.
func TestCoolDownPerLevel(t *testing.T) {
	s := newSim(t, Config{Threshold: 1000, Width: 64})
	k := newSource("k")
	k.rate = 20000
	for range 10 * s.cfg.Steps {
		s.run(k)
	}
	if evs := s.eventsOf("k"); len(evs) == 0 || evs[len(evs)-1].Level != 64 {
		t.Fatalf("events %+v, want the key at 64", evs)
	}
	ups := len(s.eventsOf("k"))
	k.rate = 300
	drop := s.now
	for s.now.Before(drop.Add(5 * s.cfg.CoolDown)) {
		s.run(k)
	}
	downs := s.eventsOf("k")[ups:]
	t.Logf("after the drop from 20T to 0.3T: %+v", downs)
	if len(downs) != 3 {
		t.Fatalf("events after the drop %+v, want three steps down", downs)
	}
	for i, want := range []shard.Level{16, 4, 1} {
		if downs[i].Level != want {
			t.Errorf("step down %d to %d, want %d", i, downs[i].Level, want)
		}
		if i > 0 && downs[i].At.Sub(downs[i-1].At) != s.cfg.CoolDown {
			t.Errorf("step down %d came %v after the one before, want CoolDown (%v)", i, downs[i].At.Sub(downs[i-1].At), s.cfg.CoolDown)
		}
	}
	window := time.Duration(s.cfg.Slots) * s.cfg.SubWindow
	if at := downs[0].At.Sub(drop); at < s.cfg.CoolDown || at > s.cfg.CoolDown+window {
		t.Errorf("first step down %v after the drop, want CoolDown (%v) plus at most a window", at, s.cfg.CoolDown)
	}
}
