package loadgen

import (
	"context"
	"errors"
	"io"
	"math"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/valyala/fasthttp"
)

// maxRedirects is how many redirects an Endpoint follows, as many as an
// http.Client does.
const maxRedirects = 10

// maxBody is the longest answer body the default client reads; a longer
// one is an error.
const maxBody = 16 << 20

// newFastClient is the client of the HTTP targets given no *http.Client:
// HTTP/1.1 over keep-alive connections, as many as there are requests in
// flight, the idle ones kept 90 s and reused last in first out (as
// http.DefaultTransport keeps them), IPv4 and IPv6, TLS verified against the
// system's roots. Requests and answers are pooled, so that a decision
// costs the client a few allocations.
func newFastClient() *fasthttp.Client {
	return &fasthttp.Client{
		Name:                   "Go-http-client/1.1", // net/http's User-Agent, as servers know loadgen
		MaxConnsPerHost:        math.MaxInt32,
		MaxIdleConnDuration:    90 * time.Second,
		ConnPoolStrategy:       fasthttp.LIFO,
		DialDualStack:          true,
		DisablePathNormalizing: true, // send the path as given, as net/http does
		MaxResponseBodySize:    maxBody,
		RetryIfErr:             retryStale,
	}
}

// retryStale reports whether to send req again after err, its connection
// failed: an idempotent request, or any request the first time the server
// is found to have closed the connection before a byte of an answer (as
// one closes a connection idle too long), as net/http sends a request again
// on a fresh connection when an idle one turns out closed.
func retryStale(req *fasthttp.Request, attempts int, err error) (resetTimeout, retry bool) {
	h := &req.Header
	return false, h.IsGet() || h.IsHead() || h.IsOptions() || h.IsTrace() || (attempts == 1 && errors.Is(err, io.EOF))
}

// doFast sends req on c and reads its answer into resp, until ctx's
// deadline, following up to maxRedirects redirects if follow is set. An
// error past ctx's deadline is context.DeadlineExceeded, as an http.Client
// returns it. ctx ending before its
// deadline does not cut a request short: it ends by its deadline at the
// latest.
func doFast(ctx context.Context, c *fasthttp.Client, req *fasthttp.Request, resp *fasthttp.Response, follow bool) error {
	err := ctx.Err()
	if err == nil {
		if d, ok := ctx.Deadline(); ok {
			left := time.Until(d)
			req.SetTimeout(left)
			if left <= 0 {
				err = context.DeadlineExceeded
			}
		}
	}
	if err == nil {
		if follow {
			err = c.DoRedirects(req, resp, maxRedirects)
		} else {
			err = c.Do(req, resp)
		}
	}
	if errors.Is(err, fasthttp.ErrTimeout) {
		// The request's timeout was ctx's deadline, its timer perhaps not
		// yet fired.
		if err = ctx.Err(); err == nil {
			err = context.DeadlineExceeded
		}
	}
	return err
}

// urlError is err of req to rawURL as an http.Client returns it: a
// *url.Error, the URL's password hidden.
func urlError(req *fasthttp.Request, rawURL string, err error) error {
	if u, perr := url.Parse(rawURL); perr == nil {
		if _, ok := u.User.Password(); ok {
			u.User = url.UserPassword(u.User.Username(), "***")
			rawURL = u.String()
		}
	}
	method := string(req.Header.Method())
	return &url.Error{Op: method[:1] + strings.ToLower(method[1:]), URL: rawURL, Err: err}
}

// status is resp's status as http.Response.Status has it: "429 Too Many
// Requests".
func status(resp *fasthttp.Response) string {
	msg := string(resp.Header.StatusMessage())
	if msg == "" {
		msg = http.StatusText(resp.StatusCode())
	}
	return strconv.Itoa(resp.StatusCode()) + " " + msg
}
