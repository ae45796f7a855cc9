package loadgencmd

import (
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/hotkeyd/hotkey/loadgen"
)

// summary is a run's result as the table and --json give it.
type summary struct {
	Target string `json:"target"`
	// API is how the target is asked: hotkeyd, plain or envoy.
	API         string  `json:"api"`
	Policy      string  `json:"policy,omitempty"`
	Domain      string  `json:"domain,omitempty"`
	Workload    string  `json:"workload"`
	Rate        float64 `json:"rate"`
	DurationSec float64 `json:"duration_s"`
	ElapsedSec  float64 `json:"elapsed_s"`
	Sent        int64   `json:"sent"`
	Allowed     int64   `json:"allowed"`
	Denied      int64   `json:"denied"`
	Errors      int64   `json:"errors"`
	FirstError  string  `json:"first_error,omitempty"`
	Decisions   float64 `json:"decisions_per_s"`
	LatencyMs   struct {
		P50  float64 `json:"p50"`
		P90  float64 `json:"p90"`
		P99  float64 `json:"p99"`
		P999 float64 `json:"p99_9"`
		Max  float64 `json:"max"`
		Mean float64 `json:"mean"`
	} `json:"latency_ms"`
	Key struct {
		Name string `json:"name"`
		// MaxLevel is the highest level /v1/hotkeys reported during the
		// run (0 without --status).
		MaxLevel int `json:"max_level"`
		// PerSecond is the key's decisions in each second of the run.
		PerSecond []loadgen.Bucket `json:"per_second"`
		// Ideal is, with --limit, the key's admitted requests set against
		// a perfect limiter's.
		Ideal *ideal `json:"ideal,omitempty"`
	} `json:"key"`
	// Quotas counts the answers that reported their limit (Envoy's
	// statuses, rate-limit headers, hotkeyd's JSON), and LastQuota is the
	// one of them meant to be sent last.
	Quotas    int64  `json:"quotas"`
	LastQuota *quota `json:"last_quota,omitempty"`
}

// ideal is --key's admitted requests against a perfect token bucket of
// --limit per --period.
type ideal struct {
	Limit     int64   `json:"limit"`
	PeriodSec float64 `json:"period_s"`
	Ideal     int64   `json:"ideal"`
	Admitted  int64   `json:"admitted"`
	// OfIdeal is Admitted ÷ Ideal: above 1, more than the limit admitted.
	OfIdeal float64 `json:"admitted_of_ideal"`
}

// quota is a loadgen.Quota in seconds; a field the answer did not carry
// is 0.
type quota struct {
	Limit         int64   `json:"limit"`
	WindowSec     float64 `json:"window_s"`
	Remaining     int64   `json:"remaining"`
	ResetAfterSec float64 `json:"reset_after_s"`
	RetryAfterSec float64 `json:"retry_after_s"`
}

func summarize(c config, r *loadgen.Result, maxLevel int64) summary {
	s := summary{
		Target: c.target, API: c.api, Workload: c.workload, Rate: c.rate,
		DurationSec: c.duration.Seconds(), ElapsedSec: r.Elapsed.Seconds(),
		Sent: r.Sent, Allowed: r.Allowed, Denied: r.Denied, Errors: r.Errors,
		Decisions: r.Rate(),
	}
	if r.FirstError != nil {
		s.FirstError = r.FirstError.Error()
	}
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	l := &r.Latency
	s.LatencyMs.P50, s.LatencyMs.P90, s.LatencyMs.P99 = ms(l.Quantile(0.5)), ms(l.Quantile(0.9)), ms(l.Quantile(0.99))
	s.LatencyMs.P999, s.LatencyMs.Max, s.LatencyMs.Mean = ms(l.Quantile(0.999)), ms(l.Max()), ms(l.Mean())
	s.Key.Name, s.Key.MaxLevel, s.Key.PerSecond = c.key, int(maxLevel), r.Watched
	switch c.api {
	case apiHotkeyd:
		s.Policy = c.policy
	case apiEnvoy:
		s.Domain = c.domain
	}
	if c.limit > 0 {
		s.Key.Ideal = &ideal{Limit: c.limit, PeriodSec: c.period.Seconds(), Ideal: r.Ideal, Admitted: r.WatchedAllowed(), OfIdeal: r.OfIdeal()}
	}
	s.Quotas = r.Quotas
	if q := r.Quota; q.Reported {
		s.LastQuota = &quota{Limit: q.Limit, WindowSec: q.Window.Seconds(), Remaining: q.Remaining,
			ResetAfterSec: q.ResetAfter.Seconds(), RetryAfterSec: q.RetryAfter.Seconds()}
	}
	return s
}

func (s summary) table(w io.Writer) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	switch s.API {
	case apiHotkeyd:
		fmt.Fprintf(tw, "target\t%s (policy %q, workload %s)\n", s.Target, s.Policy, s.Workload)
	case apiEnvoy:
		fmt.Fprintf(tw, "target\t%s (Envoy rate-limit service, domain %q, workload %s)\n", s.Target, s.Domain, s.Workload)
	default:
		fmt.Fprintf(tw, "target\t%s (HTTP endpoint: 2xx admitted, 429 denied; workload %s)\n", s.Target, s.Workload)
	}
	fmt.Fprintf(tw, "sent\t%d in %.1f s (%.0f/s asked)\n", s.Sent, s.ElapsedSec, s.Rate)
	fmt.Fprintf(tw, "decided\t%.0f/s: %d allowed, %d denied\n", s.Decisions, s.Allowed, s.Denied)
	if s.Errors > 0 {
		fmt.Fprintf(tw, "errors\t%d, first: %s\n", s.Errors, s.FirstError)
	}
	fmt.Fprintf(tw, "latency (ms)\tp50 %.2f  p90 %.2f  p99 %.2f  p99.9 %.2f  max %.2f\n",
		s.LatencyMs.P50, s.LatencyMs.P90, s.LatencyMs.P99, s.LatencyMs.P999, s.LatencyMs.Max)
	var allowed, denied int64
	shards := 0
	for _, b := range s.Key.PerSecond {
		allowed += b.Allowed
		denied += b.Denied
		shards = max(shards, b.Shards)
	}
	fmt.Fprintf(tw, "key %q\t%d allowed, %d denied", s.Key.Name, allowed, denied)
	if shards > 0 {
		fmt.Fprintf(tw, "; decided on up to %d subcounters", shards)
	}
	if s.Key.MaxLevel > 0 {
		// The level in force can be above the subcounters a decision
		// uses: a limit too small to split that far is split less.
		fmt.Fprintf(tw, "; level %d at most in /v1/hotkeys", s.Key.MaxLevel)
	}
	fmt.Fprintln(tw)
	if i := s.Key.Ideal; i != nil {
		fmt.Fprintf(tw, "ideal\t%d of %d per %v: admitted ÷ ideal %.3f\n", i.Ideal, i.Limit, time.Duration(i.PeriodSec*float64(time.Second)), i.OfIdeal)
	}
	if q := s.LastQuota; q != nil {
		fmt.Fprintf(tw, "quota\t%d answers reported one; the last: limit %d", s.Quotas, q.Limit)
		if q.WindowSec > 0 {
			fmt.Fprintf(tw, " per %gs", q.WindowSec)
		}
		fmt.Fprintf(tw, ", %d remaining, reset in %gs", q.Remaining, q.ResetAfterSec)
		if q.RetryAfterSec > 0 {
			fmt.Fprintf(tw, ", retry after %gs", q.RetryAfterSec)
		}
		fmt.Fprintln(tw)
	}
	tw.Flush()
}
