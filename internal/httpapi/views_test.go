package httpapi_test

import (
	"context"
	"testing"

	"github.com/couchrep/couchrep/internal/repjob"
)

// TestRunningInfoBeforeFirstStats: a job that runs but has not reported
// stats yet shows CouchDB's "info" object (zero counters, changes_pending
// null) in _scheduler/jobs and _scheduler/docs, not null; a job that never
// ran shows null, as CouchDB's.
func TestRunningInfoBeforeFirstStats(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	doc := repjob.PersistentDoc{Server: "http://couch.example:5984", DB: "_replicator", DocID: "d1",
		Body: []byte(`{"source":"` + srcURL + `","target":"` + tgtURL + `","continuous":true}`)}
	if _, err := e.store.AddPersistent(ctx, doc); err != nil {
		t.Fatal(err)
	}
	info := func(path string) any {
		t.Helper()
		r := e.get(path)
		if r.status != 200 {
			t.Fatalf("GET %s: %d %s", path, r.status, r.body)
		}
		v, ok := r.json(t)["info"]
		if !ok {
			t.Fatalf("GET %s: no info: %s", path, r.body)
		}
		return v
	}
	if v := info("/_scheduler/docs/_replicator/d1"); v != nil {
		t.Fatalf("pending job that never ran: info %v, want null", v)
	}
	accept(t, e.store)
	for _, path := range []string{"/_scheduler/docs/_replicator/d1", "/_scheduler/jobs/" + repjob.PersistentJobID(doc.Server, doc.DB, doc.DocID)} {
		m, ok := info(path).(map[string]any)
		if !ok {
			t.Fatalf("GET %s: running job's info is not an object", path)
		}
		for k, want := range map[string]any{"docs_read": 0.0, "docs_written": 0.0, "doc_write_failures": 0.0, "revisions_checked": 0.0,
			"missing_revisions_found": 0.0, "changes_pending": nil, "checkpointed_source_seq": "0"} {
			if got, has := m[k]; !has || got != want {
				t.Errorf("GET %s: info.%s = %v (present %v), want %v", path, k, got, has, want)
			}
		}
	}
}
