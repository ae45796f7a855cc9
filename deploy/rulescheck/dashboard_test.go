package rulescheck

import (
	"encoding/json"
	"os"
	"regexp"
	"testing"

	"github.com/prometheus/prometheus/promql/parser"
)

const dashboardFile = "../grafana/hotkey.json"

var (
	reRange = regexp.MustCompile(`\$__(rate_)?(interval|range)\b`)
	reVar   = regexp.MustCompile(`\$\{?[A-Za-z_][A-Za-z0-9_]*\}?`)
)

// TestDashboardQueries: every query of deploy/grafana/hotkey.json's panels
// is PromQL that Prometheus parses, Grafana's variables replaced ($__*
// ranges by 5m, the others by a value).
func TestDashboardQueries(t *testing.T) {
	b, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var dash map[string]any
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	p := parser.NewParser(parser.Options{})
	n := 0
	var walk func(title string, v any)
	walk = func(title string, v any) {
		switch v := v.(type) {
		case map[string]any:
			if s, ok := v["title"].(string); ok {
				title = s
			}
			if e, ok := v["expr"].(string); ok {
				n++
				q := reVar.ReplaceAllString(reRange.ReplaceAllString(e, "5m"), "x")
				if _, err := p.ParseExpr(q); err != nil {
					t.Errorf("%s: panel %q: %s: %v", dashboardFile, title, e, err)
				}
			}
			for _, x := range v {
				walk(title, x)
			}
		case []any:
			for _, x := range v {
				walk(title, x)
			}
		}
	}
	walk("", dash["panels"])
	if n == 0 {
		t.Fatalf("%s: no panel queries", dashboardFile)
	}
}
