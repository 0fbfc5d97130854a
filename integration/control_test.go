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

// TestCtlControlFromAnyNode: two couchrepd processes share one store; the
// worker runs the jobs, the front (api_frontend only) runs none. Stop,
// restart and cancel sent to the front for a job running on the worker are
// carried out by the worker's job server (through the store). A drain is
// recorded in the worker's record: `nodes` on either node shows it, and the
// worker stays drained across a restart of its process until undrained.
func TestCtlControlFromAnyNode(t *testing.T) {
	skipShort(t)
	srv := testserver.StartPouchDB(t)
	src := srv.CreateDB(t, "rsrc")
	srv.PutDocs(t, src, map[string]any{"_id": "a"}, map[string]any{"_id": "b"})
	store := filepath.Join(t.TempDir(), "shared.db")
	cfg := jobsConfig + "[couchdb]\nuuid = 7a1b2c3d4e5f60718293a4b5c6d7e8f9\n"
	workerDir, frontDir := t.TempDir(), t.TempDir()
	workerOpts := nodeOptions{name: "worker", dataDir: workerDir, store: store, config: writeConfig(t, workerDir, cfg)}
	worker := startNode(t, workerOpts)
	front := startNode(t, nodeOptions{name: "front", dataDir: frontDir, store: store, config: writeConfig(t, frontDir, cfg),
		env: []string{"COUCHREP_COUCHREP_NODE_TYPES=api_frontend"}})

	var ids []string
	for i := range 2 {
		var rep messages.ReplicateResponse
		ctlJSON(t, front, &rep, "replicate", "--continuous", src, srv.CreateDB(t, fmt.Sprintf("rtgt%d", i)))
		ids = append(ids, rep.GetId())
	}
	id := ids[0]
	first := waitCtlJob(t, front, id, statusRunning)
	if first.GetNode() != "worker" {
		t.Fatalf("job runs on %q, want worker", first.GetNode())
	}
	waitCtlJob(t, front, ids[1], statusRunning)

	// stop through the front: the worker checkpoints it and takes it again.
	out := ctlOK(t, front, "job", "stop", id)
	if !strings.Contains(out, "stopped job "+id) {
		t.Fatalf("job stop on the front: %q", out)
	}
	var show messages.GetJobResponse
	ctlJSON(t, front, &show, "job", "show", id)
	if !hasEvent(show.GetJob(), messages.JobEventType_JOB_EVENT_TYPE_STOPPED) {
		t.Fatalf("history after a remote stop: %v", show.GetJob().GetHistory())
	}
	waitCtlJob(t, front, id, statusRunning)
	if lines := worker.logLines("stopping a job on request", `"requested_by":"front"`); len(lines) == 0 {
		t.Fatal("the worker's job server did not log carrying out the front's request")
	}
	var restarted messages.RestartJobResponse
	ctlJSON(t, front, &restarted, "job", "restart", id)
	if restarted.GetJob().GetId() != id {
		t.Fatalf("job restart on the front: %v", &restarted)
	}
	waitCtlJob(t, front, id, statusRunning)

	// cancel through the front: the worker stops the actor at once.
	if out := ctlOK(t, front, "job", "cancel", id); !strings.Contains(out, "canceled job "+id) {
		t.Fatalf("job cancel on the front: %q", out)
	}
	ctlFails(t, front, 1, []string{"not_found"}, "job", "show", id)
	waitUntil(t, "the canceled job's actor gone from the worker", 60*time.Second, func() bool { return countJobActors(worker) == 1 })

	// drain: persisted and visible from the other node.
	var drained messages.DrainResponse
	ctlJSON(t, worker, &drained, "drain")
	if drained.GetReleased() != 1 || drained.GetJobIds()[0] != ids[1] {
		t.Fatalf("drain: %v", &drained)
	}
	var nodes messages.NodesResponse
	ctlJSON(t, front, &nodes, "nodes")
	if w, f := nodeInfo(&nodes, "worker"), nodeInfo(&nodes, "front"); !w.GetDraining() || f == nil || f.GetDraining() {
		t.Fatalf("nodes on the front after draining the worker: %v", &nodes)
	}
	if err := worker.stop(syscall.SIGTERM, 60*time.Second); err != nil {
		t.Fatalf("stop the worker: %v", err)
	}
	worker = startNode(t, workerOpts)
	waitUntil(t, "the restarted worker read its drain flag", 60*time.Second, func() bool {
		return len(worker.logLines("this node is drained")) > 0
	})
	if j := waitCtlJob(t, front, ids[1], statusPending); j.GetNode() != "" {
		t.Fatalf("a drained node runs %v", j)
	}
	ctlJSON(t, worker, &nodes, "nodes")
	if w := nodeInfo(&nodes, "worker"); !w.GetDraining() || w.GetRunningJobs() != 0 {
		t.Fatalf("the restarted worker: %v", w)
	}
	ctlOK(t, worker, "undrain")
	if j := waitCtlJob(t, front, ids[1], statusRunning); j.GetNode() != "worker" {
		t.Fatalf("after undrain the job runs on %q", j.GetNode())
	}
	ctlJSON(t, front, &nodes, "nodes")
	if nodeInfo(&nodes, "worker").GetDraining() {
		t.Fatalf("still draining after undrain: %v", &nodes)
	}
}

// countJobActors counts the job actors in n's tree.
func countJobActors(n *nodeProc) int {
	c := 0
	for _, p := range actorPaths(n.tree()) {
		if strings.HasPrefix(p, "job_server/jobs_sup/job-") {
			c++
		}
	}
	return c
}
