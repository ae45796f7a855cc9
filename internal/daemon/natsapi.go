package daemon

import (
	"context"
	"encoding/json"
	"strconv"
	"time"

	"github.com/nats-io/nats.go/micro"
)

// natsDecisionTimeout bounds one decision asked over NATS (the requester
// has its own timeout; this one keeps a lost requester from holding the
// endpoint).
const natsDecisionTimeout = 5 * time.Second

// handleNATS answers a request on hotkey.allow: the same JSON as POST
// /v1/allow, allowed or denied alike; errors are micro errors with the
// HTTP status as code (400, 404, 413, 503) and {"error": ...} as body.
//
// micro calls it on the endpoint subscription's goroutine, one request at
// a time; the queue group spreads requests over the daemons.
func (d *Daemon) handleNATS(req micro.Request) {
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
