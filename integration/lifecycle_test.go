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
// scheduler tick, half-second checkpoints, a crashing job's backoff of ten
// minutes (it stays crashing through the test), and an activity timeout of a
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
min_backoff_penalty_sec = 600
max_backoff_penalty_sec = 1200
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
// the tests' document ids are unique across servers), the status page and
// _active_tasks (running or absent), in that order, with the view's name.
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

	sp := add("status page")
	var status struct {
		Jobs []struct {
			ID    string `json:"id"`
			State string `json:"state"`
		} `json:"jobs"`
	}
	getJSON(t, l.addr, "/_status/data", &status)
	for _, j := range status.Jobs {
		if _, ok := ids[j.ID]; ok {
			sp[j.ID] = j.State
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

// docRev returns the current revision of document id in db on s, or ""
// if it has none.
func docRev(t *testing.T, s *testserver.Server, db, id string) string {
	t.Helper()
	resp, err := http.Get(s.DBURL(db) + id)
	if err != nil {
		t.Fatalf("GET %s: %v", id, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusNotFound {
		return ""
	}
	var m map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&m); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %d %v", id, resp.StatusCode, err)
	}
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

// TestJobLifecycle drives jobs in every state through every entry point
// on a real couchrepd watching two PouchDB Servers, on SQLite and on
// PostgreSQL, and checks that each ends in the state CouchDB would show, in
// the store, `couchrepctl jobs`, _scheduler/jobs, _scheduler/docs, the
// status page, _active_tasks, the running-jobs metric and the node's job
// actors, and
// still after a restart of the node:
//
//	entry point         job (state)                   resulting state
//	job cancel          transient (running)           gone
//	job cancel          transient (crashing)          gone
//	job cancel          document's (running)          refused (failed_precondition); running
//	job cancel          document's (completed)        refused; completed
//	job stop            document's (running)          running again ("stopped" in its history)
//	job stop            document's (crashing)         refused (failed_precondition); crashing
//	job restart         document's (running)          running again
//	job restart         document's (completed)        runs again; completed
//	document deleted    running                       gone
//	document deleted    failed (invalid document)     gone
//	document changed    running                       running with the new parameters
//	document changed    crashing (source fixed)       running
//	drain / undrain     running                       pending, across a restart; running again
//	server unwatched    running, completed            gone at the next start; deleting the
//	                                                  document then changes nothing; the
//	                                                  checkpoint stays on the endpoint
//	database deleted    running, completed            gone, across a restart
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
	ctx := context.Background()

	// ids: job id -> document id ("" for a transient job).
	ids := map[string]string{}
	putDoc := func(s *testserver.Server, docID string, body map[string]any, want int) {
		t.Helper()
		if rev := docRev(t, s, "_replicator", docID); rev != "" {
			body["_rev"] = rev
		}
		s.Do(t, "PUT", s.DBURL("_replicator")+docID, body, want)
	}
	repDoc := func(src, tgt string, continuous bool) map[string]any {
		return map[string]any{"source": src, "target": tgt, "create_target": true, "continuous": continuous}
	}
	docJob := func(s *testserver.Server, server, docID string, body map[string]any) string {
		t.Helper()
		putDoc(s, docID, body, 201)
		id := repjob.PersistentJobID(server, "_replicator", docID)
		ids[id] = docID
		return id
	}
	deleteDoc := func(s *testserver.Server, docID string) {
		t.Helper()
		s.Do(t, "DELETE", s.DBURL("_replicator")+docID+"?rev="+docRev(t, s, "_replicator", docID), nil, 200)
	}
	missing := srvA.DBURL("no-such-db")
	aCancel := docJob(srvA, urlA, "a-cancel", repDoc(srcA, srvA.DBURL("t-cancel"), true))
	aStop := docJob(srvA, urlA, "a-stop", repDoc(srcA, srvA.DBURL("t-stop"), true))
	aRestart := docJob(srvA, urlA, "a-restart", repDoc(srcA, srvA.DBURL("t-restart"), true))
	aDelete := docJob(srvA, urlA, "a-delete", repDoc(srcA, srvA.DBURL("t-delete"), true))
	aChange := docJob(srvA, urlA, "a-change", repDoc(srcA, srvA.DBURL("t-change"), true))
	aOnce := docJob(srvA, urlA, "a-oneshot", repDoc(srcA, srvA.DBURL("t-oneshot"), false))
	aCrash := docJob(srvA, urlA, "a-crash", repDoc(missing, srvA.DBURL("t-crash"), true))
	aInvalid := docJob(srvA, urlA, "a-invalid", map[string]any{"source": srcA, "target": srvA.DBURL("t-invalid"), "worker_processes": "four"})
	bCont := docJob(srvB, urlB, "b-continuous", repDoc(srcB, srvB.DBURL("t-continuous"), true))
	bOnce := docJob(srvB, urlB, "b-oneshot", repDoc(srcB, srvB.DBURL("t-oneshot"), false))
	transient := func(src, tgt string) string {
		t.Helper()
		var rep messages.ReplicateResponse
		ctlJSON(t, l.n, &rep, "replicate", "--continuous", "--create-target", src, tgt)
		ids[rep.GetId()] = ""
		return rep.GetId()
	}
	tCancel := transient(srcA, srvA.DBURL("t-transient"))
	tCrash := transient(srvA.DBURL("no-such-db-either"), srvA.DBURL("t-transient-crash"))

	want := map[string]string{aCancel: "running", aStop: "running", aRestart: "running", aDelete: "running",
		aChange: "running", aOnce: "completed", aCrash: "crashing", aInvalid: "failed",
		bCont: "running", bOnce: "completed", tCancel: "running", tCrash: "crashing"}
	l.settle("started", want, ids)
	onceStarted := func() time.Time {
		rec, err := l.store.Get(ctx, aOnce)
		if err != nil {
			t.Fatal(err)
		}
		return rec.GetLastStarted().AsTime()
	}
	firstRun := onceStarted()

	// Every entry point at once.
	refused := []string{"failed_precondition", "delete or change the document"}
	ctlFails(t, l.n, 1, append(refused, `"a-cancel"`), "job", "cancel", aCancel)
	ctlFails(t, l.n, 1, append(refused, `"a-oneshot"`), "job", "cancel", aOnce)
	ctlFails(t, l.n, 1, []string{"failed_precondition", "crashing"}, "job", "stop", aCrash)
	for _, id := range []string{tCancel, tCrash} {
		if out := ctlOK(t, l.n, "job", "cancel", id); !strings.Contains(out, "canceled job "+id) {
			t.Fatalf("job cancel of a transient job: %q", out)
		}
	}
	if out := ctlOK(t, l.n, "job", "stop", aStop); !strings.Contains(out, "stopped job "+aStop) {
		t.Fatalf("job stop: %q", out)
	}
	ctlOK(t, l.n, "job", "restart", aRestart)
	ctlOK(t, l.n, "job", "restart", aOnce)
	deleteDoc(srvA, "a-delete")
	deleteDoc(srvA, "a-invalid")
	putDoc(srvA, "a-change", repDoc(srcA, srvA.DBURL("t-changed"), true), 201)
	putDoc(srvA, "a-crash", repDoc(srcA, srvA.DBURL("t-crash"), true), 201)
	want[tCancel], want[tCrash], want[aDelete], want[aInvalid], want[aCrash] = gone, gone, gone, gone, "running"
	changedTarget := func() bool {
		rec, err := l.store.Get(ctx, aChange)
		return err == nil && strings.Contains(rec.GetTarget(), "t-changed")
	}
	waitUntil(t, "the changed document's job replaced", 60*time.Second, changedTarget)
	waitUntil(t, "the restarted one-shot job run again", 60*time.Second, func() bool { return onceStarted().After(firstRun) })
	l.settle("after every entry point", want, ids)
	var show messages.GetJobResponse
	ctlJSON(t, l.n, &show, "job", "show", aStop)
	if !hasEvent(show.GetJob(), messages.JobEventType_JOB_EVENT_TYPE_STOPPED) {
		t.Fatalf("history of the stopped job: %v", show.GetJob().GetHistory())
	}

	// The same after a restart of the node.
	rec, err := l.store.Get(ctx, bCont)
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

	// Drain: every running job goes back to the queue and stays there,
	// across a restart, until undrained.
	running := func(st string) map[string]string {
		m := map[string]string{}
		for id, s := range want {
			if s == "running" {
				s = st
			}
			m[id] = s
		}
		return m
	}
	ctlOK(t, l.n, "drain")
	l.settle("drained", running("pending"), ids)
	stop()
	l = start()
	l.settle("drained, after a restart", running("pending"), ids)
	ctlOK(t, l.n, "undrain")
	l.settle("undrained", want, ids)

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
	deleteDoc(srvB, "b-continuous")
	if !exists(t, checkpoint) {
		t.Errorf("the checkpoint %s of the forgotten job is gone from its source", checkpoint)
	}
	stop()
	l = start()
	l.settle("restarted again without server B", want, ids)
	if n := len(l.n.logLines("server no longer watched")); n != 0 {
		t.Errorf("a second start forgot servers again: %d lines", n)
	}

	// Server A's _replicator database deleted: its jobs are removed. A
	// new document's job completing first shows that the doc processor
	// follows the database's feed: a deletion racing the follower's start
	// was seen to go unnoticed by discovery on PouchDB Server (the
	// database listed again), and is then found only when the follower's
	// feed ends, after a minute (TestRecreatedDatabase in internal/docproc).
	aLast := docJob(srvA, urlA, "a-last", repDoc(srcA, srvA.DBURL("t-last"), false))
	want[aLast] = "completed"
	l.settle("a last document", want, ids)
	srvA.Do(t, "DELETE", srvA.DBURL("_replicator"), nil, 200)
	for id, doc := range ids {
		if doc != "" {
			want[id] = gone
		}
	}
	l.settle("_replicator deleted", want, ids)
	stop()
	l = start()
	l.settle("_replicator deleted, after a restart", want, ids)
}
