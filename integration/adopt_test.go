package integration

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/couchrep/couchrep/internal/replicate"
	"github.com/couchrep/couchrep/internal/testserver"
)

// TestAdoptUUIDResumesFromCouchDBCheckpoints is the move from CouchDB's
// replicator (README "Replacing CouchDB's replicator"): a node started
// with --adopt-uuid computes the server's replication ids, so it resumes
// from checkpoints another replicator recorded (simulated: couchrep's own
// checkpoints with couchrep's mark removed are what CouchDB writes), and
// _scheduler/jobs and couchrepctl say where each run started.
func TestAdoptUUIDResumesFromCouchDBCheckpoints(t *testing.T) {
	skipShort(t)
	srv := testserver.StartPouchDB(t)
	root := strings.TrimSuffix(srv.URL, "/")
	var welcome struct {
		UUID string `json:"uuid"`
	}
	srv.GetJSON(t, srv.URL, &welcome)
	if welcome.UUID == "" {
		t.Fatalf("pouchdb-server's GET / has no uuid")
	}
	src := srv.CreateDB(t, "src")
	tgt := srv.CreateDB(t, "tgt")
	put := func(ids ...string) {
		for _, id := range ids {
			srv.Do(t, "PUT", src+id, map[string]any{"v": id}, 201)
		}
	}
	put("a", "b", "c")

	dir := t.TempDir()
	n := startNode(t, nodeOptions{name: "adopter", dataDir: dir, extra: []string{"--adopt-uuid", root}})
	if b, err := os.ReadFile(filepath.Join(dir, "couchdb_uuid")); err != nil || strings.TrimSpace(string(b)) != welcome.UUID {
		t.Fatalf("<data>/couchdb_uuid = %q, %v; want the server's %q", b, err, welcome.UUID)
	}
	if len(n.logLines("adopted the server uuid", welcome.UUID)) != 1 {
		t.Fatalf("no log line for the adopted uuid")
	}
	addr := n.httpAddr("")
	body := fmt.Sprintf(`{"source":%q,"target":%q}`, src, tgt)
	p, err := replicate.ParseParams([]byte(body))
	if err != nil {
		t.Fatal(err)
	}
	base, ext, err := replicate.ID(p, welcome.UUID)
	if err != nil {
		t.Fatal(err)
	}

	// run replicates once and returns the job's info and the answer.
	run := func() (map[string]any, map[string]any) {
		t.Helper()
		r := api(t, addr, "POST", "/_replicate", body)
		if r.status != 200 {
			t.Fatalf("POST /_replicate: %d %s", r.status, r.body)
		}
		job := waitJobState(t, addr, base+ext, "completed")
		info, _ := job["info"].(map[string]any)
		return info, r.obj(t)
	}
	info, _ := run()
	if info["start_from"] != "zero" || info["docs_written"] != 3.0 {
		t.Fatalf("first run: info %v, want start_from zero and 3 docs written", info)
	}

	// CouchDB's replicator writes the same checkpoints without couchrep's
	// mark: make them so, as if CouchDB had copied a, b and c.
	for _, db := range []string{src, tgt} {
		var doc map[string]any
		srv.GetJSON(t, db+"_local/"+base, &doc)
		for _, e := range doc["history"].([]any) {
			delete(e.(map[string]any), "replicator")
		}
		srv.Do(t, "PUT", db+"_local/"+base, doc, 201)
	}
	put("d", "e")
	info, answer := run()
	if info["start_from"] != "couchdb_checkpoint" || info["start_seq"] != "3" {
		t.Fatalf("after CouchDB's checkpoint: info %v, want start_from couchdb_checkpoint at 3", info)
	}
	h := answer["history"].([]any)[0].(map[string]any)
	// Counters continue from the checkpoint's, as in CouchDB: 3 + 2.
	if h["docs_written"] != 5.0 || h["start_last_seq"] != 3.0 || h["replicator"] != "couchrep" {
		t.Fatalf("after CouchDB's checkpoint: history[0] %v, want a session from seq 3 writing 2 more docs", h)
	}

	put("f")
	if info, _ := run(); info["start_from"] != "checkpoint" || info["start_seq"] != "5" {
		t.Fatalf("after its own checkpoint: info %v, want start_from checkpoint at 5", info)
	}
	out := ctlOK(t, n, "jobs")
	if !strings.Contains(out, "STARTED_FROM") || !strings.Contains(out, "checkpoint@5") {
		t.Fatalf("couchrepctl jobs shows no start:\n%s", out)
	}
	if out := ctlOK(t, n, "job", "show", base+ext); !strings.Contains(out, "checkpoint@5") {
		t.Fatalf("couchrepctl job show shows no start:\n%s", out)
	}

	// Restarted without the flag, the node keeps the adopted uuid (from
	// the data directory and the store): nothing to do.
	if err := n.stop(syscall.SIGTERM, time.Minute); err != nil {
		t.Fatalf("stopping: %v", err)
	}
	n = startNode(t, nodeOptions{name: "adopter", dataDir: dir})
	addr = n.httpAddr("")
	r := api(t, addr, "POST", "/_replicate", body)
	if r.status != 200 || r.obj(t)["no_changes"] != true {
		t.Fatalf("after a restart without --adopt-uuid: %d %s, want no_changes (same replication id)", r.status, r.body)
	}

	// A server that is not there is a clear error, not a node with
	// another uuid.
	res := runCmd(t, filepath.Join(binDir, "couchrepd"), "--data", t.TempDir(), "--adopt-uuid", "http://user:secret@127.0.0.1:1")
	if res.code != 1 || !strings.Contains(res.stderr, "--adopt-uuid: GET http://127.0.0.1:1/") || strings.Contains(res.stderr, "secret") {
		t.Fatalf("unreachable server: exit %d, stderr %q", res.code, res.stderr)
	}
	var replicated map[string]any
	srv.GetJSON(t, tgt, &replicated)
	if replicated["doc_count"] != 6.0 {
		t.Fatalf("target has %v docs, want 6", replicated["doc_count"])
	}
}
