// Package alerts checks shardstock's Prometheus rules: they parse as
// Prometheus parses them, cover the four layers, and every expression names
// a metric the service exports. A module of its own, so that Prometheus's
// dependencies stay out of the service's go.mod.
package alerts

import (
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"
)

const (
	rulesFile = "shardstock.rules.yml"
	sourceDir = "../../internal" // where the service declares its metrics
)

// layers are the source document's four layers of alerts.
var layers = []string{"data-safety", "business-flow", "execution", "capacity"}

// metricName is how the service's code names a metric: a string literal.
var metricName = regexp.MustCompile(`"(shardstock_[a-z0-9_]+)"`)

// exported returns every metric name the service's code declares, with the
// series names a histogram adds.
func exported(t *testing.T) map[string]bool {
	t.Helper()
	names := map[string]bool{}
	err := filepath.WalkDir(sourceDir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return err
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range metricName.FindAllStringSubmatch(string(src), -1) {
			for _, suffix := range []string{"", "_bucket", "_sum", "_count"} {
				names[m[1]+suffix] = true
			}
		}
		return nil
	})
	if err != nil || len(names) == 0 {
		t.Fatalf("reading the service's metric names under %s: %v (%d found)", sourceDir, err, len(names))
	}
	// The per-SKU families are ReadMetrics's alone, never on /metrics: no
	// rule can select them.
	for name := range servedBySKU(t) {
		for _, suffix := range []string{"", "_bucket", "_sum", "_count"} {
			delete(names, name+suffix)
		}
	}
	return names
}

// skuCallsFile declares the families ReadMetrics serves by SKU
// (transport.SKUCallsFamily, transport.SKUSecondsFamily).
const skuCallsFile = "../../internal/transport/skucalls.go"

var skuFamily = regexp.MustCompile(`Family\s*=\s*"(shardstock_[a-z0-9_]+)"`)

// servedBySKU returns the families ReadMetrics serves by SKU.
func servedBySKU(t *testing.T) map[string]bool {
	t.Helper()
	src, err := os.ReadFile(skuCallsFile)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, m := range skuFamily.FindAllStringSubmatch(string(src), -1) {
		out[m[1]] = true
	}
	if len(out) == 0 {
		t.Fatalf("%s declares no per-SKU family (did its form change?)", skuCallsFile)
	}
	return out
}

// selectors returns the metric names an expression selects.
func selectors(t *testing.T, expr string) []string {
	t.Helper()
	e, err := parser.NewParser(parser.Options{}).ParseExpr(expr)
	if err != nil {
		t.Fatalf("expression %q: %v", expr, err)
	}
	var out []string
	parser.Inspect(e, func(n parser.Node, _ []parser.Node) error {
		if vs, ok := n.(*parser.VectorSelector); ok {
			out = append(out, vs.Name)
		}
		return nil
	})
	return out
}

func TestRules(t *testing.T) {
	groups, errs := rulefmt.ParseFile(rulesFile, false, model.UTF8Validation, parser.NewParser(parser.Options{}), slog.New(slog.DiscardHandler))
	for _, err := range errs {
		t.Errorf("%s: %v", rulesFile, err)
	}
	if t.Failed() {
		t.FailNow()
	}
	names := exported(t)
	ops, err := os.ReadFile("../../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]int{}
	for _, g := range groups.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				continue
			}
			for _, name := range selectors(t, r.Expr) {
				if !names[name] {
					t.Errorf("alert %s selects %q, which the service does not export", r.Alert, name)
				}
			}
			layer := r.Labels["layer"]
			seen[layer]++
			if !contains(layers, layer) {
				t.Errorf("alert %s: layer %q, want one of %v", r.Alert, layer, layers)
			}
			if sev := r.Labels["severity"]; sev != "page" && sev != "warn" {
				t.Errorf("alert %s: severity %q, want page or warn", r.Alert, sev)
			}
			if want := "docs/operations.md#" + strings.ToLower(r.Alert); r.Annotations["runbook"] != want {
				t.Errorf("alert %s: runbook %q, want %q", r.Alert, r.Annotations["runbook"], want)
			}
			if !strings.Contains(string(ops), "\n### "+r.Alert+"\n") {
				t.Errorf("alert %s has no runbook: docs/operations.md lacks a heading \"### %s\"", r.Alert, r.Alert)
			}
		}
	}
	for _, l := range layers {
		if seen[l] == 0 {
			t.Errorf("no alert in layer %s", l)
		}
	}
}

// TestRules_Reconciliation: the books are alerted on from the scheduled
// reconciliation's own metrics, with no one calling Reconcile: an
// unbalanced SKU from its gauge, and the passes stopping from the time of
// the last that finished.
func TestRules_Reconciliation(t *testing.T) {
	groups, errs := rulefmt.ParseFile(rulesFile, false, model.UTF8Validation, parser.NewParser(parser.Options{}), slog.New(slog.DiscardHandler))
	if len(errs) > 0 {
		t.Fatalf("%s: %v", rulesFile, errs)
	}
	want := map[string][]string{
		"ShardstockReconcileUnbalanced": {"shardstock_reconcile_unbalanced", "shardstock_reconcile_last_success_timestamp_seconds"},
		"ShardstockReconcileStale":      {"shardstock_reconcile_last_success_timestamp_seconds"},
	}
	for _, g := range groups.Groups {
		for _, r := range g.Rules {
			names, ok := want[r.Alert]
			if !ok {
				continue
			}
			delete(want, r.Alert)
			for _, name := range names {
				if !contains(selectors(t, r.Expr), name) {
					t.Errorf("alert %s does not select %s: %s", r.Alert, name, r.Expr)
				}
			}
		}
	}
	for alert := range want {
		t.Errorf("no alert %s in %s", alert, rulesFile)
	}
}

// A misspelt metric is caught: the check cannot pass for every name.
func TestRules_CatchesUnknownMetric(t *testing.T) {
	names := exported(t)
	for _, name := range selectors(t, `rate(shardstock_allocator_soldout_checks_totl[5m])`) {
		if names[name] {
			t.Errorf("%q counted as exported", name)
		}
	}
}

func contains(xs []string, x string) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}
