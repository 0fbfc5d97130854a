package integration

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/couchrep/couchrep/internal/config"
	"github.com/couchrep/couchrep/internal/jobqueue"
	"github.com/couchrep/couchrep/internal/kv/postgres/pgtest"
	"github.com/couchrep/couchrep/internal/repjob"
	"github.com/couchrep/couchrep/internal/testserver"
)

// TestPostgresRestart stops the PostgreSQL server three nodes share
// (pg_ctl stop -m fast) while replications run, for longer than the
// activity timeout (after which a node whose store file fails stops), and
// starts it again. While it is down every node reports the store unhealthy
// on _up (503) and in couchrepctl tree; no node stops or gives up its
// supervision tree; once
// it is back the nodes reconnect, every one-shot replication completes
// with the exact documents, continuous ones catch up with what was
// written during the outage, every job exists once and the run log shows
// no job run by two nodes at once. No log line shows the password.
func TestPostgresRestart(t *testing.T) {
	skipShort(t)
	pg := pgtest.Start(t)
	dsn := pg.NewDatabase(t)
	srv := testserver.StartPouchDB(t)

	const oneShots, continuous, docs = 12, 4, 20
	var work []*chaosJob
	for i := range oneShots + continuous {
		j := &chaosJob{continuous: i >= oneShots, kind: "transient"}
		j.src = srv.CreateDB(t, fmt.Sprintf("pgr-src-%02d", i))
		j.tgt = srv.CreateDB(t, fmt.Sprintf("pgr-tgt-%02d", i))
		var ds []map[string]any
		for d := range docs {
			ds = append(ds, map[string]any{"_id": fmt.Sprintf("pre-%04d", d), "n": d})
		}
		srv.PutDocs(t, j.src, ds...)
		work = append(work, j)
	}
	both := []string{config.NodeTypeReplication, config.NodeTypeAPIFrontend}
	const activity = 4 * time.Second
	c := startCluster(t, clusterConfig{ActivityTimeout: activity, MaxJobs: 20, Store: dsn}, both, both, both)
	ctx := context.Background()
	add := func(j *chaosJob) {
		t.Helper()
		body := fmt.Sprintf(`{"source":%q,"target":%q,"continuous":%v}`, j.src, j.tgt, j.continuous)
		r, err := c.store.AddTransient(ctx, []byte(body), "pgrestart")
		if err != nil {
			t.Fatalf("add: %v", err)
		}
		j.id, j.added = r.JobID, true
	}
	// The continuous jobs and half the one-shot ones before the outage,
	// the rest after it.
	for _, j := range work[oneShots/2:] {
		add(j)
	}
	waitFor(t, 2*time.Minute, "continuous jobs running", func() error {
		for _, j := range work[oneShots:] {
			r, err := c.store.Get(ctx, j.id)
			if err != nil {
				return err
			}
			if r.State() != repjob.StateRunning {
				return fmt.Errorf("%s is %s", j.id, r.State())
			}
		}
		return nil
	})

	if err := pg.Stop(); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	c.logf("PostgreSQL stopped")
	// Documents keep arriving at the continuous sources meanwhile.
	for i, j := range work[oneShots:] {
		doc := fmt.Sprintf(`{"docs":[{"_id":"during-outage-%d"}]}`, i)
		resp, err := http.Post(j.src+"_bulk_docs", "application/json", bytes.NewBufferString(doc))
		if err != nil || resp.StatusCode != http.StatusCreated {
			t.Fatalf("write during the outage: %v %v", err, resp)
		}
		resp.Body.Close()
	}
	for _, n := range c.nodes {
		addr := n.proc.httpAddr("")
		waitFor(t, time.Minute, n.name+" reports the store unhealthy", func() error {
			r := apiNoFail("http://" + addr + "/_up")
			if r.status != http.StatusServiceUnavailable || !strings.Contains(string(r.body), `"store":"unavailable"`) {
				return fmt.Errorf("_up: %d %s", r.status, r.body)
			}
			tr, err := treeOf(n)
			if err != nil {
				return err
			}
			if !strings.HasPrefix(tr.GetStore(), "unavailable") {
				return fmt.Errorf("tree store %q", tr.GetStore())
			}
			if strings.Contains(tr.GetStore(), pgtest.Password) {
				t.Fatalf("couchrepctl tree shows the password: %q", tr.GetStore())
			}
			return nil
		})
	}
	// The outage lasts twice the activity timeout: the scenario, not a
	// wait for something to happen.
	time.Sleep(time.Until(stopped.Add(2 * activity)))
	for _, n := range c.nodes {
		if !n.up() {
			t.Fatalf("node %s stopped during the outage: %v\n%s", n.name, n.proc.exitErr, n.proc.logs.String())
		}
	}
	if err := pg.Start(); err != nil {
		t.Fatal(err)
	}
	c.logf("PostgreSQL started after %v", time.Since(stopped).Round(time.Millisecond))
	for _, n := range c.nodes {
		addr := n.proc.httpAddr("")
		waitFor(t, 2*time.Minute, n.name+" reports the store healthy again", func() error {
			if r := apiNoFail("http://" + addr + "/_up"); r.status != http.StatusOK {
				return fmt.Errorf("_up: %d %s", r.status, r.body)
			}
			tr, err := treeOf(n)
			if err != nil {
				return err
			}
			if tr.GetStore() != "ok" {
				return fmt.Errorf("tree store %q", tr.GetStore())
			}
			return treeWhole(tr)
		})
	}
	for _, j := range work[:oneShots/2] {
		add(j)
	}

	res := &chaosResult{}
	waitFor(t, 3*time.Minute, "one-shot jobs completed, continuous running", func() error {
		for _, j := range work {
			r, err := c.store.Get(ctx, j.id)
			if err != nil {
				return err
			}
			if want := map[bool]repjob.State{true: repjob.StateRunning, false: repjob.StateCompleted}[j.continuous]; r.State() != want {
				return fmt.Errorf("%s: %s (%s)", j.id, r.State(), r.LastError)
			}
		}
		return nil
	})
	for _, j := range work[oneShots:] {
		waitCaughtUp(t, srv, j, 2*time.Minute, res)
	}
	for _, j := range work {
		verifyChaos(t, srv, j.src, j.tgt, res)
	}
	// Every job once; no job run by two nodes at once.
	seen := map[string]int{}
	if err := c.store.Each(ctx, repjob.Filter{}, func(r *repjob.Record) error {
		seen[r.GetJobId()]++
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if len(seen) != len(work) {
		res.violate("%d jobs in the store, want %d", len(seen), len(work))
	}
	for _, j := range work {
		if seen[j.id] != 1 {
			res.violate("job %s listed %d times", j.id, seen[j.id])
		}
	}
	runs, err := c.queue.Runs(ctx, repjob.JobType)
	if err != nil {
		t.Fatal(err)
	}
	for _, rs := range runs {
		if err := jobqueue.CheckRuns(rs); err != nil {
			res.violate("%v", err)
		}
	}
	for _, n := range c.nodes {
		addr := n.proc.httpAddr("")
		for _, path := range []string{"/_scheduler/jobs", "/_scheduler/docs", "/_active_tasks", "/_up", "/metrics"} {
			if r := apiNoFail("http://" + addr + path); strings.Contains(string(r.body), pgtest.Password) {
				res.violate("node %s: %s shows the password", n.name, path)
			}
		}
		if out, _, _ := n.proc.ctl("tree"); strings.Contains(out, pgtest.Password) {
			res.violate("node %s: couchrepctl tree shows the password", n.name)
		}
		if !n.up() || n.starts != 1 {
			res.violate("node %s: up %v after %d starts", n.name, n.up(), n.starts)
		}
		if strings.Contains(n.proc.logs.String(), pgtest.Password) {
			res.violate("node %s logged the password", n.name)
		}
	}
	for _, v := range res.violations {
		t.Error(v)
	}
}

// waitFor polls cond (another process's state: no event reaches the test)
// until it returns nil, failing the test with its last error after timeout.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not after %v: %v", what, timeout, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// apiNoFail GETs url and returns the reply (status 0 when unreachable).
func apiNoFail(url string) apiReply {
	cl := http.Client{Timeout: 10 * time.Second}
	resp, err := cl.Get(url)
	if err != nil {
		return apiReply{body: []byte(err.Error())}
	}
	defer resp.Body.Close()
	var b bytes.Buffer
	_, _ = b.ReadFrom(resp.Body)
	return apiReply{status: resp.StatusCode, body: b.Bytes()}
}
