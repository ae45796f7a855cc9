package daemon

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/hotkeyd/hotkey"
	"github.com/hotkeyd/hotkey/internal/envoyconf"
)

// nearLimitRatio is the share of a limit past which admitted hits count
// as near the limit, as envoyproxy/ratelimit's default NEAR_LIMIT_RATIO.
const nearLimitRatio = 0.8

// maxDetailedLabels bounds the descriptor labels that detailed_metric and
// value_to_metric add beyond the rules' own paths: past it, a descriptor
// is counted under its rule's path.
const maxDetailedLabels = 10000

// descMetrics counts hits per Envoy descriptor, as envoyproxy/ratelimit's
// per-descriptor stats: total_hits, over_limit, near_limit, within_limit
// and shadow_mode, under hotkeyd_descriptor_* names, with labels domain and
// descriptor (the rule's path, or with detailed_metric the descriptor's
// own, up to maxDetailedLabels of them).
type descMetrics struct {
	hits, over, near, within, shadow *prometheus.CounterVec

	mu       sync.Mutex
	detailed map[string]bool // labels beyond the rules' paths
}

func newDescMetrics(reg prometheus.Registerer) *descMetrics {
	vec := func(name, help string) *prometheus.CounterVec {
		v := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "hotkeyd_descriptor_" + name, Help: help}, []string{"domain", "descriptor"})
		reg.MustRegister(v)
		return v
	}
	return &descMetrics{
		hits:     vec("hits_total", "Hits (hits_addend) asked of Envoy rate-limit descriptors, by domain and descriptor (the rule's path; the descriptor's own with detailed_metric)."),
		over:     vec("over_limit_total", "Hits of Envoy rate-limit descriptors over their limit (counted in shadow mode too)."),
		near:     vec("near_limit_total", "Admitted hits of Envoy rate-limit descriptors past 80% of their limit."),
		within:   vec("within_limit_total", "Admitted hits of Envoy rate-limit descriptors."),
		shadow:   vec("shadow_mode_total", "Hits over the limit that shadow_mode answered OK."),
		detailed: make(map[string]bool),
	}
}

// overrideLabel is the descriptor label of the descriptors that carry
// their own limit once maxDetailedLabels labels are in use: their paths
// are the requests' keys, which the configuration does not bound.
const overrideLabel = "(own limit)"

// maxLabelLen bounds a descriptor label the configuration does not bound:
// a longer one is cut, and ends in "~" and 16 hex digits of its SHA-256.
const maxLabelLen = 200

// boundLabel returns l, or if it is longer than maxLabelLen a prefix of it
// (cut on a rune boundary) and a hash of the whole.
func boundLabel(l string) string {
	if len(l) <= maxLabelLen {
		return l
	}
	sum := sha256.Sum256([]byte(l))
	n := maxLabelLen - 17
	for n > 0 && !utf8.RuneStart(l[n]) {
		n--
	}
	return l[:n] + "~" + hex.EncodeToString(sum[:8])
}

// validLabel returns l with each byte that is not part of valid UTF-8
// written as \xNN: Prometheus label values are UTF-8, and descriptor keys
// and values are the request's bytes.
func validLabel(l string) string {
	if utf8.ValidString(l) {
		return l
	}
	var b strings.Builder
	for i := 0; i < len(l); {
		r, n := utf8.DecodeRuneInString(l[i:])
		if r == utf8.RuneError && n == 1 {
			fmt.Fprintf(&b, `\x%02x`, l[i])
		} else {
			b.WriteString(l[i : i+n])
		}
		i += n
	}
	return b.String()
}

// label returns the descriptor label of m, bounded: a configured rule's
// path; or a label the configuration does not bound (detailed_metric,
// value_to_metric, a descriptor's own limit) while fewer than
// maxDetailedLabels are in use, and then the rule's path, or overrideLabel.
func (dm *descMetrics) label(m envoyconf.Match) string {
	fallback := m.Rule.Path
	if m.Rule.Override {
		fallback = overrideLabel
	} else if m.Metric == m.Rule.Path || m.Metric == "" {
		return m.Rule.Path
	}
	m.Metric = boundLabel(validLabel(m.Metric))
	dm.mu.Lock()
	defer dm.mu.Unlock()
	if !dm.detailed[m.Metric] {
		if len(dm.detailed) >= maxDetailedLabels {
			return fallback
		}
		dm.detailed[m.Metric] = true
	}
	return m.Metric
}

// count counts a decision of hits on m's rule: res, over its limit or not,
// answered OK if shadow (shadow_mode, or --shadow).
func (dm *descMetrics) count(m envoyconf.Match, hits int64, res hotkey.Result, over, shadow bool) {
	if dm == nil {
		return
	}
	labels := []string{m.Rule.Domain, dm.label(m)}
	h := float64(hits)
	dm.hits.WithLabelValues(labels...).Add(h)
	if over {
		dm.over.WithLabelValues(labels...).Add(h)
		if shadow {
			dm.shadow.WithLabelValues(labels...).Add(h)
		}
		return
	}
	dm.within.WithLabelValues(labels...).Add(h)
	limit := int64(m.Rule.RequestsPerUnit)
	threshold := int64(float64(limit) * nearLimitRatio)
	if used := limit - max(0, res.Remaining); used > threshold {
		dm.near.WithLabelValues(labels...).Add(float64(min(hits, used-threshold)))
	}
}
