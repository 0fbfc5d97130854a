package integration

import (
	"fmt"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/couchrep/couchrep/internal/testserver"
	"github.com/couchrep/couchrep/messages"
)

// TestPauseResumeReset: couchrepctl job pause stops a running job and keeps
// it paused (pending, "stopped" newest in its history, as CouchDB shows a
// job its scheduler stopped) across a restart of its node and a takeover by
// another node sharing the store, while another job keeps replicating; job
// resume runs it again and it catches up; job reset (confirmed) runs it
// again from sequence 0, its checkpoint documents kept.
func TestPauseResumeReset(t *testing.T) {
	skipShort(t)
	srv := testserver.StartPouchDB(t)
	src := srv.CreateDB(t, "pz-src")
	tgt := srv.CreateDB(t, "pz-tgt")
	other := srv.CreateDB(t, "pz-other")
	srv.PutDocs(t, src, map[string]any{"_id": "a"}, map[string]any{"_id": "b"}, map[string]any{"_id": "c"})
	store := filepath.Join(t.TempDir(), "shared.db")
	dir := t.TempDir()
	opts := nodeOptions{name: "one", dataDir: dir, store: store, config: writeConfig(t, dir, jobsConfig)}
	n := startNode(t, opts)

	var rep messages.ReplicateResponse
	ctlJSON(t, n, &rep, "replicate", "--continuous", src, tgt)
	id := rep.GetId()
	waitDocCount(t, srv, tgt, 3)
	waitCtlJob(t, n, id, statusRunning)

	out := ctlOK(t, n, "job", "pause", id)
	if !strings.Contains(out, "paused job "+id) {
		t.Fatalf("job pause: %q", out)
	}
	paused := func(n *nodeProc) {
		t.Helper()
		var show messages.GetJobResponse
		ctlJSON(t, n, &show, "job", "show", id)
		j := show.GetJob()
		if j.GetStatus() != statusPending || j.GetPausedAt() == nil || j.GetNode() != "" {
			t.Fatalf("paused job: %v", j)
		}
		var sj map[string]any
		getJSON(t, n.httpAddr(""), "/_scheduler/jobs/"+j.GetReplicationId(), &sj)
		info, _ := sj["info"].(map[string]any)
		hist, _ := sj["history"].([]any)
		if sj["state"] != "pending" || sj["pid"] != nil || info["paused"] != true || len(hist) == 0 ||
			hist[0].(map[string]any)["type"] != "stopped" {
			t.Fatalf("_scheduler/jobs of a paused job: %v", sj)
		}
	}
	paused(n)
	if out := ctlOK(t, n, "jobs"); !strings.Contains(out, "pending/PAUSED") {
		t.Fatalf("jobs:\n%s", out)
	}
	ctlFails(t, n, 1, []string{"paused", "job resume"}, "job", "restart", id)

	// A change on the source while paused; the node restarts: the job stays
	// paused while another job on the node replicates.
	srv.PutDocs(t, src, map[string]any{"_id": "d"})
	if err := n.stop(syscall.SIGTERM, 60*time.Second); err != nil {
		t.Fatal(err)
	}
	n = startNode(t, opts)
	ctlOK(t, n, "replicate", "--continuous", src, other)
	waitDocCount(t, srv, other, 4)
	paused(n)
	if c := jobsDocCount(t, srv, tgt); c != 3 {
		t.Fatalf("a paused job wrote: %d docs on its target", c)
	}

	// Another node takes over the store's jobs: still paused.
	if err := n.stop(syscall.SIGTERM, 60*time.Second); err != nil {
		t.Fatal(err)
	}
	dir2 := t.TempDir()
	n = startNode(t, nodeOptions{name: "two", dataDir: dir2, store: store, config: writeConfig(t, dir2, jobsConfig)})
	waitCtlJobs(t, n, 1, "--state", "running")
	paused(n)

	out = ctlOK(t, n, "job", "resume", id)
	if !strings.Contains(out, "resumed job "+id) {
		t.Fatalf("job resume: %q", out)
	}
	waitDocCount(t, srv, tgt, 4)
	var j *messages.JobSummary
	waitUntil(t, "the resumed job running from its checkpoint", 90*time.Second, func() bool {
		var show messages.GetJobResponse
		ctlJSON(t, n, &show, "job", "show", id)
		j = show.GetJob()
		return j.GetStatus() == statusRunning && j.GetStats().GetStartFrom() == "checkpoint" && j.GetStats().GetDocsWritten() == 4
	})
	if j.GetPausedAt() != nil {
		t.Fatalf("resumed job: %v", j)
	}
	checked := j.GetStats().GetRevisionsChecked()

	// reset: asks first (no answer: refused), then starts from 0.
	ctlFails(t, n, 2, []string{"not confirmed"}, "job", "reset", id)
	out = ctlOK(t, n, "job", "reset", "--yes", id)
	if !strings.Contains(out, "reset job "+id+": its next run starts from sequence 0") {
		t.Fatalf("job reset: %q", out)
	}
	waitUntil(t, "the reset job re-read the source from 0", 90*time.Second, func() bool {
		var show messages.GetJobResponse
		ctlJSON(t, n, &show, "job", "show", id)
		j = show.GetJob()
		return j.GetStatus() == statusRunning && j.GetStats().GetStartFrom() == "reset" &&
			j.GetStats().GetRevisionsChecked() >= checked+4
	})
	if j.GetStats().GetStartSeq() != "0" {
		t.Fatalf("reset run started at %q", j.GetStats().GetStartSeq())
	}
	// The checkpoint documents were kept, with the sessions before the
	// reset in their history (for going back).
	var ckpt struct {
		History []struct {
			SessionID string `json:"session_id"`
		} `json:"history"`
	}
	for _, db := range []string{src, tgt} {
		srv.GetJSON(t, strings.TrimSuffix(db, "/")+"/_local/"+strings.TrimSuffix(j.GetReplicationId(), "+continuous"), &ckpt)
		if len(ckpt.History) < 2 {
			t.Fatalf("checkpoint history on %s after a reset: %+v", db, ckpt.History)
		}
	}
}

// TestPauseParkedJob: a parked job (hibernated: no actor) is paused as a
// running one is, stays paused while its source changes, and resumes.
func TestPauseParkedJob(t *testing.T) {
	skipShort(t)
	srv := testserver.StartPouchDBWithDBUpdates(t)
	src := srv.CreateDB(t, "pp-src")
	tgt := srv.CreateDB(t, "pp-tgt")
	srv.PutDocs(t, src, map[string]any{"_id": "a"})
	dir := t.TempDir()
	n := startNode(t, nodeOptions{dataDir: dir, config: writeConfig(t, dir, fmt.Sprintf(parkNodeConfig, "3600"))})
	var rep messages.ReplicateResponse
	ctlJSON(t, n, &rep, "replicate", "--continuous", src, tgt)
	id := rep.GetId()
	waitUntil(t, "the job parked", 90*time.Second, func() bool {
		var show messages.GetJobResponse
		ctlJSON(t, n, &show, "job", "show", id)
		return show.GetJob().GetParkedSince() != nil
	})
	ctlOK(t, n, "job", "pause", id)
	var show messages.GetJobResponse
	ctlJSON(t, n, &show, "job", "show", id)
	if j := show.GetJob(); j.GetStatus() != statusPending || j.GetPausedAt() == nil || j.GetParkedSince() != nil {
		t.Fatalf("paused parked job: %v", j)
	}
	if len(n.logLines("hibernated job ended", `"reason":"paused"`)) == 0 {
		t.Fatal("the pause did not end the hibernated job")
	}
	srv.PutDocs(t, src, map[string]any{"_id": "b"})
	ctlOK(t, n, "job", "resume", id)
	waitDocCount(t, srv, tgt, 2)
}
