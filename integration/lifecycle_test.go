package integration

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/couchrep/couchrep/internal/admin"
	"github.com/couchrep/couchrep/internal/jobqueue"
	"github.com/couchrep/couchrep/internal/kv"
	"github.com/couchrep/couchrep/internal/kv/postgres"
	"github.com/couchrep/couchrep/internal/kv/postgres/pgtest"
	"github.com/couchrep/couchrep/internal/kv/sqlite"
	"github.com/couchrep/couchrep/internal/repjob"
	"github.com/couchrep/couchrep/internal/testserver"
	"github.com/couchrep/couchrep/messages"
)

// gone is the lifecycle state of a job that no longer exists: absent from
// the store and from every view.
const gone = "gone"

// lifecycleUUID is the server uuid of the lifecycle tests' node.
const lifecycleUUID = "3b9d2f0c4e6a48b1a7c5d3e1f2a4b6c8"

// lifecycleConfig is the node config: the given servers watched, a 1 s
// scheduler tick, half-second checkpoints, and an activity timeout of a
// minute: the node lease is renewed every 20 s, so a job actor that stops
// within actorBound was stopped by a request to its node, not found out
// at a renewal.
func lifecycleConfig(watch ...string) string {
	return fmt.Sprintf(`[couchrep]
watch = %s
activity_timeout = 60
[couchdb]
uuid = %s
[replicator]
startup_jitter = 0
interval = 1000
checkpoint_interval = 500
min_backoff_penalty_sec = 2
max_backoff_penalty_sec = 8
`, strings.Join(watch, ","), lifecycleUUID)
}

// lifecycleNode is one couchrepd of a lifecycle test and the views of its
// jobs.
type lifecycleNode struct {
	t     *testing.T
	n     *nodeProc
	addr  string
	store *repjob.Store
}

// views returns the state every view shows for each of ids: the store,
// `couchrepctl jobs`, _scheduler/jobs, _scheduler/docs (by document id:
// the tests' document ids are unique across servers) and _active_tasks
// (running or absent), in that order, with the view's name.
func (l *lifecycleNode) views(ids map[string]string) (names []string, got []map[string]string) {
	t := l.t
	t.Helper()
	ctx := context.Background()
	docJob := map[string]string{} // doc id -> job id
	for id, doc := range ids {
		if doc != "" {
			docJob[doc] = id
		}
	}
	add := func(name string) map[string]string {
		names = append(names, name)
		m := map[string]string{}
		for id := range ids {
			m[id] = gone
		}
		got = append(got, m)
		return m
	}

	store := add("store")
	for id := range ids {
		rec, err := l.store.Get(ctx, id)
		switch {
		case err == nil:
			store[id] = rec.State().String()
		case !errors.Is(err, repjob.ErrNotFound):
			t.Fatalf("store: get %s: %v", id, err)
		}
	}

	ctl := add("couchrepctl jobs")
	var list messages.ListJobsResponse
	ctlJSON(t, l.n, &list, "jobs")
	for _, j := range list.GetJobs() {
		if _, ok := ids[j.GetId()]; ok {
			ctl[j.GetId()] = admin.StatusName(j.GetStatus())
		}
	}

	sj := add("_scheduler/jobs")
	var jobs struct {
		Jobs []struct {
			JobID string `json:"job_id"`
			State string `json:"state"`
		} `json:"jobs"`
	}
	getJSON(t, l.addr, "/_scheduler/jobs", &jobs)
	for _, j := range jobs.Jobs {
		if _, ok := ids[j.JobID]; ok {
			sj[j.JobID] = j.State
		}
	}
	for id := range ids {
		if st := store[id]; sj[id] == gone && (st == "completed" || st == "failed") {
			sj[id] = st // CouchDB's _scheduler/jobs lists the jobs the scheduler still has
		}
	}

	sd := add("_scheduler/docs")
	var docs struct {
		Docs []struct {
			DocID string `json:"doc_id"`
			State string `json:"state"`
		} `json:"docs"`
	}
	getJSON(t, l.addr, "/_scheduler/docs", &docs)
	for _, d := range docs.Docs {
		if id, ok := docJob[d.DocID]; ok {
			sd[id] = d.State
		}
	}
	for id, doc := range ids {
		if doc == "" {
			sd[id] = store[id] // a transient job has no document
		}
	}

	at := add("_active_tasks")
	var tasks []struct {
		PID string `json:"pid"`
	}
	getJSON(t, l.addr, "/_active_tasks", &tasks)
	for _, task := range tasks {
		id := strings.TrimPrefix(task.PID, "<")
		if i := strings.LastIndex(id, "@"); i >= 0 {
			id = id[:i]
		}
		if _, ok := ids[id]; ok {
			at[id] = "running"
		}
	}
	for id := range ids {
		if store[id] != "running" && store[id] != gone && at[id] == gone {
			at[id] = store[id] // _active_tasks lists running jobs only
		}
	}
	return names, got
}

// running counts the jobs running as the metric couchrep_replication_jobs
// shows them, by kind.
func (l *lifecycleNode) runningMetric(kind string) int {
	l.t.Helper()
	r := api(l.t, l.addr, "GET", "/metrics", "")
	if r.status != http.StatusOK {
		l.t.Fatalf("/metrics: %d %s", r.status, r.body)
	}
	n := 0
	for _, line := range strings.Split(string(r.body), "\n") {
		if !strings.HasPrefix(line, "couchrep_replication_jobs{") || !strings.Contains(line, `kind="`+kind+`"`) ||
			!strings.Contains(line, `state="running"`) {
			continue
		}
		v, err := strconv.ParseFloat(line[strings.LastIndex(line, " ")+1:], 64)
		if err != nil {
			l.t.Fatalf("metric line %q: %v", line, err)
		}
		n += int(v)
	}
	return n
}

// settle waits until the store shows want (job id -> state, or gone), then
// requires every view to show the same at once (they read the same
// record), the metric to count the running ones, and the node to run one
// job actor per running job within actorBound.
func (l *lifecycleNode) settle(what string, want map[string]string, ids map[string]string) {
	t := l.t
	t.Helper()
	ctx := context.Background()
	storeState := func(id string) string {
		rec, err := l.store.Get(ctx, id)
		if err != nil {
			return gone
		}
		return rec.State().String()
	}
	waitUntil(t, what+": the store shows every job's state", 90*time.Second, func() bool {
		for id, st := range want {
			if storeState(id) != st {
				return false
			}
		}
		return true
	})
	names, got := l.views(ids)
	for i, m := range got {
		for id, st := range want {
			if m[id] != st {
				t.Errorf("%s: %s shows job %s %s, want %s", what, names[i], id, m[id], st)
			}
		}
	}
	running := map[string]int{}
	for id, st := range want {
		if st == "running" {
			kind := "persistent"
			if ids[id] == "" {
				kind = "transient"
			}
			running[kind]++
		}
	}
	for _, kind := range []string{"persistent", "transient"} {
		if got := l.runningMetric(kind); got != running[kind] {
			t.Errorf("%s: couchrep_replication_jobs{kind=%q,state=\"running\"} = %d, want %d", what, kind, got, running[kind])
		}
	}
	// The job actors follow the store: a job that stopped running here
	// has no actor left within actorBound (before, an idle run whose job
	// was canceled, deleted or replaced ran on until its next write to
	// the store, which under a node lease might never come).
	total := running["persistent"] + running["transient"]
	waitUntil(t, fmt.Sprintf("%s: %d job actors", what, total), actorBound, func() bool { return countJobActors(l.n) == total })
	if t.Failed() {
		t.FailNow()
	}
}

// actorBound is how long a job actor may outlive its job's run in the
// store: the node reads the request to stop it from a kv watch (issue 24
// asks for a second; the bound leaves room for a loaded machine and stays
// far below the lease renewal that used to be the only way to find out).
const actorBound = 3 * time.Second

// getJSON GETs path on the node's HTTP API and decodes the 200 reply.
func getJSON(t *testing.T, addr, path string, into any) {
	t.Helper()
	r := api(t, addr, "GET", path, "")
	if r.status != http.StatusOK {
		t.Fatalf("GET %s: %d %s", path, r.status, r.body)
	}
	if err := json.Unmarshal(r.body, into); err != nil {
		t.Fatalf("GET %s: %v: %s", path, err, r.body)
	}
}

// openJobStore opens the store a node uses (a file or a PostgreSQL DSN)
// from the test process.
func openJobStore(t *testing.T, path string) *repjob.Store {
	t.Helper()
	var db kv.Database
	var err error
	if postgres.IsDSN(path) {
		db, err = postgres.Open(context.Background(), path, postgres.Options{})
	} else {
		db, err = sqlite.Open(context.Background(), path, sqlite.Options{})
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return repjob.New(jobqueue.New(db, jobqueue.Options{NodeName: "test", Logger: zerolog.Nop()}), db,
		repjob.Options{ServerUUID: lifecycleUUID})
}

// docRev returns the current revision of document id in db on s.
func docRev(t *testing.T, s *testserver.Server, db, id string) string {
	t.Helper()
	var m map[string]any
	s.GetJSON(t, s.DBURL(db)+id, &m)
	rev, _ := m["_rev"].(string)
	return rev
}

// exists reports whether GET u answers 200.
func exists(t *testing.T, u string) bool {
	t.Helper()
	resp, err := http.Get(u)
	if err != nil {
		t.Fatalf("GET %s: %v", u, err)
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// TestJobLifecycle drives one job per entry point through a real couchrepd
// watching two PouchDB Servers, on SQLite and on PostgreSQL, and checks
// that each ends in the state CouchDB would show, in the store, `couchrepctl
// jobs`, _scheduler/jobs, _scheduler/docs, _active_tasks, the running-jobs
// metric and the node's job actors, and still after a restart of the node:
//
//	entry point                           resulting state
//	job cancel, transient job             gone
//	job cancel, document's job            refused (failed_precondition); still running
//	job stop, document's job              running again (a "stopped" event in its history)
//	job restart, document's job           running again
//	document deleted                      gone
//	document changed                      running with the new parameters
//	server no longer watched (restart)    gone, continuous and completed alike; its
//	                                      document deleted later changes nothing; the
//	                                      replication checkpoint stays on the endpoint
func TestJobLifecycle(t *testing.T) {
	skipShort(t)
	backends := []struct {
		name  string
		store func(t *testing.T, dir string) string
	}{
		{"sqlite", func(_ *testing.T, dir string) string { return filepath.Join(dir, "couchrep.db") }},
		{"postgres", func(t *testing.T, _ string) string { return pgtest.Start(t).NewDatabase(t) }},
	}
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			dir := t.TempDir()
			testJobLifecycle(t, dir, b.store(t, dir))
		})
	}
}

func testJobLifecycle(t *testing.T, dir, storePath string) {
	srvA := testserver.StartPouchDB(t)
	srvB := testserver.StartPouchDB(t)
	plainReplicatorDB(t, srvA, true)
	plainReplicatorDB(t, srvB, true)
	srcA := srvA.CreateDB(t, "src")
	srcB := srvB.CreateDB(t, "src")
	for i := range 3 {
		srvA.Do(t, "PUT", fmt.Sprintf("%sd%d", srcA, i), map[string]any{"i": i}, 201)
		srvB.Do(t, "PUT", fmt.Sprintf("%sd%d", srcB, i), map[string]any{"i": i}, 201)
	}
	urlA, urlB := strings.TrimSuffix(srvA.URL, "/"), strings.TrimSuffix(srvB.URL, "/")
	cfgPath := writeConfig(t, dir, lifecycleConfig(urlA, urlB))
	opts := nodeOptions{name: "lc", dataDir: filepath.Join(dir, "data"), store: storePath, config: cfgPath}
	start := func() *lifecycleNode {
		n := startNode(t, opts)
		return &lifecycleNode{t: t, n: n, addr: n.httpAddr(""), store: openJobStore(t, storePath)}
	}
	l := start()

	// ids: job id -> document id ("" for a transient job).
	ids := map[string]string{}
	docJob := func(s *testserver.Server, server, docID string, continuous bool, tgt string) string {
		t.Helper()
		src := srcA
		if s == srvB {
			src = srcB
		}
		s.Do(t, "PUT", s.DBURL("_replicator")+docID, map[string]any{"source": src, "target": s.DBURL(tgt),
			"create_target": true, "continuous": continuous}, 201)
		id := repjob.PersistentJobID(server, "_replicator", docID)
		ids[id] = docID
		return id
	}
	aCancel := docJob(srvA, urlA, "a-cancel", true, "t-cancel")
	aStop := docJob(srvA, urlA, "a-stop", true, "t-stop")
	aRestart := docJob(srvA, urlA, "a-restart", true, "t-restart")
	aDelete := docJob(srvA, urlA, "a-delete", true, "t-delete")
	aChange := docJob(srvA, urlA, "a-change", true, "t-change")
	bCont := docJob(srvB, urlB, "b-continuous", true, "t-continuous")
	bOnce := docJob(srvB, urlB, "b-oneshot", false, "t-oneshot")
	var rep messages.ReplicateResponse
	ctlJSON(t, l.n, &rep, "replicate", "--continuous", "--create-target", srcA, srvA.DBURL("t-transient"))
	tCancel := rep.GetId()
	ids[tCancel] = ""

	want := map[string]string{aCancel: "running", aStop: "running", aRestart: "running", aDelete: "running",
		aChange: "running", bCont: "running", bOnce: "completed", tCancel: "running"}
	l.settle("started", want, ids)

	// Every entry point at once.
	ctlFails(t, l.n, 1, []string{"failed_precondition", `"a-cancel"`, "delete or change the document"}, "job", "cancel", aCancel)
	if out := ctlOK(t, l.n, "job", "cancel", tCancel); !strings.Contains(out, "canceled job "+tCancel) {
		t.Fatalf("job cancel of a transient job: %q", out)
	}
	if out := ctlOK(t, l.n, "job", "stop", aStop); !strings.Contains(out, "stopped job "+aStop) {
		t.Fatalf("job stop: %q", out)
	}
	ctlOK(t, l.n, "job", "restart", aRestart)
	srvA.Do(t, "DELETE", srvA.DBURL("_replicator")+"a-delete?rev="+docRev(t, srvA, "_replicator", "a-delete"), nil, 200)
	srvA.Do(t, "PUT", srvA.DBURL("_replicator")+"a-change", map[string]any{"_rev": docRev(t, srvA, "_replicator", "a-change"),
		"source": srcA, "target": srvA.DBURL("t-changed"), "create_target": true, "continuous": true}, 201)
	want[tCancel], want[aDelete] = gone, gone
	changedTarget := func() bool {
		rec, err := l.store.Get(context.Background(), aChange)
		return err == nil && strings.Contains(rec.GetTarget(), "t-changed")
	}
	waitUntil(t, "the changed document's job replaced", 60*time.Second, changedTarget)
	l.settle("after every entry point", want, ids)
	var show messages.GetJobResponse
	ctlJSON(t, l.n, &show, "job", "show", aStop)
	if !hasEvent(show.GetJob(), messages.JobEventType_JOB_EVENT_TYPE_STOPPED) {
		t.Fatalf("history of the stopped job: %v", show.GetJob().GetHistory())
	}

	// The same after a restart of the node.
	rec, err := l.store.Get(context.Background(), bCont)
	if err != nil {
		t.Fatal(err)
	}
	checkpoint := srcB + "_local/" + rec.GetBaseId()
	waitUntil(t, "the checkpoint of b-continuous on its source", 60*time.Second, func() bool { return exists(t, checkpoint) })
	stop := func() {
		t.Helper()
		if err := l.n.stop(syscall.SIGTERM, 60*time.Second); err != nil {
			t.Fatalf("stop the node: %v", err)
		}
	}
	stop()
	l = start()
	l.settle("after a restart", want, ids)
	if !changedTarget() {
		t.Fatal("the changed document's job lost its new parameters across the restart")
	}

	// Server B no longer watched: its jobs stop and are forgotten at the
	// next start; deleting its document then changes nothing; the
	// checkpoint stays on the endpoint.
	stop()
	writeConfig(t, dir, lifecycleConfig(urlA))
	l = start()
	want[bCont], want[bOnce] = gone, gone
	l.settle("server B no longer watched", want, ids)
	if lines := l.n.logLines("server no longer watched", urlB); len(lines) == 0 {
		t.Error("the node did not log forgetting server B")
	}
	srvB.Do(t, "DELETE", srvB.DBURL("_replicator")+"b-continuous?rev="+docRev(t, srvB, "_replicator", "b-continuous"), nil, 200)
	if !exists(t, checkpoint) {
		t.Errorf("the checkpoint %s of the forgotten job is gone from its source", checkpoint)
	}
	stop()
	l = start()
	l.settle("restarted again without server B", want, ids)
	if n := len(l.n.logLines("server no longer watched")); n != 0 {
		t.Errorf("a second start forgot servers again: %d lines", n)
	}
}
