package coordinator

import (
	"sync"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/hotkeyd/hotkey/internal/natsserver"
	"github.com/hotkeyd/hotkey/internal/testkit"
	"github.com/hotkeyd/hotkey/shard"
)

// TestRegionApart: on one NATS, coordinators of one namespace in one region
// count each other and share leases; those of another region, or of none,
// publish on subjects of their own, and are neither counted nor heard.
func TestRegionApart(t *testing.T) {
	s := startServer(t, natsserver.Options{})
	spy := rawConn(t, s)
	var mu sync.Mutex
	heard := map[string]int{} // heartbeats by subject and origin
	if _, err := spy.Subscribe("hotkey.default.>", func(m *nats.Msg) {
		if msg, r := decode(m.Data, testLimits); r == reasonNone && msg.T == typeHB {
			mu.Lock()
			heard[m.Subject+" "+msg.Origin]++
			mu.Unlock()
		}
	}); err != nil {
		t.Fatal(err)
	}
	if err := spy.FlushTimeout(patience); err != nil {
		t.Fatal(err)
	}
	inRegion := func(id, region string) spec {
		cfg := testConfig(id, s.URL())
		cfg.Region = region
		return cfg
	}
	_, ra := startCoord(t, inRegion("a", "eu"))
	_, rb := startCoord(t, inRegion("b", "eu"))
	c, rc := startCoord(t, inRegion("c", "us-east_1"))
	_, rd := startCoord(t, testConfig("d", s.URL()))
	waitMesh(t, 2, ra, rb)
	c.Announce("hot", shard.NameHash("hot"), 16)
	testkit.For(t, patience, "3 heartbeats of each coordinator on its region's subject", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return heard["hotkey.default.eu.hb a"] >= 3 && heard["hotkey.default.eu.hb b"] >= 3 &&
			heard["hotkey.default.us-east_1.hb c"] >= 3 && heard["hotkey.default.hb d"] >= 3
	})
	for _, r := range []*recorder{ra, rb} {
		if n := r.instances(); n != 2 {
			t.Errorf("%s counts %d instances, want 2 (its region's)", r.name, n)
		}
		if l := r.level("hot"); l != 1 {
			t.Errorf("%s has the other region's lease: level %d", r.name, l)
		}
	}
	for _, r := range []*recorder{rc, rd} {
		if n := r.instances(); n != 1 {
			t.Errorf("%s counts %d instances, want 1 (alone in its region)", r.name, n)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	for k, n := range heard {
		switch k {
		case "hotkey.default.eu.hb a", "hotkey.default.eu.hb b", "hotkey.default.us-east_1.hb c", "hotkey.default.hb d":
		default:
			t.Errorf("%d heartbeats on %s, want each coordinator on its region's subject only", n, k)
		}
	}
}
