package natsserver

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
)

func startSupercluster(t *testing.T, regions []string, nodes int) *Supercluster {
	t.Helper()
	start := time.Now()
	sc, err := StartSupercluster(regions, nodes, Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sc.Close)
	t.Logf("%d regions of %d servers joined in %v", len(regions), nodes, time.Since(start))
	return sc
}

// connect connects a client to node i of region.
func connect(t *testing.T, sc *Supercluster, region string, i int) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(sc.Cluster(region).URL(i))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// subscribe subscribes nc to subject and flushes, so that its server has
// the subscription.
func subscribe(t *testing.T, nc *nats.Conn, subject string) <-chan *nats.Msg {
	t.Helper()
	ch := make(chan *nats.Msg, 4096)
	if _, err := nc.ChanSubscribe(subject, ch); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return ch
}

// pings numbers await's messages, so that each call waits for its own.
var pings atomic.Int64

// await publishes a new ping on subject from pub until ch receives it
// (interest crosses gateways asynchronously), and fails after a minute.
func await(t *testing.T, pub *nats.Conn, subject string, ch <-chan *nats.Msg) {
	t.Helper()
	data := fmt.Sprintf("ping %d", pings.Add(1))
	deadline := time.After(time.Minute)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		if err := pub.Publish(subject, []byte(data)); err != nil {
			t.Fatal(err)
		}
		select {
		case m := <-ch:
			if string(m.Data) == data {
				return
			}
		case <-tick.C:
		case <-deadline:
			t.Fatalf("nothing received on %s in a minute", subject)
		}
	}
}

// receive waits up to a minute for the message with payload data on ch,
// skipping others.
func receive(t *testing.T, ch <-chan *nats.Msg, data string) {
	t.Helper()
	deadline := time.After(time.Minute)
	for {
		select {
		case m := <-ch:
			if string(m.Data) == data {
				return
			}
		case <-deadline:
			t.Fatalf("%q not received in a minute", data)
		}
	}
}

// TestSuperclusterDelay: a message published in one region reaches
// subscribers in the two others; with the links delayed by 50–200 ms, none
// arrives sooner than 50 ms after it was published.
func TestSuperclusterDelay(t *testing.T) {
	t.Parallel()
	sc := startSupercluster(t, []string{"a", "b", "c"}, 1)
	a, b, c := connect(t, sc, "a", 0), connect(t, sc, "b", 0), connect(t, sc, "c", 0)
	inB, inC := subscribe(t, b, "d"), subscribe(t, c, "d")
	await(t, a, "d", inB)
	await(t, a, "d", inC)
	inA := subscribe(t, a, "r")
	await(t, b, "r", inA)

	const lo, hi = 50 * time.Millisecond, 200 * time.Millisecond
	sc.SetDelay(lo, hi)
	least := time.Duration(1 << 62)
	for k := range 5 {
		data := fmt.Sprintf("delayed %d", k)
		start := time.Now()
		if err := a.Publish("d", []byte(data)); err != nil {
			t.Fatal(err)
		}
		for region, ch := range map[string]<-chan *nats.Msg{"b": inB, "c": inC} {
			receive(t, ch, data)
			took := time.Since(start)
			if took < lo {
				t.Fatalf("%q reached %s %v after it was published in a, want at least %v", data, region, took, lo)
			}
			least = min(least, took)
		}
	}
	// The other way too.
	start := time.Now()
	if err := b.Publish("r", []byte("back")); err != nil {
		t.Fatal(err)
	}
	receive(t, inA, "back")
	if took := time.Since(start); took < lo {
		t.Fatalf("b's message reached a %v after it was published, want at least %v", took, lo)
	}
	t.Logf("with links delayed [%v, %v]: the fastest of 10 deliveries from a took %v", lo, hi, least)
}

// TestSuperclusterCut: a region cut off neither sends nor receives anything
// while its servers keep trying to reconnect, the other regions still talk,
// and once healed it rejoins through the proxies and messages flow both
// ways again.
func TestSuperclusterCut(t *testing.T) {
	t.Parallel()
	const nodes = 2
	regions := []string{"a", "b", "c"}
	sc := startSupercluster(t, regions, nodes)
	// Publishers and subscribers on different nodes of their regions.
	a, b, c := connect(t, sc, "a", 0), connect(t, sc, "b", 0), connect(t, sc, "c", 0)
	a1, b1, c1 := connect(t, sc, "a", 1), connect(t, sc, "b", 1), connect(t, sc, "c", 1)
	abIn, acIn := subscribe(t, b1, "ab"), subscribe(t, c1, "ab")
	baIn, bcIn, cbIn := subscribe(t, a1, "ba"), subscribe(t, c1, "bc"), subscribe(t, b1, "cb")
	aaIn := subscribe(t, a1, "aa")
	flows := func() {
		await(t, a, "ab", abIn)
		await(t, a, "ab", acIn)
		await(t, b, "ba", baIn)
		await(t, b, "bc", bcIn)
		await(t, c, "cb", cbIn)
	}
	flows()

	// Every gateway connection touching a is some server's outbound, and
	// each retries about once a second while cut: wait until the cut links
	// have turned away two rounds of them, publishing all along.
	refused := func() int64 {
		var n int64
		for _, from := range regions {
			for _, to := range regions {
				if from != to && (from == "a" || to == "a") {
					for _, p := range sc.Proxies(from, to) {
						n += p.Refused()
					}
				}
			}
		}
		return n
	}
	conns := int64(2 * nodes * (len(regions) - 1))
	before := refused()
	sc.Cut("a")
	start := time.Now()
	leaked := func() {
		t.Helper()
		for name, ch := range map[string]<-chan *nats.Msg{"a→b": abIn, "a→c": acIn, "b→a": baIn} {
			for len(ch) > 0 {
				if m := <-ch; string(m.Data) == "cut" {
					t.Fatalf("%s: a message crossed while a was cut", name)
				}
			}
		}
	}
	published := 0
	for refused()-before < 2*conns {
		if time.Since(start) > time.Minute {
			t.Fatalf("cut links turned away %d connections in a minute, want %d", refused()-before, 2*conns)
		}
		if err := a.Publish("ab", []byte("cut")); err != nil {
			t.Fatal(err)
		}
		if err := b.Publish("ba", []byte("cut")); err != nil {
			t.Fatal(err)
		}
		published++
		leaked()
		time.Sleep(10 * time.Millisecond)
	}
	// b and c still talk, and a's servers to each other (routes are not
	// proxied).
	await(t, b, "bc", bcIn)
	await(t, c, "cb", cbIn)
	await(t, a, "aa", aaIn)
	for _, nc := range []*nats.Conn{a, b, a1, b1, c1} {
		if err := nc.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	leaked()
	t.Logf("cut %v: %d messages each way from a and b, none crossed; %d connections turned away", time.Since(start), published, refused()-before)

	sc.Heal("a")
	start = time.Now()
	if err := sc.WaitJoined(time.Minute); err != nil {
		t.Fatal(err)
	}
	t.Logf("healed: rejoined in %v", time.Since(start))
	flows()
}

func TestStartSuperclusterRefuses(t *testing.T) {
	for _, tt := range []struct {
		name    string
		regions []string
		nodes   int
	}{
		{"no regions", nil, 1},
		{"no nodes", []string{"a", "b"}, 0},
		{"repeated", []string{"a", "b", "a"}, 1},
		{"empty", []string{"a", ""}, 1},
		{"space", []string{"a", "b c"}, 1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if sc, err := StartSupercluster(tt.regions, tt.nodes, Options{}); err == nil {
				sc.Close()
				t.Fatalf("StartSupercluster(%q, %d) started", tt.regions, tt.nodes)
			}
		})
	}
}

// TestSuperclusterRestart: a node restarted keeps its gateway port, so the
// proxies of the links into its region reach it again and it rejoins.
func TestSuperclusterRestart(t *testing.T) {
	t.Parallel()
	sc := startSupercluster(t, []string{"a", "b"}, 2)
	gw := sc.Cluster("b").Server(1).Server().GatewayAddr().String()
	if err := sc.Cluster("b").Restart(1); err != nil {
		t.Fatal(err)
	}
	if got := sc.Cluster("b").Server(1).Server().GatewayAddr().String(); got != gw {
		t.Fatalf("gateway address %s after Restart, was %s", got, gw)
	}
	start := time.Now()
	if err := sc.WaitJoined(time.Minute); err != nil {
		t.Fatal(err)
	}
	t.Logf("b-n1 restarted, rejoined in %v", time.Since(start))
	a, b1 := connect(t, sc, "a", 0), connect(t, sc, "b", 1)
	await(t, a, "x", subscribe(t, b1, "x"))
	inA := subscribe(t, a, "y")
	await(t, b1, "y", inA)
}
