package integration

import (
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
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

// perUser is a running per-user set-up: the server (whose requests are
// counted at the server: serverRequests), the node watching its
// _replicator database, and the jobs' documents written in one _bulk_docs.
type perUser struct {
	srv     *testserver.Server
	node    *nodeProc
	addr    string
	users   []string
	central string // URL of the central database
	jobs    int    // _replicator documents written: fan-in plus fan-out
	// written is when the one _bulk_docs of every job was answered;
	// took is how long the server took to answer it.
	written time.Time
	took    time.Duration
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
	p.node, p.addr = scaleNode(t, p.jobs, append([]string{"COUCHREP_COUCHREP_WATCH=" + strings.TrimSuffix(p.srv.URL, "/")}, env...)...)
	p.writeDocs(t, fanOut)
	return p
}

// newPerUserServer starts a PouchDB Server with a real _db_updates feed
// whose requests are counted at the server (count-requests.js), with n
// user databases and the central one.
func newPerUserServer(t testing.TB, n int) *perUser {
	t.Helper()
	t.Setenv("NODE_OPTIONS", "--require "+countRequestsScript(t))
	srv := testserver.StartPouchDBWithDBUpdates(t)
	plainReplicatorDB(t, srv, true)
	p := &perUser{srv: srv, users: make([]string, n)}
	for i := range p.users {
		p.users[i] = perUserName(i)
	}
	createDBs(t, srv, p.users)
	p.central = srv.CreateDB(t, "central")
	return p
}

// writeDocs writes every job's _replicator document in one _bulk_docs:
// a fan-in job per user ("in-<user>": userdb → central, continuous), and
// with fanOut a fan-out job per user ("out-<user>": central → userdb,
// continuous, selector {"owner": user}).
func (p *perUser) writeDocs(t testing.TB, fanOut bool) {
	t.Helper()
	srv := p.srv
	p.jobs = len(p.users)
	if fanOut {
		p.jobs *= 2
	}
	docs := make([]json.RawMessage, 0, p.jobs)
	for _, u := range p.users {
		db := srv.DBURL(perUserDB(u))
		docs = append(docs, json.RawMessage(fmt.Sprintf(`{"_id":"in-%s","source":%q,"target":%q,"continuous":true}`, u, db, p.central)))
		if fanOut {
			docs = append(docs, json.RawMessage(fmt.Sprintf(`{"_id":"out-%s","source":%q,"target":%q,"continuous":true,"selector":{"owner":%q}}`,
				u, p.central, db, u)))
		}
	}
	start := time.Now()
	srv.Do(t, http.MethodPost, srv.DBURL("_replicator")+"_bulk_docs", map[string]any{"docs": docs}, http.StatusCreated)
	p.written = time.Now()
	p.took = p.written.Sub(start)
}

// createDBs creates the user databases of users, 16 at a time.
func createDBs(t testing.TB, srv *testserver.Server, users []string) {
	t.Helper()
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 16}, Timeout: time.Minute}
	defer client.CloseIdleConnections()
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for range 16 {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= len(users) {
					return
				}
				req, _ := http.NewRequest(http.MethodPut, srv.DBURL(perUserDB(users[i])), nil)
				resp, err := client.Do(req)
				if err != nil {
					errs <- err
					return
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusCreated {
					errs <- fmt.Errorf("PUT %s: %d", perUserDB(users[i]), resp.StatusCode)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		t.Fatalf("creating the user databases: %v", err)
	}
}

// waitRunning waits until the node's /metrics count every job running and
// returns how long after the _bulk_docs that was.
func (p *perUser) waitRunning(t testing.TB, timeout time.Duration) time.Duration {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		running := runningJobsTB(t, p.addr)
		if running >= p.jobs {
			return time.Since(p.written)
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d jobs running %s after the _bulk_docs", running, p.jobs, time.Since(p.written).Round(time.Second))
		}
		select {
		case <-p.node.exited:
			t.Fatalf("couchrepd exited (%v)", p.node.exitErr)
		case <-time.After(250 * time.Millisecond): // another process's state: poll
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
		sent := metricSum(t, p.addr, metricPrefix("couchrep_replication_requests_total"))
		answered := metricSum(t, p.addr, metricPrefix("couchrep_replication_responses_total"))
		if sent != last || answered < sent {
			last, since = sent, time.Now()
		}
		if time.Now().After(deadline) {
			t.Fatalf("jobs still starting after %s (%.0f requests, %.0f answered)", timeout, sent, answered)
		}
		select {
		case <-p.node.exited:
			t.Fatalf("couchrepd exited (%v)", p.node.exitErr)
		case <-time.After(250 * time.Millisecond): // another process's state: poll
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
		case <-time.After(250 * time.Millisecond): // another process's state: poll
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
}

// requests reads the server's request counts; reset starts new peaks.
func (p *perUser) requests(t testing.TB, reset bool) serverRequests {
	t.Helper()
	u := p.srv.URL + "_couchrep_requests"
	if reset {
		u += "?reset=1"
	}
	var r serverRequests
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
// ([replicator] startup_concurrency jobs starting per server, a few
// requests each, counted at the server); the node's file descriptors are
// bounded by its own feeds, not by the jobs; and a write to each user
// database of a sample wakes its job and reaches the central database, and
// only those.
func TestPerUserDatabases(t *testing.T) {
	skipShort(t)
	n, sample := perUserTestDBs(), 20
	p := startPerUser(t, n, false, "COUCHREP_REPLICATOR_IDLE_PARK_AFTER=5")
	nodeCPU, srvCPU := procCPU(p.node.cmd.Process.Pid), procCPU(serverPID(p.srv))
	running := p.waitRunning(t, 5*time.Minute)
	parked := p.waitParked(t, 5*time.Minute)
	reqs := p.requests(t, false)
	fds := procFDs(p.node.cmd.Process.Pid)
	t.Logf("%d jobs: the server took the _bulk_docs in %s; all running %s after it, all parked after %s "+
		"(CPU meanwhile: couchrepd %s, pouchdb-server %s; %d requests); server: peak %d requests in flight, %d feeds; couchrepd fds %d; load %s",
		p.jobs, p.took.Round(time.Millisecond), running.Round(time.Millisecond), parked.Round(time.Millisecond),
		procCPU(p.node.cmd.Process.Pid)-nodeCPU, procCPU(serverPID(p.srv))-srvCPU, reqs.Total, reqs.Peak, reqs.PeakFeeds, fds, loadAvg())
	// A starting job sends at most 5 requests at once (source and target
	// infos and checkpoints; then the shared feed's info, then its
	// catch-up); the rest is the node's own (doc processor, _db_updates)
	// and this test's. Without the limit the server had 6,036 in flight.
	if limit := 6*perUserStartupConcurrency + 40; reqs.Peak > limit {
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
		roundTrip(t, client, p.srv.DBURL(perUserDB(u)), p.central, "note-"+u, u)
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
