package couchrep_test

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/couchrep/couchrep"
	"github.com/couchrep/couchrep/messages"
)

// metricName finds metric names in PromQL: ours and the Go/process
// collectors'.
var metricName = regexp.MustCompile(`\b(?:couchrep|process|go)_[a-z0-9_]+\b`)

// promBuiltins are series Prometheus makes itself, not a node.
var promBuiltins = map[string]bool{"up": true}

// exprsOf returns every "expr" string in a Grafana dashboard.
func exprsOf(v any, out *[]string) {
	switch x := v.(type) {
	case map[string]any:
		for k, c := range x {
			if s, ok := c.(string); ok && k == "expr" {
				*out = append(*out, s)
			}
			exprsOf(c, out)
		}
	case []any:
		for _, c := range x {
			exprsOf(c, out)
		}
	}
}

// scrapeNames returns the metric families a node's GET /metrics declares
// (# TYPE lines), with the series names of histograms and summaries.
func scrapeNames(t *testing.T, url string) map[string]bool {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	names := map[string]bool{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 4 && f[0] == "#" && f[1] == "TYPE" {
			names[f[2]] = true
			if f[3] == "histogram" || f[3] == "summary" {
				for _, suf := range []string{"_bucket", "_sum", "_count"} {
					names[f[2]+suf] = true
				}
			}
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return names
}

// TestDeployMetricNamesAreExported checks that every metric the Grafana
// dashboard and the Prometheus rules in deploy/ use is one a node exports
// on GET /metrics.
func TestDeployMetricNamesAreExported(t *testing.T) {
	cfg := couchrep.DefaultConfig()
	cfg.Couchrep.DataDir = t.TempDir()
	cfg.Couchrep.HTTPBind = "127.0.0.1:0"
	cfg.Shares = map[string]int{"high/_replicator": 200} // per-database share series
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	n, err := couchrep.Start(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := n.Stop(ctx); err != nil {
			t.Errorf("stop: %v", err)
		}
	}()
	b, err := os.ReadFile(filepath.Join(cfg.Couchrep.DataDir, "http.addr"))
	if err != nil {
		t.Fatal(err)
	}
	base := "http://" + strings.TrimSpace(string(b))
	// Labelled series appear once something happened: a request to the
	// API and an actor restart.
	if resp, err := http.Get(base + "/"); err == nil {
		resp.Body.Close()
	}
	if _, err := n.Request(ctx, &messages.KillRequest{Actor: "job_server/acceptor"}); err != nil {
		t.Fatal(err)
	}
	var names map[string]bool
	deadline := time.Now().Add(time.Minute)
	for {
		names = scrapeNames(t, base+"/metrics")
		if names["couchrep_actor_restarts_total"] && names["couchrep_http_requests_total"] || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}

	used := map[string][]string{} // metric name → files using it
	rules, err := os.ReadFile("deploy/prometheus/couchrep-rules.yml")
	if err != nil {
		t.Fatal(err)
	}
	var exprs []string
	for _, line := range strings.Split(string(rules), "\n") {
		if e, ok := strings.CutPrefix(strings.TrimSpace(line), "expr:"); ok {
			exprs = append(exprs, e)
		}
	}
	if len(exprs) < 4 {
		t.Fatalf("only %d rules in couchrep-rules.yml", len(exprs))
	}
	for _, e := range exprs {
		for _, m := range metricName.FindAllString(e, -1) {
			used[m] = append(used[m], "couchrep-rules.yml")
		}
	}
	raw, err := os.ReadFile("deploy/grafana/couchrep-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash any
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatalf("dashboard is not JSON: %v", err)
	}
	exprs = nil
	exprsOf(dash, &exprs)
	if len(exprs) < 10 {
		t.Fatalf("only %d queries in the dashboard", len(exprs))
	}
	for _, e := range exprs {
		for _, m := range metricName.FindAllString(e, -1) {
			used[m] = append(used[m], "couchrep-dashboard.json")
		}
	}
	var missing []string
	for m, files := range used {
		if !names[m] && !promBuiltins[m] {
			missing = append(missing, m+" (used in "+strings.Join(files, ", ")+")")
		}
	}
	sort.Strings(missing)
	if len(missing) > 0 {
		t.Fatalf("metrics used in deploy/ that the node does not export:\n  %s", strings.Join(missing, "\n  "))
	}
	if len(used) < 20 {
		t.Fatalf("only %d metric names found in deploy/: %v", len(used), used)
	}
}
