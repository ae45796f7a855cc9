package main

import (
	"fmt"
	"testing"
)

// TestMaxKeys: --max-keys bounds the daemon's counters in memory. A flood
// of new keys past it is denied and counted in
// hotkey_memory_store_full_total; a key that spent its limit before the
// flood stays spent.
func TestMaxKeys(t *testing.T) {
	t.Parallel()
	const maxKeys = 64
	d := startDaemon(t, daemonOpts{args: []string{"--max-keys", fmt.Sprint(maxKeys), "--policies", writeFile(t, "p.yaml", `policies:
  hourly:
    algorithm: sliding_log
    limit: 5
    period: 1h
`)}})
	admitted := 0
	take := func() {
		for range 10 {
			if r := d.allow(t, `{"policy":"hourly","key":"user"}`); r.status == 200 {
				admitted++
			}
		}
	}
	take()
	flood := 0
	for i := range 4 * maxKeys {
		if r := d.allow(t, fmt.Sprintf(`{"policy":"hourly","key":"flood%d"}`, i)); r.status == 200 {
			flood++
		}
	}
	take()
	if admitted != 5 {
		t.Errorf("user admitted %d of 20 within the hour, want 5", admitted)
	}
	if flood >= maxKeys {
		t.Errorf("the flood admitted %d new keys, more than the %d counters --max-keys allows", flood, maxKeys)
	}
	full := metric(string(do(t, "GET", d.admin+"/metrics", "").body), `hotkey_memory_store_full_total{store="store"}`)
	if want := float64(4*maxKeys - flood); full != want {
		t.Errorf(`hotkey_memory_store_full_total{store="store"} = %v, want the %v flood keys denied`, full, want)
	}
}
