// Package rulescheck runs Prometheus's own parsers on the deployment kit's
// Prometheus files: a module of its own, so that Prometheus's dependencies
// stay out of the main module's.
package rulescheck

import (
	"log/slog"
	"testing"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"
)

const alertsFile = "../prometheus/alerts.yaml"

// TestAlertRules: deploy/prometheus/alerts.yaml is accepted by the parser
// Prometheus loads rule files with (YAML with no unknown field, PromQL,
// label names, annotation templates), and holds alerting rules only, each
// with a for duration, a severity label, a summary and a description.
func TestAlertRules(t *testing.T) {
	groups, errs := rulefmt.ParseFile(alertsFile, false, model.UTF8Validation, parser.NewParser(parser.Options{}), slog.New(slog.DiscardHandler))
	for _, err := range errs {
		t.Error(err)
	}
	if groups == nil {
		t.FailNow()
	}
	n := 0
	for _, g := range groups.Groups {
		for _, r := range g.Rules {
			n++
			if r.Alert == "" {
				t.Errorf("group %s: a recording rule (%s): the file is for alerts", g.Name, r.Record)
				continue
			}
			if r.For <= 0 {
				t.Errorf("alert %s: no for: duration", r.Alert)
			}
			if r.Labels["severity"] == "" {
				t.Errorf("alert %s: no severity label", r.Alert)
			}
			for _, a := range []string{"summary", "description"} {
				if r.Annotations[a] == "" {
					t.Errorf("alert %s: no %s annotation", r.Alert, a)
				}
			}
		}
	}
	if n == 0 {
		t.Errorf("%s: no rules", alertsFile)
	}
}
