package daemon

import (
	"net/http"
	"strconv"
	"sync"
)

// appendAllowResponse appends r as json.Marshal encodes it, and a newline.
func appendAllowResponse(b []byte, r AllowResponse) []byte {
	b = append(b, `{"allowed":`...)
	b = strconv.AppendBool(b, r.Allowed)
	b = append(b, `,"limit":`...)
	b = strconv.AppendInt(b, r.Limit, 10)
	b = append(b, `,"remaining":`...)
	b = strconv.AppendInt(b, r.Remaining, 10)
	b = append(b, `,"reset_after_ms":`...)
	b = strconv.AppendInt(b, r.ResetAfterMs, 10)
	b = append(b, `,"retry_after_ms":`...)
	b = strconv.AppendInt(b, r.RetryAfterMs, 10)
	b = append(b, `,"shards":`...)
	b = strconv.AppendInt(b, int64(r.Shards), 10)
	b = append(b, `,"degraded":`...)
	b = strconv.AppendBool(b, r.Degraded)
	if r.ShadowDenied {
		b = append(b, `,"shadow_denied":true`...)
	}
	return append(b, "}\n"...)
}

// bufPool holds the buffers requests are read into and answers encoded in.
var bufPool = sync.Pool{New: func() any { b := make([]byte, 0, 512); return &b }}

// maxPooled is the largest buffer put back in bufPool: a batch's is left
// to the collector.
const maxPooled = 64 << 10

func getBuf() *[]byte { return bufPool.Get().(*[]byte) }

func putBuf(b *[]byte) {
	if cap(*b) > maxPooled {
		return
	}
	*b = (*b)[:0]
	bufPool.Put(b)
}

// The header values an answer sets, shared by every answer: net/http only
// reads them, and an append to one (len = cap) copies it.
var (
	jsonContentType = []string{"application/json"}
	// contentLengths[n] is the Content-Length header of an n-byte body.
	contentLengths = func() [][]string {
		v := make([][]string, 256)
		for i := range v {
			v[i] = []string{strconv.Itoa(i)}
		}
		return v
	}()
)

// writeBody writes body, JSON, with status; it returns the status.
func writeBody(w http.ResponseWriter, status int, body []byte) int {
	h := w.Header()
	h["Content-Type"] = jsonContentType
	if len(body) < len(contentLengths) {
		h["Content-Length"] = contentLengths[len(body)]
	} else {
		h["Content-Length"] = []string{strconv.Itoa(len(body))}
	}
	w.WriteHeader(status)
	w.Write(body)
	return status
}
