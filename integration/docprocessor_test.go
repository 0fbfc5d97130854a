package integration

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/couchrep/couchrep/internal/config"
	"github.com/couchrep/couchrep/internal/jobqueue"
	"github.com/couchrep/couchrep/internal/kv/sqlite"
	"github.com/couchrep/couchrep/internal/repjob"
	"github.com/couchrep/couchrep/internal/testserver"
)

// plainReplicatorDB stops pouchdb-server's own replicator daemon from
// driving _replicator (it is moved to another database) and recreates
// _replicator as a plain database (keep) or leaves it absent.
func plainReplicatorDB(t testing.TB, s *testserver.Server, keep bool) {
	t.Helper()
	s.Do(t, "PUT", s.URL+"_config/replicator/db", []byte(`"pouchdb_own_replicator"`), 200)
	s.Do(t, "DELETE", s.URL+"_replicator", nil, 200)
	if keep {
		s.Do(t, "PUT", s.URL+"_replicator", nil, 201)
	}
}

// waitUntil polls cond (state kept by other processes) until it holds.
func waitUntil(t *testing.T, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func docField(t *testing.T, s *testserver.Server, db, id, field string) any {
	t.Helper()
	var m map[string]any
	s.GetJSON(t, s.DBURL(db)+id, &m)
	return m[field]
}

// TestDocProcessor runs a real couchrepd watching two pouchdb-servers and
// checks what _replicator documents do to the job store (read from this
// process: the store file is shared) and to the documents.
func TestDocProcessor(t *testing.T) {
	skipShort(t)
	srv1 := testserver.StartPouchDB(t)
	srv2 := testserver.StartPouchDB(t)
	plainReplicatorDB(t, srv1, true)
	plainReplicatorDB(t, srv2, false)
	src := srv1.CreateDB(t, "src")
	for i := range 5 {
		srv1.Do(t, "PUT", fmt.Sprintf("%sd%d", src, i), map[string]any{"i": i}, 201)
	}

	dir := t.TempDir()
	storePath := filepath.Join(dir, "couchrep.db")
	ini := filepath.Join(dir, "node.ini")
	cfgText := fmt.Sprintf("[couchrep]\nwatch = %s,%s\n[replicator]\ninterval = 1000\n", strings.TrimSuffix(srv1.URL, "/"), strings.TrimSuffix(srv2.URL, "/"))
	if err := os.WriteFile(ini, []byte(cfgText), 0o644); err != nil {
		t.Fatal(err)
	}
	n := startNode(t, nodeOptions{name: "dp1", store: storePath, config: ini})

	ctx := context.Background()
	db, err := sqlite.Open(ctx, storePath, sqlite.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	store := repjob.NewFromConfig(jobqueue.New(db, jobqueue.Options{}), db, config.Default(), zerolog.Nop())
	server1, server2 := srv1.URL, srv2.URL
	job := func(server, id string) (*repjob.Record, error) {
		return store.Get(ctx, repjob.PersistentJobID(server, "_replicator", id))
	}
	exists := func(server, id string) func() bool {
		return func() bool { _, err := job(server, id); return err == nil }
	}

	rdb := srv1.DBURL("_replicator")
	tgt := srv1.DBURL("tgt")
	srv1.Do(t, "PUT", rdb+"r1", map[string]any{"source": src, "target": tgt, "create_target": true, "continuous": true}, 201)
	waitUntil(t, "job of r1", 30*time.Second, exists(server1, "r1"))
	rec, _ := job(server1, "r1")
	if !rec.GetContinuous() || rec.GetDocId() != "r1" || rec.GetDbName() != "_replicator" {
		t.Fatalf("job of r1: %v", rec.ReplicationJob)
	}
	if st := rec.State(); st != repjob.StatePending && st != repjob.StateRunning && st != repjob.StateCrashing {
		t.Fatalf("job of r1 in state %s", st)
	}

	// An invalid document fails with a reason naming the field, and no job.
	srv1.Do(t, "PUT", rdb+"bad", map[string]any{"source": src, "target": tgt, "worker_processes": "four"}, 201)
	waitUntil(t, "bad failed", 30*time.Second, func() bool { return docField(t, srv1, "_replicator", "bad", "_replication_state") == "failed" })
	if r, _ := docField(t, srv1, "_replicator", "bad", "_replication_state_reason").(string); !strings.Contains(r, "worker_processes") {
		t.Fatalf("reason %q does not name the field", r)
	}
	// It is recorded as a failed job (so that _scheduler/docs shows it)
	// that never runs.
	waitUntil(t, "failed record of bad", 30*time.Second, exists(server1, "bad"))
	if rec, _ := job(server1, "bad"); rec.State() != repjob.StateFailed || !strings.Contains(rec.GetLastError(), "worker_processes") {
		t.Fatalf("invalid document's job: state %s, error %q", rec.State(), rec.GetLastError())
	}

	// A document too large for one job record (10,000 doc_ids) fails
	// naming the field to shrink, and its failure is recorded too.
	ids := make([]string, 10_000)
	for i := range ids {
		ids[i] = fmt.Sprintf("document-%06d", i)
	}
	srv1.Do(t, "PUT", rdb+"huge", map[string]any{"source": src, "target": tgt, "doc_ids": ids}, 201)
	waitUntil(t, "huge failed", 30*time.Second, func() bool { return docField(t, srv1, "_replicator", "huge", "_replication_state") == "failed" })
	if r, _ := docField(t, srv1, "_replicator", "huge", "_replication_state_reason").(string); !strings.Contains(r, "too large") || !strings.Contains(r, "`doc_ids`") {
		t.Fatalf("reason %q does not say doc_ids is too large", r)
	}
	waitUntil(t, "failed record of huge", 30*time.Second, exists(server1, "huge"))
	if rec, _ := job(server1, "huge"); rec.State() != repjob.StateFailed || !strings.Contains(rec.GetLastError(), "`doc_ids`") {
		t.Fatalf("too large document's job: state %s, error %q", rec.State(), rec.GetLastError())
	}

	// Editing the document updates its job's parameters.
	var cur map[string]any
	srv1.GetJSON(t, rdb+"r1", &cur)
	cur["worker_batch_size"] = 7
	b, _ := json.Marshal(cur)
	srv1.Do(t, "PUT", rdb+"r1", b, 201)
	waitUntil(t, "job of r1 updated", 30*time.Second, func() bool {
		r, err := job(server1, "r1")
		return err == nil && strings.Contains(string(r.GetBody()), `"worker_batch_size":7`)
	})

	// Deleting the document removes its job.
	srv1.GetJSON(t, rdb+"r1", &cur)
	srv1.Do(t, "DELETE", fmt.Sprintf("%sr1?rev=%s", rdb, cur["_rev"]), nil, 200)
	waitUntil(t, "job of r1 removed", 30*time.Second, func() bool {
		_, err := job(server1, "r1")
		return errors.Is(err, repjob.ErrNotFound)
	})

	// A _replicator database created on the second server is discovered.
	srv2.Do(t, "PUT", srv2.URL+"_replicator", nil, 201)
	srv2.Do(t, "PUT", srv2.DBURL("_replicator")+"r2", map[string]any{"source": src, "target": srv1.DBURL("tgt2"), "create_target": true}, 201)
	waitUntil(t, "job of r2", 30*time.Second, exists(server2, "r2"))

	if lines := n.logLines("doc_processor", "following _replicator database"); len(lines) != 2 {
		t.Errorf("followed %d databases, want 2:\n%s", len(lines), strings.Join(lines, "\n"))
	}

	t.Run("completed", func(t *testing.T) {
		waitUntil(t, "r2 completed", 60*time.Second, func() bool {
			return docField(t, srv2, "_replicator", "r2", "_replication_state") == "completed"
		})
		stats, _ := docField(t, srv2, "_replicator", "r2", "_replication_stats").(map[string]any)
		if stats["docs_written"] != float64(5) {
			t.Fatalf("_replication_stats %v", stats)
		}
		var info map[string]any
		srv1.GetJSON(t, srv1.DBURL("tgt2"), &info)
		if info["doc_count"] != float64(5) {
			t.Fatalf("target doc_count %v", info["doc_count"])
		}
	})
}
