package integration

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/couchrep/couchrep/internal/testserver"
)

// parkNodeConfig parks a job after one idle second; the safety net is left
// out (an hour) unless a test sets its own park_recheck.
const parkNodeConfig = `[replicator]
startup_jitter = 0
idle_park_after = 1
park_recheck = %s
`

// parkProxy stands between couchrepd and a test server: it counts the
// continuous _changes requests per database and those open now, and can
// drop the rows of the server's _db_updates feed (headers and heartbeats
// pass), which makes every watch of the node one that never fires.
type parkProxy struct {
	*httptest.Server
	mu     sync.Mutex
	feeds  map[string]int // continuous _changes requests by database
	open   atomic.Int64   // continuous _changes requests open
	beats  atomic.Int64   // heartbeats sent on them
	dbUps  atomic.Int64   // _db_updates continuous requests open
	drop   atomic.Bool    // drop _db_updates rows
	probes map[string]int // GET /db by database
	reqs   map[string]int // every request to a database, by database
	// dbsInfo: each POST /_dbs_info, its keys and the answer's status
	dbsInfo []dbsInfoReq
}

// dbsInfoReq is one POST /_dbs_info the proxy passed.
type dbsInfoReq struct {
	keys, status int
}

// statusRecorder keeps the status of an answer.
type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (s *statusRecorder) WriteHeader(code int) {
	s.status = code
	s.ResponseWriter.WriteHeader(code)
}

func newParkProxy(t *testing.T, target string) *parkProxy {
	u, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	rp := httputil.NewSingleHostReverseProxy(u)
	rp.FlushInterval = -1 // feeds pass at once
	rp.ErrorLog = log.New(io.Discard, "", 0)
	p := &parkProxy{feeds: map[string]int{}, probes: map[string]int{}, reqs: map[string]int{}}
	p.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		parts := strings.Split(strings.Trim(r.URL.Path, "/"), "/")
		if !strings.HasPrefix(parts[0], "_") {
			p.mu.Lock()
			p.reqs[parts[0]]++
			p.mu.Unlock()
		}
		switch {
		case len(parts) == 2 && parts[1] == "_changes" && r.URL.Query().Get("feed") == "continuous":
			p.mu.Lock()
			p.feeds[parts[0]]++
			p.mu.Unlock()
			p.open.Add(1)
			defer p.open.Add(-1)
			w = &beatCounter{ResponseWriter: w, beats: &p.beats}
		case len(parts) == 1 && parts[0] == "_db_updates" && r.URL.Query().Get("feed") == "continuous":
			p.dbUps.Add(1)
			defer p.dbUps.Add(-1)
			w = &dbUpdatesRowDropper{ResponseWriter: w, drop: &p.drop}
		case len(parts) == 1 && r.Method == http.MethodGet && !strings.HasPrefix(parts[0], "_"):
			p.mu.Lock()
			p.probes[parts[0]]++
			p.mu.Unlock()
		case len(parts) == 1 && r.Method == http.MethodPost && parts[0] == "_dbs_info":
			b, _ := io.ReadAll(r.Body)
			r.Body = io.NopCloser(bytes.NewReader(b))
			var body struct {
				Keys []string `json:"keys"`
			}
			_ = json.Unmarshal(b, &body)
			rec := &statusRecorder{ResponseWriter: w, status: http.StatusOK}
			rp.ServeHTTP(rec, r)
			p.mu.Lock()
			p.dbsInfo = append(p.dbsInfo, dbsInfoReq{keys: len(body.Keys), status: rec.status})
			p.mu.Unlock()
			return
		}
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(p.Close)
	return p
}

// feedsOf returns the continuous _changes requests per database so far.
func (p *parkProxy) feedsOf(dbs ...string) []int {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]int, len(dbs))
	for i, db := range dbs {
		out[i] = p.feeds[db]
	}
	return out
}

// reqsOf returns the requests to each of dbs so far.
func (p *parkProxy) reqsOf(dbs ...string) []int {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]int, len(dbs))
	for i, db := range dbs {
		out[i] = p.reqs[db]
	}
	return out
}

// dbUpdatesRowDropper passes a continuous feed's answer but its rows (lines with a
// "db_name") while drop is set.
type dbUpdatesRowDropper struct {
	http.ResponseWriter
	drop *atomic.Bool
	buf  []byte
}

func (d *dbUpdatesRowDropper) Write(b []byte) (int, error) {
	d.buf = append(d.buf, b...)
	for {
		i := bytes.IndexByte(d.buf, '\n')
		if i < 0 {
			return len(b), nil
		}
		line := d.buf[:i+1]
		if !d.drop.Load() || !bytes.Contains(line, []byte(`"db_name"`)) {
			if _, err := d.ResponseWriter.Write(line); err != nil {
				return 0, err
			}
		}
		d.buf = d.buf[i+1:]
	}
}

func (d *dbUpdatesRowDropper) Flush() {
	if f, ok := d.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// parkNodeRig is a node whose continuous jobs replicate user databases of one
// test server (through a parkProxy) into a central database.
type parkNodeRig struct {
	t     *testing.T
	s     *testserver.Server
	px    *parkProxy
	node  *nodeProc
	addr  string
	users []string
	jobs  map[string]string // user db -> replication id
	extra string            // more fields of the jobs' documents
	dir   string            // the node's data directory
	conf  string            // its config file
}

func newParkNodeRig(t *testing.T, s *testserver.Server, users int, recheck string, extra ...string) *parkNodeRig {
	t.Helper()
	return newParkNodeRigConf(t, s, users, fmt.Sprintf(parkNodeConfig, recheck), extra...)
}

// newParkNodeRigConf is newParkNodeRig with the node's whole config.
func newParkNodeRigConf(t *testing.T, s *testserver.Server, users int, conf string, extra ...string) *parkNodeRig {
	t.Helper()
	r := &parkNodeRig{t: t, s: s, px: newParkProxy(t, s.URL), jobs: map[string]string{}, extra: strings.Join(extra, "")}
	s.CreateDB(t, "central")
	for i := range users {
		db := fmt.Sprintf("user-%d", i)
		r.users = append(r.users, db)
		s.CreateDB(t, db)
		s.PutDocs(t, s.DBURL(db), map[string]any{"_id": db + "-first"})
	}
	r.dir = t.TempDir()
	r.conf = writeConfig(t, r.dir, conf)
	r.node = startNode(t, nodeOptions{dataDir: r.dir, config: r.conf})
	r.addr = r.node.httpAddr("")
	for _, db := range r.users {
		r.jobs[db] = r.start(db)
	}
	return r
}

// sourceURL is db's URL through the proxy (with the server's credentials
// and, on a server the tests did not start, the test's prefix).
func (r *parkNodeRig) sourceURL(db string) string {
	r.t.Helper()
	u, err := url.Parse(r.s.DBURL(db))
	if err != nil {
		r.t.Fatal(err)
	}
	px, err := url.Parse(r.px.URL)
	if err != nil {
		r.t.Fatal(err)
	}
	u.Scheme, u.Host = px.Scheme, px.Host
	return u.String()
}

// start adds the continuous replication of db into central.
func (r *parkNodeRig) start(db string) string {
	r.t.Helper()
	body := fmt.Sprintf(`{"source":%q,"target":%q,"continuous":true%s}`, r.sourceURL(db), r.s.DBURL("central"), r.extra)
	rep := api(r.t, r.addr, "POST", "/_replicate", body)
	if rep.status != http.StatusAccepted {
		r.t.Fatalf("POST /_replicate: %d %s", rep.status, rep.body)
	}
	return rep.obj(r.t)["_local_id"].(string)
}

// awaitCentral waits until central holds doc id.
func (r *parkNodeRig) awaitCentral(ids ...string) {
	r.t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		var all struct {
			Rows []struct{ ID string } `json:"rows"`
		}
		r.s.GetJSON(r.t, r.s.DBURL("central")+"_all_docs", &all)
		have := map[string]bool{}
		for _, row := range all.Rows {
			have[row.ID] = true
		}
		missing := 0
		for _, id := range ids {
			if !have[id] {
				missing++
			}
		}
		if missing == 0 {
			return
		}
		if time.Now().After(deadline) {
			r.t.Fatalf("central lacks %d of %v after a minute", missing, ids)
		}
		time.Sleep(50 * time.Millisecond) // other processes' state: poll
	}
}

// schedJobs returns the node's _scheduler/jobs entries by replication id.
func (r *parkNodeRig) schedJobs() map[string]map[string]any {
	r.t.Helper()
	rep := api(r.t, r.addr, "GET", "/_scheduler/jobs", "")
	var out struct {
		Jobs []map[string]any `json:"jobs"`
	}
	if err := json.Unmarshal(rep.body, &out); err != nil {
		r.t.Fatalf("_scheduler/jobs: %v: %s", err, rep.body)
	}
	m := map[string]map[string]any{}
	for _, j := range out.Jobs {
		m[j["id"].(string)] = j
	}
	return m
}

// parked reports whether the job of db is running and parked in
// _scheduler/jobs.
func parkedJob(j map[string]any) bool {
	info, _ := j["info"].(map[string]any)
	return j["state"] == "running" && info["parked"] == true
}

// awaitParked waits until the jobs of dbs are all running parked and no
// _changes feed is open on the server.
func (r *parkNodeRig) awaitParked(dbs ...string) {
	r.t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		jobs := r.schedJobs()
		n := 0
		for _, db := range dbs {
			if parkedJob(jobs[r.jobs[db]]) {
				n++
			}
		}
		if n == len(dbs) && r.px.open.Load() == 0 {
			return
		}
		if time.Now().After(deadline) {
			r.t.Fatalf("%d of %d jobs parked, %d feeds open after a minute: %v", n, len(dbs), r.px.open.Load(), jobs)
		}
		time.Sleep(50 * time.Millisecond) // other processes' state: poll
	}
}

var parkedJobsMetric = regexp.MustCompile(`(?m)^couchrep_replication_jobs_parked\{database="",kind="transient",server=""\} (\d+)$`)

// TestParkingWakesOnDBUpdates: continuous jobs of user databases on a
// server with a real _db_updates feed park after idle_park_after: their
// _changes feeds are closed (the server answers none), they are running
// and parked in _scheduler/jobs, _active_tasks, /metrics and couchrepctl
// jobs; a write to one user database wakes that job alone (one new feed on
// that database, none on the others) and reaches the central database,
// and the job parks again; a parked job is stopped and canceled as a
// running one is.
func TestParkingWakesOnDBUpdates(t *testing.T) {
	skipShort(t)
	s := testserver.StartPouchDBWithDBUpdates(t)
	r := newParkNodeRig(t, s, 3, "3600")
	r.awaitCentral("user-0-first", "user-1-first", "user-2-first")
	r.awaitParked(r.users...)
	if r.px.dbUps.Load() != 1 {
		t.Errorf("%d _db_updates feeds open, want 1 for the server", r.px.dbUps.Load())
	}

	tasks := api(t, r.addr, "GET", "/_active_tasks", "")
	var active []map[string]any
	if err := json.Unmarshal(tasks.body, &active); err != nil || len(active) != 3 {
		t.Fatalf("_active_tasks: %v %s", err, tasks.body)
	}
	for _, task := range active {
		if task["parked"] != true || task["parked_since"] == nil {
			t.Errorf("_active_tasks entry not parked: %v", task)
		}
	}
	if m := parkedJobsMetric.FindSubmatch(api(t, r.addr, "GET", "/metrics", "").body); m == nil || string(m[1]) != "3" {
		t.Errorf("couchrep_replication_jobs_parked: %q, want 3", m)
	}
	out, errOut, code := r.node.ctl("jobs")
	if code != 0 || strings.Count(out, "running/PARKED") != 3 || !strings.Contains(out, "3 of them parked") {
		t.Errorf("couchrepctl jobs: exit %d %s\n%s", code, errOut, out)
	}

	before := r.px.feedsOf(r.users...)
	s.PutDocs(t, s.DBURL("user-1"), map[string]any{"_id": "user-1-second"})
	r.awaitCentral("user-1-second")
	r.awaitParked(r.users...)
	after := r.px.feedsOf(r.users...)
	if after[0] != before[0] || after[2] != before[2] || after[1] != before[1]+1 {
		t.Errorf("continuous feeds per user db before the write %v, after %v: want one more on user-1 alone", before, after)
	}

	// A parked job is stopped (back to the queue, then started again by
	// the node: it parks again) and canceled as a running one is.
	out, errOut, code = r.node.ctl("job", "stop", r.jobs["user-0"])
	if code != 0 || !strings.Contains(out, "stopped job") {
		t.Fatalf("job stop of a parked job: exit %d: %s %s", code, out, errOut)
	}
	r.awaitParked(r.users...)
	rep := api(t, r.addr, "POST", "/_replicate", fmt.Sprintf(`{"replication_id":%q,"cancel":true}`, r.jobs["user-2"]))
	if rep.status != http.StatusOK {
		t.Fatalf("cancel of a parked job: %d %s", rep.status, rep.body)
	}
	if _, ok := r.schedJobs()[r.jobs["user-2"]]; ok {
		t.Error("a canceled parked job is still listed")
	}
	s.PutDocs(t, s.DBURL("user-0"), map[string]any{"_id": "user-0-second"})
	r.awaitCentral("user-0-second")
}

// TestParkingQuietStart: a continuous job that finds nothing to replicate
// when it starts (an empty user database) parks within seconds, not after
// idle_park_after (an hour here), while a job that replicated a document
// keeps its feed; a write to the parked job's database wakes it through
// _db_updates and reaches the central database.
func TestParkingQuietStart(t *testing.T) {
	skipShort(t)
	s := testserver.StartPouchDBWithDBUpdates(t)
	r := newParkNodeRigConf(t, s, 1, "[replicator]\nstartup_jitter = 0\nidle_park_after = 3600\npark_recheck = 3600\n")
	r.awaitCentral("user-0-first")
	s.CreateDB(t, "empty-0")
	r.jobs["empty-0"] = r.start("empty-0")
	deadline := time.Now().Add(time.Minute)
	for !parkedJob(r.schedJobs()[r.jobs["empty-0"]]) {
		if time.Now().After(deadline) {
			t.Fatalf("the job of an empty database not parked after a minute: %v", r.schedJobs())
		}
		time.Sleep(50 * time.Millisecond) // another process's state: poll
	}
	if j := r.schedJobs()[r.jobs["user-0"]]; j["state"] != "running" || parkedJob(j) {
		t.Errorf("the job that replicated a document: %v, want running with its feed (idle_park_after is an hour)", j)
	}
	if n := r.px.feedsOf("empty-0")[0]; n > 1 {
		t.Errorf("%d continuous feeds of the empty database, want at most its start's", n)
	}
	s.PutDocs(t, s.DBURL("empty-0"), map[string]any{"_id": "empty-0-first"})
	r.awaitCentral("empty-0-first")
}

// TestParkingFallback: on plain PouchDB Server (_db_updates is a 400 stub)
// no job parks: its feed stays open well past idle_park_after (the feed's
// heartbeats, one a second, count the time) and a write replicates live.
func TestParkingFallback(t *testing.T) {
	skipShort(t)
	s := testserver.StartPouchDB(t)
	r := newParkNodeRig(t, s, 1, "3600", `,"connection_timeout":3000`)
	r.awaitCentral("user-0-first")
	deadline := time.Now().Add(time.Minute)
	for len(r.node.logLines("_db_updates cannot be read")) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the node did not say the server's _db_updates cannot be read")
		}
		time.Sleep(50 * time.Millisecond) // the node's log: poll
	}
	from := r.px.beats.Load()
	for r.px.beats.Load() < from+3 { // three seconds idle on its feed
		if time.Now().After(deadline) {
			t.Fatalf("%d heartbeats on the job's feed within a minute", r.px.beats.Load()-from)
		}
		time.Sleep(50 * time.Millisecond) // the proxy's count: poll
	}
	if j := r.schedJobs()[r.jobs["user-0"]]; parkedJob(j) || j["state"] != "running" {
		t.Errorf("job on a server without _db_updates: %v", j)
	}
	if n := r.px.open.Load(); n != 1 {
		t.Errorf("%d continuous feeds open, want the job's 1", n)
	}
	if got := r.px.feedsOf("user-0")[0]; got != 1 {
		t.Errorf("%d continuous feeds opened, want 1 (never parked)", got)
	}
	s.PutDocs(t, s.DBURL("user-0"), map[string]any{"_id": "user-0-live"})
	r.awaitCentral("user-0-live")
}

// dbsInfoSince returns the POST /_dbs_info requests after the first n.
func (p *parkProxy) dbsInfoSince(n int) []dbsInfoReq {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]dbsInfoReq(nil), p.dbsInfo[min(n, len(p.dbsInfo)):]...)
}

// probesOf returns the GET /db requests to each of dbs so far.
func (p *parkProxy) probesOf(dbs ...string) []int {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]int, len(dbs))
	for i, db := range dbs {
		out[i] = p.probes[db]
	}
	return out
}

// TestParkedRechecksBatched: the safety net of parked jobs (every
// _db_updates row dropped on the way, park_recheck 2 s) reads the sources'
// update_seq in batches: on a server with POST /_dbs_info (Apache CouchDB
// 3.4.3, make test-couchdb) one request answers several jobs and no job
// sends its own GET /db; on one without (PouchDB Server answers 404) the
// node asks once, then sends a GET /db per recheck. Either way a write to
// a parked job's database reaches the target, and the other jobs do not
// wake.
func TestParkedRechecksBatched(t *testing.T) {
	skipShort(t)
	s := testserver.StartPouchDBWithDBUpdates(t)
	const users = 8
	r := newParkNodeRig(t, s, users, "2")
	r.px.drop.Store(true)
	var firsts []string
	for _, db := range r.users {
		firsts = append(firsts, db+"-first")
	}
	r.awaitCentral(firsts...)
	r.awaitParked(r.users...)
	names := make([]string, len(r.users))
	for i, db := range r.users {
		u, err := url.Parse(r.sourceURL(db))
		if err != nil {
			t.Fatal(err)
		}
		names[i] = strings.Trim(u.Path, "/")
	}
	from := len(r.px.dbsInfoSince(0))
	probes0 := r.px.probesOf(names...)
	feeds0 := r.px.feedsOf(names...)
	sum := func(xs []int) (n int) {
		for _, x := range xs {
			n += x
		}
		return n
	}
	// Every job rechecks within 1.5 park_recheck and a gather of half of
	// it: 5 s; wait for two of every job's on a loaded machine.
	deadline := time.Now().Add(time.Minute)
	var batched, keys, singles int
	var reqs []dbsInfoReq
	for {
		reqs = r.px.dbsInfoSince(from)
		batched, keys = 0, 0
		for _, q := range reqs {
			if q.status == http.StatusOK {
				batched++
				keys += q.keys
			}
		}
		singles = sum(r.px.probesOf(names...)) - sum(probes0)
		if keys+singles >= 2*users {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after a minute: POST /_dbs_info %v, %d GET /db: fewer than two rechecks a job", reqs, singles)
		}
		time.Sleep(100 * time.Millisecond) // the proxy's counts: poll
	}
	t.Logf("rechecks: POST /_dbs_info %v (%d answered, %d keys), %d GET /db", reqs, batched, keys, singles)
	if s.External() {
		// Apache CouchDB: batched. A look alone in its gather window goes
		// as a GET /db; most do not.
		if batched == 0 || keys <= batched || singles >= keys {
			t.Errorf("CouchDB: POST /_dbs_info %v (%d answered, %d keys), %d GET /db: want batches of several jobs, most rechecks in them",
				reqs, batched, keys, singles)
		}
	} else {
		// PouchDB Server: 404, asked once; then a GET /db per recheck.
		if len(reqs) != 1 || reqs[0].status != http.StatusNotFound || singles < 2*users {
			t.Errorf("PouchDB Server: POST /_dbs_info %v, %d GET /db: want one answered 404, then a GET /db per recheck", reqs, singles)
		}
	}
	if feeds := r.px.feedsOf(names...); sum(feeds) != sum(feeds0) {
		t.Errorf("continuous feeds per db %v → %v: a job woke though nothing moved", feeds0, feeds)
	}
	s.PutDocs(t, s.DBURL(r.users[0]), map[string]any{"_id": r.users[0] + "-second"})
	r.awaitCentral(r.users[0] + "-second")
	r.awaitParked(r.users...)
	if feeds := r.px.feedsOf(names...); feeds[0] != feeds0[0]+1 || sum(feeds[1:]) != sum(feeds0[1:]) {
		t.Errorf("continuous feeds per db %v → %v: want one more on %s alone", feeds0, feeds, r.users[0])
	}
}

// TestParkingSafetyNet: with every _db_updates row dropped on the way (a
// watch that never fires), a write to a parked job's database still
// reaches the target: the job's recheck (park_recheck 1 s) sees its
// update_seq move.
func TestParkingSafetyNet(t *testing.T) {
	skipShort(t)
	s := testserver.StartPouchDBWithDBUpdates(t)
	r := newParkNodeRig(t, s, 2, "1")
	r.px.drop.Store(true)
	r.awaitCentral("user-0-first", "user-1-first")
	r.awaitParked(r.users...)
	s.PutDocs(t, s.DBURL("user-0"), map[string]any{"_id": "user-0-second"})
	r.awaitCentral("user-0-second")
	r.awaitParked(r.users...)
	if got := r.px.feedsOf(r.users...); got[1] != 1 {
		t.Errorf("continuous feeds per db %v: user-1's job woke without a change", got)
	}
}
