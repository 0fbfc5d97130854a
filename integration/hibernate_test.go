package integration

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/couchrep/couchrep/internal/testserver"
	"github.com/couchrep/couchrep/messages"
)

// jobActors returns the job actors under the node's jobs_sup.
func jobActors(t *testing.T, n *nodeProc) []string {
	t.Helper()
	var find func(*messages.TreeNode) *messages.TreeNode
	find = func(tn *messages.TreeNode) *messages.TreeNode {
		if tn.GetName() == "jobs_sup" {
			return tn
		}
		for _, c := range tn.GetChildren() {
			if f := find(c); f != nil {
				return f
			}
		}
		return nil
	}
	sup := find(n.tree().GetRoot())
	if sup == nil {
		t.Fatal("no jobs_sup in the node's tree")
	}
	var out []string
	for _, c := range sup.GetChildren() {
		out = append(out, c.GetName())
	}
	return out
}

// awaitNoJobActors waits until the node runs no job actor: every job
// hibernated.
func awaitNoJobActors(t *testing.T, n *nodeProc) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		a := jobActors(t, n)
		if len(a) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("job actors still running after a minute: %v", a)
		}
		time.Sleep(50 * time.Millisecond) // another process's tree: poll
	}
}

// TestHibernatedJobs: parked jobs leave the actor system (no job actor under
// jobs_sup while they are running and parked in every view); a write wakes
// one (an actor again, which replicates it and hibernates again); a killed
// jobs_sup loses none of them (they had no actor: still parked, and woken
// by a write afterwards under the new jobs_sup); a drain hands them back to
// the queue still parked, and after the undrain the node takes them again
// straight to sleep without a request to their databases.
func TestHibernatedJobs(t *testing.T) {
	skipShort(t)
	s := testserver.StartPouchDBWithDBUpdates(t)
	r := newParkNodeRig(t, s, 3, "3600")
	r.awaitCentral("user-0-first", "user-1-first", "user-2-first")
	r.awaitParked(r.users...)
	awaitNoJobActors(t, r.node)

	s.PutDocs(t, s.DBURL("user-1"), map[string]any{"_id": "user-1-second"})
	r.awaitCentral("user-1-second")
	r.awaitParked(r.users...)
	awaitNoJobActors(t, r.node)

	// jobs_sup killed (rest_for_one: the acceptor restarts after it): the
	// hibernated jobs are still the node's, parked, and wake.
	if out, errOut, code := r.node.ctl("kill", "job_server/jobs_sup"); code != 0 {
		t.Fatalf("kill jobs_sup: exit %d: %s %s", code, out, errOut)
	}
	for _, db := range r.users {
		if !parkedJob(r.schedJobs()[r.jobs[db]]) {
			t.Errorf("job of %s not running and parked after jobs_sup was killed: %v", db, r.schedJobs()[r.jobs[db]])
		}
	}
	s.PutDocs(t, s.DBURL("user-2"), map[string]any{"_id": "user-2-after-kill"})
	r.awaitCentral("user-2-after-kill")
	r.awaitParked(r.users...)

	// Drain: every hibernated job back to the queue (pending), none left.
	out, errOut, code := r.node.ctl("drain")
	if code != 0 || !strings.Contains(out, "3") {
		t.Fatalf("drain: exit %d: %s %s", code, out, errOut)
	}
	for _, db := range r.users {
		if st := r.schedJobs()[r.jobs[db]]["state"]; st != "pending" {
			t.Errorf("job of %s after the drain: %v, want pending", db, st)
		}
	}
	before := r.px.reqsOf(r.users...)
	if _, errOut, code := r.node.ctl("undrain"); code != 0 {
		t.Fatalf("undrain: exit %d: %s", code, errOut)
	}
	// Taken again, straight to sleep: parked at once, no job actor left,
	// and not one request to their databases (park_recheck 3600: the first
	// recheck of an adopted job is at least 450 s away).
	r.awaitParked(r.users...)
	awaitNoJobActors(t, r.node)
	if after := r.px.reqsOf(r.users...); !slices.Equal(before, after) {
		t.Errorf("requests to the user databases before the undrain %v, after the jobs were taken again %v: want none", before, after)
	}
	s.PutDocs(t, s.DBURL("user-0"), map[string]any{"_id": "user-0-after-drain"})
	r.awaitCentral("user-0-after-drain")
}

// TestHibernatedAdoptedOnRestart: a node stopped with its jobs parked hands
// them back to the queue still parked; restarted, it takes them again
// straight to sleep: running and parked in every view without one request
// to their databases (not even GET /db) before something wakes them; a
// write then wakes the job of its database, which replicates it.
func TestHibernatedAdoptedOnRestart(t *testing.T) {
	skipShort(t)
	s := testserver.StartPouchDBWithDBUpdates(t)
	r := newParkNodeRig(t, s, 3, "3600")
	r.awaitCentral("user-0-first", "user-1-first", "user-2-first")
	r.awaitParked(r.users...)
	sinces := map[string]any{}
	for db, id := range r.jobs {
		sinces[db] = r.schedJobs()[id]["info"].(map[string]any)["parked_since"]
	}
	if err := r.node.stop(syscall.SIGTERM, time.Minute); err != nil {
		t.Fatal(err)
	}
	before := r.px.reqsOf(r.users...)
	r.node = startNode(t, nodeOptions{dataDir: r.dir, config: r.conf})
	r.addr = r.node.httpAddr("")
	r.awaitParked(r.users...)
	awaitNoJobActors(t, r.node)
	for db, id := range r.jobs {
		j := r.schedJobs()[id]
		if got := j["info"].(map[string]any)["parked_since"]; got != sinces[db] {
			t.Errorf("job of %s parked_since %v after the restart, want %v (it never ran)", db, got, sinces[db])
		}
	}
	if m := parkedJobsMetric.FindSubmatch(api(t, r.addr, "GET", "/metrics", "").body); m == nil || string(m[1]) != "3" {
		t.Errorf("couchrep_replication_jobs_parked after the restart: %q, want 3", m)
	}
	if after := r.px.reqsOf(r.users...); !slices.Equal(before, after) {
		t.Errorf("requests to the user databases before the restart %v, after the jobs were adopted %v: want none", before, after)
	}
	s.PutDocs(t, s.DBURL("user-1"), map[string]any{"_id": "user-1-after-restart"})
	r.awaitCentral("user-1-after-restart")
	r.awaitParked(r.users...)
	got := r.px.reqsOf(r.users...)
	if got[0] != before[0] || got[2] != before[2] {
		t.Errorf("requests to user-0 and user-2 %v -> %v: a write to user-1 woke others", before, got)
	}
}

// TestHibernatedAdoptionGap: a write while a parked job has no node (here:
// its node is down; in a failover, between the dead node's last look and
// the new node's watch) is signalled by no _db_updates row the new watch
// reads. The adopted job's first recheck comes early (park.AdoptJitter:
// within park_recheck/2, here 4 s) and finds it.
func TestHibernatedAdoptionGap(t *testing.T) {
	skipShort(t)
	s := testserver.StartPouchDBWithDBUpdates(t)
	r := newParkNodeRig(t, s, 2, "8")
	r.awaitCentral("user-0-first", "user-1-first")
	r.awaitParked(r.users...)
	if err := r.node.stop(syscall.SIGTERM, time.Minute); err != nil {
		t.Fatal(err)
	}
	s.PutDocs(t, s.DBURL("user-0"), map[string]any{"_id": "user-0-in-the-gap"})
	r.node = startNode(t, nodeOptions{dataDir: r.dir, config: r.conf})
	r.addr = r.node.httpAddr("")
	r.awaitCentral("user-0-in-the-gap")
	r.awaitParked(r.users...)
}

// TestHibernatedBeyondMaxJobs: parked jobs take no max_jobs slot: a node with
// max_jobs 2 runs five continuous jobs, all running and parked, and writes
// to three of them at once all arrive (the woken jobs take the slots in
// turn, never more than two active at once: the scheduler's status lists
// the active jobs).
func TestHibernatedBeyondMaxJobs(t *testing.T) {
	skipShort(t)
	s := testserver.StartPouchDBWithDBUpdates(t)
	conf := fmt.Sprintf(parkNodeConfig, "3600") + "max_jobs = 2\n"
	r := newParkNodeRigConf(t, s, 5, conf)
	r.awaitCentral("user-0-first", "user-1-first", "user-2-first", "user-3-first", "user-4-first")
	r.awaitParked(r.users...)
	awaitNoJobActors(t, r.node)
	for _, db := range []string{"user-0", "user-2", "user-4"} {
		s.PutDocs(t, s.DBURL(db), map[string]any{"_id": db + "-second"})
	}
	deadline := time.Now().Add(time.Minute)
	for max := 0; ; {
		if n := len(jobActors(t, r.node)); n > max {
			max = n
			if max > 2 {
				t.Fatalf("%d job actors with max_jobs 2", max)
			}
		}
		var all struct {
			Rows []struct{ ID string } `json:"rows"`
		}
		s.GetJSON(t, s.DBURL("central")+"_all_docs", &all)
		n := 0
		for _, row := range all.Rows {
			if strings.HasSuffix(row.ID, "-second") {
				n++
			}
		}
		if n == 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of 3 writes in central after a minute", n)
		}
		time.Sleep(20 * time.Millisecond) // other processes' state: poll
	}
	r.awaitParked(r.users...)
	awaitNoJobActors(t, r.node)
	// Hibernated jobs are not the scheduler's active jobs: none to rotate.
	out, errOut, code := r.node.ctl("send", "scheduler", "couchrep.v1.SchedulerStatusRequest")
	if code != 0 {
		t.Fatalf("scheduler status: exit %d: %s", code, errOut)
	}
	var status struct {
		MaxJobs int      `json:"max_jobs"`
		Running []string `json:"running"`
	}
	if i := strings.IndexByte(out, '{'); i >= 0 {
		out = out[i:] // after the reply's type name
	}
	if err := json.Unmarshal([]byte(out), &status); err != nil || status.MaxJobs != 2 || len(status.Running) != 0 {
		t.Errorf("scheduler status with every job parked: %v %s, want max_jobs 2 and no active job", err, out)
	}
}
