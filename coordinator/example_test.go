package coordinator_test

import (
	"fmt"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/hotkeyd/hotkey/coordinator"
	"github.com/hotkeyd/hotkey/internal/natsserver"
	"github.com/hotkeyd/hotkey/shard"
)

// levels is a Handler that passes on the levels it is told.
type levels chan string

func (l levels) SetLevel(key string, _ uint64, level shard.Level) {
	l <- fmt.Sprintf("%s at level %d", key, level)
}
func (levels) SetInstances(int) {}

// Two instances on one NATS server: a key one announces hot is split on
// the other. Each coordinator takes a connection its program dialed, with
// the credentials and TLS options nats.go takes, and leaves it open.
func ExampleNewNATS() {
	s, err := natsserver.Start(natsserver.Options{DontListen: true})
	if err != nil {
		panic(err)
	}
	defer s.Shutdown()
	start := func(id string, h coordinator.Handler) (*coordinator.NATS, *nats.Conn) {
		nc, err := s.Connect(nats.MaxReconnects(-1), nats.ReconnectBufSize(-1), nats.NoEcho())
		if err != nil {
			panic(err)
		}
		co, err := coordinator.NewNATS(nc, coordinator.Config{ID: id, Namespace: "gateway-eu"})
		if err != nil {
			panic(err)
		}
		if err := co.Start(h); err != nil {
			panic(err)
		}
		return co, nc
	}
	a, ncA := start("a", make(levels, 8))
	b := make(levels, 8)
	cb, ncB := start("b", b)

	a.Announce("user_123", 0, shard.Level16)
	select {
	case got := <-b:
		fmt.Println("b:", got)
	case <-time.After(30 * time.Second):
		fmt.Println("b: nothing")
	}
	a.Close()
	cb.Close()
	ncA.Close() // the connections are their program's to close
	ncB.Close()
	// Output: b: user_123 at level 16
}
