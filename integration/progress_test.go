package integration

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/couchrep/couchrep/internal/testserver"
)

// liveConfig makes store writes of a running job's progress rare: an
// activity timeout of 10 minutes (progress is written every 5) and, in the
// replication bodies, a 10-minute checkpoint_interval. What the API shows
// within a minute of a batch can then only come from the job's live stats.
const liveConfig = `[couchrep]
activity_timeout = 600
[replicator]
startup_jitter = 0
`

// seqNum reads a numeric seq as _active_tasks shows it (a number or a
// string holding one).
func seqNum(t *testing.T, v any) int64 {
	t.Helper()
	switch x := v.(type) {
	case float64:
		return int64(x)
	case string:
		n, err := strconv.ParseInt(strings.SplitN(x, "-", 2)[0], 10, 64)
		if err != nil {
			t.Fatalf("seq %q is not a number", x)
		}
		return n
	}
	t.Fatalf("seq %v (%T) is not a number", v, v)
	return 0
}

// TestLiveProgress: while a continuous replication runs, the node running
// it shows each batch's progress in _active_tasks, _scheduler/jobs, the
// status page and /metrics at once — not when it is next written to the
// store (here 5 minutes after the job's first report; the test gives it
// one) — with source_seq never behind through_seq and changes_pending
// known (PouchDB Server gives no "pending": the estimate from numeric
// seqs).
func TestLiveProgress(t *testing.T) {
	skipShort(t)
	dir := t.TempDir()
	n := startNode(t, nodeOptions{dataDir: dir, config: writeConfig(t, dir, liveConfig)})
	addr := n.httpAddr("")
	src, tgt := testserver.StartPouchDB(t), testserver.StartPouchDB(t)
	srcDB, tgtDB := src.CreateDB(t, "src"), tgt.CreateDB(t, "tgt")
	src.PutDocs(t, srcDB, map[string]any{"_id": "before"})
	r := api(t, addr, "POST", "/_replicate", `{"source":"`+srcDB+`","target":"`+tgtDB+`","continuous":true,"checkpoint_interval":600000}`)
	id, _ := r.obj(t)["_local_id"].(string)
	if r.status != 202 || id == "" {
		t.Fatalf("POST continuous: %d %s", r.status, r.body)
	}
	task := func() map[string]any {
		var tasks []map[string]any
		r := api(t, addr, "GET", "/_active_tasks", "")
		if err := json.Unmarshal(r.body, &tasks); err != nil {
			t.Fatalf("_active_tasks %d: %s", r.status, r.body)
		}
		for _, tk := range tasks {
			if tk["replication_id"] == id {
				return tk
			}
		}
		return nil
	}
	// Once the first document shows, the store has had at most the job's
	// first report; its next write is 5 minutes away.
	waitUntil(t, "the first report", time.Minute, func() bool {
		tk := task()
		return tk != nil && tk["docs_written"] == 1.0
	})
	const more = 25
	docs := make([]map[string]any, more)
	for i := range docs {
		docs[i] = map[string]any{"_id": fmt.Sprintf("live-%02d", i)}
	}
	src.PutDocs(t, srcDB, docs...)
	var tk map[string]any
	waitUntil(t, "_active_tasks to show the new batch", time.Minute, func() bool {
		tk = task()
		return tk != nil && tk["docs_written"] == float64(1+more)
	})
	through, source := seqNum(t, tk["through_seq"]), seqNum(t, tk["source_seq"])
	if through < 1+more || source < through {
		t.Errorf("through_seq %d, source_seq %d: want through_seq %d or more and source_seq not behind it", through, source, 1+more)
	}
	if p, ok := tk["changes_pending"].(float64); !ok || p != 0 {
		t.Errorf("changes_pending %v, want 0 once caught up", tk["changes_pending"])
	}
	if tk["revisions_checked"] != float64(1+more) || tk["docs_read"] != float64(1+more) {
		t.Errorf("revisions_checked %v, docs_read %v, want %d", tk["revisions_checked"], tk["docs_read"], 1+more)
	}

	job := api(t, addr, "GET", "/_scheduler/jobs/"+id, "").obj(t)
	info, _ := job["info"].(map[string]any)
	if info == nil || info["docs_written"] != float64(1+more) || info["changes_pending"] != 0.0 {
		t.Errorf("_scheduler/jobs info %v, want docs_written %d and changes_pending 0", info, 1+more)
	}

	var status struct {
		Jobs []struct {
			RepID       string `json:"rep_id"`
			DocsWritten int64  `json:"docs_written"`
			Pending     *int64 `json:"changes_pending"`
		} `json:"jobs"`
	}
	if err := json.Unmarshal(api(t, addr, "GET", "/_status/data", "").body, &status); err != nil {
		t.Fatal(err)
	}
	found := false
	for _, j := range status.Jobs {
		if j.RepID == id {
			found = true
			if j.DocsWritten != 1+more || j.Pending == nil || *j.Pending != 0 {
				t.Errorf("status page: docs_written %d, changes_pending %v; want %d and 0", j.DocsWritten, j.Pending, 1+more)
			}
		}
	}
	if !found {
		t.Errorf("status page lacks job %s", id)
	}

	met := string(api(t, addr, "GET", "/metrics", "").body)
	for _, want := range []string{
		fmt.Sprintf(`couchrep_replication_docs_written{database="",kind="transient",server=""} %d`, 1+more),
		`couchrep_replication_changes_pending{database="",kind="transient",server=""} 0`,
	} {
		if !strings.Contains(met, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}

// TestNoChangesAnswer: a one-shot POST /_replicate that has nothing to
// replicate answers as CouchDB 3.4.3: {"ok":true,"no_changes":true} for
// doc_ids matching nothing or none and a filter matching nothing, and
// no_changes with the existing
// checkpoint's history when nothing changed since the last run
// (replication_test.exs "nothing to replicate").
func TestNoChangesAnswer(t *testing.T) {
	skipShort(t)
	n := startNode(t, nodeOptions{})
	addr := n.httpAddr("")
	src, tgt := testserver.StartPouchDB(t), testserver.StartPouchDB(t)
	srcDB, tgtDB := src.CreateDB(t, "src"), tgt.CreateDB(t, "tgt")
	src.PutDocs(t, srcDB, map[string]any{"_id": "a"}, map[string]any{"_id": "b"}, map[string]any{"_id": "foo_c"},
		map[string]any{"_id": "_design/f", "filters": map[string]any{"none": "function(doc, req) { return false; }"}})
	for _, c := range []struct{ name, extra string }{
		{"doc_ids matching nothing", `"doc_ids":["foo_1","foo_2"]`},
		{"empty doc_ids", `"doc_ids":[]`},
		// PouchDB Server answers this feed with the database's last_seq
		// (CouchDB does for every filtered feed): still no change
		// processed, so no checkpoint and no_changes.
		{"a filter matching nothing", `"filter":"f/none"`},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := api(t, addr, "POST", "/_replicate", `{"source":"`+srcDB+`","target":"`+tgtDB+`",`+c.extra+`}`)
			if r.status != 200 || strings.TrimSpace(string(r.body)) != `{"ok":true,"no_changes":true}` {
				t.Fatalf("answer %d %s, want 200 {\"ok\":true,\"no_changes\":true}", r.status, r.body)
			}
		})
	}
	t.Run("nothing new since the last run", func(t *testing.T) {
		body := `{"source":"` + srcDB + `","target":"` + tgtDB + `"}`
		first := api(t, addr, "POST", "/_replicate", body).obj(t)
		if first["ok"] != true || first["no_changes"] != nil || first["history"] == nil {
			t.Fatalf("first run: %v", first)
		}
		again := api(t, addr, "POST", "/_replicate", body).obj(t)
		if again["ok"] != true || again["no_changes"] != true || again["session_id"] != first["session_id"] || again["history"] == nil {
			t.Fatalf("second run: %v, want no_changes with the first run's checkpoint (session %v)", again, first["session_id"])
		}
	})
}
