package alerts

import (
	"log/slog"
	"os"
	"regexp"
	"strconv"
	"testing"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"
)

// pageFile is the dashboard's script, which judges some of the rules from
// the metrics it reads (docs/dashboard.md).
const pageFile = "../../web/dashboard/app.js"

var (
	// pageRule is one entry of the page's alertRules.
	pageRule = regexp.MustCompile(`\{ name: "(Shardstock\w+)", layer: "([a-z-]+)", threshold: ([0-9.]+),`)
	// pageMetrics is the page's list of the families it reads, and
	// pageSKUMetrics of those it reads by SKU.
	pageMetrics    = regexp.MustCompile(`(?s)const metricNames = \[(.*?)\];`)
	pageSKUMetrics = regexp.MustCompile(`(?s)const skuMetricNames = \[(.*?)\];`)
)

// TestDashboardPage: every rule the dashboard judges is an alert of the
// rules file, of the same layer, whose expression has the page's
// threshold among its numbers; every family the page reads is one the
// service exports, or one ReadMetrics serves by SKU. A rule renamed,
// moved or retuned in one place and not the other fails here.
func TestDashboardPage(t *testing.T) {
	src, err := os.ReadFile(pageFile)
	if err != nil {
		t.Fatal(err)
	}
	groups, errs := rulefmt.ParseFile(rulesFile, false, model.UTF8Validation, parser.NewParser(parser.Options{}), slog.New(slog.DiscardHandler))
	if len(errs) > 0 {
		t.Fatalf("%s: %v", rulesFile, errs)
	}
	type rule struct{ layer, expr string }
	rules := map[string]rule{}
	for _, g := range groups.Groups {
		for _, r := range g.Rules {
			rules[r.Alert] = rule{r.Labels["layer"], r.Expr}
		}
	}
	matches := pageRule.FindAllStringSubmatch(string(src), -1)
	if len(matches) < 5 {
		t.Fatalf("%s: %d alert rules found, want the page's list (did its form change?)", pageFile, len(matches))
	}
	for _, m := range matches {
		name, layer := m[1], m[2]
		threshold, err := strconv.ParseFloat(m[3], 64)
		if err != nil {
			t.Fatalf("%s: %s threshold %q: %v", pageFile, name, m[3], err)
		}
		r, ok := rules[name]
		if !ok {
			t.Errorf("%s judges %s, which is not an alert of %s", pageFile, name, rulesFile)
			continue
		}
		if r.layer != layer {
			t.Errorf("%s: %s in layer %s, the rules file has %s", pageFile, name, layer, r.layer)
		}
		if nums := numbers(t, r.expr); !nums[threshold] {
			t.Errorf("%s: %s threshold %v, not among the numbers of its rule %s", pageFile, name, threshold, r.expr)
		}
	}
	list := pageMetrics.FindSubmatch(src)
	if list == nil {
		t.Fatalf("%s: no metricNames list", pageFile)
	}
	exports := exported(t)
	for _, n := range metricName.FindAllStringSubmatch(string(list[1]), -1) {
		if !exports[n[1]] {
			t.Errorf("%s reads %s, which the service does not export", pageFile, n[1])
		}
	}
	bySKU := pageSKUMetrics.FindSubmatch(src)
	if bySKU == nil {
		t.Fatalf("%s: no skuMetricNames list", pageFile)
	}
	served := servedBySKU(t)
	for _, n := range metricName.FindAllStringSubmatch(string(bySKU[1]), -1) {
		if !served[n[1]] {
			t.Errorf("%s reads %s by SKU, which ReadMetrics does not serve by SKU", pageFile, n[1])
		}
	}
}

// numbers are the number literals of a PromQL expression.
func numbers(t *testing.T, expr string) map[float64]bool {
	t.Helper()
	e, err := parser.NewParser(parser.Options{}).ParseExpr(expr)
	if err != nil {
		t.Fatalf("parse %s: %v", expr, err)
	}
	out := map[float64]bool{}
	parser.Inspect(e, func(n parser.Node, _ []parser.Node) error {
		if l, ok := n.(*parser.NumberLiteral); ok {
			out[l.Val] = true
		}
		return nil
	})
	return out
}
