package daemon

import (
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
)

// natsDecisionTimeout bounds one decision asked over NATS, give or take
// deadlineStep (the requester has its own timeout; this one keeps a
// decision that does not end from holding a --nats-concurrency slot).
const natsDecisionTimeout = 5 * time.Second

// natsRequests runs the decisions asked on hotkey.allow: each on a
// goroutine of its own, at most --nats-concurrency at once, so that a
// daemon over NATS keeps as many decisions in flight as one over HTTP (and
// the Redis store batches them). micro calls the handler on the endpoint
// subscription's goroutine; while every slot is taken, it waits there, and
// later requests wait in the NATS client's buffer.
type natsRequests struct {
	slots     chan struct{} // a token per decision in flight
	mu        sync.RWMutex  // guards stopping against wg.Add
	stopping  bool
	wg        sync.WaitGroup
	seconds   *observers // hotkeyd_request_duration_seconds{api="nats"}, by code: natsCodes
	deadlines deadlines  // the decisions'
}

// natsCodes are the code labels of api nats, indexes of natsRequests.seconds.
var natsCodes = []string{natsOK, natsError}

// job is work for natsRequests.run.
type job interface{ do() }

// jobFunc is a func as a job.
type jobFunc func()

func (f jobFunc) do() { f() }

// run runs f on a goroutine once a slot is free; once stopping, on the
// caller's goroutine, so that the connection's drain waits for it.
func (n *natsRequests) run(f func()) { n.runJob(jobFunc(f)) }

// runJob is run for a job.
func (n *natsRequests) runJob(j job) {
	n.mu.RLock()
	if n.stopping {
		n.mu.RUnlock()
		j.do()
		return
	}
	n.wg.Add(1)
	n.mu.RUnlock()
	n.slots <- struct{}{}
	go n.runOwn(j)
}

func (n *natsRequests) runOwn(j job) {
	defer func() { <-n.slots; n.wg.Done() }()
	j.do()
}

// stop waits for the decisions running on their own goroutines, until ctx
// is done; later ones run on the caller's. It reports whether they all
// ended.
func (n *natsRequests) stop(ctx context.Context) bool {
	n.mu.Lock()
	n.stopping = true
	n.mu.Unlock()
	done := make(chan struct{})
	go func() { n.wg.Wait(); close(done) }()
	select {
	case <-done:
		return true
	case <-ctx.Done():
		return false
	}
}

// handleNATS answers a request on hotkey.allow: the same JSON as POST
// /v1/allow, one request or a batch, allowed or denied alike; errors carry
// the HTTP status as Nats-Service-Error-Code, the message as
// Nats-Service-Error, and {"error": ...} as body, as micro's own errors do.
// The queue group spreads requests over the daemons. A request whose reply
// subject is not under _INBOX. (nats.go's default inbox prefix) is dropped
// unanswered.
//
// The decision runs after the handler has returned, so it must not touch
// req, which micro reads once the handler returns: it keeps the request's
// data and reply subject, and publishes its answer itself. So micro's
// $SRV.STATS counts the requests but neither their errors nor their time;
// /metrics has both (their time: hotkeyd_request_duration_seconds).
func (d *Daemon) handleNATS(req micro.Request) {
	start := time.Now()
	data, reply := req.Data(), req.Reply()
	if !strings.HasPrefix(reply, nats.InboxPrefix) {
		// A client that may publish on hotkey.allow only must not have the
		// daemon, which may publish on the coordination subjects, publish
		// there on its behalf, whatever the NATS server's permissions.
		d.log.Debug("hotkey.allow request with a reply subject outside "+nats.InboxPrefix+" ignored", "reply", truncate(reply, 100))
		return
	}
	j := natsJobs.Get().(*natsJob)
	*j = natsJob{d: d, ctx: d.nats.deadlines.at(start), data: data, reply: reply, start: start}
	if d.tracer != nil {
		var cancel context.CancelFunc
		j.ctx, j.end = d.tracer.natsSpan(req.Subject(), req.Headers())
		j.ctx, cancel = context.WithTimeout(j.ctx, natsDecisionTimeout)
		end := j.end
		j.end = func(code string) { cancel(); end(code) }
	}
	d.nats.runJob(j)
}

// natsJob is a request on hotkey.allow, decided once run. The daemon
// reuses it once done.
type natsJob struct {
	d     *Daemon
	ctx   context.Context
	data  []byte
	reply string
	start time.Time
	end   func(code string) // ends the trace span; nil without tracing
}

var natsJobs = sync.Pool{New: func() any { return new(natsJob) }}

func (j *natsJob) do() {
	code := j.d.answerNATS(j.ctx, j.data, j.reply)
	if j.end != nil {
		j.end(code)
	}
	i := 0 // natsCodes
	if code != natsOK {
		i = 1
	}
	since(j.d.nats.seconds.get(i), j.start)
	*j = natsJob{}
	natsJobs.Put(j)
}

// answerNATS decides the request data, under ctx (which bounds it), and publishes the answer to reply;
// it returns natsOK for an answer with decisions published, natsError for
// an error reply, or for an answer that could not be published.
func (d *Daemon) answerNATS(ctx context.Context, data []byte, reply string) string {
	areq, batch, ae := DecodeAllowBody(data)
	if ae != nil {
		return d.natsError(reply, ae)
	}
	var body []byte
	if batch != nil {
		body, _ = json.Marshal(d.decideBatch(ctx, batch))
		// Long error messages (an unknown policy's lists the policies)
		// could make the answer too long for the server, and the
		// requester would time out: say why instead.
		if limit := d.nc.MaxPayload(); int64(len(body)) > limit {
			return d.natsError(reply, errorf(http.StatusInternalServerError, "the answer to this batch of %d requests (decided) is %d bytes, over the NATS max payload of %d: send smaller batches", len(batch), len(body), limit))
		}
	} else {
		resp, _, _, ae := d.decide(ctx, areq)
		if ae != nil {
			return d.natsError(reply, ae)
		}
		buf := getBuf()
		defer putBuf(buf)
		// Without the newline POST /v1/allow ends its body with.
		*buf = appendAllowResponse((*buf)[:0], resp)
		body = (*buf)[:len(*buf)-1]
	}
	// Publish copies body before it returns.
	if err := d.nc.Publish(reply, body); err != nil {
		d.log.Debug("NATS reply failed", "err", err)
		return natsError
	}
	return natsOK
}

// natsError publishes ae to reply as a micro error reply; it returns
// natsError.
func (d *Daemon) natsError(reply string, ae *apiError) string {
	body, _ := json.Marshal(ErrorResponse{Error: ae.Msg})
	msg := &nats.Msg{Subject: reply, Data: body, Header: nats.Header{
		micro.ErrorHeader:     []string{ae.Msg},
		micro.ErrorCodeHeader: []string{strconv.Itoa(ae.Status)},
	}}
	if err := d.nc.PublishMsg(msg); err != nil {
		d.log.Debug("NATS error reply failed", "err", err)
	}
	return natsError
}
