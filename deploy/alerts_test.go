package deploy_test

import (
	"maps"
	"regexp"
	"slices"
	"strings"
	"testing"
)

const (
	operationsFile = "docs/operations.md"
	deployDocFile  = "docs/deploy.md"
)

var (
	reBackticked = regexp.MustCompile("`([^`]*)`")
	reAlertRow   = regexp.MustCompile("(?m)^\\| `(Hotkey[A-Za-z0-9]*)` \\(")
	reSpace      = regexp.MustCompile(`\s+`)
)

// TestAlertsRecommended: every query that docs/operations.md names as
// worth an alert (a backticked expression of a hotkey metric in its
// "Worth an alert" paragraph) has an alert in the rules that uses its
// metrics with its label matchers.
func TestAlertsRecommended(t *testing.T) {
	doc := string(readFile(t, operationsFile))
	i := strings.Index(doc, "Worth an alert")
	if i < 0 {
		t.Fatalf("%s: no \"Worth an alert\" paragraph", operationsFile)
	}
	para, _, _ := strings.Cut(doc[i:], "\n\n")
	alerts := alertQueries(t)
	n := 0
	for _, m := range reBackticked.FindAllStringSubmatch(para, -1) {
		rec := m[1]
		names := metricNames(rec)
		if len(names) == 0 {
			continue
		}
		n++
		var matchers []string
		for _, sel := range selectors(rec) {
			for _, mm := range reMatcher.FindAllString(sel.matchers, -1) {
				matchers = append(matchers, reSpace.ReplaceAllString(mm, ""))
			}
		}
		found := false
		for _, a := range alerts {
			expr := reSpace.ReplaceAllString(a.expr, "")
			ok := true
			for _, s := range append(names, matchers...) {
				ok = ok && strings.Contains(expr, s)
			}
			found = found || ok
		}
		if !found {
			t.Errorf("%s recommends an alert on %s: no rule of %s queries %v with %v", operationsFile, rec, alertsFile, names, matchers)
		}
	}
	if n == 0 {
		t.Fatalf("%s: no metric in the \"Worth an alert\" paragraph", operationsFile)
	}
}

// TestAlertsDocumented: docs/deploy.md's table of alerts has a row for
// every alert of the rules, and no other.
func TestAlertsDocumented(t *testing.T) {
	rules := map[string]bool{}
	for _, q := range alertQueries(t) {
		_, name, _ := strings.Cut(q.where, " / ")
		rules[name] = true
	}
	doc := map[string]bool{}
	for _, m := range reAlertRow.FindAllStringSubmatch(string(readFile(t, deployDocFile)), -1) {
		doc[m[1]] = true
	}
	for _, a := range slices.Sorted(maps.Keys(rules)) {
		if !doc[a] {
			t.Errorf("alert %s of %s: no row in %s", a, alertsFile, deployDocFile)
		}
	}
	for _, a := range slices.Sorted(maps.Keys(doc)) {
		if !rules[a] {
			t.Errorf("%s documents alert %s, not in %s", deployDocFile, a, alertsFile)
		}
	}
}
