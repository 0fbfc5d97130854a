package integration

import (
	"fmt"
	"net/url"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	"github.com/couchrep/couchrep/actors/jobrunner"
	"github.com/couchrep/couchrep/internal/testserver"
	"github.com/couchrep/couchrep/messages"
)

// withUserinfo is srv's root URL with user:pass in it, as a user exports
// $SOURCE, without the trailing slash.
func withUserinfo(t *testing.T, srv *testserver.Server, user, pass string) string {
	t.Helper()
	u, err := url.Parse(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword(user, pass)
	return strings.TrimSuffix(u.String(), "/")
}

// startedFromCol is the STARTED_FROM column of job id's row in a
// `couchrepctl jobs` table.
func startedFromCol(t *testing.T, table, id string) string {
	t.Helper()
	lines := strings.Split(table, "\n")
	head := strings.Fields(lines[0])
	col := -1
	for i, h := range head {
		if h == "STARTED_FROM" {
			col = i
		}
	}
	if col < 0 {
		t.Fatalf("jobs table has no STARTED_FROM:\n%s", table)
	}
	for _, l := range lines[1:] {
		if f := strings.Fields(l); len(f) > col && f[0] == id {
			return f[col]
		}
	}
	t.Fatalf("jobs table has no row %s:\n%s", id, table)
	return ""
}

// TestCtlViewsYouCanTrust drives a real couchrepd watching a PouchDB Server
// whose URL carries an admin's password, through couchrepctl as a user
// does (issue 24, finding 9):
//   - the id `jobs` shows, the same id with the password in it (as built
//     from an exported $SOURCE), the replication id, its 12 characters the
//     status page shows, the actor name `tree` shows and a unique prefix
//     all name the job for job show/restart/stop; an ambiguous prefix says
//     which jobs it matches;
//   - STARTED_FROM is current right after a job restart and a node
//     restart (the run's own checkpoint, not the previous run's), with
//     activity_timeout long enough that a stale value could not be
//     replaced by a heartbeat;
//   - `job stop` says that the scheduler started the job again instead of
//     "now running";
//   - no output or error holds the password.
func TestCtlViewsYouCanTrust(t *testing.T) {
	skipShort(t)
	const pass = "s3cret-trust-pw"
	srv := testserver.StartPouchDB(t)
	plainReplicatorDB(t, srv, true)
	srv.AddAdmin(t, "admin", pass)
	server := withUserinfo(t, srv, "admin", pass)
	src := srv.CreateDB(t, "src")
	srv.CreateDB(t, "tgt")
	var docs []map[string]any
	for i := range 5 {
		docs = append(docs, map[string]any{"_id": fmt.Sprintf("d%d", i), "n": i})
	}
	srv.PutDocs(t, src, docs...)
	srcDB, tgtDB := server+"/src", server+"/tgt"

	dir := t.TempDir()
	cfg := fmt.Sprintf("[couchrep]\nwatch = %s\nactivity_timeout = 600\n%s", server, jobsConfig)
	n := startNode(t, nodeOptions{dataDir: dir, config: writeConfig(t, dir, cfg), name: "trust"})

	// Every output of couchrepctl, checked for the password.
	ctl := func(t *testing.T, args ...string) (string, string, int) {
		t.Helper()
		out, errOut, code := n.ctl(args...)
		if strings.Contains(out+errOut, pass) {
			t.Fatalf("couchrepctl %v shows the password:\n%s%s", args, out, errOut)
		}
		return out, errOut, code
	}
	ok := func(t *testing.T, args ...string) string {
		t.Helper()
		out, errOut, code := ctl(t, args...)
		if code != 0 {
			t.Fatalf("couchrepctl %v: exit %d: %s", args, code, errOut)
		}
		return out
	}

	outer := t
	t.Cleanup(func() {
		if strings.Contains(n.logs.String(), pass) {
			t.Error("the node's log holds the password")
		}
	})
	rdb := srv.DBURL("_replicator")
	srv.Do(t, "PUT", rdb+"backup", map[string]any{"source": srcDB, "target": tgtDB, "continuous": true}, 201)
	list := waitCtlJobs(t, n, 1)
	shown := list.GetJobs()[0].GetId()
	t.Logf("jobs shows id %q", shown)
	if strings.Contains(shown, pass) || !strings.HasSuffix(shown, "|_replicator|backup") {
		t.Fatalf("jobs shows id %q", shown)
	}
	// The id as a user builds it from $SOURCE, password and all.
	withPass := server + "|_replicator|backup"
	job := waitCtlJob(t, n, shown, statusRunning)
	waitDocCount(t, srv, srv.DBURL("tgt"), 5)
	waitUntil(t, "the first run's start recorded", 90*time.Second, func() bool {
		return startedFromCol(t, ok(t, "jobs"), shown) == "zero"
	})

	t.Run("ids", func(t *testing.T) {
		var got messages.GetJobResponse
		ctlJSON(t, n, &got, "job", "show", shown)
		repID := got.GetJob().GetReplicationId()
		if repID == "" {
			t.Fatalf("no replication id: %v", got.GetJob())
		}
		tree := ok(t, "tree")
		actor := jobrunner.Name(job.GetId())
		if !strings.Contains(tree, actor) {
			t.Fatalf("tree does not show actor %s:\n%s", actor, tree)
		}
		for _, id := range []string{shown, withPass, repID, repID[:12], actor, strings.TrimSuffix(shown, "kup")} {
			var r messages.GetJobResponse
			out, errOut, code := ctl(t, "--json", "job", "show", id)
			if code != 0 {
				t.Errorf("job show %s: exit %d: %s", id, code, errOut)
				continue
			}
			if err := protojson.Unmarshal([]byte(out), &r); err != nil || r.GetJob().GetId() != shown {
				t.Errorf("job show %s: %v %v", id, r.GetJob().GetId(), err)
			}
		}
	})

	t.Run("restart with the password in the id", func(t *testing.T) {
		out := ok(t, "job", "restart", withPass)
		if !strings.Contains(out, "restarted job "+shown) {
			t.Fatalf("job restart: %q", out)
		}
		// The new run started from its own checkpoint; the table says so
		// while the run goes on (nothing else changes: no stats to write).
		waitUntil(t, "STARTED_FROM of the new run", 30*time.Second, func() bool {
			return strings.HasPrefix(startedFromCol(t, ok(t, "jobs"), shown), "checkpoint@")
		})
	})

	t.Run("stop says what happened", func(t *testing.T) {
		out := ok(t, "job", "stop", strings.TrimSuffix(shown, "backup")+"back")
		if strings.Contains(out, "now running") || !strings.Contains(out, "stopped job "+shown) ||
			!(strings.Contains(out, "started it again") || strings.Contains(out, "back in the queue")) {
			t.Fatalf("job stop: %q", out)
		}
	})

	t.Run("STARTED_FROM after a node restart", func(t *testing.T) {
		// Three more documents, all replicated; the stop at SIGTERM
		// checkpoints at the source's sequence 8, where the next run
		// starts.
		srv.PutDocs(t, src, map[string]any{"_id": "e1"}, map[string]any{"_id": "e2"}, map[string]any{"_id": "e3"})
		waitDocCount(t, srv, srv.DBURL("tgt"), 8)
		if err := n.stop(syscall.SIGTERM, 60*time.Second); err != nil {
			t.Fatal(err)
		}
		n = startNode(outer, nodeOptions{dataDir: dir, config: writeConfig(t, dir, cfg), name: "trust"}) // lives past the subtest
		waitCtlJob(t, n, shown, statusRunning)
		waitUntil(t, "STARTED_FROM of the run after the restart", 30*time.Second, func() bool {
			return startedFromCol(t, ok(t, "jobs"), shown) == "checkpoint@8"
		})
	})

	t.Run("ambiguous prefix", func(t *testing.T) {
		// The target with the admin's credentials: an anonymous create
		// (PUT /tgt2) once an admin exists crashes PouchDB Server
		// (integration/README).
		srv.Do(t, "PUT", rdb+"backup2", map[string]any{"source": srcDB, "target": server + "/tgt2", "create_target": true}, 201)
		waitCtlJobs(t, n, 2)
		_, errOut, code := ctl(t, "job", "show", server+"|_replicator|back")
		if code != 1 || !strings.Contains(errOut, "matches 2 jobs") || !strings.Contains(errOut, shown) ||
			!strings.Contains(errOut, shown+"2") || !strings.Contains(errOut, "invalid_argument") {
			t.Fatalf("job show of an ambiguous prefix: exit %d: %s", code, errOut)
		}
	})
}
