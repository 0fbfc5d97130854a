package integration

import (
	"cmp"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/couchrep/couchrep/internal/testserver"
)

// The database-per-user pattern (issue 26): N user databases on one
// server, each replicated continuously into one central database (fan-in),
// and optionally the central database's per-user slice (a Mango selector
// on "owner") replicated back to each user (fan-out). The scale test and
// BenchmarkPerUser share this set-up.

// perUserName is user i's name; perUserDB its database, named as CouchDB's
// couch_peruser names it: "userdb-" and the name's bytes in hex.
func perUserName(i int) string { return fmt.Sprintf("user%05d", i) }

func perUserDB(user string) string { return "userdb-" + hex.EncodeToString([]byte(user)) }

// perUser is a running per-user set-up: the server of the user and
// central databases (whose requests are counted at the server on a test
// server: serverRequests), the server holding the _replicator database the
// node watches (the same test server; on an Apache CouchDB
// (COUCHREP_TEST_COUCH_URL) a PouchDB Server of its own, see
// newPerUserServer), the node, and the jobs' documents written in one
// _bulk_docs.
type perUser struct {
	srv     *testserver.Server
	repSrv  *testserver.Server // holds the _replicator database
	node    *nodeProc
	addr    string
	users   []string
	central string // URL of the central database
	jobs    int    // _replicator documents written: fan-in plus fan-out
	// written is when the one _bulk_docs of every job was answered;
	// took is how long the server took to answer it.
	written time.Time
	took    time.Duration
	// external: srv is a CouchDB the tests did not start; its databases
	// are named prefix+perUserDB(user) and prefix+"central", the user
	// databases kept after the run when keep is set.
	external bool
	prefix   string
	keep     bool
	// tag makes the benchmark's document ids unique to this run (user
	// databases kept from an earlier run hold that run's documents).
	tag string
	// proxy counts the node's requests to an external server (its jobs'
	// sources and targets are addressed through it); nil on a test
	// server (which counts them itself) or with COUCHREP_PERUSER_COUNT=0.
	proxy *inflightProxy
}

// nodeURL is u (a database URL on srv) as the node's jobs address it:
// through the counting proxy, if any.
func (p *perUser) nodeURL(t testing.TB, u string) string {
	if p.proxy == nil {
		return u
	}
	return p.proxy.via(t, u)
}

// userDB is the URL of user's database.
func (p *perUser) userDB(user string) string {
	if p.external {
		return p.srv.URL + url.PathEscape(p.prefix+perUserDB(user)) + "/"
	}
	return p.srv.DBURL(perUserDB(user))
}

// serverName names the process serverPID finds: what the logs call it.
func (p *perUser) serverName() string {
	if p.external {
		return "beam.smp"
	}
	return "pouchdb-server"
}

// serverPID is the pid of the user databases' server process: the test
// server's, or on an external CouchDB on this machine its beam.smp's.
func (p *perUser) serverPID() int {
	if p.external {
		return beamPID()
	}
	return serverPID(p.srv)
}

// beamPID is the pid of the (one) Erlang VM running on this machine, the
// CouchDB of COUCHREP_TEST_COUCH_URL; 0 when there is none or several.
func beamPID() int {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return 0
	}
	found := 0
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmd, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err != nil {
			continue
		}
		if arg0, _, _ := strings.Cut(string(cmd), "\x00"); strings.HasSuffix(arg0, "/beam.smp") && strings.Contains(string(cmd), "couchdb") {
			if found != 0 {
				return 0
			}
			found = pid
		}
	}
	return found
}

// countRequestsScript is integration/bench/count-requests.js, preloaded
// into the pouchdb-server process (NODE_OPTIONS) to count its requests.
func countRequestsScript(t testing.TB) string {
	p, err := filepath.Abs(filepath.Join("bench", "count-requests.js"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("per-user: %v", err)
	}
	return p
}

// startPerUser creates n user databases and the central one on a new
// PouchDB Server with a real _db_updates feed (newPerUserServer), starts a
// node watching it (max_jobs above the jobs, env added to its environment)
// and writes every job's _replicator document in one _bulk_docs
// (writeDocs).
func startPerUser(t testing.TB, n int, fanOut bool, env ...string) *perUser {
	t.Helper()
	p := newPerUserServer(t, n)
	p.jobs = n
	if fanOut {
		p.jobs = 2 * n
	}
	p.node, p.addr = scaleNode(t, p.jobs, append([]string{"COUCHREP_COUCHREP_WATCH=" + strings.TrimSuffix(p.repSrv.URL, "/")}, env...)...)
	p.writeDocs(t, fanOut)
	return p
}

// newPerUserServer starts a PouchDB Server with a real _db_updates feed
// whose requests are counted at the server (count-requests.js), with n
// user databases and the central one.
//
// With COUCHREP_TEST_COUCH_URL (an Apache CouchDB with _global_changes)
// the databases are that server's instead, named with the prefix
// COUCHREP_PERUSER_DB_PREFIX (default "couchrep-peruser-") and created
// with q=1 (CouchDB's advice for many small databases); the central one
// is created anew and deleted at the end, the user databases too unless
// COUCHREP_PERUSER_KEEP_DBS=1 keeps them for the next run (creating 10,000
// takes CouchDB minutes; a kept one that exists is used as it is). The
// _replicator documents go to a PouchDB Server of their own: the CouchDB's
// own _replicator databases are seen by its replicator (max_jobs 0 keeps
// it from running them, not from parsing and scheduling them) and by any
// other node watching that CouchDB. The node reaches that CouchDB through
// a counting proxy in this process (inflightProxy; not with
// COUCHREP_PERUSER_COUNT=0), whose counts are the node's requests.
func newPerUserServer(t testing.TB, n int) *perUser {
	t.Helper()
	p := &perUser{users: make([]string, n), tag: strconv.FormatInt(time.Now().UnixNano()/1e6, 36)}
	for i := range p.users {
		p.users[i] = perUserName(i)
	}
	if ext := os.Getenv(testserver.ExternalURLEnv); ext != "" {
		p.external = true
		p.prefix = cmp.Or(os.Getenv("COUCHREP_PERUSER_DB_PREFIX"), "couchrep-peruser-")
		p.keep = os.Getenv("COUCHREP_PERUSER_KEEP_DBS") == "1"
		p.srv = testserver.StartPouchDBWithDBUpdates(t) // the external server
		// A PouchDB Server for the _replicator database: started with
		// the variable unset (StartPouchDB would return the CouchDB).
		os.Unsetenv(testserver.ExternalURLEnv)
		p.repSrv = testserver.StartPouchDB(t)
		os.Setenv(testserver.ExternalURLEnv, ext)
		plainReplicatorDB(t, p.repSrv, true)
		p.central = p.srv.URL + url.PathEscape(p.prefix+"central") + "/"
		_, _, _ = p.srv.Request(http.MethodDelete, p.central, nil) // a run that did not end
		p.srv.Do(t, http.MethodPut, p.central+"?q=1", nil, http.StatusCreated)
		t.Cleanup(func() {
			_, _, _ = p.srv.Request(http.MethodDelete, p.central, nil)
			if !p.keep {
				deleteDBs(t, p.srv, p.userDBs())
			}
		})
		if os.Getenv("COUCHREP_PERUSER_COUNT") != "0" {
			p.proxy = startInflightProxy(t, p.srv.URL)
		}
		start := time.Now()
		createDBs(t, p.srv, p.userDBs(), true)
		t.Logf("per-user: %d user databases on %s (prefix %q) ready in %s", n, p.srv.URL, p.prefix, time.Since(start).Round(time.Millisecond))
		return p
	}
	t.Setenv("NODE_OPTIONS", "--require "+countRequestsScript(t))
	p.srv = testserver.StartPouchDBWithDBUpdates(t)
	p.repSrv = p.srv
	plainReplicatorDB(t, p.srv, true)
	createDBs(t, p.srv, p.userDBs(), false)
	p.central = p.srv.CreateDB(t, "central")
	return p
}

// userDBs are the URLs of every user's database.
func (p *perUser) userDBs() []string {
	urls := make([]string, len(p.users))
	for i, u := range p.users {
		urls[i] = p.userDB(u)
	}
	return urls
}

// writeDocs writes every job's _replicator document in one _bulk_docs:
// a fan-in job per user ("in-<user>": userdb → central, continuous), and
// with fanOut a fan-out job per user ("out-<user>": central → userdb,
// continuous, selector {"owner": user}).
func (p *perUser) writeDocs(t testing.TB, fanOut bool) {
	t.Helper()
	p.jobs = len(p.users)
	if fanOut {
		p.jobs *= 2
	}
	docs := make([]json.RawMessage, 0, p.jobs)
	central := p.nodeURL(t, p.central)
	for _, u := range p.users {
		db := p.nodeURL(t, p.userDB(u))
		docs = append(docs, json.RawMessage(fmt.Sprintf(`{"_id":"in-%s","source":%q,"target":%q,"continuous":true}`, u, db, central)))
		if fanOut {
			docs = append(docs, json.RawMessage(fmt.Sprintf(`{"_id":"out-%s","source":%q,"target":%q,"continuous":true,"selector":{"owner":%q}}`,
				u, central, db, u)))
		}
	}
	start := time.Now()
	p.repSrv.Do(t, http.MethodPost, p.repSrv.DBURL("_replicator")+"_bulk_docs", map[string]any{"docs": docs}, http.StatusCreated)
	p.written = time.Now()
	p.took = p.written.Sub(start)
}

// createDBs creates the databases at urls, 16 at a time (q=1 on a
// CouchDB: the query parameter is ignored by PouchDB Server). With
// existingOK a database that exists already (412) is taken as it is.
func createDBs(t testing.TB, srv *testserver.Server, urls []string, existingOK bool) {
	t.Helper()
	forEachDB(t, srv, urls, http.MethodPut, func(status int) bool {
		return status == http.StatusCreated || status == http.StatusAccepted || existingOK && status == http.StatusPreconditionFailed
	})
}

// deleteDBs deletes the databases at urls, 16 at a time (one missing is
// no error).
func deleteDBs(t testing.TB, srv *testserver.Server, urls []string) {
	t.Helper()
	forEachDB(t, srv, urls, http.MethodDelete, func(status int) bool {
		return status == http.StatusOK || status == http.StatusAccepted || status == http.StatusNotFound
	})
}

// forEachDB sends method to every URL of urls (with srv's admin
// credentials, if any), 16 at a time; ok says which statuses succeed.
func forEachDB(t testing.TB, srv *testserver.Server, urls []string, method string, ok func(status int) bool) {
	t.Helper()
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for range 16 {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= len(urls) {
					return
				}
				u := urls[i]
				if method == http.MethodPut && srv.External() {
					u += "?q=1"
				}
				b, status, err := srv.Request(method, u, nil)
				if err != nil {
					errs <- err
					return
				}
				if !ok(status) {
					errs <- fmt.Errorf("%s %s: %d %s", method, redactedURL(urls[i]), status, b)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		t.Fatalf("%s of the user databases: %v", method, err)
	}
}

// waitRunning waits until the node's /metrics count every job running and
// returns how long after the _bulk_docs that was.
func (p *perUser) waitRunning(t testing.TB, timeout time.Duration) time.Duration {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var logged time.Time
	for {
		var running, records float64 // one scrape
		metricSum(t, p.addr, func(line string) bool {
			if !strings.HasPrefix(line, "couchrep_replication_jobs{") {
				return false
			}
			f := strings.Fields(line)
			v, _ := strconv.ParseFloat(f[len(f)-1], 64)
			records += v
			if strings.Contains(line, `state="running"`) {
				running += v
			}
			return false
		})
		if int(running) >= p.jobs {
			return time.Since(p.written)
		}
		if time.Since(logged) >= 5*time.Second {
			logged = time.Now()
			t.Logf("%s after the _bulk_docs: %.0f jobs in the store, %.0f running; server %+v",
				time.Since(p.written).Round(100*time.Millisecond), records, running, p.requests(t, false))
		}
		if time.Now().After(deadline) {
			t.Fatalf("%.0f of %d jobs running %s after the _bulk_docs", running, p.jobs, time.Since(p.written).Round(time.Second))
		}
		select {
		case <-p.node.exited:
			t.Fatalf("couchrepd exited (%v)", p.node.exitErr)
		case <-time.After(time.Second): // another process's state: poll (a /metrics scrape is not free)
		}
	}
}

// waitStarted waits until the jobs' start-up requests are done: the node
// has no request in flight and sent none for quiet. It returns how long
// after the _bulk_docs that was (quiet not counted).
func (p *perUser) waitStarted(t testing.TB, quiet, timeout time.Duration) time.Duration {
	t.Helper()
	deadline := time.Now().Add(timeout)
	last, since := -1.0, time.Now()
	for time.Since(since) < quiet {
		var sent, answered float64 // one scrape: at 20,000 jobs each costs the node ~0.1-0.5 s of CPU
		metricSum(t, p.addr, func(line string) bool {
			f := strings.Fields(line)
			v, _ := strconv.ParseFloat(f[len(f)-1], 64)
			switch {
			case metricPrefix("couchrep_replication_requests_total")(line):
				sent += v
			case metricPrefix("couchrep_replication_responses_total")(line):
				answered += v
			}
			return false
		})
		if sent != last || answered < sent {
			last, since = sent, time.Now()
		}
		if time.Now().After(deadline) {
			t.Fatalf("jobs still starting after %s (%.0f requests, %.0f answered)", timeout, sent, answered)
		}
		select {
		case <-p.node.exited:
			t.Fatalf("couchrepd exited (%v)", p.node.exitErr)
		case <-time.After(time.Second): // another process's state: poll (a /metrics scrape is not free)
		}
	}
	return since.Sub(p.written)
}

// waitParked waits until the node's /metrics count every job parked
// (through its start-up and idle for idle_park_after) and returns how long
// after the _bulk_docs that was.
func (p *perUser) waitParked(t testing.TB, timeout time.Duration) time.Duration {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		parked := int(metricSum(t, p.addr, metricPrefix("couchrep_replication_jobs_parked")))
		if parked >= p.jobs {
			return time.Since(p.written)
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d jobs parked %s after the _bulk_docs", parked, p.jobs, time.Since(p.written).Round(time.Second))
		}
		select {
		case <-p.node.exited:
			t.Fatalf("couchrepd exited (%v)", p.node.exitErr)
		case <-time.After(time.Second): // another process's state: poll (a /metrics scrape is not free)
		}
	}
}

// serverRequests are the pouchdb-server process's request counts
// (integration/bench/count-requests.js): requests other than feeds in
// flight and their peak, feeds open and their peak, and all requests
// since it started.
type serverRequests struct {
	Inflight  int `json:"inflight"`
	Peak      int `json:"peak"`
	Feeds     int `json:"feeds"`
	PeakFeeds int `json:"peak_feeds"`
	Total     int `json:"total"`
	// Errors: exchanges with the server that failed (the counting
	// proxy's; count-requests.js has none).
	Errors int `json:"errors"`
}

// requests reads the server's request counts; reset starts new peaks. On
// an external CouchDB they are the counting proxy's (the node's requests
// only), or all zero without one.
func (p *perUser) requests(t testing.TB, reset bool) serverRequests {
	t.Helper()
	var r serverRequests
	if p.external {
		if p.proxy != nil {
			r = p.proxy.counts(reset)
		}
		return r
	}
	u := p.srv.URL + "_couchrep_requests"
	if reset {
		u += "?reset=1"
	}
	p.srv.GetJSON(t, u, &r)
	return r
}

// roundTrip writes document id (with "owner": user) to the database at
// from and returns how long until a GET of it at to answers 200.
func roundTrip(t testing.TB, client *http.Client, from, to, id, user string) time.Duration {
	t.Helper()
	body := fmt.Sprintf(`{"owner":%q,"at":%q}`, user, time.Now().Format(time.RFC3339Nano))
	start := time.Now()
	req, _ := http.NewRequest(http.MethodPut, from+id, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("PUT %s%s: %d", redactedURL(from), id, resp.StatusCode)
	}
	deadline := start.Add(2 * time.Minute)
	for !docExists(client, to, id) {
		if time.Now().After(deadline) {
			t.Fatalf("%s written to %s did not reach %s within 2 minutes", id, redactedURL(from), redactedURL(to))
		}
		time.Sleep(5 * time.Millisecond) // another process's state: poll
	}
	return time.Since(start)
}

// redactedURL is u without its userinfo.
func redactedURL(u string) string {
	if i := strings.Index(u, "@"); i >= 0 {
		if j := strings.Index(u, "://"); j >= 0 && j < i {
			return u[:j+3] + u[i+1:]
		}
	}
	return u
}

// runningJobsTB is runningJobs for a test or a benchmark.
func runningJobsTB(t testing.TB, addr string) int {
	return int(metricSum(t, addr, func(line string) bool {
		return strings.HasPrefix(line, "couchrep_replication_jobs{") && strings.Contains(line, `state="running"`)
	}))
}

// perUserTestDBs is how many user databases TestPerUserDatabases runs
// (COUCHREP_PERUSER_TEST_DBS overrides it while debugging).
func perUserTestDBs() int {
	var n int
	if _, err := fmt.Sscan(os.Getenv("COUCHREP_PERUSER_TEST_DBS"), &n); err == nil && n > 0 {
		return n
	}
	return 2000
}

// perUserStartupConcurrency is [replicator] startup_concurrency's default,
// which the per-user test and benchmark run with.
const perUserStartupConcurrency = 20

// TestPerUserDatabases is the database-per-user pattern at scale (issue
// 26): 2,000 user databases on one PouchDB Server (with a real
// _db_updates feed), one continuous replication each into a central
// database, written as 2,000 _replicator documents in one _bulk_docs. Every
// job comes to run on one node, goes through its start-up and parks
// (idle_park_after 5 s here); the server never had more requests in
// flight at once than the node's start-up limit allows
// ([replicator] startup_concurrency start-up requests per server, counted
// at the server, plus a few of the node's own); the node's file descriptors are
// bounded by its own feeds, not by the jobs; and a write to each user
// database of a sample wakes its job and reaches the central database, and
// only those.
func TestPerUserDatabases(t *testing.T) {
	skipShort(t)
	n, sample := perUserTestDBs(), 20
	p := startPerUser(t, n, false, "COUCHREP_REPLICATOR_IDLE_PARK_AFTER=5")
	nodeCPU, srvCPU := procCPU(p.node.cmd.Process.Pid), procCPU(p.serverPID())
	running := p.waitRunning(t, 5*time.Minute)
	parked := p.waitParked(t, 5*time.Minute)
	reqs := p.requests(t, false)
	fds := procFDs(p.node.cmd.Process.Pid)
	t.Logf("%d jobs: the server took the _bulk_docs in %s; all running %s after it, all parked after %s "+
		"(CPU meanwhile: couchrepd %s, pouchdb-server %s; %d requests); server: peak %d requests in flight, %d feeds; couchrepd fds %d; load %s",
		p.jobs, p.took.Round(time.Millisecond), running.Round(time.Millisecond), parked.Round(time.Millisecond),
		procCPU(p.node.cmd.Process.Pid)-nodeCPU, procCPU(p.serverPID())-srvCPU, reqs.Total, reqs.Peak, reqs.PeakFeeds, fds, loadAvg())
	// A starting job sends up to 4 requests at once (source and target
	// infos and checkpoints; then its catch-up, when its source changed
	// since its checkpoint: TestPerUserStartRequests), but the jobs in
	// their start-up have at most startup_concurrency requests in flight
	// per server (startlimit.Limiter.Request); the rest is the node's own
	// (the doc processor's reads of the _replicator database on this same
	// server) and this test's. Without the limit the server had 6,036 in
	// flight; with a limit of jobs alone (20 jobs, ~4 requests each),
	// 65-79.
	if limit := perUserStartupConcurrency + 10; reqs.Peak > limit {
		t.Errorf("the server had %d requests in flight at once (feeds not counted), want at most %d (startup_concurrency %d)",
			reqs.Peak, limit, perUserStartupConcurrency)
	}
	// Parked jobs hold no feed: what is open is the node's own (store,
	// listeners, the _replicator and _db_updates feeds, pooled
	// connections), a few dozen, not one per job.
	if fds > 200 {
		t.Errorf("couchrepd holds %d file descriptors with %d jobs parked, want at most 200", fds, p.jobs)
	}

	client := &http.Client{Timeout: time.Minute}
	for k := range sample {
		u := p.users[k*n/sample]
		roundTrip(t, client, p.userDB(u), p.central, "note-"+u, u)
	}
	var info struct {
		DocCount int `json:"doc_count"`
	}
	p.srv.GetJSON(t, p.central, &info)
	if info.DocCount != sample {
		t.Errorf("central has %d documents, want the %d written", info.DocCount, sample)
	}
	if running := runningJobsTB(t, p.addr); running != p.jobs {
		t.Errorf("%d jobs running after the writes, want %d", running, p.jobs)
	}
}
