package daemon

import (
	"context"
	"encoding/json"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go/micro"
)

// natsDecisionTimeout bounds one decision asked over NATS (the requester
// has its own timeout; this one keeps a lost requester from holding the
// endpoint).
const natsDecisionTimeout = 5 * time.Second

// natsRequests runs the decisions asked on hotkey.allow: each on a
// goroutine of its own, at most --nats-concurrency at once, so that a
// daemon over NATS keeps as many decisions in flight as one over HTTP (and
// the Redis store batches them). micro calls the handler on the endpoint
// subscription's goroutine; while every slot is taken, it waits there, and
// later requests wait in the NATS client's buffer.
type natsRequests struct {
	slots    chan struct{} // a token per decision in flight
	mu       sync.RWMutex  // guards stopping against wg.Add
	stopping bool
	wg       sync.WaitGroup
}

// run runs f on a goroutine once a slot is free; once stopping, on the
// caller's goroutine, so that the connection's drain waits for it.
func (n *natsRequests) run(f func()) {
	n.mu.RLock()
	if n.stopping {
		n.mu.RUnlock()
		f()
		return
	}
	n.wg.Add(1)
	n.mu.RUnlock()
	n.slots <- struct{}{}
	go func() {
		defer func() { <-n.slots; n.wg.Done() }()
		f()
	}()
}

// stop waits for the decisions running on their own goroutines; later ones
// run on the caller's.
func (n *natsRequests) stop() {
	n.mu.Lock()
	n.stopping = true
	n.mu.Unlock()
	n.wg.Wait()
}

// handleNATS answers a request on hotkey.allow: the same JSON as POST
// /v1/allow, allowed or denied alike; errors are micro errors with the
// HTTP status as code (400, 404, 413, 503) and {"error": ...} as body. The
// queue group spreads requests over the daemons.
func (d *Daemon) handleNATS(req micro.Request) {
	d.nats.run(func() { d.answerNATS(req) })
}

func (d *Daemon) answerNATS(req micro.Request) {
	areq, err := DecodeAllow(req.Data())
	if err != nil {
		d.natsError(req, err.(*apiError))
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), natsDecisionTimeout)
	defer cancel()
	resp, _, _, ae := d.decide(ctx, areq)
	if ae != nil {
		d.natsError(req, ae)
		return
	}
	if err := req.RespondJSON(resp); err != nil {
		d.log.Debug("NATS reply failed", "err", err)
	}
}

func (d *Daemon) natsError(req micro.Request, ae *apiError) {
	body, _ := json.Marshal(ErrorResponse{Error: ae.Msg})
	if err := req.Error(strconv.Itoa(ae.Status), ae.Msg, body); err != nil {
		d.log.Debug("NATS error reply failed", "err", err)
	}
}
