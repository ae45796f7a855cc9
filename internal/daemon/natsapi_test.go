package daemon

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
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
