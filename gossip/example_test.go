package gossip_test

import (
	"context"
	"fmt"
	"time"

	"github.com/hotkeyd/hotkey/counter"
	"github.com/hotkeyd/hotkey/gossip"
)

// A sender flushes its round into messages; a receiver decodes each and
// applies it once.
func Example() {
	cfg := gossip.DefaultConfig()
	round, codec, dedup := gossip.NewRound(cfg), gossip.NewCodec(cfg), gossip.NewDedup(cfg)

	round.Add("api", "alice", counter.Hash("alice"), 3)
	round.Add("api", "alice", counter.Hash("alice"), 2)
	msgs, err := codec.Encode(gossip.Header{Sender: "i-1", Start: 1, Round: 7}, round.Flush())
	if err != nil {
		panic(err)
	}
	for _, delivery := range [][]byte{msgs[0], msgs[0]} { // delivered twice
		m, err := codec.Decode(delivery)
		if err != nil {
			panic(err)
		}
		if !dedup.Accept(m.Header) {
			fmt.Println("duplicate: not applied")
			continue
		}
		for _, e := range m.Entries {
			fmt.Printf("charge %s/%s %d units\n", e.Limit, e.Key, e.Units)
		}
	}
	// Output:
	// charge api/alice 5 units
	// duplicate: not applied
}

// Two instances' stores: what one admits reaches the other at its next
// round, once however often it is delivered.
func ExampleStore() {
	lim := counter.Limit{Algorithm: counter.FixedWindow, Rate: 10, Period: time.Hour}
	a := gossip.NewStore(gossip.StoreConfig{ID: "a"})
	b := gossip.NewStore(gossip.StoreConfig{ID: "b"})
	a.Take(context.Background(), "alice", counter.Hash("alice"), lim, 4)
	msgs, _ := a.Flush(time.Now())
	for _, m := range append(msgs, msgs...) { // delivered twice
		b.Apply(m)
	}
	r, _ := b.Take(context.Background(), "alice", counter.Hash("alice"), lim, 1)
	fmt.Println("b admits one more:", r.Allowed, "remaining", r.Remaining)
	// Output:
	// b admits one more: true remaining 5
}
