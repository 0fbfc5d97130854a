package integration

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/couchrep/couchrep/internal/testserver"
)

// CouchDB's replicator scenarios that need a replicator server: the HTTP
// API of a real couchrepd (POST /_replicate, _active_tasks,
// _scheduler/jobs) and its job server. See scenarios_test.go.

// rejectEvenVDU is couch_replicator_retain_stats_between_job_runs' vdu().
const rejectEvenVDU = `function(newDoc, oldDoc, userCtx) {
  if (newDoc.nope === true) { throw({forbidden: 'nope'}); } else { return; }
}`

// populateRejectEven writes docs start..end, the even ones with
// {"nope":true} (populate_db_reject_even_docs).
func populateRejectEven(t *testing.T, s *testserver.Server, db string, start, end int) {
	t.Helper()
	var docs []map[string]any
	for i := start; i <= end; i++ {
		d := map[string]any{"_id": fmt.Sprint(i)}
		if i%2 == 0 {
			d["nope"] = true
		}
		docs = append(docs, d)
	}
	s.PutDocs(t, db, docs...)
}

// jobStats are the counters CouchDB's retained-stats test reads from a
// task of _active_tasks and from a job's info in _scheduler/jobs.
type jobStats struct {
	DocsRead         *int64 `json:"docs_read"`
	DocsWritten      *int64 `json:"docs_written"`
	DocWriteFailures *int64 `json:"doc_write_failures"`
	BulkGetDocs      *int64 `json:"bulk_get_docs"`
	BulkGetAttempts  *int64 `json:"bulk_get_attempts"`
}

func (s jobStats) is(read, written, failed int64) bool {
	eq := func(p *int64, v int64) bool { return p != nil && *p == v }
	return eq(s.DocsRead, read) && eq(s.BulkGetDocs, read) && eq(s.BulkGetAttempts, read) &&
		eq(s.DocsWritten, written) && eq(s.DocWriteFailures, failed)
}

func (s jobStats) String() string {
	v := func(p *int64) string {
		if p == nil {
			return "absent"
		}
		return fmt.Sprint(*p)
	}
	return fmt.Sprintf("docs_read %s, bulk_get_docs %s, bulk_get_attempts %s, docs_written %s, doc_write_failures %s",
		v(s.DocsRead), v(s.BulkGetDocs), v(s.BulkGetAttempts), v(s.DocsWritten), v(s.DocWriteFailures))
}

// waitJobStats waits until the job's task in _active_tasks and its info in
// _scheduler/jobs both show the counters (check_active_tasks/3 and
// check_scheduler_jobs/3); the info must also have every key CouchDB's
// test lists.
func waitJobStats(t *testing.T, addr, id string, read, written, failed int64) {
	t.Helper()
	var task, info jobStats
	var infoRaw map[string]json.RawMessage
	deadline := time.Now().Add(time.Minute)
	for {
		var tasks []struct {
			jobStats
			ReplicationID string `json:"replication_id"`
		}
		task = jobStats{}
		if r := api(t, addr, "GET", "/_active_tasks", ""); r.status == http.StatusOK {
			_ = json.Unmarshal(r.body, &tasks)
			for _, x := range tasks {
				if x.ReplicationID == id {
					task = x.jobStats
				}
			}
		}
		var job struct {
			Info json.RawMessage `json:"info"`
		}
		info, infoRaw = jobStats{}, nil
		if r := api(t, addr, "GET", "/_scheduler/jobs/"+id, ""); r.status == http.StatusOK {
			_ = json.Unmarshal(r.body, &job)
			_ = json.Unmarshal(job.Info, &info)
			_ = json.Unmarshal(job.Info, &infoRaw)
		}
		if task.is(read, written, failed) && info.is(read, written, failed) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("job %s after 1 min: _active_tasks %v; _scheduler/jobs info %v; want docs_read = bulk_get_docs = bulk_get_attempts = %d, docs_written %d, doc_write_failures %d",
				id, task, info, read, written, failed)
		}
		time.Sleep(50 * time.Millisecond)
	}
	for _, k := range []string{"changes_pending", "doc_write_failures", "docs_read", "bulk_get_docs", "bulk_get_attempts",
		"docs_written", "missing_revisions_found", "checkpointed_source_seq", "source_seq", "revisions_checked"} {
		if _, ok := infoRaw[k]; !ok {
			t.Errorf("_scheduler/jobs info has no %q: %v", k, infoRaw)
		}
	}
}

// replicateContinuous posts a continuous replication and returns its id.
func replicateContinuous(t *testing.T, addr, src, tgt string) string {
	t.Helper()
	r := api(t, addr, "POST", "/_replicate", fmt.Sprintf(`{"source":%q,"target":%q,"continuous":true}`, src, tgt))
	id, _ := r.obj(t)["_local_id"].(string)
	if r.status != http.StatusAccepted || id == "" {
		t.Fatalf("POST /_replicate continuous: %d %s", r.status, r.body)
	}
	return id
}

// TestScenarioNode runs the scenarios of a replicator server against one
// couchrepd process and one PouchDB Server: replication_test.exs "source
// database not found with host" and "replication cancellation", and
// couch_replicator_retain_stats_between_job_runs.
func TestScenarioNode(t *testing.T) {
	skipShort(t)
	s := testserver.StartPouchDB(t)
	dir := t.TempDir()
	n := startNode(t, nodeOptions{dataDir: dir, config: writeConfig(t, dir, jobsConfig)})
	addr := n.httpAddr("")

	t.Run("source database not found with host", func(t *testing.T) {
		r := api(t, addr, "POST", "/_replicate", fmt.Sprintf(`{"source":%q,"target":%q}`, s.DBURL("nf-src"), s.DBURL("nf-tgt")))
		if m := r.obj(t); m["error"] != "db_not_found" {
			t.Errorf("POST /_replicate with a missing source: %d %s, want error db_not_found", r.status, r.body)
		}
	})

	t.Run("replication cancellation", func(t *testing.T) {
		src := s.CreateDB(t, "cancel-src")
		s.PutDocs(t, src, makeDocs(1, 6)...)
		r := api(t, addr, "POST", "/_replicate", fmt.Sprintf(`{"source":%q,"target":%q,"continuous":true,"create_target":true}`, src, s.DBURL("cancel-tgt")))
		id, _ := r.obj(t)["_local_id"].(string)
		if r.obj(t)["ok"] != true || id == "" {
			t.Fatalf("POST /_replicate: %d %s", r.status, r.body)
		}
		task := func() bool {
			var tasks []map[string]any
			_ = json.Unmarshal(api(t, addr, "GET", "/_active_tasks", "").body, &tasks)
			for _, x := range tasks {
				if x["replication_id"] == id {
					return true
				}
			}
			return false
		}
		waitUntil(t, "the task in _active_tasks", time.Minute, task)
		cancel := fmt.Sprintf(`{"replication_id":%q,"cancel":true}`, id)
		if r := api(t, addr, "POST", "/_replicate", cancel); r.status != http.StatusOK {
			t.Fatalf("cancel: %d %s", r.status, r.body)
		}
		waitUntil(t, "the task gone from _active_tasks", time.Minute, func() bool { return !task() })
		if r := api(t, addr, "POST", "/_replicate", cancel); r.status != http.StatusNotFound {
			t.Errorf("second cancel: %d %s, want 404", r.status, r.body)
		}
	})

	t.Run("t_stats_retained_by_scheduler", func(t *testing.T) {
		src := s.CreateDB(t, "retain1-src")
		tgt := s.CreateDB(t, "retain1-tgt")
		putDoc(t, s, tgt, map[string]any{"_id": "_design/vdu", "language": "javascript", "validate_doc_update": rejectEvenVDU})
		populateRejectEven(t, s, src, 1, 10)
		id := replicateContinuous(t, addr, src, tgt)
		waitDocCount(t, s, tgt, 6) // 5 + the vdu
		waitJobStats(t, addr, id, 10, 5, 5)
		// Stopped and started again (CouchDB: max_jobs 0, then 500).
		ctlOK(t, n, "job", "stop", id)
		waitCtlJob(t, n, id, statusRunning)
		waitJobStats(t, addr, id, 10, 5, 5)
		if r := api(t, addr, "POST", "/_replicate", fmt.Sprintf(`{"replication_id":%q,"cancel":true}`, id)); r.status != http.StatusOK {
			t.Fatalf("cancel: %d %s", r.status, r.body)
		}
	})

	t.Run("t_stats_retained_on_job_removal", func(t *testing.T) {
		src := s.CreateDB(t, "retain2-src")
		tgt := s.CreateDB(t, "retain2-tgt")
		putDoc(t, s, tgt, map[string]any{"_id": "_design/vdu", "language": "javascript", "validate_doc_update": rejectEvenVDU})
		for i, want := range []int{6, 11, 16} {
			populateRejectEven(t, s, src, 10*i+1, 10*i+10)
			id := replicateContinuous(t, addr, src, tgt)
			waitDocCount(t, s, tgt, want)
			k := int64(10 * (i + 1))
			waitJobStats(t, addr, id, k, k/2, k/2)
			// Removed; the next run of the same replication starts from
			// its checkpoint and its counters.
			if r := api(t, addr, "POST", "/_replicate", fmt.Sprintf(`{"replication_id":%q,"cancel":true}`, id)); r.status != http.StatusOK {
				t.Fatalf("cancel: %d %s", r.status, r.body)
			}
			waitUntil(t, "the job gone", time.Minute, func() bool {
				return api(t, addr, "GET", "/_scheduler/jobs/"+id, "").status == http.StatusNotFound
			})
		}
	})
}

// TestScenarioNodeConfig runs the [replicator] settings cases CouchDB's
// modules test that pass against couchrepd:
// couch_replicator_id_too_long_tests should_succeed (an id as long as
// max_document_id_length replicates) and couch_replicator_bulk_get_tests
// job_enable_overrides_global_disable (use_bulk_get true on the job with
// [replicator] use_bulk_get = false: _bulk_get is used). Their other
// halves (should_fail, global_disable_works) fail: couchrepd never applies
// max_document_id_length nor the per-job defaults of [replicator] (see
// integration/README.md, "CouchDB's replicator scenarios").
func TestScenarioNodeConfig(t *testing.T) {
	skipShort(t)
	s := testserver.StartPouchDB(t)
	rec := newRecorder(t, s.URL)
	src := s.CreateDB(t, "cfg-src")
	putDoc(t, s, src, map[string]any{"_id": "12345"})
	for i, c := range []struct {
		name, config, extra string
		bulkGet             bool
		copied              bool // the document reaches the target
		failures            float64
		checkpoints         bool
	}{
		{"id_too_long/should_succeed", "max_document_id_length = 5\n", "", true, true, 0, true},
		{"id_too_long/should_fail", "max_document_id_length = 4\n", "", false, false, 1, true},
		{"bulk_get/global_disable_works", "use_bulk_get = false\n", "", false, true, 0, true},
		{"bulk_get/job_enable_overrides_global_disable", "use_bulk_get = false\n", `,"use_bulk_get":true`, true, true, 0, true},
		{"use_checkpoints/global_disable", "use_checkpoints = false\n", "", true, true, 0, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			n := startNode(t, nodeOptions{dataDir: dir, config: writeConfig(t, dir, jobsConfig+c.config)})
			tgt := fmt.Sprintf("cfg%d-tgt", i)
			rec.reset()
			r := api(t, n.httpAddr(""), "POST", "/_replicate", fmt.Sprintf(`{"source":%q,"target":%q,"create_target":true%s}`, dbVia(s, rec.URL, "cfg-src"), dbVia(s, rec.URL, tgt), c.extra))
			if r.status != http.StatusOK || r.obj(t)["ok"] != true {
				t.Fatalf("POST /_replicate: %d %s", r.status, r.body)
			}
			ids := []string{}
			if c.copied {
				ids = nil // all of them
			}
			verify(t, s, s, src, s.DBURL(tgt), ids)
			var res struct {
				History []struct {
					DocWriteFailures float64 `json:"doc_write_failures"`
				} `json:"history"`
			}
			_ = json.Unmarshal(r.body, &res)
			if c.checkpoints && (len(res.History) == 0 || res.History[0].DocWriteFailures != c.failures) {
				t.Errorf("result %s: want doc_write_failures %v", r.body, c.failures)
			}
			if got := rec.count(http.MethodPost, "/_bulk_get", "") > 0; got != c.bulkGet {
				t.Errorf("_bulk_get used: %v, want %v\n%s", got, c.bulkGet, rec)
			}
			if got := rec.count(http.MethodPost, "/_ensure_full_commit", "") > 0; got != c.checkpoints {
				t.Errorf("checkpoints recorded: %v, want %v\n%s", got, c.checkpoints, rec)
			}
		})
	}
}

// TestScenarioCompaction is couch_replicator_compact_tests: a continuous
// replication keeps running while a writer adds 50 documents per round
// and both databases are compacted (POST /{db}/_compact, three rounds);
// the target catches up, the task in _active_tasks describes the job, and
// after the cancel the databases match. PouchDB Server's _compact (in
// memory: it drops the bodies of non-leaf revisions) stands in for
// CouchDB's file swap.
func TestScenarioCompaction(t *testing.T) {
	skipShort(t)
	s := testserver.StartPouchDB(t)
	dir := t.TempDir()
	n := startNode(t, nodeOptions{dataDir: dir, config: writeConfig(t, dir, jobsConfig)})
	addr := n.httpAddr("")
	src := s.CreateDB(t, "compact-src")
	tgt := s.CreateDB(t, "compact-tgt")
	id := replicateContinuous(t, addr, src, tgt)
	task := func() map[string]any {
		var tasks []map[string]any
		_ = json.Unmarshal(api(t, addr, "GET", "/_active_tasks", "").body, &tasks)
		for _, x := range tasks {
			if x["replication_id"] == id {
				return x
			}
		}
		return nil
	}
	waitUntil(t, "the task in _active_tasks", time.Minute, func() bool { return task() != nil })
	compact := func(db string) {
		if _, status, err := doRaw(http.MethodPost, db+"_compact", []byte("{}")); err != nil || status != http.StatusAccepted {
			t.Errorf("POST %s_compact: %d %v", db, status, err)
		}
	}
	running := func() {
		t.Helper()
		r := api(t, addr, "GET", "/_scheduler/jobs/"+id, "")
		var job struct {
			State   string `json:"state"`
			History []struct {
				Type string `json:"type"`
			} `json:"history"`
		}
		_ = json.Unmarshal(r.body, &job)
		for _, h := range job.History {
			if h.Type == "crashed" {
				t.Fatalf("the job crashed: %s", r.body)
			}
		}
		if job.State != "running" {
			t.Fatalf("job state %q: %s", job.State, r.body)
		}
	}
	next := 0
	for round := 1; round <= 3; round++ {
		compact(src)
		compact(tgt)
		running()
		done := make(chan struct{})
		go func() {
			defer close(done)
			for i := 0; i < 50; i++ {
				next++
				if _, status, err := doRaw(http.MethodPut, src+fmt.Sprintf("doc%04d", next), []byte(`{"value":1}`)); err != nil || status != http.StatusCreated {
					t.Errorf("PUT doc%04d: %d %v", next, status, err)
					return
				}
				if i == 25 {
					compact(src)
					compact(tgt)
				}
			}
		}()
		<-done
		compact(src)
		compact(tgt)
		running()
	}
	waitDocCount(t, s, tgt, 150)
	running()
	// changes_pending is null until the job's next progress report after
	// the last batch (measured: within a second; CouchDB's task has it at
	// once).
	waitUntil(t, "changes_pending in _active_tasks", 20*time.Second, func() bool { _, ok := task()["changes_pending"].(float64); return ok })
	x := task()
	for _, k := range []string{"docs_read", "docs_written", "doc_write_failures", "revisions_checked", "missing_revisions_found", "changes_pending"} {
		if _, ok := x[k].(float64); !ok {
			t.Errorf("_active_tasks %s = %v, want a number", k, x[k])
		}
	}
	if x["continuous"] != true || x["source"] != noCreds(src) || x["target"] != noCreds(tgt) {
		t.Errorf("_active_tasks: continuous %v, source %v, target %v", x["continuous"], x["source"], x["target"])
	}
	if r := api(t, addr, "POST", "/_replicate", fmt.Sprintf(`{"replication_id":%q,"cancel":true}`, id)); r.status != http.StatusOK {
		t.Fatalf("cancel: %d %s", r.status, r.body)
	}
	verify(t, s, s, src, tgt, nil)
}

// TestScenarioContinuous is replication_test.exs "continuous replication"
// against couchrepd: documents, attachments on documents and on a design
// document, new documents and deletions arrive while the job runs, each
// step waited for on _active_tasks (revisions_checked reaching CouchDB's
// count and nothing in the source's _changes after through_seq); the
// cancel by body answers the same _local_id and the job copies nothing
// more.
func TestScenarioContinuous(t *testing.T) {
	skipShort(t)
	s := testserver.StartPouchDB(t)
	dir := t.TempDir()
	n := startNode(t, nodeOptions{dataDir: dir, config: writeConfig(t, dir, jobsConfig)})
	addr := n.httpAddr("")
	src := s.CreateDB(t, "cont-src")
	tgt := s.CreateDB(t, "cont-tgt")
	readme := []byte("some text")
	data := bytes.Repeat([]byte("att1 data\n"), 300)
	s.PutDocs(t, src, append(makeDocs(1, 25), map[string]any{"_id": "_design/mydesign", "language": "javascript",
		"filters": map[string]any{"myfilter": "function(doc, req) { return true; }"}})...)
	rev := func(id string) string {
		_, d := getDoc(t, src, id, "")
		return d["_rev"].(string)
	}
	for i := 10; i < 15; i++ {
		s.PutAttachment(t, src, fmt.Sprint(i), rev(fmt.Sprint(i)), "readme.txt", "text/plain", readme)
	}
	id := replicateContinuous(t, addr, src, tgt)
	task := func() map[string]any {
		var tasks []map[string]any
		_ = json.Unmarshal(api(t, addr, "GET", "/_active_tasks", "").body, &tasks)
		for _, x := range tasks {
			if x["replication_id"] == id {
				return x
			}
		}
		return nil
	}
	waitRepl := func(revsChecked float64) {
		t.Helper()
		waitUntil(t, fmt.Sprintf("revisions_checked %v and through_seq at the source's last change", revsChecked), time.Minute, func() bool {
			x := task()
			if x == nil {
				return false
			}
			if rc, _ := x["revisions_checked"].(float64); rc < revsChecked {
				return false
			}
			through, _ := json.Marshal(x["through_seq"])
			var ch struct {
				Results []any `json:"results"`
			}
			s.GetJSON(t, src+"_changes?since="+url.QueryEscape(strings.Trim(string(through), `"`)), &ch)
			return len(ch.Results) == 0
		})
	}
	checkAtts := func(id string, want map[string][]byte) {
		t.Helper()
		_, d := getDoc(t, tgt, id, "")
		atts, _ := d["_attachments"].(map[string]any)
		if len(atts) != len(want) {
			t.Errorf("target %s attachments %v, want %d", id, atts, len(want))
		}
		for name, b := range want {
			got, status, err := doRaw(http.MethodGet, tgt+id+"/"+name, nil)
			if err != nil || status != http.StatusOK || !bytes.Equal(got, b) {
				t.Errorf("target %s/%s: %d, %d bytes (want %d), %v", id, name, status, len(got), len(b), err)
			}
		}
	}
	waitRepl(26)
	verify(t, s, s, src, tgt, nil)
	for i := 10; i < 15; i++ {
		checkAtts(fmt.Sprint(i), map[string][]byte{"readme.txt": readme})
	}

	for i := 10; i < 15; i++ {
		s.PutAttachment(t, src, fmt.Sprint(i), rev(fmt.Sprint(i)), "data.dat", "application/binary", data)
	}
	s.PutAttachment(t, src, "_design/mydesign", rev("_design/mydesign"), "readme.txt", "text/plain", readme)
	waitRepl(32)
	verify(t, s, s, src, tgt, nil)
	for i := 10; i < 15; i++ {
		checkAtts(fmt.Sprint(i), map[string][]byte{"readme.txt": readme, "data.dat": data})
	}
	checkAtts("_design/mydesign", map[string][]byte{"readme.txt": readme})

	s.PutAttachment(t, src, "_design/mydesign", rev("_design/mydesign"), "data.dat", "application/binary", data)
	waitRepl(33)
	checkAtts("_design/mydesign", map[string][]byte{"readme.txt": readme, "data.dat": data})

	s.PutDocs(t, src, makeDocs(26, 35)...)
	waitRepl(43)
	verify(t, s, s, src, tgt, nil)

	for _, del := range []string{"26", "32"} {
		putDoc(t, s, src, map[string]any{"_id": del, "_rev": rev(del), "_deleted": true})
	}
	waitRepl(45)
	for _, del := range []string{"26", "32"} {
		if status, _ := getDoc(t, tgt, del, ""); status != http.StatusNotFound {
			t.Errorf("deleted %s on the target: status %d", del, status)
		}
	}
	verify(t, s, s, src, tgt, nil)

	r := api(t, addr, "POST", "/_replicate", fmt.Sprintf(`{"source":%q,"target":%q,"continuous":true,"cancel":true}`, src, tgt))
	if m := r.obj(t); r.status != http.StatusOK || m["ok"] != true || m["_local_id"] != id {
		t.Fatalf("cancel by body: %d %s, want ok with _local_id %s", r.status, r.body, id)
	}
	waitUntil(t, "the task gone", time.Minute, func() bool { return task() == nil })
	putDoc(t, s, src, map[string]any{"_id": "foobar", "value": 666})
	if status, _ := getDoc(t, tgt, "foobar", ""); status != http.StatusNotFound {
		t.Errorf("foobar on the target after the cancel: status %d", status)
	}
}

// TestScenarioReplicatorDB is couch_replicator_scheduler_docs_tests on the
// _replicator database of a PouchDB Server watched by couchrepd, with
// [replicator] update_docs false and true: _scheduler/docs' total_rows
// matches its docs; _local and design documents can be written and make no
// job; a completed document gets _replication_state "completed", a new
// _replication_state_time and _replication_stats whatever state fields it
// was written with; unknown fields are ignored; _replication_id is the
// job's with update_docs, absent without. A malformed document, which CouchDB's
// before_doc_update refuses with 403, is stored by the server couchrep
// watches (it cannot refuse writes to a database it does not serve) and
// shows as failed in _scheduler/docs.
func TestScenarioReplicatorDB(t *testing.T) {
	skipShort(t)
	for _, updateDocs := range []bool{false, true} {
		t.Run(fmt.Sprintf("update_docs=%v", updateDocs), func(t *testing.T) {
			s := testserver.StartPouchDB(t)
			if s.External() {
				// couchrepd would take over the _replicator database of the
				// CouchDB every test of make test-couchdb shares.
				t.Skip("watches the server's own _replicator: not on a shared CouchDB")
			}
			plainReplicatorDB(t, s, true)
			src := s.CreateDB(t, "src")
			s.PutDocs(t, src, makeDocs(1, 3)...)
			dir := t.TempDir()
			n := startNode(t, nodeOptions{dataDir: dir, config: writeConfig(t, dir, fmt.Sprintf("[couchrep]\nwatch = %s\n%supdate_docs = %v\n",
				strings.TrimSuffix(s.URL, "/"), jobsConfig, updateDocs))})
			addr := n.httpAddr("")
			rdb := s.DBURL("_replicator")
			docState := func(id string) string {
				r := api(t, addr, "GET", "/_scheduler/docs/_replicator/"+url.PathEscape(id), "")
				if r.status != http.StatusOK {
					return fmt.Sprintf("HTTP %d", r.status)
				}
				st, _ := r.obj(t)["state"].(string)
				return st
			}

			// t_doc_fields_are_updated
			s.Do(t, "PUT", rdb+"updated", map[string]any{"source": src, "target": s.DBURL("tgt-updated"), "create_target": true,
				"_replication_id": "foo3", "_replication_state": "triggered", "_replication_state_time": "foo5", "_replication_state_reason": "foo6"}, http.StatusCreated)
			// t_doc_fields_are_ignored
			s.Do(t, "PUT", rdb+"ignored", map[string]any{"source": src, "target": s.DBURL("tgt-ignored"), "create_target": true,
				"replication_id": "foo1", "id": "foo2", "other_junk": true}, http.StatusCreated)
			for _, id := range []string{"updated", "ignored"} {
				var doc map[string]any
				waitUntil(t, id+" completed", time.Minute, func() bool {
					doc = nil
					s.GetJSON(t, rdb+id, &doc)
					return doc["_replication_state"] == "completed"
				})
				if st, ok := doc["_replication_state_time"].(string); !ok || st == "foo5" {
					t.Errorf("%s: _replication_state_time %v", id, doc["_replication_state_time"])
				}
				if _, ok := doc["_replication_stats"].(map[string]any); !ok {
					t.Errorf("%s: _replication_stats %v", id, doc["_replication_stats"])
				}
				if _, ok := doc["_replication_state_reason"]; ok {
					t.Errorf("%s: _replication_state_reason %v after completing", id, doc["_replication_state_reason"])
				}
				// As CouchDB: the job's _replication_id only with
				// update_docs; otherwise none, not even the one the
				// document was written with.
				rid, has := doc["_replication_id"].(string)
				if updateDocs && (rid == "" || rid == "foo3") || !updateDocs && has {
					t.Errorf("%s (update_docs %v): _replication_id %v", id, updateDocs, doc["_replication_id"])
				}
				verify(t, s, s, src, s.DBURL("tgt-"+id), nil)
			}

			// t_local_docs_can_be_written, t_design_docs_can_be_written
			s.Do(t, "PUT", rdb+"_local/doc1", map[string]any{}, http.StatusCreated)
			s.Do(t, "PUT", rdb+"_local/doc2", map[string]any{"foo": "bar"}, http.StatusCreated)
			s.Do(t, "PUT", rdb+"_design/ddoc1", map[string]any{}, http.StatusCreated)
			s.Do(t, "PUT", rdb+"_design/ddoc2", map[string]any{"foo": "bar"}, http.StatusCreated)
			// t_malformed_docs_are_rejected (couchrep: failed, see above)
			s.Do(t, "PUT", rdb+"rep1", map[string]any{}, http.StatusCreated)
			s.Do(t, "PUT", rdb+"rep2", map[string]any{"foo": "bar"}, http.StatusCreated)
			for _, id := range []string{"rep1", "rep2"} {
				waitUntil(t, id+" failed in _scheduler/docs", time.Minute, func() bool { return docState(id) == "failed" })
			}

			// t_scheduler_docs_total_rows: the rows are the four
			// replication documents, none of the _local or design ones.
			var body struct {
				TotalRows int `json:"total_rows"`
				Docs      []struct {
					DocID string `json:"doc_id"`
				} `json:"docs"`
			}
			if err := json.Unmarshal(api(t, addr, "GET", "/_scheduler/docs", "").body, &body); err != nil {
				t.Fatal(err)
			}
			var ids []string
			for _, d := range body.Docs {
				ids = append(ids, d.DocID)
			}
			if body.TotalRows != len(body.Docs) || !equalIDs(sortedIDs(ids...), []string{"ignored", "rep1", "rep2", "updated"}) {
				t.Errorf("_scheduler/docs: total_rows %d, docs %v; want 4 rows: ignored, rep1, rep2, updated", body.TotalRows, ids)
			}
		})
	}
}
