package integration

import (
	"fmt"
	"net/http"
	"testing"

	"github.com/couchrep/couchrep/internal/testserver"
)

// TestMetricsCountOnlyOwnWork is issue 32's phantom throughput: the
// node's counters (couchrep_replication_docs_read_total, _docs_written_total,
// revisions checked, missing revisions found) count what this process
// copied, never the stats a job restores when it (re)starts from a
// checkpoint. A replication copies 30 documents; run again with nothing
// to copy the counters stay; a second node with the first's server uuid
// (a takeover: it finds the first's checkpoint with its 30 in the
// history) runs it with nothing to copy and counts 0, though the job's
// own stats say 30, as CouchDB's do.
func TestMetricsCountOnlyOwnWork(t *testing.T) {
	skipShort(t)
	s := testserver.StartPouchDB(t)
	src, tgt := s.CreateDB(t, "metrics-src"), s.CreateDB(t, "metrics-tgt")
	var docs []map[string]any
	for i := range 30 {
		docs = append(docs, map[string]any{"_id": fmt.Sprintf("d%02d", i)})
	}
	s.PutDocs(t, src, docs...)
	body := fmt.Sprintf(`{"source":%q,"target":%q}`, src, tgt)
	replicate := func(addr string) map[string]any {
		t.Helper()
		r := api(t, addr, "POST", "/_replicate", body)
		if r.status != http.StatusOK {
			t.Fatalf("POST /_replicate: %d %s", r.status, r.body)
		}
		return r.obj(t)
	}
	counters := []string{"couchrep_replication_docs_read_total", "couchrep_replication_docs_written_total",
		"couchrep_replication_revisions_checked_total", "couchrep_replication_missing_revisions_found_total"}
	want := func(what, addr string, n float64) {
		t.Helper()
		for _, name := range counters {
			if got := metricValue(t, addr, name); got != n {
				t.Errorf("%s: %s = %v, want %v", what, name, got, n)
			}
		}
	}

	n1 := startNode(t, nodeOptions{})
	a1 := n1.httpAddr("")
	replicate(a1)
	want("after copying 30 documents", a1, 30)
	res := replicate(a1)
	want("after the same replication again, nothing to copy", a1, 30)
	if h := historyOf(res); h["docs_read"] != 30.0 {
		t.Errorf("second run's history %v, want docs_read 30 (restored)", h)
	}

	var root struct {
		UUID string `json:"uuid"`
	}
	getJSON(t, a1, "/", &root)
	if root.UUID == "" {
		t.Fatal("GET / has no uuid")
	}
	n2 := startNode(t, nodeOptions{extra: []string{"--adopt-uuid", root.UUID}})
	a2 := n2.httpAddr("")
	res = replicate(a2)
	want("on a node taking the replication over, nothing to copy", a2, 0)
	if h := historyOf(res); h["docs_read"] != 30.0 {
		t.Errorf("taken-over run's history %v, want docs_read 30 (the first node's checkpoint)", h)
	}
}

func historyOf(res map[string]any) map[string]any {
	hist, _ := res["history"].([]any)
	if len(hist) == 0 {
		return nil
	}
	h, _ := hist[0].(map[string]any)
	return h
}
