package integration

import (
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/couchrep/couchrep/internal/testserver"
)

// TestSchedulerDocsShowsEveryState drives _replicator documents through
// every state a replication can be in — completed, failed, running,
// pending, crashing — on a real couchrepd watching a real PouchDB Server,
// and reads each state back from GET /_scheduler/docs, as a user would.
func TestSchedulerDocsShowsEveryState(t *testing.T) {
	skipShort(t)
	srv := testserver.StartPouchDB(t)
	plainReplicatorDB(t, srv, true)
	src := srv.CreateDB(t, "src")
	for i := range 5 {
		srv.Do(t, "PUT", fmt.Sprintf("%sd%d", src, i), map[string]any{"i": i}, 201)
	}
	dir := t.TempDir()
	ini := filepath.Join(dir, "node.ini")
	// One slot, so that a second continuous replication waits; a short
	// backoff, so that crashing shows quickly.
	cfg := fmt.Sprintf("[couchrep]\nwatch = %s\n[replicator]\nmax_jobs = 1\nstartup_jitter = 0\nmin_backoff_penalty_sec = 2\n", strings.TrimSuffix(srv.URL, "/"))
	if err := os.WriteFile(ini, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	n := startNode(t, nodeOptions{config: ini})
	addr := n.httpAddr("")
	rdb := srv.DBURL("_replicator")

	// docState reads one document's state from /_scheduler/docs/_replicator/{id}.
	docState := func(id string) (string, map[string]any) {
		r := api(t, addr, "GET", "/_scheduler/docs/_replicator/"+url.PathEscape(id), "")
		if r.status != 200 {
			return fmt.Sprintf("HTTP %d", r.status), nil
		}
		m := r.obj(t)
		st, _ := m["state"].(string)
		return st, m
	}
	waitDoc := func(id, state string) map[string]any {
		t.Helper()
		var last string
		var doc map[string]any
		waitUntil(t, id+" "+state+" in _scheduler/docs", 90*time.Second, func() bool {
			last, doc = docState(id)
			return last == state
		})
		return doc
	}

	// completed: a one-shot replication.
	srv.Do(t, "PUT", rdb+"oneshot", map[string]any{"source": src, "target": srv.DBURL("t1"), "create_target": true}, 201)
	done := waitDoc("oneshot", "completed")
	if done["doc_id"] != "oneshot" || done["database"] != "_replicator" {
		t.Fatalf("completed entry: %v", done)
	}

	// failed: an invalid document, with a reason naming the field.
	srv.Do(t, "PUT", rdb+"bad", map[string]any{"source": src, "target": srv.DBURL("t2"), "doc_ids": "d1"}, 201)
	bad := waitDoc("bad", "failed")
	if !strings.Contains(fmt.Sprint(bad["info"]), "doc_ids") {
		t.Fatalf("failed entry does not name the field: %v", bad)
	}

	// running: a continuous replication holds the only slot...
	srv.Do(t, "PUT", rdb+"cont", map[string]any{"source": src, "target": srv.DBURL("t3"), "create_target": true, "continuous": true}, 201)
	waitDoc("cont", "running")

	// ...so an unreachable one waits: pending.
	srv.Do(t, "PUT", rdb+"unreachable", map[string]any{"source": "http://127.0.0.1:1/nowhere", "target": srv.DBURL("t4"), "continuous": true}, 201)
	waitDoc("unreachable", "pending")

	// A second slot lets it run; it crashes and backs off: crashing.
	if _, errOut, code := n.ctl("config", "set", "max_jobs=2"); code != 0 {
		t.Fatalf("couchrepctl config set: exit %d: %s", code, errOut)
	}
	crash := waitDoc("unreachable", "crashing")
	if crash["error_count"] == nil || fmt.Sprint(crash["error_count"]) == "0" {
		t.Fatalf("crashing entry has no error count: %v", crash)
	}

	// The list endpoint shows all five with their states, and filters by state.
	r := api(t, addr, "GET", "/_scheduler/docs/_replicator", "").obj(t)
	states := map[string]string{}
	for _, d := range r["docs"].([]any) {
		m := d.(map[string]any)
		states[m["doc_id"].(string)], _ = m["state"].(string)
	}
	want := map[string]string{"oneshot": "completed", "bad": "failed", "cont": "running", "unreachable": "crashing"}
	for id, st := range want {
		if states[id] != st {
			t.Errorf("_scheduler/docs/_replicator lists %s as %q, want %q (all: %v)", id, states[id], st, states)
		}
	}
	f := api(t, addr, "GET", "/_scheduler/docs/_replicator?states=crashing,failed", "").obj(t)
	if rows := f["docs"].([]any); len(rows) != 2 {
		t.Errorf("states=crashing,failed gives %d docs, want 2: %v", len(rows), rows)
	}
}
