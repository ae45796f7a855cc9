package loadgen

import (
	"math"
	"strconv"
	"testing"
	"time"
)

// drive asks w for n requests paced at rate, and counts the keys.
func drive(w Workload, rate float64, n int) map[string]int {
	got := map[string]int{}
	for i := range int64(n) {
		got[w.Key(i, time.Duration(float64(i)/rate*float64(time.Second)))]++
	}
	return got
}

func TestUniform(t *testing.T) {
	got := drive(Uniform("u", 10, 7), 1000, 100_000)
	if len(got) != 10 {
		t.Fatalf("%d keys, want 10", len(got))
	}
	for k, c := range got {
		if c < 9_000 || c > 11_000 {
			t.Errorf("%s: %d of 100,000, want about 10,000", k, c)
		}
	}
	if a, b := drive(Uniform("u", 10, 7), 1000, 100), drive(Uniform("u", 10, 7), 1000, 100); len(a) != len(b) || a["u3"] != b["u3"] {
		t.Error("same seed, different keys")
	}
}

// TestZipf: key k is drawn in proportion to 1/(k+1)^s.
func TestZipf(t *testing.T) {
	if _, err := Zipf("z", 100, 1, 1); err == nil {
		t.Error("s = 1 accepted")
	}
	w, err := Zipf("z", 1000, 1.2, 3)
	if err != nil {
		t.Fatal(err)
	}
	got := drive(w, 1000, 200_000)
	var norm float64
	for k := range 1000 {
		norm += math.Pow(float64(k+1), -1.2)
	}
	for _, k := range []int{0, 1, 9} {
		want := 200_000 * math.Pow(float64(k+1), -1.2) / norm
		if c := float64(got["z"+itoa(k)]); math.Abs(c-want) > 0.05*want {
			t.Errorf("z%d: %v, want %.0f ± 5%%", k, c, want)
		}
	}
}

func itoa(i int) string { return strconv.Itoa(i) }

func TestFlood(t *testing.T) {
	got := drive(Flood("f:", 1), 1000, 10_000)
	if len(got) != 10_000 {
		t.Fatalf("%d distinct keys of 10,000", len(got))
	}
}

// TestHotspot: the hot key is sent at its rate, to the request, and the
// rest go to the background.
func TestHotspot(t *testing.T) {
	got := drive(Hotspot("hot", 250, Uniform("bg", 4, 1)), 1000, 10_000) // 0 to 9.999 s
	if got["hot"] != 2499 {                                              // the 2,500th is due at 10 s
		t.Errorf("hot: %d by 9.999 s at 250/s, want 2499", got["hot"])
	}
	if got["hot"]+got["bg0"]+got["bg1"]+got["bg2"]+got["bg3"] != 10_000 {
		t.Errorf("keys %v do not add up to 10,000", got)
	}
}

// TestRamp: the key's requests in each second follow the ramp's rate, and
// add up to its area.
func TestRamp(t *testing.T) {
	peak := 400.0
	rise, hold, fall := 4*time.Second, 2*time.Second, 4*time.Second
	w := Ramp("hot", peak, rise, hold, fall, Uniform("bg", 4, 1))
	per := make([]int, 12)
	const rate = 1000
	for i := range int64(12 * rate) {
		at := time.Duration(i) * time.Second / rate
		if w.Key(i, at) == "hot" {
			per[at/time.Second]++
		}
	}
	total := 0
	for s, c := range per {
		mid := time.Duration(s)*time.Second + time.Second/2
		want := RampRate(peak, rise, hold, fall, mid) // the mean over a second of a linear piece
		if math.Abs(float64(c)-want) > 1 {
			t.Errorf("second %d: %d, want %.0f", s, c, want)
		}
		total += c
	}
	if want := peak * (2 + 2 + 2); total != int(want) {
		t.Errorf("total %d, want %.0f", total, want)
	}
}

func TestFixed(t *testing.T) {
	if got := drive(Fixed("only"), 1000, 100); got["only"] != 100 || len(got) != 1 {
		t.Errorf("Fixed: %v", got)
	}
}
