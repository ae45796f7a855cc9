package hotkey

import (
	"errors"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/hotkeyd/hotkey/counter"
)

// TestRegion: WithRegion takes one NATS subject token and refuses any
// other name; the region is in Stats and, with metrics, in
// hotkey_region_info, which is absent without a region.
func TestRegion(t *testing.T) {
	checkLeaks(t)
	for _, c := range []struct {
		give string
		want bool // accepted
	}{
		{"eu-west_1", true},
		{"US2", true},
		{strings.Repeat("r", maxRegionLen), true},
		{strings.Repeat("r", maxRegionLen+1), false},
		{"", false},
		{"eu.west", false},
		{"eu west", false},
		{"eu*", false},
		{">", false},
		{"été", false},
	} {
		reg := prometheus.NewRegistry()
		e, err := New(counter.NewMemoryStore(counter.MemoryConfig{}), WithoutDetector(), WithRegion(c.give), WithMetrics(reg))
		if !c.want {
			if err == nil {
				e.Close()
				t.Errorf("WithRegion(%q) accepted, want it refused", c.give)
			} else if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), "want 1 to 64 of A-Z a-z 0-9 - _") {
				t.Errorf("WithRegion(%q): %v, want ErrInvalidConfig saying what a region is", c.give, err)
			}
			continue
		}
		if err != nil {
			t.Errorf("WithRegion(%q): %v, want it accepted", c.give, err)
			continue
		}
		if got := e.Stats().Region; got != c.give {
			t.Errorf("WithRegion(%q): Stats().Region %q", c.give, got)
		}
		if got := gather(t, reg)[`hotkey_region_info{region="`+c.give+`"}`]; got != 1 {
			t.Errorf("WithRegion(%q): hotkey_region_info %v, want 1", c.give, got)
		}
		e.Close()
	}

	reg := prometheus.NewRegistry()
	e, err := New(counter.NewMemoryStore(counter.MemoryConfig{}), WithoutDetector(), WithMetrics(reg))
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	if got := e.Stats().Region; got != "" {
		t.Errorf("no region: Stats().Region %q", got)
	}
	if n, err := testutil.GatherAndCount(reg, "hotkey_region_info"); err != nil || n != 0 {
		t.Errorf("no region: %d hotkey_region_info series, %v; want none", n, err)
	}
}
