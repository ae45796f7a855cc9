package daemon

import (
	"log/slog"
	"maps"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/hotkeyd/hotkey"
	"github.com/hotkeyd/hotkey/counter"
	"github.com/hotkeyd/hotkey/internal/testkit"
)

// descNames is a Registerer that records the names of the metrics its
// collectors describe, and registers nothing.
type descNames struct{ names []string }

var reFQName = regexp.MustCompile(`fqName: "([^"]*)"`)

func (r *descNames) Register(c prometheus.Collector) error {
	ch := make(chan *prometheus.Desc)
	go func() {
		c.Describe(ch)
		close(ch)
	}()
	for d := range ch {
		if m := reFQName.FindStringSubmatch(d.String()); m != nil {
			r.names = append(r.names, m[1])
		}
	}
	return nil
}

func (r *descNames) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		r.Register(c)
	}
}

func (r *descNames) Unregister(prometheus.Collector) bool { return false }

// engineMetricNames returns the names of the metrics the engine library
// registers on the Registerer given to hotkey.WithMetrics.
func engineMetricNames(t *testing.T) []string {
	t.Helper()
	rec := &descNames{}
	e, err := hotkey.New(counter.NewMemoryStore(counter.MemoryConfig{}), hotkey.WithMetrics(rec))
	if err != nil {
		t.Fatal(err)
	}
	e.Close()
	if len(rec.names) == 0 {
		t.Fatal("the engine registered no metric")
	}
	return rec.names
}

// scrapeFamilies starts a daemon with Envoy rules, sends a decision over
// HTTP, NATS and gRPC (one on a rule, so that the descriptor metrics are
// exported), and returns its /metrics, parsed.
func scrapeFamilies(t *testing.T) map[string]*dto.MetricFamily {
	t.Helper()
	e := startRLS(t, "memory", invalidUTF8Rules)
	base := "http://" + e.d.Addr()
	client := &http.Client{Transport: &http.Transport{}, Timeout: time.Minute}
	defer client.CloseIdleConnections()
	resp, err := client.Post(base+"/v1/allow", "application/json", strings.NewReader(`{"key":"a"}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	nc, err := nats.Connect(e.d.NATSURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if _, err := nc.Request(natsSubject, []byte(`{"key":"n"}`), time.Minute); err != nil {
		t.Fatal(err)
	}
	if _, err := e.raw(wireRequest("edge", []string{"remote_address", "203.0.113.7"})); err != nil {
		t.Fatal(err)
	}

	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(scrapeMetrics(t, e.d)))
	if err != nil {
		t.Fatalf("/metrics: %v", err)
	}
	return fams
}

// TestMetricLabelsReserved: no metric of a daemon's /metrics has a label
// that Prometheus sets on every series it scrapes (job, instance), which
// a scrape would rename to exported_job, exported_instance.
func TestMetricLabelsReserved(t *testing.T) {
	fams := scrapeFamilies(t)
	for _, name := range slices.Sorted(maps.Keys(fams)) {
		seen := map[string]bool{}
		for _, m := range fams[name].GetMetric() {
			for _, l := range m.GetLabel() {
				if n := l.GetName(); (n == model.JobLabel || n == model.InstanceLabel || strings.HasPrefix(n, "exported_")) && !seen[n] {
					seen[n] = true
					t.Errorf("%s has a label %q: Prometheus renames it on scrape", name, n)
				}
			}
		}
	}
}

// TestMetricPrefixes: the metrics the engine library registers are named
// hotkey_*, and those only the daemon exports hotkeyd_*.
func TestMetricPrefixes(t *testing.T) {
	engine := engineMetricNames(t)
	for _, n := range engine {
		if !strings.HasPrefix(n, "hotkey_") {
			t.Errorf("engine metric %s: want the prefix hotkey_", n)
		}
	}
	fams := scrapeFamilies(t)
	daemonOnly := 0
	for _, name := range slices.Sorted(maps.Keys(fams)) {
		if !strings.HasPrefix(name, "hotkey") || slices.Contains(engine, name) {
			continue
		}
		daemonOnly++
		if !strings.HasPrefix(name, "hotkeyd_") {
			t.Errorf("daemon metric %s: not the engine's, want the prefix hotkeyd_", name)
		}
	}
	if daemonOnly == 0 {
		t.Error("no daemon metric on /metrics")
	}

	// The TLS metrics, which only a daemon with --tls-cert exports.
	ca := testkit.NewCA(t, "hotkeyd test CA")
	cert, key := ca.Server(t, "hotkeyd", "127.0.0.1")
	f, err := newTLSFiles(Config{TLSCert: cert, TLSKey: key}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	rec := &descNames{}
	rec.MustRegister(f.metrics()...)
	if len(rec.names) == 0 {
		t.Error("no TLS metric")
	}
	for _, n := range rec.names {
		if !strings.HasPrefix(n, "hotkeyd_tls_") {
			t.Errorf("TLS metric %s: want the prefix hotkeyd_tls_", n)
		}
	}
}
