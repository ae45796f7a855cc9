package main

import (
	"fmt"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/hotkeyd/hotkey/internal/natsserver"
	"github.com/hotkeyd/hotkey/internal/testkit"
)

// gossipPolicies is a policies file with the token bucket limit per 24h
// (burst limit, so that no unit refills during a test) twice: "gos" with
// sync: gossip, "sto" with sync: store.
func gossipPolicies(t *testing.T, limit int) string {
	return writeFile(t, "p.yaml", fmt.Sprintf("policies:\n  gos:\n    limit: %d\n    period: 24h\n    sync: gossip\n  sto:\n    limit: %d\n    period: 24h\n", limit, limit))
}

// TestGossipDaemons: two daemons on the memory store sharing NATS, one key
// of a sync: gossip policy and one of the same policy with sync: store,
// each sent 3 × its limit L in turns through both daemons, one request
// per daemon per 200 ms. Under store each daemon admits L (2L, the
// fleet's error gossip removes). Under gossip a daemon's view misses only
// the units the other admitted since its last round reached it: a round
// is sent every 100 ms and delivered in well under a millisecond on
// loopback, so about one unit; the bound allows 2 (a round and its
// delivery late by up to 300 ms on a loaded machine). Every admission
// under gossip counts in both views, which never exceed what was
// admitted, so at least L are.
func TestGossipDaemons(t *testing.T) {
	t.Parallel()
	const limit, perDaemonGap = 20, 200 * time.Millisecond
	args := []string{"--policies", gossipPolicies(t, limit), "--reload-interval", "0"}
	a := startDaemon(t, daemonOpts{args: args})
	b := startDaemon(t, daemonOpts{args: args, join: a.natsURL})
	testkit.For(t, time.Minute, "each daemon sees the other", func() bool {
		return a.hotKeys(t).Peers == 1 && b.hotKeys(t).Peers == 1
	})

	admitted := map[string][2]int{}
	tick := time.NewTicker(perDaemonGap / 2)
	defer tick.Stop()
	for i := range 3 * limit {
		<-tick.C // paces the load; the bound does not depend on when
		for _, policy := range []string{"gos", "sto"} {
			r := []*proc{a, b}[i%2].allow(t, `{"policy":"`+policy+`","key":"k"}`)
			switch r.status {
			case 200:
				n := admitted[policy]
				n[i%2]++
				admitted[policy] = n
			case 429:
			default:
				t.Fatalf("%s through daemon %d: %d %s", policy, i%2, r.status, r.body)
			}
		}
	}
	gos, sto := admitted["gos"], admitted["sto"]
	t.Logf("of %d requests per key, limit %d: sync: gossip admitted %d (%d + %d), sync: store %d (%d + %d)",
		3*limit, limit, gos[0]+gos[1], gos[0], gos[1], sto[0]+sto[1], sto[0], sto[1])
	if n := sto[0] + sto[1]; n*2 <= 3*limit {
		t.Errorf("sync: store on memory counters admitted %d, want over 1.5 × %d: each daemon its own limit", n, limit)
	}
	if n := gos[0] + gos[1]; n < limit || n > limit+2 {
		t.Errorf("sync: gossip admitted %d, want %d to %d", n, limit, limit+2)
	}
}

// TestGossipNATSDown: a daemon whose NATS goes away goes on deciding its
// sync: gossip policy on its own counts, to the limit; /readyz says
// degraded, naming the policy, and hotkey_gossip_alone is 1 until NATS is
// back.
func TestGossipNATSDown(t *testing.T) {
	t.Parallel()
	const limit = 5
	addr := freeAddr(t)
	host, port, _ := net.SplitHostPort(addr)
	p, _ := strconv.Atoi(port)
	startNATS := func() *natsserver.Server {
		ns, err := natsserver.Start(natsserver.Options{Configure: func(o *server.Options) { o.Host, o.Port = host, p }})
		if err != nil {
			t.Fatal(err)
		}
		return ns
	}
	ns := startNATS()
	defer func() { ns.Shutdown() }()
	d := startDaemon(t, daemonOpts{join: "nats://" + addr, args: []string{"--policies", gossipPolicies(t, limit), "--reload-interval", "0"}})
	alone := func() float64 {
		return metric(string(do(t, "GET", d.admin+"/metrics", "").body), "hotkey_gossip_alone")
	}
	const reason = "this daemon decides the sync: gossip policy gos on its own counts alone"
	if r := d.allow(t, `{"policy":"gos","key":"k"}`); r.status != 200 {
		t.Fatalf("the first decision: %d %s", r.status, r.body)
	}
	testkit.For(t, time.Minute, "ready, and hotkey_gossip_alone 0, with NATS up", func() bool {
		return alone() == 0 && do(t, "GET", d.base+"/readyz?strict=true", "").status == 200
	})

	ns.Shutdown()
	testkit.For(t, time.Minute, "degraded, and hotkey_gossip_alone 1, with NATS down", func() bool {
		r := do(t, "GET", d.base+"/readyz", "")
		return alone() == 1 && r.status == 200 && strings.Contains(string(r.body), `"status":"degraded"`) && strings.Contains(string(r.body), reason)
	})
	for i := 1; i <= limit; i++ {
		want := 200
		if i == limit {
			want = 429
		}
		if r := d.allow(t, `{"policy":"gos","key":"k"}`); r.status != want {
			t.Errorf("decision %d of %d with NATS down: %d %s, want %d", i+1, limit+1, r.status, r.body, want)
		}
	}

	ns = startNATS()
	testkit.For(t, time.Minute, "ready, and hotkey_gossip_alone 0, once NATS is back", func() bool {
		return alone() == 0 && do(t, "GET", d.base+"/readyz?strict=true", "").status == 200
	})
}
