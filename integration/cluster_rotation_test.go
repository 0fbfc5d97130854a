package integration

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/couchrep/couchrep/internal/config"
	"github.com/couchrep/couchrep/internal/jobqueue"
	"github.com/couchrep/couchrep/internal/repjob"
	"github.com/couchrep/couchrep/internal/testserver"
	"github.com/couchrep/couchrep/messages"
)

// TestClusterRotationSplit: two couchrepd nodes on one store, max_jobs 2
// each, 5 continuous jobs (one always pending), interval 1 s. Each node's
// scheduler judges the pending job against the other node's free slots
// (its heartbeat carries them) and the full nodes split the rotation: n0
// (first by name) rotates the one job a tick, n1 none but in the moments
// when n0 has a slot free (a stop just done). Before, each full node
// rotated for the whole queue: n1 stopped a job at nearly every tick too,
// and the job it stopped ran again at once.
func TestClusterRotationSplit(t *testing.T) {
	skipShort(t)
	const jobs, maxJobs, ticks = 5, 2, 10
	ctx := context.Background()
	srv := testserver.StartPouchDB(t)
	src := srv.CreateDB(t, "rsrc")
	srv.PutDocs(t, src, map[string]any{"_id": "x"})
	repl := []string{config.NodeTypeReplication}
	c := startCluster(t, clusterConfig{ActivityTimeout: 10 * time.Second, MaxJobs: maxJobs}, repl, repl)
	if err := c.store.Init(ctx); err != nil {
		t.Fatal(err)
	}
	for i := range jobs {
		tgt := srv.CreateDB(t, fmt.Sprintf("rtgt%d", i))
		body := fmt.Sprintf(`{"source":%q,"target":%q,"continuous":true}`, src, tgt)
		if _, err := c.store.AddPersistent(ctx, repjob.PersistentDoc{Server: srv.URL, DB: "_replicator", DocID: fmt.Sprint("r", i), Body: []byte(body)}); err != nil {
			t.Fatal(err)
		}
	}
	running := func() map[string]int {
		per := map[string]int{}
		if err := c.store.Each(ctx, repjob.Filter{}, func(r *repjob.Record) error {
			if r.QueueState == jobqueue.StateRunning && r.State() == repjob.StateRunning {
				per[r.WorkerNode]++
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		return per
	}
	deadline := time.Now().Add(90 * time.Second)
	for per := running(); per["n0"] != maxJobs || per["n1"] != maxJobs; per = running() {
		if time.Now().After(deadline) {
			t.Fatalf("running per node %v, want %d on each", per, maxJobs)
		}
		time.Sleep(200 * time.Millisecond) // another process's store: poll
	}
	status := func(n *clusterNode) *messages.SchedulerStatusResponse {
		var st messages.SchedulerStatusResponse
		sendJSON(t, n.proc, &st, "scheduler", "couchrep.v1.SchedulerStatusRequest")
		return &st
	}
	n0, n1 := c.nodes[0], c.nodes[1]
	base0, base1 := status(n0), status(n1)
	var st0, st1 *messages.SchedulerStatusResponse
	deadline = time.Now().Add(120 * time.Second)
	for st0, st1 = status(n0), status(n1); st0.Ticks-base0.Ticks < ticks || st1.Ticks-base1.Ticks < ticks; st0, st1 = status(n0), status(n1) {
		if time.Now().After(deadline) {
			t.Fatalf("ticks n0 %d, n1 %d in 120 s, want %d each", st0.Ticks-base0.Ticks, st1.Ticks-base1.Ticks, ticks)
		}
		time.Sleep(500 * time.Millisecond) // the nodes tick on their own: poll
	}
	t0, r0 := st0.Ticks-base0.Ticks, st0.Rotated-base0.Rotated
	t1, r1 := st1.Ticks-base1.Ticks, st1.Rotated-base1.Rotated
	t.Logf("n0: %d ticks, %d rotated; n1: %d ticks, %d rotated", t0, r0, t1, r1)
	if r0 == 0 {
		t.Errorf("n0 rotated nothing in %d ticks with a job pending and every slot taken", t0)
	}
	if 2*r1 > t1 {
		t.Errorf("n1 rotated %d jobs in %d ticks: the full nodes each rotated for the whole queue", r1, t1)
	}
}
