package natsserver

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// roundTrip subscribes on sub, then publishes on pub until a message
// arrives (interest spreads across routes asynchronously), and fails after
// a minute.
func roundTrip(t *testing.T, pub, sub *nats.Conn, subject string) {
	t.Helper()
	ch := make(chan *nats.Msg, 16)
	s, err := sub.ChanSubscribe(subject, ch)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Unsubscribe()
	if err := sub.Flush(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	deadline := time.After(time.Minute)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		if err := pub.Publish(subject, []byte("ping")); err != nil {
			t.Fatal(err)
		}
		select {
		case m := <-ch:
			if string(m.Data) != "ping" {
				t.Fatalf("got %q", m.Data)
			}
			t.Logf("%s: delivered %v after subscribing", subject, time.Since(start))
			return
		case <-tick.C:
		case <-deadline:
			t.Fatalf("no message on %s in a minute", subject)
		}
	}
}

func TestStartTCP(t *testing.T) {
	s, err := Start(Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Shutdown()
	if !strings.HasPrefix(s.URL(), "nats://127.0.0.1:") {
		t.Fatalf("URL %q", s.URL())
	}
	nc, err := nats.Connect(s.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	roundTrip(t, nc, nc, "x")
	s.Shutdown()
	if s.Running() {
		t.Fatal("running after Shutdown")
	}
	s.Shutdown() // twice is fine
}

func TestStartInProcess(t *testing.T) {
	s, err := Start(Options{DontListen: true, MaxPayload: 2 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Shutdown()
	if s.URL() != "" {
		t.Fatalf("URL %q with DontListen", s.URL())
	}
	nc, err := s.Connect()
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if nc.MaxPayload() != 2<<20 {
		t.Fatalf("max payload %d", nc.MaxPayload())
	}
	roundTrip(t, nc, nc, "x")
}

func TestConfigureAuth(t *testing.T) {
	s, err := Start(Options{Configure: func(o *server.Options) { o.Authorization = "s3cret" }})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Shutdown()
	if _, err := nats.Connect(s.URL(), nats.Token("wrong")); !errors.Is(err, nats.ErrAuthorization) {
		t.Fatalf("wrong token: %v", err)
	}
	nc, err := nats.Connect(s.URL(), nats.Token("s3cret"))
	if err != nil {
		t.Fatal(err)
	}
	nc.Close()
}

func TestCluster(t *testing.T) {
	start := time.Now()
	c, err := StartCluster(3, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	t.Logf("3 nodes meshed in %v", time.Since(start))
	if c.Len() != 3 || len(c.URLs()) != 3 {
		t.Fatalf("len %d, urls %v", c.Len(), c.URLs())
	}
	conns := make([]*nats.Conn, 3)
	for i := range conns {
		if conns[i], err = nats.Connect(c.URL(i)); err != nil {
			t.Fatal(err)
		}
		defer conns[i].Close()
	}
	roundTrip(t, conns[0], conns[2], "a")
	roundTrip(t, conns[2], conns[1], "b")

	// Node 0, the seed, goes away and comes back on the same ports.
	url0 := c.URL(0)
	c.Shutdown(0)
	if c.Server(0) != nil {
		t.Fatal("node 0 still listed")
	}
	roundTrip(t, conns[1], conns[2], "c") // the others still route to each other
	start = time.Now()
	if err := c.Restart(0); err != nil {
		t.Fatal(err)
	}
	t.Logf("node 0 restarted and meshed in %v", time.Since(start))
	if c.URL(0) != url0 || c.Server(0).URL() != url0 {
		t.Fatalf("URL changed: %s → %s", url0, c.Server(0).URL())
	}
	nc0, err := nats.Connect(url0)
	if err != nil {
		t.Fatal(err)
	}
	defer nc0.Close()
	roundTrip(t, nc0, conns[2], "d")
	roundTrip(t, conns[1], nc0, "e")

	// A non-seed node too.
	if err := c.Restart(2); err != nil {
		t.Fatal(err)
	}
	nc2, err := nats.Connect(c.URL(2))
	if err != nil {
		t.Fatal(err)
	}
	defer nc2.Close()
	roundTrip(t, nc0, nc2, "f")
}

func TestClusterOfOne(t *testing.T) {
	c, err := StartCluster(1, Options{})
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	if _, err := StartCluster(0, Options{}); err == nil {
		t.Fatal("cluster of 0 started")
	}
}
