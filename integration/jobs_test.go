package integration

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/couchrep/couchrep/actors/jobrunner"
	"github.com/couchrep/couchrep/internal/jobqueue"
	"github.com/couchrep/couchrep/internal/kv/sqlite"
	"github.com/couchrep/couchrep/internal/repjob"
	"github.com/couchrep/couchrep/internal/testserver"
)

// jobsConfig is the node config of the job tests: no startup jitter, short
// backoffs so that a crashing job shows its doubling within a test.
const jobsConfig = `[replicator]
startup_jitter = 0
min_backoff_penalty_sec = 2
max_backoff_penalty_sec = 8
`

// jobStore opens the store file a node uses, from the test process (the
// store is shared between processes, as between nodes).
func jobStore(t *testing.T, path string) *repjob.Store {
	t.Helper()
	uuid, err := os.ReadFile(filepath.Join(filepath.Dir(path), "couchdb_uuid"))
	if err != nil {
		t.Fatal(err)
	}
	db, err := sqlite.Open(context.Background(), path, sqlite.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	q := jobqueue.New(db, jobqueue.Options{NodeName: "test", Logger: zerolog.Nop()})
	return repjob.New(q, db, repjob.Options{ServerUUID: strings.TrimSpace(string(uuid))})
}

func writeConfig(t *testing.T, dir, text string) string {
	t.Helper()
	p := filepath.Join(dir, "couchrep.ini")
	if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func waitState(t *testing.T, s *repjob.Store, id string, states ...repjob.State) *repjob.Record {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	rec, err := s.WaitState(ctx, id, states...)
	if err != nil {
		cur, _ := s.Get(context.Background(), id)
		t.Fatalf("job %s: waiting for %v: %v (now %+v)", id, states, err, cur)
	}
	return rec
}

func jobsDocCount(t *testing.T, s *testserver.Server, dbURL string) int {
	var info struct {
		DocCount int `json:"doc_count"`
	}
	s.GetJSON(t, dbURL, &info)
	return info.DocCount
}

const (
	running   = repjob.StateRunning
	completed = repjob.StateCompleted
	crashing  = repjob.StateCrashing
	pending   = repjob.StatePending
)

func TestJobsRunToCompletion(t *testing.T) {
	skipShort(t)
	srv := testserver.StartPouchDB(t)
	src, tgt := srv.CreateDB(t, "jsrc"), srv.CreateDB(t, "jtgt")
	var docs []map[string]any
	for i := range 20 {
		docs = append(docs, map[string]any{"_id": fmt.Sprintf("d%02d", i), "n": i})
	}
	srv.PutDocs(t, src, docs...)
	dir := t.TempDir()
	startNode(t, nodeOptions{dataDir: dir, config: writeConfig(t, dir, jobsConfig), name: "jobs-node"})
	store := jobStore(t, filepath.Join(dir, "couchrep.db"))
	ctx := context.Background()

	oneShot, err := store.AddTransient(ctx, []byte(`{"source":"`+src+`","target":"`+tgt+`"}`), "alice")
	if err != nil {
		t.Fatal(err)
	}
	persistent, err := store.AddPersistent(ctx, repjob.PersistentDoc{Server: srv.URL, DB: "_replicator", DocID: "r1",
		Body: []byte(`{"source":"` + src + `","target":"` + srv.DBURL("jtgt2") + `","create_target":true}`)})
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{oneShot.JobID, persistent.JobID} {
		rec := waitState(t, store, id, completed)
		if rec.Stats.GetDocsWritten() != 20 || len(rec.Result) == 0 || rec.Node != "jobs-node" {
			t.Fatalf("job %s: stats %+v result %q node %q", id, rec.Stats, rec.Result, rec.Node)
		}
	}
	if c := jobsDocCount(t, srv, tgt); c != 20 {
		t.Fatalf("target has %d docs", c)
	}
	if c := jobsDocCount(t, srv, srv.DBURL("jtgt2")); c != 20 {
		t.Fatalf("created target has %d docs", c)
	}
}

func TestTransientJobSurvivesRestart(t *testing.T) {
	skipShort(t)
	srv := testserver.StartPouchDB(t)
	src, tgt := srv.CreateDB(t, "rsrc"), srv.CreateDB(t, "rtgt")
	srv.PutDocs(t, src, map[string]any{"_id": "a"})
	dir := t.TempDir()
	cfg := writeConfig(t, dir, jobsConfig)
	n := startNode(t, nodeOptions{dataDir: dir, config: cfg, name: "restart-node"})
	store := jobStore(t, filepath.Join(dir, "couchrep.db"))
	ctx := context.Background()
	r, err := store.AddTransient(ctx, []byte(`{"source":"`+src+`","target":"`+tgt+`","continuous":true}`), "alice")
	if err != nil {
		t.Fatal(err)
	}
	waitState(t, store, r.JobID, running)
	if err := n.stop(syscall.SIGTERM, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	// A clean stop checkpoints and hands the job back to the queue.
	rec, err := store.Get(ctx, r.JobID)
	if err != nil || rec.State() != pending {
		t.Fatalf("after stop: %v %v", rec, err)
	}
	startNode(t, nodeOptions{dataDir: dir, config: cfg, name: "restart-node"})
	waitState(t, store, r.JobID, running)
	// It still replicates: a new source doc reaches the target.
	srv.PutDocs(t, src, map[string]any{"_id": "b"})
	deadline := time.Now().Add(60 * time.Second)
	for jobsDocCount(t, srv, tgt) != 2 {
		if time.Now().After(deadline) {
			t.Fatal("continuous job did not replicate after restart")
		}
		time.Sleep(100 * time.Millisecond) // polling an external server, no event to await
	}
}

func TestUnreachableEndpointCrashesJobNotNode(t *testing.T) {
	skipShort(t)
	dir := t.TempDir()
	n := startNode(t, nodeOptions{dataDir: dir, config: writeConfig(t, dir, jobsConfig)})
	store := jobStore(t, filepath.Join(dir, "couchrep.db"))
	ctx := context.Background()
	r, err := store.AddTransient(ctx, []byte(`{"source":"http://127.0.0.1:1/nowhere","target":"http://127.0.0.1:1/t","continuous":true}`), "alice")
	if err != nil {
		t.Fatal(err)
	}
	var backoffs []time.Duration
	var after uint64
	for len(backoffs) < 2 {
		c, cancel := context.WithTimeout(ctx, 60*time.Second)
		rec, err := store.WaitChange(c, r.JobID, after)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		after = rec.Version
		if rec.State() == crashing && int(rec.ErrorCount) == len(backoffs)+1 {
			backoffs = append(backoffs, rec.ScheduledAt.Sub(rec.History()[0].At))
			if !strings.Contains(rec.LastError, "db_not_found") {
				t.Fatalf("reason %q", rec.LastError)
			}
		}
	}
	if backoffs[0] != 2*time.Second || backoffs[1] != 4*time.Second {
		t.Fatalf("backoffs %v, want 2s then 4s", backoffs)
	}
	if tr := n.tree(); tr.GetRoot() == nil {
		t.Fatal("node tree unavailable")
	}
}

func TestKilledJobActorsLoseNoJob(t *testing.T) {
	skipShort(t)
	srv := testserver.StartPouchDB(t)
	src, tgt := srv.CreateDB(t, "ksrc"), srv.CreateDB(t, "ktgt")
	srv.PutDocs(t, src, map[string]any{"_id": "a"})
	dir := t.TempDir()
	n := startNode(t, nodeOptions{dataDir: dir, config: writeConfig(t, dir, jobsConfig)})
	store := jobStore(t, filepath.Join(dir, "couchrep.db"))
	ctx := context.Background()
	r, err := store.AddTransient(ctx, []byte(`{"source":"`+src+`","target":"`+tgt+`","continuous":true}`), "alice")
	if err != nil {
		t.Fatal(err)
	}
	for _, victim := range []string{"job_server/jobs_sup/" + jobrunner.Name(r.JobID), "job_server/acceptor", "job_server"} {
		rec := waitState(t, store, r.JobID, running)
		_, errOut, code := n.ctl("kill", victim)
		if code != 0 {
			t.Fatalf("kill %s: %s", victim, errOut)
		}
		if victim == "job_server/acceptor" {
			// The job keeps running; the new acceptor keeps counting it.
			continue
		}
		// Killing the job actor (or everything above it) stops the job
		// cleanly; it is taken again at once.
		c, cancel := context.WithTimeout(ctx, 60*time.Second)
		var after = rec.Version
		for {
			cur, err := store.WaitChange(c, r.JobID, after)
			if err != nil {
				cancel()
				t.Fatalf("after killing %s: %v", victim, err)
			}
			after = cur.Version
			if cur.State() == running && cur.LastStarted.AsTime().After(rec.LastStarted.AsTime()) {
				break
			}
		}
		cancel()
	}
	waitState(t, store, r.JobID, running)
	if n, err := store.List(ctx, repjob.Filter{}); err != nil || len(n) != 1 {
		t.Fatalf("jobs after kills: %d %v", len(n), err)
	}
}
