package integration

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/couchrep/couchrep/internal/testserver"
)

// CouchDB's _replicator-database tests (test/javascript/tests/replicator_db_*.js
// of CouchDB 2.x: simple, continuous, credential_delegation, filtered,
// identical, invalid_filter, security, survives, by_doc_id,
// compact_rep_db, successive, bad_rep_id), adapted to 3.x, run against a
// real couchrepd watching a real server: PouchDB Server in `make test`,
// the Apache CouchDB of COUCHREP_TEST_COUCH_URL in `make test-couchdb`.
//
// What 3.x changed, and so what is asserted instead of 2.x's:
//   - a document is written only its final state (completed or failed);
//     "triggered" and "error" live in _scheduler/docs, never in the
//     document, so a running continuous document keeps its revision;
//   - user_ctx grants nothing for URL endpoints: the credentials in the
//     URLs decide (credential delegation is by URL);
//   - a filter that cannot be fetched is a temporary error (retried),
//     not a state written into the document;
//   - two documents for one replication: the second is failed, naming
//     the first, while the first's job exists;
//   - the design document the filtered test's filter lets through is
//     written (the endpoints' credentials are an admin's, or PouchDB
//     Server's admin party), so its stats count it as written.
//
// The scenarios that need users, _security and CouchDB's _replicator
// validation (credential delegation, security) run on CouchDB only: on
// PouchDB Server they check what couchrep does there.

// repDBEnv is one server, its _replicator database and the node
// watching it.
type repDBEnv struct {
	srv    *testserver.Server
	node   *nodeProc
	dir    string
	config string
	rdb    string // the _replicator database's name
	rdbURL string
}

func newRepDBEnv(t *testing.T) *repDBEnv {
	t.Helper()
	e := &repDBEnv{srv: testserver.StartPouchDB(t), dir: t.TempDir()}
	if e.srv.External() {
		// A _replicator database of the test's own (prefixed, deleted at
		// the end), never the server's.
		e.rdbURL = e.srv.CreateDB(t, "rep/_replicator")
		name, err := url.PathUnescape(strings.TrimSuffix(strings.TrimPrefix(e.rdbURL, e.srv.URL), "/"))
		if err != nil {
			t.Fatal(err)
		}
		e.rdb = name
	} else {
		plainReplicatorDB(t, e.srv, true)
		e.rdb, e.rdbURL = "_replicator", e.srv.DBURL("_replicator")
	}
	e.config = writeConfig(t, e.dir, jobsConfig+fmt.Sprintf("interval = 1000\n[couchrep]\nwatch = %s\n", strings.TrimSuffix(e.srv.URL, "/")))
	e.start(t)
	return e
}

func (e *repDBEnv) start(t *testing.T) {
	t.Helper()
	e.node = startNode(t, nodeOptions{name: "repdb", dataDir: e.dir, config: e.config})
}

// db creates a database for one scenario and returns its URL (with the
// server admin's credentials on CouchDB).
func (e *repDBEnv) db(t *testing.T, name string) string {
	t.Helper()
	return e.srv.CreateDB(t, name)
}

// docs1 are replicator_db_inc.js's documents.
func docs1() []map[string]any {
	return []map[string]any{{"_id": "foo1", "value": 11}, {"_id": "foo2", "value": 22}, {"_id": "foo3", "value": 33}}
}

// put writes documents to db and returns their revisions. On a CouchDB
// cluster a write is acknowledged by 2 copies of 3 and a _changes read
// right after may come from the third: it waits until _changes lists
// them, so that a replication started now sees them (CouchDB's own would
// not either).
func (e *repDBEnv) put(t *testing.T, db string, docs ...map[string]any) []string {
	t.Helper()
	revs := e.srv.PutDocs(t, db, docs...)
	if !e.srv.External() {
		return revs
	}
	waitUntil(t, "the writes in _changes", time.Minute, func() bool {
		b := string(e.srv.Do(t, "GET", db+"_changes?style=all_docs", nil, http.StatusOK))
		for _, rev := range revs {
			if !strings.Contains(b, `"rev":"`+rev+`"`) {
				return false
			}
		}
		return true
	})
	return revs
}

// putRep writes a replication document and returns its revision.
func (e *repDBEnv) putRep(t *testing.T, id string, doc map[string]any) string {
	t.Helper()
	var r struct{ Rev string }
	if err := json.Unmarshal(e.srv.Do(t, "PUT", e.rdbURL+url.PathEscape(id), doc, http.StatusCreated), &r); err != nil {
		t.Fatal(err)
	}
	return r.Rev
}

// repDoc reads a replication document.
func (e *repDBEnv) repDoc(t *testing.T, id string) map[string]any {
	t.Helper()
	var m map[string]any
	e.srv.GetJSON(t, e.rdbURL+url.PathEscape(id), &m)
	return m
}

// deleteRep deletes a replication document. On CouchDB every copy of its
// shard has the deletion when it returns (w=3; 202 where a single node has
// fewer copies): a write that follows lands after it on each copy.
func (e *repDBEnv) deleteRep(t *testing.T, id string) {
	t.Helper()
	d := e.repDoc(t, id)
	u := fmt.Sprintf("%s%s?rev=%s", e.rdbURL, url.PathEscape(id), d["_rev"])
	if !e.srv.External() {
		e.srv.Do(t, "DELETE", u, nil, http.StatusOK)
		return
	}
	b, status, err := e.srv.Request("DELETE", u+"&w=3", nil)
	if err != nil || (status != http.StatusOK && status != http.StatusAccepted) {
		t.Fatalf("DELETE %s: %d %s %v", id, status, b, err)
	}
}

// sameShardID returns id, or on CouchDB the first of id_1, id_2, ... that
// lives in the same shard range of the _replicator database as other
// (GET /db/_shards/docid). CouchDB's document processor reads each shard's
// changes in order, but the shards' feeds in no order between them: a
// document written after another one's deletion may be processed before
// that deletion when it is in another shard.
func (e *repDBEnv) sameShardID(t *testing.T, id, other string) string {
	t.Helper()
	if !e.srv.External() {
		return id
	}
	rangeOf := func(docID string) string {
		var r struct {
			Range string `json:"range"`
		}
		e.srv.GetJSON(t, e.rdbURL+"_shards/"+url.PathEscape(docID), &r)
		if r.Range == "" {
			t.Fatalf("GET _shards/%s: no range", docID)
		}
		return r.Range
	}
	want := rangeOf(other)
	for i := 0; i < 1000; i++ {
		cand := id
		if i > 0 {
			cand = fmt.Sprintf("%s_%d", id, i)
		}
		if rangeOf(cand) == want {
			return cand
		}
	}
	t.Fatalf("no id like %s in %s's shard range %s", id, other, want)
	return ""
}

// waitRep waits until the document's _replication_state is state
// (waitForRep); another final state fails at once.
func (e *repDBEnv) waitRep(t *testing.T, id, state string) map[string]any {
	t.Helper()
	var d map[string]any
	waitUntil(t, id+" "+state, 2*time.Minute, func() bool {
		d = e.repDoc(t, id)
		if st, _ := d["_replication_state"].(string); st != "" && st != state {
			t.Fatalf("%s is %s, want %s: %v", id, st, state, d)
		}
		return d["_replication_state"] == state
	})
	return d
}

// schedDoc is the node's GET /_scheduler/docs/{db}/{id}.
func (e *repDBEnv) schedDoc(t *testing.T, id string) (int, map[string]any) {
	t.Helper()
	r := api(t, e.node.httpAddr(""), "GET", "/_scheduler/docs/"+url.PathEscape(e.rdb)+"/"+url.PathEscape(id), "")
	var m map[string]any
	_ = json.Unmarshal(r.body, &m)
	return r.status, m
}

// waitSched waits until _scheduler/docs shows the document in state.
func (e *repDBEnv) waitSched(t *testing.T, id, state string) map[string]any {
	t.Helper()
	var m map[string]any
	waitUntil(t, id+" "+state+" in _scheduler/docs", 2*time.Minute, func() bool {
		var status int
		status, m = e.schedDoc(t, id)
		return status == http.StatusOK && m["state"] == state
	})
	return m
}

// serverForgot waits, on CouchDB, until its own scheduler no longer holds
// a job for document id. Its document processor runs with max_jobs 0 too:
// it keeps a pending job per one-shot document, on the 3-node cluster even
// after couchrep wrote the document completed, and writes failed ("already
// started, triggered by document ...") into a second document of the same
// replication, in conflict with couchrep's completed.
func (e *repDBEnv) serverForgot(t *testing.T, id string) {
	t.Helper()
	if !e.srv.External() {
		return
	}
	var last string
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("CouchDB's _scheduler/jobs: %s", last)
		}
	})
	waitUntil(t, "CouchDB's scheduler to drop the job of "+id, time.Minute, func() bool {
		var r struct {
			Jobs []struct {
				Database string `json:"database"`
				DocID    string `json:"doc_id"`
			} `json:"jobs"`
		}
		b := e.srv.Do(t, "GET", e.srv.URL+"_scheduler/jobs", nil, http.StatusOK)
		last = string(b)
		_ = json.Unmarshal(b, &r)
		for _, j := range r.Jobs {
			if j.Database == e.rdb && j.DocID == id {
				return false
			}
		}
		return true
	})
}

// open reads a document of db, nil when it does not exist.
func (e *repDBEnv) open(t *testing.T, db, id string) map[string]any {
	t.Helper()
	b, status, err := e.srv.Request("GET", db+url.PathEscape(id), nil)
	if err != nil {
		t.Fatal(err)
	}
	if status == http.StatusNotFound {
		return nil
	}
	var m map[string]any
	if status != http.StatusOK || json.Unmarshal(b, &m) != nil {
		t.Fatalf("GET %s: %d %s", id, status, b)
	}
	return m
}

// waitDoc waits until db has document id (with rev, when not "").
func (e *repDBEnv) waitDoc(t *testing.T, db, id, rev string) map[string]any {
	t.Helper()
	var d map[string]any
	waitUntil(t, "document "+id+" on the target", 2*time.Minute, func() bool {
		d = e.open(t, db, id)
		return d != nil && (rev == "" || d["_rev"] == rev)
	})
	return d
}

// wantCopies checks each document's value on the target: copied, or absent.
func (e *repDBEnv) wantCopies(t *testing.T, tgt string, docs []map[string]any, copied func(map[string]any) bool) {
	t.Helper()
	for _, d := range docs {
		c := e.open(t, tgt, d["_id"].(string))
		switch {
		case copied(d) && (c == nil || fmt.Sprint(c["value"]) != fmt.Sprint(d["value"])):
			t.Errorf("%s on the target: %v, want value %v", d["_id"], c, d["value"])
		case !copied(d) && c != nil:
			t.Errorf("%s was copied: %v", d["_id"], c)
		}
	}
}

// wantStats checks _replication_stats: revisions_checked,
// missing_revisions_found, docs_read, docs_written, doc_write_failures.
func wantStats(t *testing.T, doc map[string]any, want [5]float64) {
	t.Helper()
	st, _ := doc["_replication_stats"].(map[string]any)
	var got [5]float64
	for i, k := range []string{"revisions_checked", "missing_revisions_found", "docs_read", "docs_written", "doc_write_failures"} {
		got[i], _ = st[k].(float64)
	}
	if got != want {
		t.Errorf("_replication_stats %v: revisions_checked, missing_revisions_found, docs_read, docs_written, doc_write_failures = %v, want %v", st, got, want)
	}
}

// wantCompleted checks what CouchDB writes into a completed document, and
// that its checkpointed_source_seq is src's update_seq (unless src is "").
func wantCompleted(t *testing.T, e *repDBEnv, doc map[string]any, src string) {
	t.Helper()
	if _, ok := doc["_replication_state_time"].(string); !ok {
		t.Errorf("no _replication_state_time: %v", doc)
	}
	if _, ok := doc["_replication_stats"].(map[string]any); !ok {
		t.Errorf("no _replication_stats: %v", doc)
	}
	st, _ := doc["_replication_stats"].(map[string]any)
	if _, ok := st["checkpointed_source_seq"]; !ok || src == "" {
		if !ok {
			t.Errorf("no checkpointed_source_seq: %v", st)
		}
		return
	}
	var info struct {
		UpdateSeq json.RawMessage `json:"update_seq"`
	}
	e.srv.GetJSON(t, src, &info)
	if got, want := seqPrefix(st["checkpointed_source_seq"]), seqPrefix(info.UpdateSeq); got != want {
		t.Errorf("checkpointed_source_seq %v, the source's update_seq %s", st["checkpointed_source_seq"], info.UpdateSeq)
	}
}

// seqPrefix is a sequence's number part ("12-g1AAA..." and 12 are 12).
func seqPrefix(v any) string {
	if raw, ok := v.(json.RawMessage); ok {
		var x any
		_ = json.Unmarshal(raw, &x)
		v = x
	}
	s := fmt.Sprint(v)
	n, _, _ := strings.Cut(s, "-")
	return n
}

// TestReplicatorDBScenarios runs the scenarios on one node and one server.
func TestReplicatorDBScenarios(t *testing.T) {
	skipShort(t)
	e := newRepDBEnv(t)

	t.Run("simple", func(t *testing.T) {
		src, tgt := e.db(t, "simple-a"), e.db(t, "simple-b")
		e.put(t, src, docs1()...)
		e.putRep(t, "foo_simple_rep", map[string]any{"source": src, "target": tgt})
		d := e.waitRep(t, "foo_simple_rep", "completed")
		e.wantCopies(t, tgt, docs1(), func(map[string]any) bool { return true })
		if d["source"] != src || d["target"] != tgt {
			t.Errorf("the document's source and target changed: %v", d)
		}
		wantCompleted(t, e, d, src)
		wantStats(t, d, [5]float64{3, 3, 3, 3, 0})
	})

	t.Run("continuous", func(t *testing.T) {
		src, tgt := e.db(t, "cont-a"), e.db(t, "cont-b")
		e.put(t, src, docs1()...)
		rev := e.putRep(t, "foo_cont_rep_doc", map[string]any{"source": src, "target": tgt, "continuous": true})
		e.waitDoc(t, tgt, "foo3", "")
		e.wantCopies(t, tgt, docs1(), func(map[string]any) bool { return true })
		// The node's _active_tasks names the document.
		waitUntil(t, "the task of foo_cont_rep_doc", time.Minute, func() bool {
			var tasks []map[string]any
			_ = json.Unmarshal(api(t, e.node.httpAddr(""), "GET", "/_active_tasks", "").body, &tasks)
			for _, x := range tasks {
				if x["doc_id"] == "foo_cont_rep_doc" {
					return true
				}
			}
			return false
		})
		e.put(t, src, map[string]any{"_id": "foo1000", "value": 1001})
		if c := e.waitDoc(t, tgt, "foo1000", ""); c["value"] != float64(1001) {
			t.Errorf("foo1000 copied as %v", c)
		}
		// 3.x: running is shown in _scheduler/docs, not written.
		e.waitSched(t, "foo_cont_rep_doc", "running")
		if d := e.repDoc(t, "foo_cont_rep_doc"); d["_rev"] != rev || d["_replication_state"] != nil {
			t.Errorf("a running document was written: %v (was %s)", d, rev)
		}
		// Design documents, and their updates.
		ddocRev := e.put(t, src, map[string]any{"_id": "_design/foobar", "language": "javascript"})[0]
		e.waitDoc(t, tgt, "_design/foobar", ddocRev)
		ddocRev = e.put(t, src, map[string]any{"_id": "_design/foobar", "_rev": ddocRev, "language": "erlang"})[0]
		if !strings.HasPrefix(ddocRev, "2-") {
			t.Fatalf("design document revision %s", ddocRev)
		}
		if c := e.waitDoc(t, tgt, "_design/foobar", ddocRev); c["language"] != "erlang" {
			t.Errorf("design document copied as %v", c)
		}
		// Deleting the document stops the replication.
		e.deleteRep(t, "foo_cont_rep_doc")
		waitUntil(t, "the job of the deleted document gone", time.Minute, func() bool {
			status, _ := e.schedDoc(t, "foo_cont_rep_doc")
			return status == http.StatusNotFound
		})
		e.put(t, src, map[string]any{"_id": "foo666", "value": 999})
		if c := e.open(t, tgt, "foo666"); c != nil {
			t.Errorf("foo666 copied after the document was deleted: %v", c)
		}
	})

	t.Run("credential delegation", func(t *testing.T) {
		if !e.srv.External() {
			t.Log("users and _security: CouchDB only (make test-couchdb)")
			return
		}
		credentialDelegation(t, e)
	})

	t.Run("filtered", func(t *testing.T) {
		src, tgt := e.db(t, "filt-a"), e.db(t, "filt-b")
		docs2 := append(docs1(), map[string]any{"_id": "_design/mydesign", "language": "javascript",
			"filters": map[string]any{"myfilter": `function(doc, req) { return (doc.value % 2) !== Number(req.query.myparam); }`}})
		e.put(t, src, docs2...)
		e.putRep(t, "foo_filt_rep_doc", map[string]any{"source": src, "target": tgt, "filter": "mydesign/myfilter",
			"query_params": map[string]any{"myparam": 1}})
		d := e.waitRep(t, "foo_filt_rep_doc", "completed")
		// value % 2 !== 1: foo2 passes, foo1 and foo3 do not.
		e.wantCopies(t, tgt, docs1(), func(doc map[string]any) bool { return doc["value"].(int)%2 != 1 })
		// Not checkpointed_source_seq = update_seq (2.x's check, true there
		// because the last change passed the filter): a one-shot checkpoints
		// the last change it processed, as CouchDB's does
		// (couch_replicator_changes_reader queues last_seq only for
		// continuous feeds), and the last change here may be filtered out.
		wantCompleted(t, e, d, "")
		// foo2 and the design document (its value is undefined: NaN !== 1);
		// 2.x's local target refused the design document (1 failure), an
		// admin's URL (3.x) or PouchDB Server's admin party writes it.
		wantStats(t, d, [5]float64{2, 2, 2, 2, 0})
		if e.open(t, tgt, "_design/mydesign") == nil {
			t.Errorf("the design document the filter lets through was not written")
		}
	})

	t.Run("identical", func(t *testing.T) {
		src, tgt := e.db(t, "ident-a"), e.db(t, "ident-b")
		e.put(t, src, docs1()...)
		// Continuous, so that the first document's job exists when the
		// second is processed (replicator_db_identical_continuous.js);
		// one-shots race the first's completion.
		rep := map[string]any{"source": src, "target": tgt, "continuous": true}
		e.putRep(t, "foo_dup_rep_doc_1", rep)
		e.waitSched(t, "foo_dup_rep_doc_1", "running")
		e.putRep(t, "foo_dup_rep_doc_2", rep)
		d2 := e.waitRep(t, "foo_dup_rep_doc_2", "failed")
		if r, _ := d2["_replication_state_reason"].(string); !strings.Contains(r, "foo_dup_rep_doc_1") {
			t.Errorf("the duplicate's reason does not name the first document: %q", r)
		}
		e.waitDoc(t, tgt, "foo3", "")
		e.wantCopies(t, tgt, docs1(), func(map[string]any) bool { return true })
		if d1 := e.repDoc(t, "foo_dup_rep_doc_1"); d1["_replication_state"] != nil {
			t.Errorf("the first document was written: %v", d1)
		}
		e.deleteRep(t, "foo_dup_rep_doc_1")
	})

	t.Run("invalid filter", func(t *testing.T) { invalidFilter(t, e) })

	t.Run("security", func(t *testing.T) {
		if !e.srv.External() {
			t.Log("_users, owner and credential stripping are CouchDB's: CouchDB only (make test-couchdb)")
			return
		}
		security(t, e)
	})

	// replicator_db_field_validation.js, and docs/replicate.md's typo
	// example: CouchDB 3.x refuses a bad field at write time (403 from its
	// _replicator validation); where a server stores it, couchrep writes it
	// failed with the same reason.
	t.Run("bad field", func(t *testing.T) {
		const reason = "parameter `doc_ids` must be an array"
		doc := map[string]any{"source": e.srv.DBURL("typo-a"), "target": e.srv.DBURL("typo-b"), "doc_ids": "doc1"}
		b, status, err := e.srv.Request("PUT", e.rdbURL+"typo", doc)
		if err != nil {
			t.Fatal(err)
		}
		if e.srv.External() {
			if status != http.StatusForbidden || !strings.Contains(string(b), `"forbidden"`) || !strings.Contains(string(b), reason) {
				t.Fatalf("CouchDB stored a document with a bad field: %d %s", status, b)
			}
			return
		}
		if status != http.StatusCreated {
			t.Fatalf("PUT: %d %s", status, b)
		}
		if d := e.waitRep(t, "typo", "failed"); d["_replication_state_reason"] != reason {
			t.Errorf("_replication_state_reason %q, want %q", d["_replication_state_reason"], reason)
		}
	})

	t.Run("by doc id", func(t *testing.T) {
		src, tgt := e.db(t, "byid-a"), e.db(t, "byid-b")
		e.put(t, src, append(docs1(), map[string]any{"_id": "_design/mydesign", "language": "javascript"})...)
		e.putRep(t, "foo_cont_rep_doc", map[string]any{"source": src, "target": tgt,
			"doc_ids": []string{"foo666", "foo3", "_design/mydesign", "foo999", "foo1"}})
		d := e.waitRep(t, "foo_cont_rep_doc", "completed")
		e.wantCopies(t, tgt, docs1(), func(doc map[string]any) bool { return doc["_id"] != "foo2" })
		for _, id := range []string{"foo666", "foo999"} {
			if e.open(t, tgt, id) != nil {
				t.Errorf("%s exists on the target", id)
			}
		}
		if e.open(t, tgt, "_design/mydesign") == nil {
			t.Errorf("_design/mydesign was not copied")
		}
		wantStats(t, d, [5]float64{3, 3, 3, 3, 0})
	})

	t.Run("compaction", func(t *testing.T) {
		a, b := e.db(t, "compact-a"), e.db(t, "compact-b")
		ac, bc := e.db(t, "compact-a-copy"), e.db(t, "compact-b-copy")
		docs := make([]map[string]any, 50)
		for i := range docs {
			docs[i] = map[string]any{"_id": fmt.Sprint(i + 1), "integer": i + 1}
		}
		e.put(t, a, docs...)
		e.put(t, b, docs...)
		e.putRep(t, "compact_rep1", map[string]any{"source": a, "target": ac, "continuous": true})
		e.putRep(t, "compact_rep2", map[string]any{"source": b, "target": bc, "continuous": true})
		e.srv.Do(t, "POST", e.rdbURL+"_compact", []byte(`{}`), http.StatusAccepted)
		waitDocCount(t, e.srv, ac, 50)
		waitDocCount(t, e.srv, bc, 50)
		waitUntil(t, "the compaction's end", time.Minute, func() bool {
			var info map[string]any
			e.srv.GetJSON(t, e.rdbURL, &info)
			return info["compact_running"] != true
		})
		e.put(t, a, map[string]any{"_id": "foo666", "value": 666})
		e.put(t, b, map[string]any{"_id": "foo666", "value": 666})
		e.waitDoc(t, ac, "foo666", "")
		e.waitDoc(t, bc, "foo666", "")
		e.deleteRep(t, "compact_rep1")
		e.deleteRep(t, "compact_rep2")
	})

	t.Run("successive", func(t *testing.T) {
		src, tgt := e.db(t, "succ-a"), e.db(t, "succ-b")
		e.put(t, src, docs1()...)
		e.putRep(t, "foo_ident_rep_1", map[string]any{"source": src, "target": tgt})
		d1 := e.waitRep(t, "foo_ident_rep_1", "completed")
		e.wantCopies(t, tgt, docs1(), func(map[string]any) bool { return true })
		wantCompleted(t, e, d1, src)
		wantStats(t, d1, [5]float64{3, 3, 3, 3, 0})
		e.put(t, src, map[string]any{"_id": "doc666", "value": 666})
		if e.open(t, tgt, "doc666") != nil {
			t.Errorf("a completed one-shot copied a later write")
		}
		// On CouchDB, the second document is in the first one's shard:
		// its own document processor (max_jobs 0) then sees the first's
		// deletion before the second (see sameShardID).
		second := e.sameShardID(t, "foo_ident_rep_2", "foo_ident_rep_1")
		if e.srv.External() {
			// CouchDB's own document processor keeps a pending job for the
			// completed first document (a completed state only drops its
			// row, couch_replicator_doc_processor {completed, Id}) and
			// writes the second failed as its duplicate ("already started,
			// triggered by document foo_ident_rep_1") while that job
			// exists: the first document goes, as a user would remove it,
			// and the job with it.
			e.deleteRep(t, "foo_ident_rep_1")
			e.serverForgot(t, "foo_ident_rep_1")
		}
		e.putRep(t, second, map[string]any{"source": src, "target": tgt})
		d2 := e.waitRep(t, second, "completed")
		if c := e.open(t, tgt, "doc666"); c == nil || c["value"] != float64(666) {
			t.Errorf("doc666 on the target: %v", c)
		}
		wantCompleted(t, e, d2, src)
		// It resumed from the first one's checkpoint (same replication id)
		// and, as 3.x does (couch_replicator_scheduler_job: a job's stats
		// start from its checkpoint's), counts on from its stats: 3 + 1
		// (2.x counted this run only: 1).
		wantStats(t, d2, [5]float64{4, 4, 4, 4, 0})
		if d1["_replication_id"] != nil && d2["_replication_id"] != d1["_replication_id"] {
			t.Errorf("_replication_id %v, the first's %v", d2["_replication_id"], d1["_replication_id"])
		}
	})

	t.Run("bad rep id", func(t *testing.T) {
		src, tgt := e.db(t, "badid-a"), e.db(t, "badid-b")
		e.put(t, src, docs1()...)
		e.putRep(t, "foo_rep", map[string]any{"source": src, "target": tgt, "replication_id": "1234abc"})
		d := e.waitRep(t, "foo_rep", "completed")
		e.wantCopies(t, tgt, docs1(), func(map[string]any) bool { return true })
		if d["_replication_id"] == "1234abc" {
			t.Errorf("the document's replication_id was taken for its id: %v", d)
		}
		status, m := e.schedDoc(t, "foo_rep")
		if status == http.StatusOK && strings.HasPrefix(fmt.Sprint(m["id"]), "1234abc") {
			t.Errorf("_scheduler/docs shows the document's replication_id as its id: %v", m)
		}
	})

	// Last: it restarts the node.
	t.Run("survives restart", func(t *testing.T) {
		src, tgt := e.db(t, "surv-a"), e.db(t, "surv-b")
		e.put(t, src, docs1()...)
		rev := e.putRep(t, "foo_cont_rep_survives_doc", map[string]any{"source": src, "target": tgt, "continuous": true})
		e.waitDoc(t, tgt, "foo3", "")
		if err := e.node.stop(syscall.SIGTERM, time.Minute); err != nil {
			t.Fatal(err)
		}
		e.start(t)
		e.put(t, src, map[string]any{"_id": "foo1000", "value": 1001})
		if c := e.waitDoc(t, tgt, "foo1000", ""); c["value"] != float64(1001) {
			t.Errorf("foo1000 copied as %v", c)
		}
		d := e.repDoc(t, "foo_cont_rep_survives_doc")
		if d["continuous"] != true || d["_rev"] != rev {
			t.Errorf("the document after the restart: %v (was %s)", d, rev)
		}
		e.deleteRep(t, "foo_cont_rep_survives_doc")
	})
}

// invalidFilter: replicator_db_invalid_filter.js (COUCHDB-1199) in 3.x
// terms: a filter that cannot be fetched (no source, no design document)
// is a temporary error in _scheduler/docs, nothing is written into the
// document, and it completes once the filter exists; a valid one completes.
func invalidFilter(t *testing.T, e *repDBEnv) {
	tgt := e.db(t, "badfilt-b")
	// The source does not exist: a temporary error, nothing written.
	missing := e.srv.DBURL("badfilt-missing")
	rev1 := e.putRep(t, "badfilt_rep1", map[string]any{"source": missing, "target": tgt, "filter": "test/foofilter"})
	// The design document does not exist: the same, until it does.
	src := e.db(t, "badfilt-a")
	e.put(t, src, docs1()...)
	rev2 := e.putRep(t, "badfilt_rep2", map[string]any{"source": src, "target": tgt, "filter": "test/foofilter"})
	// Their errors name what is missing: the source database, the design
	// document (CouchDB: "Could not open source database `...`",
	// "Couldn't open document `_design/test` from source database `...`").
	for id, rev := range map[string]string{"badfilt_rep1": rev1, "badfilt_rep2": rev2} {
		m := e.waitSched(t, id, "error")
		if missing := map[string]string{"badfilt_rep1": "badfilt-missing", "badfilt_rep2": "_design/test"}[id]; !strings.Contains(fmt.Sprint(m["info"]), missing) {
			t.Errorf("%s: _scheduler/docs info does not name %s: %v", id, missing, m)
		}
		if d := e.repDoc(t, id); d["_rev"] != rev || d["_replication_state"] != nil {
			t.Errorf("%s: a filter that cannot be fetched was written into the document: %v", id, d)
		}
	}
	// A valid filter completes.
	e.put(t, src, map[string]any{"_id": "_design/mydesign", "language": "javascript",
		"filters": map[string]any{"myfilter": `function(doc, req) { return true; }`}})
	e.putRep(t, "badfilt_rep3", map[string]any{"source": src, "target": tgt, "filter": "mydesign/myfilter"})
	if d := e.waitRep(t, "badfilt_rep3", "completed"); d["_replication_state_reason"] != nil {
		t.Errorf("rep3: %v", d)
	}
	// rep2 recovers once its filter exists (retried with backoff).
	e.put(t, src, map[string]any{"_id": "_design/test", "language": "javascript",
		"filters": map[string]any{"foofilter": `function(doc, req) { return true; }`}})
	e.waitRep(t, "badfilt_rep2", "completed")
	e.deleteRep(t, "badfilt_rep1")
}

// asUser sends one request to the server as user (basic auth).
func asUser(t *testing.T, e *repDBEnv, user, pass, method, u string, body any) (int, map[string]any) {
	t.Helper()
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = strings.NewReader(string(b))
	}
	pu, err := url.Parse(u)
	if err != nil {
		t.Fatal(err)
	}
	pu.User = nil
	req, _ := http.NewRequest(method, pu.String(), rd)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json")
	req.SetBasicAuth(user, pass)
	resp, err := (&http.Client{Timeout: time.Minute}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var m map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&m)
	return resp.StatusCode, m
}

// addUser creates a user in the server's _users database, removed when the
// test ends.
func addUser(t *testing.T, e *repDBEnv, name, pass string, roles []string) {
	t.Helper()
	id := "org.couchdb.user:" + name
	u := e.srv.URL + "_users/" + url.PathEscape(id)
	if b, status, _ := e.srv.Request("GET", u, nil); status == http.StatusOK { // a leftover of an interrupted run
		var old struct {
			Rev string `json:"_rev"`
		}
		_ = json.Unmarshal(b, &old)
		e.srv.Do(t, "DELETE", u+"?rev="+old.Rev, nil, http.StatusOK)
	}
	e.srv.Do(t, "PUT", u, map[string]any{"_id": id, "type": "user", "name": name, "password": pass, "roles": roles}, http.StatusCreated)
	t.Cleanup(func() {
		if b, status, _ := e.srv.Request("GET", u, nil); status == http.StatusOK {
			var cur struct {
				Rev string `json:"_rev"`
			}
			_ = json.Unmarshal(b, &cur)
			_, _, _ = e.srv.Request("DELETE", u+"?rev="+cur.Rev, nil)
		}
	})
}

// withUser is u with name:pass as its credentials.
func withUser(u, name, pass string) string {
	pu, _ := url.Parse(u)
	pu.User = url.UserPassword(name, pass)
	return pu.String()
}

// credentialDelegation: replicator_db_credential_delegation.js in 3.x
// terms: the target's _security makes role "god" its admins; a
// replication with the credentials of a user without that role copies the
// documents but not the design document (doc_write_failures 1), one with
// them copies it too.
func credentialDelegation(t *testing.T, e *repDBEnv) {
	src, tgt := e.db(t, "deleg-a"), e.db(t, "deleg-b")
	e.put(t, src, append(docs1(), map[string]any{"_id": "_design/beer", "language": "javascript"})...)
	e.srv.Do(t, "PUT", tgt+"_security", map[string]any{"admins": map[string]any{"names": []string{}, "roles": []string{"god"}},
		"members": map[string]any{"names": []string{}, "roles": []string{"erlanger"}}}, http.StatusOK)
	user := "couchrep-test-joe-" + fmt.Sprint(time.Now().UnixNano()%1e6)
	addUser(t, e, user, "erly", []string{"erlanger"})
	god := user + "-god"
	addUser(t, e, god, "erly", []string{"god", "erlanger"})

	e.putRep(t, "foo_rep_del_doc_1", map[string]any{"source": src, "target": withUser(tgt, user, "erly")})
	d := e.waitRep(t, "foo_rep_del_doc_1", "completed")
	e.wantCopies(t, tgt, docs1(), func(map[string]any) bool { return true })
	if e.open(t, tgt, "_design/beer") != nil {
		t.Errorf("a user who is not an admin of the target wrote its design document")
	}
	wantStats(t, d, [5]float64{4, 4, 4, 3, 1})

	e.putRep(t, "foo_rep_del_doc_2", map[string]any{"source": src, "target": withUser(tgt, god, "erly")})
	e.waitRep(t, "foo_rep_del_doc_2", "completed")
	if c := e.open(t, tgt, "_design/beer"); c == nil || c["language"] != "javascript" {
		t.Errorf("an admin of the target (role god) did not write the design document: %v", c)
	}
}

// security: replicator_db_security.js's part that involves a replicator in
// 3.x: a user's document (CouchDB sets its owner) runs with the user's
// credentials, its completed state is written without touching the owner,
// other users never see its credentials, and neither does _scheduler/docs
// (they are left out, as CouchDB leaves them out).
func security(t *testing.T, e *repDBEnv) {
	src, tgt := e.db(t, "sec-a"), e.db(t, "sec-b")
	e.put(t, src, docs1()...)
	suffix := fmt.Sprint(time.Now().UnixNano() % 1e6)
	owner, other := "couchrep-test-fdmanana-"+suffix, "couchrep-test-jchris-"+suffix
	addUser(t, e, owner, "foobar", []string{})
	addUser(t, e, other, "mp3", []string{})
	// The user may write the target and read the source: members.
	for _, db := range []string{src, tgt} {
		e.srv.Do(t, "PUT", db+"_security", map[string]any{"members": map[string]any{"names": []string{owner}, "roles": []string{}}}, http.StatusOK)
	}
	// Every user may write the _replicator database (as the server's own:
	// a new database is admin-only in 3.x).
	e.srv.Do(t, "PUT", e.rdbURL+"_security", map[string]any{}, http.StatusOK)
	srcWithCreds := withUser(src, owner, "foobar")
	status, r := asUser(t, e, owner, "foobar", "PUT", e.rdbURL+"fdmanana-rep-doc",
		map[string]any{"source": srcWithCreds, "target": withUser(tgt, owner, "foobar")})
	if status != http.StatusCreated {
		t.Fatalf("the user's document: %d %v", status, r)
	}
	d := e.waitRep(t, "fdmanana-rep-doc", "completed")
	e.wantCopies(t, tgt, docs1(), func(map[string]any) bool { return true })
	if d["owner"] != owner {
		t.Errorf("owner %v after couchrep wrote the state, want %s", d["owner"], owner)
	}
	wantStats(t, d, [5]float64{3, 3, 3, 3, 0})
	// The owner sees the credentials, another user does not.
	if _, mine := asUser(t, e, owner, "foobar", "GET", e.rdbURL+"fdmanana-rep-doc", nil); mine["source"] != srcWithCreds {
		t.Errorf("the owner reads source %v, want it with the credentials", mine["source"])
	}
	_, theirs := asUser(t, e, other, "mp3", "GET", e.rdbURL+"fdmanana-rep-doc", nil)
	if s, _ := theirs["source"].(string); strings.Contains(s, "foobar") {
		t.Errorf("another user reads the credentials: %v", theirs)
	}
	// Another user cannot edit it.
	theirs["target"] = e.srv.DBURL("sec-c")
	if status, _ := asUser(t, e, other, "mp3", "PUT", e.rdbURL+"fdmanana-rep-doc", theirs); status != http.StatusForbidden && status != http.StatusUnauthorized {
		t.Errorf("another user edited the document: %d", status)
	}
	// A running replication of the user's: _scheduler/docs and
	// _scheduler/jobs list its URLs without the credentials, not masked
	// (README step 4), as CouchDB lists them.
	status, r = asUser(t, e, owner, "foobar", "PUT", e.rdbURL+"fdmanana-cont",
		map[string]any{"source": srcWithCreds, "target": withUser(tgt, owner, "foobar"), "continuous": true})
	if status != http.StatusCreated {
		t.Fatalf("the user's continuous document: %d %v", status, r)
	}
	m := e.waitSched(t, "fdmanana-cont", "running")
	jobs := string(api(t, e.node.httpAddr(""), "GET", "/_scheduler/jobs", "").body)
	for what, shown := range map[string]string{"_scheduler/docs": fmt.Sprint(m), "_scheduler/jobs": jobs} {
		if strings.Contains(shown, "foobar") || strings.Contains(shown, "*****") || strings.Contains(shown, owner+":") {
			t.Errorf("%s shows the credentials: %s", what, shown)
		}
	}
	if src, _ := m["source"].(string); !strings.HasSuffix(src, "sec-a/") || strings.Contains(src, "@") {
		t.Errorf("_scheduler/docs source %q", m["source"])
	}
	e.deleteRep(t, "fdmanana-cont")
}
