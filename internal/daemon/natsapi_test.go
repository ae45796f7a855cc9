package daemon

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/hotkeyd/hotkey/coordinator"
	"github.com/hotkeyd/hotkey/internal/natsserver"
	"github.com/hotkeyd/hotkey/internal/testkit"
	"github.com/hotkeyd/hotkey/shard"
)

// TestNATSRequests: decisions run on goroutines of their own, never more
// than the slots at once; stop waits for them as long as its ctx allows,
// and later ones run on the caller's goroutine (the connection's drain then
// waits for them).
func TestNATSRequests(t *testing.T) {
	n := natsRequests{slots: make(chan struct{}, 4)}
	release := make(chan struct{})
	var running, most, done, starts atomic.Int64
	var started sync.WaitGroup
	started.Add(4)
	work := func() {
		r := running.Add(1)
		for m := most.Load(); r > m && !most.CompareAndSwap(m, r); m = most.Load() {
		}
		if starts.Add(1) <= 4 {
			started.Done()
		}
		<-release
		running.Add(-1)
		done.Add(1)
	}
	submitted := make(chan struct{})
	go func() {
		for range 10 {
			n.run(work) // the 5th waits here for a slot
		}
		close(submitted)
	}()
	started.Wait() // 4 run at once, on goroutines of their own
	if r, m := running.Load(), most.Load(); r != 4 || m != 4 {
		t.Fatalf("%d running, at most %d at once; want 4 (the slots)", r, m)
	}
	// stop waits only as long as its ctx: with 4 still blocked, a done
	// ctx returns false at once.
	expired, cancel := context.WithCancel(context.Background())
	cancel()
	if n.stop(expired) {
		t.Fatal("stop reported every decision done while 4 were blocked")
	}
	close(release)
	<-submitted
	if !n.stop(context.Background()) {
		t.Fatal("stop did not see the decisions end")
	}
	if done.Load() != 10 {
		t.Fatalf("%d done, want 10", done.Load())
	}
	ran := false
	n.run(func() { ran = true }) // inline: no goroutine to wait for
	if !ran {
		t.Fatal("a request after stop did not run on the caller's goroutine")
	}
}

// TestNATSConcurrentReplies: many requests at once over NATS, decisions and
// errors mixed, each answered on its own reply subject, with the error
// headers micro clients read (run under -race: answers are published off
// micro's handler).
func TestNATSConcurrentReplies(t *testing.T) {
	d, err := StartArgs(context.Background(), "--listen", "127.0.0.1:0", "--nats-listen", "127.0.0.1:0", "--nats-concurrency", "8")
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute) // only catches a hang
		defer cancel()
		if err := d.Shutdown(ctx); err != nil {
			t.Errorf("shutdown: %v", err)
		}
	}()
	nc, err := nats.Connect(d.NATSURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	var wg sync.WaitGroup
	for i := range 200 {
		wg.Go(func() {
			body, wantErr := fmt.Sprintf(`{"key":"k%d"}`, i), ""
			if i%3 == 0 {
				body, wantErr = fmt.Sprintf(`{"key":"k%d","policy":"nope"}`, i), "404"
			}
			msg, err := nc.Request("hotkey.allow", []byte(body), time.Minute)
			if err != nil {
				t.Error(err)
				return
			}
			if code := msg.Header.Get("Nats-Service-Error-Code"); code != wantErr {
				t.Errorf("request %d: error code %q, want %q: %s", i, code, wantErr, msg.Data)
				return
			}
			var ar AllowResponse
			if wantErr == "" && (json.Unmarshal(msg.Data, &ar) != nil || !ar.Allowed) {
				t.Errorf("request %d: %s", i, msg.Data)
			}
		})
	}
	wg.Wait()
}

// TestNATSReplyOutsideInbox: on a NATS server of the operator's own, with
// no permissions of the daemon's making, a request on hotkey.allow whose
// reply subject is a coordination subject gets no answer there, so the
// coordinators listening on it count nothing invalid; a request with an
// _INBOX. reply is answered.
func TestNATSReplyOutsideInbox(t *testing.T) {
	ns, err := natsserver.Start(natsserver.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Shutdown()
	// One slot: the daemon publishes its answers in the order the requests came.
	d, err := StartArgs(context.Background(), "--listen", "127.0.0.1:0", "--nats", ns.URL(), "--nats-concurrency", "1")
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute) // only catches a hang
		defer cancel()
		if err := d.Shutdown(ctx); err != nil {
			t.Errorf("shutdown: %v", err)
		}
	}()
	wc, err := ns.Connect()
	if err != nil {
		t.Fatal(err)
	}
	defer wc.Close()
	watcher, err := coordinator.NewNATS(wc, coordinator.Config{ID: "watcher"})
	if err != nil {
		t.Fatal(err)
	}
	defer watcher.Close()
	if err := watcher.Start(nopHandler{}); err != nil {
		t.Fatal(err)
	}
	nc, err := ns.Connect()
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	const lease = "hotkey.default.lease"
	there, err := nc.SubscribeSync(lease)
	if err != nil {
		t.Fatal(err)
	}
	if err := wc.Flush(); err != nil { // the watcher's subscriptions are in
		t.Fatal(err)
	}
	before := watcher.Stats().Invalid

	if err := nc.PublishRequest("hotkey.allow", lease, []byte(`{"key":"k"}`)); err != nil {
		t.Fatal(err)
	}
	m, err := nc.Request("hotkey.allow", []byte(`{"key":"k"}`), time.Minute)
	if err != nil || !strings.Contains(string(m.Data), `"allowed":true`) {
		t.Fatalf("a request with an _INBOX. reply: %v %v", m, err)
	}
	// Any answer on the lease subject came before the one just received: a
	// marker published now comes after it, and is too long for a lease.
	if err := nc.Publish(lease, make([]byte, coordinator.DefaultMaxMessage+1)); err != nil {
		t.Fatal(err)
	}
	first, err := there.NextMsg(time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if len(first.Data) <= coordinator.DefaultMaxMessage {
		t.Errorf("the daemon answered on %s: %s", lease, first.Data)
	}
	testkit.For(t, time.Minute, "the watcher to count the marker", func() bool { return watcher.Stats().InvalidBy["size"] == 1 })
	if got := watcher.Stats().Invalid - before; got != 1 {
		t.Errorf("the watcher counted %d invalid messages, want 1 (the marker): %v", got, watcher.Stats().InvalidBy)
	}
}

// nopHandler is a coordinator.Handler that ignores what it is told.
type nopHandler struct{}

func (nopHandler) SetLevel(string, uint64, shard.Level) {}
func (nopHandler) SetInstances(int)                     {}
