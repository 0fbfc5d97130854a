package integration

import (
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/couchrep/couchrep/internal/redact"
	"github.com/couchrep/couchrep/internal/testserver"
)

// TestTakeoverGoingBack runs the examples of docs/takeover.md marked
// `couchdb` ("Going back to CouchDB's replicator") against the Apache
// CouchDB of COUCHREP_TEST_COUCH_URL (make test-couchdb): couchrep, with
// the server's uuid, runs a continuous _replicator document from $SOURCE/src
// to $TARGET/copy and stops; the guide's `PUT max_jobs "500"` turns
// CouchDB's replicator on, and CouchDB resumes the document from couchrep's
// checkpoint. CouchDB's [replicator] max_jobs is put back as it was found
// (0, which the guide's first example expects), holding the config lock
// of COUCHREP_TEST_COUCH_CONFIG_LOCK when set. Without a CouchDB it
// checks that the guide still has those examples.
func TestTakeoverGoingBack(t *testing.T) {
	skipShort(t)
	var guide docExamples
	for _, f := range readDocExamples(t) {
		if f.file == "docs/takeover.md" {
			guide = f
		}
	}
	var exs []readmeExample
	for _, ex := range guide.exs {
		if ex.couchdb {
			exs = append(exs, ex)
		}
	}
	if len(exs) < 3 {
		t.Fatalf("docs/takeover.md has %d examples marked couchdb, want the way back (max_jobs, running, resumed)", len(exs))
	}
	if os.Getenv(testserver.ExternalURLEnv) == "" {
		t.Logf("the way back needs CouchDB: make test-couchdb COUCH_URL=... runs its %d examples", len(exs))
		return
	}
	srv := testserver.StartPouchDB(t) // the CouchDB of COUCHREP_TEST_COUCH_URL
	holdConfigLock(t)
	root := strings.TrimSuffix(srv.URL, "/")
	const maxJobs = "_node/_local/_config/replicator/max_jobs"
	if got := strings.TrimSpace(string(srv.Do(t, "GET", srv.URL+maxJobs, nil, 200))); got != `"0"` {
		t.Fatalf("CouchDB's [replicator] max_jobs is %s: turn its replicator off first (make test-couchdb's precondition)", got)
	}
	// The guide's names, on a server shared with others: refuse to touch
	// databases that exist already.
	for _, db := range []string{"src", "copy"} {
		if _, status, _ := srv.Request("GET", srv.URL+db, nil); status != 404 {
			t.Fatalf("%s/%s exists (%d): the guide's example uses it; remove it first", redactedRoot(srv), db, status)
		}
	}
	if _, status, _ := srv.Request("GET", srv.URL+"_replicator/backup", nil); status != 404 {
		t.Fatalf("%s/_replicator/backup exists (%d): remove it first", redactedRoot(srv), status)
	}
	// On a cluster the guide turns the replicator on on every node; its
	// example shows the one it talks to (_local): the others are done here.
	var local struct{ Name string }
	var members struct {
		ClusterNodes []string `json:"cluster_nodes"`
	}
	srv.GetJSON(t, srv.URL+"_node/_local", &local)
	srv.GetJSON(t, srv.URL+"_membership", &members)
	var others []string
	for _, m := range members.ClusterNodes {
		if m != local.Name {
			others = append(others, srv.URL+"_node/"+url.PathEscape(m)+"/_config/replicator/max_jobs")
		}
	}
	t.Cleanup(func() {
		for _, u := range others {
			_, _, _ = srv.Request("PUT", u, []byte(`"0"`))
		}
		if b, status, _ := srv.Request("GET", srv.URL+"_replicator/backup", nil); status == 200 {
			rev := strings.Split(strings.Split(string(b), `"_rev":"`)[1], `"`)[0]
			_, _, _ = srv.Request("DELETE", srv.URL+"_replicator/backup?rev="+rev, nil)
		}
		_, _, _ = srv.Request("PUT", srv.URL+maxJobs, []byte(`"0"`))
		_, _, _ = srv.Request("DELETE", srv.URL+"src", nil)
		_, _, _ = srv.Request("DELETE", srv.URL+"copy", nil)
	})
	srv.Do(t, "PUT", srv.URL+"src", nil, 201)
	srv.Do(t, "PUT", srv.URL+"copy", nil, 201)
	srv.PutDocs(t, srv.URL+"src/", map[string]any{"_id": "doc1"}, map[string]any{"_id": "doc2"}, map[string]any{"_id": "doc3"})
	srv.Do(t, "PUT", srv.URL+"_replicator/backup", map[string]any{"source": root + "/src", "target": root + "/copy", "continuous": true}, 201)

	// couchrep, with CouchDB's uuid, runs it and checkpoints.
	dir := t.TempDir()
	cfg := writeConfig(t, dir, jobsConfig+"interval = 1000\ncheckpoint_interval = 1000\n[couchrep]\nwatch = "+root+"\n")
	n := startNode(t, nodeOptions{name: "going-back", dataDir: dir, config: cfg, extra: []string{"--adopt-uuid", root}})
	waitUntil(t, "couchrep's checkpoint on the target", 2*time.Minute, func() bool {
		b, _, _ := srv.Request("GET", srv.URL+"copy/_local_docs?include_docs=true", nil)
		return strings.Contains(string(b), `"replicator":"couchrep"`) && strings.Contains(string(b), `"docs_written":3`)
	})
	couchrep := "http://" + n.httpAddr("")
	if err := n.stop(syscall.SIGTERM, time.Minute); err != nil {
		t.Fatal(err)
	}

	work := t.TempDir()
	if err := os.Symlink(binDir, filepath.Join(work, "bin")); err != nil {
		t.Fatal(err)
	}
	vars := map[string]string{"SOURCE": root, "TARGET": root, "COUCHREP": couchrep}
	env := append(os.Environ(), "LC_ALL=C")
	for k, v := range vars {
		env = append(env, k+"="+v)
	}
	for _, u := range others {
		srv.Do(t, "PUT", u, []byte(`"500"`), 200)
	}
	start := time.Now()
	for _, ex := range exs {
		runDocExample(t, guide.file, guide.vars, vars, work, env, ex)
	}
	t.Logf("%d examples of the way back ran in %v", len(exs), time.Since(start).Round(time.Millisecond))
}

func redactedRoot(s *testserver.Server) string { return redact.URL(strings.TrimSuffix(s.URL, "/")) }

// holdConfigLock takes the exclusive flock of ConfigLockEnv's file, if
// set, until the test ends (its cleanups, which put the configuration
// back, run first).
func holdConfigLock(t *testing.T) {
	t.Helper()
	p := os.Getenv(ConfigLockEnv)
	if p == "" {
		return
	}
	f, err := os.OpenFile(p, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		t.Fatalf("config lock %s: %v", p, err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		t.Fatalf("config lock %s: %v", p, err)
	}
	t.Cleanup(func() { _ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN); f.Close() })
}
