package coordinator

import (
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/hotkeyd/hotkey/internal/natsserver"
)

// rawConn connects a plain client, as a forger would, closed at cleanup.
func rawConn(t *testing.T, s *natsserver.Server) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(s.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// publishAll publishes each message of msgs on subject and flushes.
func publishAll(t *testing.T, nc *nats.Conn, subject string, msgs ...[]byte) {
	t.Helper()
	for _, m := range msgs {
		if err := nc.Publish(subject, m); err != nil {
			t.Fatal(err)
		}
	}
	if err := nc.FlushTimeout(patience); err != nil {
		t.Fatal(err)
	}
}

// instancesTold returns every instance count r was told, in order.
func instancesTold(r *recorder) []int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.insts)
}

// TestForgedPeers: one connection publishing heartbeats of thousands of
// origins. Origins heard once never count; origins heard twice count up to
// MaxPeers, but the instance count handed to the Handler stays at most
// MaxInstances; once the forger stops, they lapse and the real peer is
// still counted.
func TestForgedPeers(t *testing.T) {
	s := startServer(t, natsserver.Options{})
	clk := newFakeClock()
	cfg := clk.config("victim", s.URL())
	c, r := startCoord(t, cfg)
	_, rb := startCoord(t, clk.config("real", s.URL()))
	waitMesh(t, 2, r, rb)
	nc := rawConn(t, s)
	const hb, forged = "hotkey.default.hb", 2000

	// A lease of the forger's after its heartbeats: once it is in force, the
	// heartbeats before it were handled (one publisher, one subscription: in
	// order), and the dispatcher took the live count with it.
	sentinel := func(i int) {
		t.Helper()
		k := "sentinel-" + strconv.Itoa(i)
		publishAll(t, nc, "hotkey.default.lease", encodeLease("forger", k, 4, time.Minute))
		waitFor(t, "the forger's heartbeats handled", func() bool { return r.level(k) == 4 })
	}

	// Each origin once.
	start := time.Now()
	var once [][]byte
	for i := range forged {
		once = append(once, encodeControl("once-"+strconv.Itoa(i), typeHB))
	}
	publishAll(t, nc, hb, once...)
	sentinel(1)
	st := c.Stats()
	t.Logf("%d origins heard once, handled in %v: instances told %d (max %d), peers %d, heard once %d, rejected %d",
		forged, time.Since(start), r.instances(), slices.Max(instancesTold(r)), st.Peers, st.PendingPeers, st.PeersRejected)
	if r.instances() != 2 || slices.Max(instancesTold(r)) != 2 || st.Peers != 1 {
		t.Errorf("origins heard once counted: instances %d (max %d), peers %d; want 2 and 1",
			r.instances(), slices.Max(instancesTold(r)), st.Peers)
	}
	if st.PendingPeers > DefaultMaxPeers {
		t.Errorf("%d origins heard once kept, cap %d", st.PendingPeers, DefaultMaxPeers)
	}

	// Each origin twice: they count as peers, up to MaxPeers, but the
	// Handler is told at most MaxInstances.
	start = time.Now()
	var twice [][]byte
	for i := range forged {
		m := encodeControl("twice-"+strconv.Itoa(i), typeHB)
		twice = append(twice, m, m)
	}
	publishAll(t, nc, hb, twice...)
	sentinel(2)
	st = c.Stats()
	maxTold := slices.Max(instancesTold(r))
	t.Logf("%d origins heard twice, handled in %v: instances told %d (max %d), peers %d, rejected %d",
		forged, time.Since(start), r.instances(), maxTold, st.Peers, st.PeersRejected)
	if r.instances() != DefaultMaxInstances || maxTold != DefaultMaxInstances || st.Peers != DefaultMaxPeers {
		t.Errorf("instances told %d (max %d), peers %d; want %d, %d, %d",
			r.instances(), maxTold, st.Peers, DefaultMaxInstances, DefaultMaxInstances, DefaultMaxPeers)
	}

	// The forger stops: its origins lapse after the peer timeout, the real
	// peer, heard at every new instant, stays.
	timeout := peerTimeout * cfg.Heartbeat
	moves := 0
	waitFor(t, "back to 2 instances", func() bool {
		if r.instances() == 2 {
			return true
		}
		clk.Advance(timeout - 1)
		moves++
		now := clk.Now()
		waitFor(t, "the real peer heard after the clock moved", func() bool { return heardAt(c, "real").Equal(now) })
		return false
	})
	if told := instancesTold(r); slices.Min(told[1:]) < 2 {
		t.Errorf("the real peer stopped counting: instances told %v", told)
	}
	t.Logf("forged peers gone after %d moves of the clock; stats %+v", moves, c.Stats())
}
