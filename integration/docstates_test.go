package integration

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/couchrep/couchrep/internal/redact"
	"github.com/couchrep/couchrep/internal/testserver"
)

// docStatesSubject is what answers GET /_scheduler/docs for the
// _replicator database rdb: a couchrepd watching a PouchDB Server, or, under
// `make test-couchdb`, Apache CouchDB itself, whose own document processor
// is the oracle for every claim these tests make about CouchDB (it runs
// even with [replicator] max_jobs = 0: its documents then wait as pending).
type docStatesSubject struct {
	srv    *testserver.Server
	rdb    string // the _replicator database's URL
	dbName string // its name, as _scheduler/docs shows it
	get    func(path string) (int, map[string]any)
}

func newDocStatesSubject(t *testing.T) *docStatesSubject {
	srv := testserver.StartPouchDB(t)
	s := &docStatesSubject{srv: srv}
	if srv.External() {
		s.rdb = srv.DBURL("ds/_replicator")
		s.srv.CreateDB(t, "ds/_replicator")
		u, _ := url.Parse(s.rdb)
		s.dbName = strings.TrimSuffix(strings.TrimPrefix(u.Path, "/"), "/")
		s.get = func(path string) (int, map[string]any) {
			b, status, err := srv.Request("GET", strings.TrimSuffix(srv.URL, "/")+path, nil)
			if err != nil {
				t.Fatalf("GET %s: %v", path, err)
			}
			var m map[string]any
			_ = json.Unmarshal(b, &m)
			return status, m
		}
		return s
	}
	plainReplicatorDB(t, srv, true)
	s.rdb, s.dbName = srv.DBURL("_replicator"), "_replicator"
	ini := filepath.Join(t.TempDir(), "node.ini")
	// Crashes back off 2 s then 4 s, so that a document whose filter
	// appears runs soon after.
	cfg := fmt.Sprintf("[couchrep]\nwatch = %s\n[replicator]\nstartup_jitter = 0\nmin_backoff_penalty_sec = 2\nmax_backoff_penalty_sec = 4\n", strings.TrimSuffix(srv.URL, "/"))
	if err := os.WriteFile(ini, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	addr := startNode(t, nodeOptions{config: ini}).httpAddr("")
	s.get = func(path string) (int, map[string]any) {
		r := api(t, addr, "GET", path, "")
		var m map[string]any
		_ = json.Unmarshal(r.body, &m)
		return r.status, m
	}
	return s
}

// entry is GET /_scheduler/docs/{db}/{id}: nil unless 200.
func (s *docStatesSubject) entry(id string) map[string]any {
	status, m := s.get("/_scheduler/docs/" + url.PathEscape(s.dbName) + "/" + url.PathEscape(id))
	if status != http.StatusOK {
		return nil
	}
	return m
}

// waitEntry polls the document's entry until cond holds, and returns it.
func (s *docStatesSubject) waitEntry(t *testing.T, id, what string, cond func(map[string]any) bool) map[string]any {
	t.Helper()
	var e map[string]any
	waitUntil(t, id+": "+what, 90*time.Second, func() bool {
		e = s.entry(id)
		return e != nil && cond(e)
	})
	return e
}

func (s *docStatesSubject) put(t *testing.T, id string, doc map[string]any) {
	t.Helper()
	s.srv.Do(t, "PUT", s.rdb+url.PathEscape(id), doc, http.StatusCreated)
}

// doc reads a replication document.
func (s *docStatesSubject) doc(t *testing.T, id string) map[string]any {
	t.Helper()
	var m map[string]any
	s.srv.GetJSON(t, s.rdb+url.PathEscape(id), &m)
	return m
}

// shown is an endpoint URL as _scheduler/docs shows it: no credentials.
func shown(u string) string { return redact.StripUserinfo(u) }

func stateIs(st string) func(map[string]any) bool {
	return func(e map[string]any) bool { return e["state"] == st }
}

// TestReplicatorDocFilterError: a _replicator document whose named filter
// cannot be fetched is CouchDB's temporary "error" (its text, no source or
// target, an error count), nothing is written into the document, and it
// runs once the filter exists. Observed on CouchDB 3.4.3: the three texts
// below, exactly; it retries after rand(64·2^errors) s.
func TestReplicatorDocFilterError(t *testing.T) {
	skipShort(t)
	s := newDocStatesSubject(t)
	src := s.srv.CreateDB(t, "src")
	s.srv.Do(t, "PUT", src+"d1", map[string]any{"i": 1}, http.StatusCreated)
	s.srv.Do(t, "PUT", src+"_design/g", map[string]any{"filters": map[string]any{"other": "function(d){return true}"}}, http.StatusCreated)
	missing := s.srv.DBURL("missing")
	tgt := s.srv.DBURL("tgt")
	s.put(t, "noddoc", map[string]any{"source": src, "target": tgt, "create_target": true, "filter": "f/by"})
	s.put(t, "nosource", map[string]any{"source": missing, "target": s.srv.DBURL("tgt2"), "create_target": true, "filter": "f/by"})
	s.put(t, "nofilter", map[string]any{"source": src, "target": s.srv.DBURL("tgt3"), "create_target": true, "filter": "g/by"})

	want := map[string]string{
		"noddoc":   fmt.Sprintf("Couldn't open document `_design/f` from source database `%s`: {error,<<\"not_found\">>}", shown(src)),
		"nosource": fmt.Sprintf("Could not open source database `%s`: {db_not_found,<<\"%s\">>}", shown(missing), shown(missing)),
		"nofilter": fmt.Sprintf("Couldn't parse filter code from document g on `%s`  Error: {not_found,<<\"missing json key: by\">>}", shown(src)),
	}
	for id, text := range want {
		e := s.waitEntry(t, id, "error", stateIs("error"))
		if info, _ := e["info"].(map[string]any); info["error"] != text {
			t.Errorf("%s: info %v, want error %q", id, e["info"], text)
		}
		if n, _ := e["error_count"].(float64); n < 1 || e["id"] != nil || e["node"] == nil {
			t.Errorf("%s: entry %v: want error_count >= 1, id null, a node", id, e)
		}
		for _, k := range []string{"source", "target"} {
			if _, has := e[k]; has {
				t.Errorf("%s: an error entry has %s (CouchDB's has none): %v", id, k, e)
			}
		}
		for k := range s.doc(t, id) {
			if strings.HasPrefix(k, "_replication") {
				t.Errorf("%s: %s written into the document", id, k)
			}
		}
	}
	status, list := s.get("/_scheduler/docs/" + url.PathEscape(s.dbName) + "?states=error")
	if rows, _ := list["docs"].([]any); status != http.StatusOK || len(rows) != 3 {
		t.Errorf("?states=error: %d, %d rows, want 3: %v", status, len(rows), list)
	}
	// Not in the scheduler yet: _scheduler/jobs does not list them.
	_, jobs := s.get("/_scheduler/jobs")
	for _, j := range jobs["jobs"].([]any) {
		if m := j.(map[string]any); m["database"] == s.dbName {
			t.Errorf("_scheduler/jobs lists a document whose filter cannot be fetched: %v", m)
		}
	}
	if s.srv.External() {
		// CouchDB retries after rand(64·2^errors) s: minutes, too long
		// for a test; couchrep's crash backoff is checked below.
		return
	}

	// The filter appears: the document runs and completes.
	s.srv.Do(t, "PUT", src+"_design/f", map[string]any{"filters": map[string]any{"by": "function(d){return true}"}}, http.StatusCreated)
	s.waitEntry(t, "noddoc", "completed", stateIs("completed"))
	waitUntil(t, "noddoc completed in its document", 60*time.Second, func() bool {
		return s.doc(t, "noddoc")["_replication_state"] == "completed"
	})
	if _, status, _ := s.srv.Request("GET", tgt+"d1", nil); status != http.StatusOK {
		t.Fatalf("d1 on the target: %d", status)
	}
}

// TestReplicatorDocWrittenTerminal: a document that carries completed or
// failed (written so, or completed by CouchDB before a takeover) is listed
// by _scheduler/docs with what CouchDB 3.4.3 reads from it
// (couch_replicator:info_from_doc): the exact entries below.
func TestReplicatorDocWrittenTerminal(t *testing.T) {
	skipShort(t)
	s := newDocStatesSubject(t)
	src, tgt := s.srv.DBURL("src"), s.srv.DBURL("tgtx")
	s.put(t, "wcompleted", map[string]any{"source": src, "target": map[string]any{"url": tgt, "headers": map[string]any{"a": "b"}},
		"_replication_state": "completed", "_replication_state_time": "2026-01-02T03:04:05+00:00",
		"_replication_stats": map[string]any{"revisions_checked": 3, "docs_written": 3, "checkpointed_source_seq": 7, "start_time": "2026-01-02T03:04:00Z", "extra": "x"}})
	s.put(t, "wcompletednostats", map[string]any{"source": src, "target": tgt, "_replication_state": "completed"})
	s.put(t, "wfailed", map[string]any{"source": src, "target": tgt, "_replication_state": "failed",
		"_replication_state_time": "2026-01-02T03:04:05Z", "_replication_state_reason": "some reason"})
	// Not validated: a failed document is ignored whatever it holds.
	s.put(t, "wfailedbad", map[string]any{"source": src, "target": tgt, "worker_processes": "four", "_replication_state": "failed"})

	base := func(id, state string) map[string]any {
		return map[string]any{"database": s.dbName, "doc_id": id, "id": nil, "source": shown(src), "target": shown(tgt), "state": state}
	}
	with := func(m map[string]any, kv ...any) map[string]any {
		for i := 0; i < len(kv); i += 2 {
			m[kv[i].(string)] = kv[i+1]
		}
		return m
	}
	want := map[string]map[string]any{
		"wcompleted": with(base("wcompleted", "completed"), "error_count", 0.0, "start_time", "2026-01-02T03:04:00Z", "last_updated", "2026-01-02T03:04:05+00:00",
			"info", map[string]any{"revisions_checked": 3.0, "docs_written": 3.0, "checkpointed_source_seq": 7.0, "extra": "x"}),
		"wcompletednostats": with(base("wcompletednostats", "completed"), "error_count", 0.0, "start_time", nil, "last_updated", nil, "info", map[string]any{}),
		"wfailed": with(base("wfailed", "failed"), "error_count", 1.0, "start_time", "2026-01-02T03:04:05Z", "last_updated", "2026-01-02T03:04:05Z",
			"info", map[string]any{"error": "some reason"}),
		"wfailedbad": with(base("wfailedbad", "failed"), "error_count", 1.0, "start_time", nil, "last_updated", nil, "info", nil),
	}
	for id, w := range want {
		e := s.waitEntry(t, id, w["state"].(string), stateIs(w["state"].(string)))
		delete(e, "server") // couchrep's: which watched server
		if got, exp := fmt.Sprint(e), fmt.Sprint(w); got != exp {
			t.Errorf("%s:\n got %s\nwant %s", id, got, exp)
		}
	}
	for state, n := range map[string]int{"completed": 2, "failed": 2} {
		_, list := s.get("/_scheduler/docs/" + url.PathEscape(s.dbName) + "?states=" + state)
		if rows, _ := list["docs"].([]any); len(rows) != n {
			t.Errorf("?states=%s: %d rows, want %d: %v", state, len(rows), n, list)
		}
	}
	// Nothing ran: no target.
	if _, status, _ := s.srv.Request("GET", tgt, nil); status != http.StatusNotFound {
		t.Errorf("target answers %d: a document written completed or failed ran", status)
	}
}

// TestReplicatorDocEditKeepingState: editing a completed or failed document
// while it keeps its _replication_state does not run it (CouchDB 3.4.3
// ignores the change); removing the state runs it.
func TestReplicatorDocEditKeepingState(t *testing.T) {
	skipShort(t)
	s := newDocStatesSubject(t)
	src := s.srv.CreateDB(t, "src")
	s.srv.Do(t, "PUT", src+"d1", map[string]any{"i": 1}, http.StatusCreated)
	t1, t2, t3 := s.srv.DBURL("t1"), s.srv.DBURL("t2"), s.srv.DBURL("t3")
	if s.srv.External() {
		// CouchDB's scheduler is off: the document is written completed,
		// as CouchDB writes it.
		s.put(t, "done", map[string]any{"source": src, "target": t1, "create_target": true, "_replication_state": "completed",
			"_replication_state_time": "2026-01-02T03:04:05Z", "_replication_stats": map[string]any{"docs_written": 1}})
	} else {
		s.put(t, "done", map[string]any{"source": src, "target": t1, "create_target": true})
		waitUntil(t, "done completed in its document", 60*time.Second, func() bool {
			return s.doc(t, "done")["_replication_state"] == "completed"
		})
	}
	s.put(t, "bad", map[string]any{"source": src, "target": t3, "_replication_state": "failed", "_replication_state_reason": "was bad"})
	s.waitEntry(t, "bad", "failed", stateIs("failed"))

	// Edit both to new targets, keeping their states.
	for id, target := range map[string]string{"done": t2, "bad": t2} {
		d := s.doc(t, id)
		d["target"] = target
		s.srv.Do(t, "PUT", s.rdb+id, d, http.StatusCreated)
	}
	// A document put after them: once it is processed (an error: its
	// filter is missing), so are the edits.
	s.put(t, "sentinel", map[string]any{"source": src, "target": s.srv.DBURL("t9"), "filter": "nope/none"})
	s.waitEntry(t, "sentinel", "error", stateIs("error"))
	for id, st := range map[string]string{"done": "completed", "bad": "failed"} {
		e := s.entry(id)
		if e["state"] != st || e["target"] != shown(t2) {
			t.Errorf("%s after an edit keeping %s: %v", id, st, e)
		}
		if d := s.doc(t, id); d["_replication_state"] != st {
			t.Errorf("%s: document's state %v, want %s", id, d["_replication_state"], st)
		}
	}
	if _, status, _ := s.srv.Request("GET", t2, nil); status != http.StatusNotFound {
		t.Errorf("new target answers %d: an edit keeping the terminal state ran the replication", status)
	}

	// Removing the state runs it.
	d := s.doc(t, "done")
	delete(d, "_replication_state")
	s.srv.Do(t, "PUT", s.rdb+"done", d, http.StatusCreated)
	if s.srv.External() {
		s.waitEntry(t, "done", "scheduled again", func(e map[string]any) bool { return e["state"] == "pending" || e["state"] == "running" })
		return
	}
	waitUntil(t, "done completed again in its document", 60*time.Second, func() bool {
		return s.doc(t, "done")["_replication_state"] == "completed"
	})
	b, status, _ := s.srv.Request("GET", t2, nil)
	if status != http.StatusOK {
		t.Fatalf("new target answers %d %s after the state was removed", status, b)
	}
}
