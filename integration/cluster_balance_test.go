package integration

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/couchrep/couchrep/internal/config"
	"github.com/couchrep/couchrep/internal/jobqueue"
	"github.com/couchrep/couchrep/internal/kv"
	"github.com/couchrep/couchrep/internal/repjob"
	"github.com/couchrep/couchrep/internal/testserver"
)

// TestClusterAcceptBalance: three couchrepd nodes on one store, 60
// continuous jobs added in one transaction: each node accepts its share
// (20 ± 10 %), where the first accept loop to come took a batch of as many
// as it had slots for (split 1/37/22 before). SIGKILL one: its jobs are
// spread over the two others (30 ± 10 % each); SIGKILL another: the last
// node takes every job.
func TestClusterAcceptBalance(t *testing.T) {
	skipShort(t)
	const jobs = 60
	ctx := context.Background()
	srv := testserver.StartPouchDB(t)
	src := srv.CreateDB(t, "bsrc")
	srv.PutDocs(t, src, map[string]any{"_id": "x"})
	repl := []string{config.NodeTypeReplication}
	timeout := 4 * time.Second
	c := startCluster(t, clusterConfig{ActivityTimeout: timeout, MaxJobs: 100}, repl, repl, repl)
	if err := c.store.Init(ctx); err != nil {
		t.Fatal(err)
	}
	var docs []repjob.PersistentDoc
	for i := range jobs {
		tgt := srv.CreateDB(t, fmt.Sprintf("btgt%02d", i))
		body := fmt.Sprintf(`{"source":%q,"target":%q,"continuous":true}`, src, tgt)
		docs = append(docs, repjob.PersistentDoc{Server: srv.URL, DB: "_replicator", DocID: fmt.Sprint("b", i), Body: []byte(body)})
	}
	// Every node up and heartbeating before the jobs come: the burst is
	// what is measured.
	deadline := time.Now().Add(60 * time.Second)
	for {
		v, err := c.nodesView(c.nodes[0])
		alive := 0
		for _, m := range v.GetNodes() {
			if m.GetAlive() {
				alive++
			}
		}
		if err == nil && alive == len(c.nodes) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("nodes alive: %d of %d after 60 s (%v)", alive, len(c.nodes), err)
		}
		time.Sleep(200 * time.Millisecond) // other processes' heartbeats: poll
	}
	if err := c.db.Transact(ctx, func(tx kv.Tx) error {
		for _, d := range docs {
			if _, err := c.store.AddPersistentTx(tx, d); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	held := func() (map[string]int, int) {
		per, all := map[string]int{}, 0 // running jobs per node, in all
		if err := c.store.Each(ctx, repjob.Filter{}, func(r *repjob.Record) error {
			if r.QueueState == jobqueue.StateRunning && r.State() == repjob.StateRunning && r.GetNode() == r.WorkerNode {
				per[r.WorkerNode]++
				all++
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		return per, all
	}
	// balanced waits until every job runs on the live nodes and checks
	// that each holds its part within 10 %.
	balanced := func(what string, within time.Duration) {
		t.Helper()
		live := c.live()
		onLive := func(per map[string]int) int {
			n := 0
			for _, nd := range live {
				n += per[nd.name]
			}
			return n
		}
		deadline := time.Now().Add(within)
		per, _ := held()
		for ; onLive(per) != jobs; per, _ = held() {
			if time.Now().After(deadline) {
				t.Fatalf("%s: %d of %d jobs running on the live nodes after %v: %v", what, onLive(per), jobs, within, per)
			}
			time.Sleep(100 * time.Millisecond) // other processes' accepts: poll
		}
		want := jobs / len(live)
		t.Logf("%s: %v", what, per)
		for _, n := range live {
			if got := per[n.name]; 10*got < 9*want || 10*got > 11*want {
				t.Errorf("%s: %s holds %d jobs, want %d ± 10 %% (%v)", what, n.name, got, want, per)
			}
		}
	}
	balanced("3 nodes", 60*time.Second)
	c.kill(c.nodes[0])
	balanced("n0 killed", failoverBound(timeout)+30*time.Second)
	c.kill(c.nodes[1])
	balanced("n1 killed too", failoverBound(timeout)+30*time.Second)
}
