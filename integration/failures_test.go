package integration

import (
	"encoding/json"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/couchrep/couchrep/internal/testserver"
	"github.com/couchrep/couchrep/messages"
)

// guardDDoc is a validate_doc_update that refuses documents with
// "secret" (PouchDB Server runs it, as CouchDB does, on replicated writes).
var guardDDoc = map[string]any{"_id": "_design/guard",
	"validate_doc_update": "function (newDoc) { if (newDoc.secret) { throw({forbidden: 'no secrets here'}); } }"}

// metricValue reads one unlabelled sample from the node's /metrics.
func metricValue(t *testing.T, addr, name string) float64 {
	t.Helper()
	r := api(t, addr, "GET", "/metrics", "")
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(name) + ` (\S+)$`).FindSubmatch(r.body)
	if m == nil {
		t.Fatalf("/metrics has no %s", name)
	}
	v, err := strconv.ParseFloat(string(m[1]), 64)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// TestWriteFailuresInSight: a target whose validate_doc_update refuses two
// documents: the job's refused documents (id, rev, 403, forbidden, the
// VDU's reason) are in couchrepctl job show, _scheduler/jobs, the status
// page and the counter, and are still there after the node restarts (they
// live in the job's record). With stop_on_write_failure the job fails with
// the document's reason.
func TestWriteFailuresInSight(t *testing.T) {
	skipShort(t)
	srv := testserver.StartPouchDB(t)
	src := srv.CreateDB(t, "wf-src")
	tgt := srv.CreateDB(t, "wf-tgt")
	srv.PutDocs(t, tgt, guardDDoc)
	revs := srv.PutDocs(t, src, map[string]any{"_id": "ok1"}, map[string]any{"_id": "ok2"},
		map[string]any{"_id": "s1", "secret": true}, map[string]any{"_id": "s2", "secret": true})
	dir := t.TempDir()
	opts := nodeOptions{dataDir: dir, config: writeConfig(t, dir, jobsConfig)}
	n := startNode(t, opts)
	addr := n.httpAddr("")

	var rep messages.ReplicateResponse
	ctlJSON(t, n, &rep, "replicate", "--continuous", src, tgt)
	id := rep.GetId()
	var job *messages.JobSummary
	waitUntil(t, "2 documents written and 2 refused", 90*time.Second, func() bool {
		var show messages.GetJobResponse
		ctlJSON(t, n, &show, "job", "show", id)
		job = show.GetJob()
		return job.GetStats().GetDocsWritten() == 2 && len(job.GetWriteFailures()) == 2
	})
	for i, f := range job.GetWriteFailures() {
		if want := fmt.Sprintf("s%d", i+1); f.GetId() != want || f.GetRev() != revs[i+2] || f.GetStatus() != 403 ||
			f.GetError() != "forbidden" || f.GetReason() != "no secrets here" || f.GetAt() == nil {
			t.Fatalf("write failure %d: %v, want %s %s 403 forbidden: no secrets here", i, f, want, revs[i+2])
		}
	}
	if out := ctlOK(t, n, "job", "show", id); !strings.Contains(out, "documents the target refused (2, newest last; the last 100 are kept)") ||
		!strings.Contains(out, "no secrets here") {
		t.Fatalf("job show:\n%s", out)
	}
	var sj map[string]any
	getJSON(t, addr, "/_scheduler/jobs/"+job.GetReplicationId(), &sj)
	fs, _ := sj["write_failures"].([]any)
	if len(fs) != 2 || fs[0].(map[string]any)["reason"] != "no secrets here" || fs[0].(map[string]any)["status"] != 403.0 {
		t.Fatalf("_scheduler/jobs write_failures: %v", sj["write_failures"])
	}
	var status struct {
		Jobs []struct {
			ID             string `json:"id"`
			RecentFailures []struct {
				ID, Reason string
			} `json:"recent_failures"`
		} `json:"jobs"`
	}
	getJSON(t, addr, "/_status/data", &status)
	if len(status.Jobs) != 1 || len(status.Jobs[0].RecentFailures) != 2 || status.Jobs[0].RecentFailures[1].ID != "s2" {
		t.Fatalf("status page data: %+v", status.Jobs)
	}
	if v := metricValue(t, addr, "couchrep_replication_doc_write_failures_total"); v != 2 {
		t.Fatalf("couchrep_replication_doc_write_failures_total %v, want 2", v)
	}

	// The refused documents live in the job's record: a restart keeps them.
	if err := n.stop(syscall.SIGTERM, 60*time.Second); err != nil {
		t.Fatal(err)
	}
	n = startNode(t, opts)
	j := waitCtlJob(t, n, id, statusRunning)
	if len(j.GetWriteFailures()) != 2 || j.GetWriteFailures()[1].GetReason() != "no secrets here" {
		t.Fatalf("after a restart: %v", j.GetWriteFailures())
	}

	// stop_on_write_failure: the job fails with the document's reason.
	tgt2 := srv.CreateDB(t, "wf-tgt2")
	srv.PutDocs(t, tgt2, guardDDoc)
	body, _ := json.Marshal(map[string]any{"source": src, "target": tgt2, "continuous": true, "stop_on_write_failure": true})
	r := api(t, n.httpAddr(""), "POST", "/_replicate", string(body))
	if r.status != 202 {
		t.Fatalf("POST /_replicate: %d %s", r.status, r.body)
	}
	stopID, _ := r.obj(t)["_local_id"].(string) // the replication id
	if stopID == "" {
		t.Fatalf("POST /_replicate: %s", r.body)
	}
	failed := waitCtlJob(t, n, stopID, messages.JobStatus_JOB_STATUS_FAILED)
	if e := failed.GetError(); !strings.Contains(e, "doc_write_failed: forbidden: no secrets here") ||
		!strings.Contains(e, "stop_on_write_failure") || !strings.Contains(e, `"s1"`) {
		t.Fatalf("failed job's error: %q", e)
	}
}

// TestLagOfAStalledJob: a continuous job whose target stops answering
// (every byte to it held) while its source has changes shows a lag that
// grows with the stall in _scheduler/jobs and on the status page (the
// node's live view), and falls back to 0 once the target answers and the
// job caught up. (Its checkpoint is not due during the stall: a checkpoint
// stalled on the target holds the run's reports until it fails, see
// docs/operations.md.)
func TestLagOfAStalledJob(t *testing.T) {
	skipShort(t)
	srv := testserver.StartPouchDB(t)
	tp := testserver.StartToxiproxy(t)
	link := tp.Link(t, "lag-target", srv.URL)
	src := srv.CreateDB(t, "lag-src")
	srv.CreateDB(t, "lag-tgt")
	tgt := strings.TrimSuffix(link.URL, "/") + "/lag-tgt"
	srv.PutDocs(t, src, map[string]any{"_id": "a"})
	dir := t.TempDir()
	n := startNode(t, nodeOptions{dataDir: dir, config: writeConfig(t, dir, jobsConfig)})
	addr := n.httpAddr("")
	body, _ := json.Marshal(map[string]any{"source": src, "target": tgt, "continuous": true, "checkpoint_interval": 60000})
	r := api(t, addr, "POST", "/_replicate", string(body))
	repID, _ := r.obj(t)["_local_id"].(string)
	if r.status != 202 || repID == "" {
		t.Fatalf("POST /_replicate: %d %s", r.status, r.body)
	}
	var lastInfo map[string]any
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("last info: %v", lastInfo)
		}
	})
	lag := func() float64 {
		var sj map[string]any
		getJSON(t, addr, "/_scheduler/jobs/"+repID, &sj)
		info, _ := sj["info"].(map[string]any)
		lastInfo = info
		l, _ := info["lag_seconds"].(float64)
		return l
	}
	waitDocCount(t, srv, srv.DBURL("lag-tgt"), 1)
	if l := lag(); l != 0 {
		t.Fatalf("lag of a caught-up job: %v", l)
	}
	stall := link.Timeout(t, testserver.Upstream, 0)
	srv.PutDocs(t, src, map[string]any{"_id": "b"}, map[string]any{"_id": "c"})
	waitUntil(t, "a lag of 3 s in _scheduler/jobs", 20*time.Second, func() bool { return lag() >= 3 })
	var status struct {
		Jobs []struct {
			Lag float64 `json:"lag_seconds"`
		} `json:"jobs"`
	}
	getJSON(t, addr, "/_status/data", &status)
	if len(status.Jobs) != 1 || status.Jobs[0].Lag < 3 {
		t.Fatalf("status page: %+v", status.Jobs)
	}
	m := regexp.MustCompile(`couchrep_replication_lag_seconds\{database="",kind="transient",server=""\} (\S+)`).
		FindSubmatch(api(t, addr, "GET", "/metrics", "").body)
	if m == nil {
		t.Fatal("no couchrep_replication_lag_seconds for the transient jobs")
	}
	link.RemoveToxic(t, stall)
	waitDocCount(t, srv, srv.DBURL("lag-tgt"), 3)
	waitUntil(t, "the lag back to 0 once caught up", 60*time.Second, func() bool { return lag() == 0 })
}
