package alerts

import (
	"encoding/json"
	"os"
	"regexp"
	"strings"
	"testing"
)

// dashboardFile is shardstock's Grafana board, which deploy/grafana's
// kustomization makes a ConfigMap that Grafana's sidecar loads.
const dashboardFile = "../grafana/shardstock.json"

// madeByPrometheus are series Prometheus makes, not the service: the
// alerts firing.
var madeByPrometheus = map[string]bool{"ALERTS": true}

// grafanaVars are the board's variables and Grafana's own, each with a
// value that keeps an expression valid PromQL, so that Prometheus's
// parser can read it as Grafana will send it.
var grafanaVars = strings.NewReplacer("$__rate_interval", "1m", "$__interval", "1m", "${datasource}", "ds", "$sku", "sku-1")

type dashboardPanel struct {
	Type    string `json:"type"`
	Title   string `json:"title"`
	Targets []struct {
		Expr string `json:"expr"`
	} `json:"targets"`
	Panels []dashboardPanel `json:"panels"` // a collapsed row's
}

type dashboard struct {
	Panels     []dashboardPanel `json:"panels"`
	Templating struct {
		List []struct {
			Name       string `json:"name"`
			Definition string `json:"definition"`
		} `json:"list"`
	} `json:"templating"`
}

// labelValues is a template variable's query of label values of a metric.
var labelValues = regexp.MustCompile(`^label_values\(([a-zA-Z_:][a-zA-Z0-9_:]*)\s*,\s*[a-zA-Z_]+\)$`)

// TestDashboard: the board's rows are the four layers of the alert rules,
// in their order, each with panels; every panel's PromQL parses with
// Prometheus's parser and every metric it (or a variable's query) names is
// one the service exports, as read from its code, or one Prometheus makes.
func TestDashboard(t *testing.T) {
	raw, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(raw, &d); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	names := exported(t)
	check := func(where, expr string) {
		t.Helper()
		for _, name := range selectors(t, grafanaVars.Replace(expr)) {
			if !names[name] && !madeByPrometheus[name] {
				t.Errorf("%s selects %q, which the service does not export", where, name)
			}
		}
	}
	var rows []string
	perRow := map[string]int{}
	for _, p := range d.Panels {
		if p.Type == "row" {
			rows = append(rows, p.Title)
			for _, c := range p.Panels {
				perRow[p.Title]++
				checkPanel(t, c, check)
			}
			continue
		}
		if len(rows) == 0 {
			t.Errorf("panel %q comes before the first row", p.Title)
			continue
		}
		perRow[rows[len(rows)-1]]++
		checkPanel(t, p, check)
	}
	if len(rows) != len(layers) {
		t.Fatalf("rows %q, want one per layer %v", rows, layers)
	}
	for i, r := range rows {
		if strings.ReplaceAll(strings.ToLower(r), " ", "-") != layers[i] {
			t.Errorf("row %d is %q, want layer %s", i, r, layers[i])
		}
		if perRow[r] == 0 {
			t.Errorf("row %q has no panel", r)
		}
	}
	for _, v := range d.Templating.List {
		if v.Definition == "" {
			continue
		}
		m := labelValues.FindStringSubmatch(v.Definition)
		if m == nil {
			t.Errorf("variable %s: query %q, want label_values(metric, label)", v.Name, v.Definition)
			continue
		}
		check("variable "+v.Name, m[1])
	}
}

// checkPanel checks that a panel queries something and each query with
// check.
func checkPanel(t *testing.T, p dashboardPanel, check func(where, expr string)) {
	t.Helper()
	if len(p.Targets) == 0 {
		t.Errorf("panel %q has no query", p.Title)
	}
	for _, q := range p.Targets {
		if strings.TrimSpace(q.Expr) == "" {
			t.Errorf("panel %q has an empty query", p.Title)
			continue
		}
		check("panel "+p.Title, q.Expr)
	}
}
