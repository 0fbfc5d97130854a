package integration

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	"github.com/couchrep/couchrep/internal/testserver"
	"github.com/couchrep/couchrep/messages"
)

// competingCheck is one server's entry of GET /_up "competing_replicators".
type competingCheck struct {
	Server      string   `json:"server"`
	Status      string   `json:"status"`
	Reason      string   `json:"reason"`
	OtherStores []string `json:"other_stores"`
}

// upCompeting reads n's GET /_up competing_replicators.
func upCompeting(t *testing.T, n *nodeProc) []competingCheck {
	t.Helper()
	r := api(t, n.httpAddr(""), "GET", "/_up", "")
	var up struct {
		Competing []competingCheck `json:"competing_replicators"`
	}
	if err := json.Unmarshal(r.body, &up); err != nil {
		t.Fatalf("GET /_up: %v: %s", err, r.body)
	}
	return up.Competing
}

// takeoverJSON runs couchrepctl --json takeover url against n and returns
// the reply and the exit code.
func takeoverJSON(t *testing.T, n *nodeProc, url string) (*messages.TakeoverResponse, int) {
	t.Helper()
	out, errOut, code := n.ctl("--json", "takeover", url)
	var r messages.TakeoverResponse
	if err := protojson.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("couchrepctl --json takeover: exit %d: %v\n%s\n%s", code, err, out, errOut)
	}
	return &r, code
}

func checkOf(r *messages.TakeoverResponse, name string) *messages.TakeoverCheck {
	for _, c := range r.GetChecks() {
		if c.GetName() == name {
			return c
		}
	}
	return &messages.TakeoverCheck{}
}

// TestTakeover is the takeover flow against real processes: two couchrepd
// with different job stores watch one PouchDB Server and each sees the
// other's marker (GET /_up); couchrepctl takeover refuses while the other
// store follows the server and while [replicator] max_jobs cannot be read,
// each time with the next step, refuses a node whose uuid is not the
// server's, and succeeds once the other store stopped and max_jobs = 0 is
// set the way the refusal said.
func TestTakeover(t *testing.T) {
	skipShort(t)
	srv := testserver.StartPouchDB(t)
	root := strings.TrimSuffix(srv.URL, "/")
	uuid := serverUUIDOf(t, srv)
	cfg := filepath.Join(t.TempDir(), "couchrep.ini")
	if err := os.WriteFile(cfg, fmt.Appendf(nil, "[couchrep]\nwatch = %s\n[replicator]\ninterval = 1000\n", root), 0o600); err != nil {
		t.Fatal(err)
	}
	a := startNode(t, nodeOptions{name: "taker", config: cfg, extra: []string{"--adopt-uuid", root}})
	b := startNode(t, nodeOptions{name: "other", config: cfg})

	// Each node's store id, from its takeover answer.
	ra, code := takeoverJSON(t, a, root)
	rb, _ := takeoverJSON(t, b, root)
	if code != 1 || ra.GetStoreId() == "" || rb.GetStoreId() == "" || ra.GetStoreId() == rb.GetStoreId() {
		t.Fatalf("store ids %q and %q, exit %d", ra.GetStoreId(), rb.GetStoreId(), code)
	}

	// Each sees the other's marker: competing, naming the other store.
	for _, x := range []struct {
		n     *nodeProc
		other string
	}{{a, fmt.Sprintf("store %s (node other)", rb.GetStoreId())}, {b, fmt.Sprintf("store %s (node taker)", ra.GetStoreId())}} {
		waitFor(t, 30*time.Second, x.n.dataDir+": the other store's marker in GET /_up", func() error {
			c := upCompeting(t, x.n)
			if len(c) != 1 || c[0].Status != "competing" || !slices.Contains(c[0].OtherStores, x.other) || !strings.Contains(c[0].Reason, x.other) {
				return fmt.Errorf("competing_replicators %+v, want %q", c, x.other)
			}
			return nil
		})
	}
	if out := ctlOK(t, a, "nodes"); !strings.Contains(out, "another couchrep store follows _replicator: store "+rb.GetStoreId()) {
		t.Fatalf("couchrepctl nodes does not name the other store:\n%s", out)
	}

	// Refused: the other store follows the server, max_jobs unknown on
	// PouchDB Server; every check says what it found, those not met the
	// next step.
	out, errOut, code := a.ctl("takeover", root)
	if code != 1 || !strings.Contains(errOut, "is not ready to be taken over") {
		t.Fatalf("takeover: exit %d, want 1: %s", code, errOut)
	}
	t.Logf("couchrepctl takeover refusing:\n%s", out)
	maxJobsStep := fmt.Sprintf(`curl -u ADMIN -X PUT %s/_config/replicator/max_jobs -d '"0"'`, root)
	for _, want := range []string{
		"takeover of " + srv.URL + ", checked by node taker (job store " + ra.GetStoreId() + "):",
		"ok      watched ", "ok      uuid ", "the node uses the server's uuid " + uuid,
		"unknown replicator   GET /_node/_local/_config/replicator answered 404 and /_config/replicator has no max_jobs",
		"next: set [replicator] max_jobs = 0 on " + srv.URL + " where it keeps its configuration: " + maxJobsStep,
		"ok      tasks        GET /_active_tasks lists no replication task",
		"ok      scheduler    GET /_scheduler/docs answered 404: no replication scheduler",
		"fail    other_stores another couchrep store follows the _replicator databases: store " + rb.GetStoreId() + " (node other) in _replicator",
		"next: stop that store's nodes or remove " + srv.URL + " from their [couchrep] watch",
		"refused: 2 of 6 preconditions not met",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("takeover output lacks %q:\n%s", want, out)
		}
	}

	// The other node's uuid is its own: refused with --adopt-uuid as the
	// next step.
	if c := checkOf(rb, "uuid"); c.GetResult() != "fail" || !strings.Contains(c.GetNext(), "--adopt-uuid "+srv.URL) {
		t.Fatalf("other node's uuid check: %+v", c)
	}
	// A URL with credentials of its own is used as given (PouchDB Server
	// refuses them), and they show nowhere.
	withCreds := strings.Replace(root, "http://", "http://admin:s3cret@", 1)
	out, errOut, code = a.ctl("takeover", withCreds)
	if code != 1 || !strings.Contains(out, "answered 401") || strings.Contains(out+errOut+a.logs.String(), "s3cret") {
		t.Fatalf("takeover with credentials: exit %d:\n%s\n%s", code, out, errOut)
	}
	// A server the node does not watch: refused, with the watch line.
	if r, _ := takeoverJSON(t, a, root+"/elsewhere"); checkOf(r, "watched").GetResult() != "fail" {
		t.Fatalf("unwatched server: %+v", r.GetChecks())
	}

	// The other store stops: its node removes its marker.
	if err := b.stop(syscall.SIGTERM, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	if r, _ := takeoverJSON(t, a, root); checkOf(r, "other_stores").GetResult() != "ok" {
		t.Fatalf("after the other store stopped: %+v", checkOf(r, "other_stores"))
	}
	// max_jobs = 500 where PouchDB Server keeps its configuration: the
	// server's replicator is on, for the takeover and the node's check.
	srv.Do(t, "PUT", srv.URL+"_config/replicator/max_jobs", []byte(`"500"`), 200)
	r, code := takeoverJSON(t, a, root)
	if c := checkOf(r, "replicator"); code != 1 || c.GetResult() != "fail" || !strings.Contains(c.GetFound(), "max_jobs = 500 (/_config/replicator)") ||
		!strings.Contains(c.GetNext(), maxJobsStep) {
		t.Fatalf("max_jobs 500: exit %d, %+v", code, c)
	}
	waitFor(t, 30*time.Second, "GET /_up competing: max_jobs 500", func() error {
		if c := upCompeting(t, a); len(c) != 1 || c[0].Status != "competing" || !strings.Contains(c[0].Reason, "its own replicator is on: [replicator] max_jobs = 500") {
			return fmt.Errorf("competing_replicators %+v", c)
		}
		return nil
	})
	// The next step as printed (without -u ADMIN: no admins here).
	runCmd(t, "sh", "-c", strings.Replace(maxJobsStep, "-u ADMIN ", "-s ", 1))
	out, errOut, code = a.ctl("takeover", root)
	if code != 0 {
		t.Fatalf("takeover after the next steps: exit %d:\n%s\n%s", code, out, errOut)
	}
	t.Logf("couchrepctl takeover ready:\n%s", out)
	for _, want := range []string{
		"ok      replicator   [replicator] max_jobs = 0 (/_config/replicator): the server's own replicator runs no job",
		"ok      other_stores no other couchrep store's marker (_local/couchrep-stores) in _replicator",
		"ready: every precondition is met; node taker runs the jobs of the _replicator documents of " + srv.URL + " alone",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("takeover output lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "next:") {
		t.Errorf("a ready takeover prints a next step:\n%s", out)
	}
	// The node's own check reads the same facts: none found.
	waitFor(t, 30*time.Second, "GET /_up none_found", func() error {
		if c := upCompeting(t, a); len(c) != 1 || c[0].Status != "none_found" {
			return fmt.Errorf("competing_replicators %+v", c)
		}
		return nil
	})
}

// TestSecondStoreRefuses is finding 5's second couchrep: a node of another
// job store, started with on_competing_replicator = refuse on a server a
// first store follows, finds the first's marker at its first check and
// leaves the _replicator documents to it (no job, a warning naming the
// other store); once the first store's node stops (and removes its
// marker), it takes the documents over.
func TestSecondStoreRefuses(t *testing.T) {
	skipShort(t)
	srv := testserver.StartPouchDB(t)
	plainReplicatorDB(t, srv, true)
	root := strings.TrimSuffix(srv.URL, "/")
	src := srv.CreateDB(t, "src")
	for i := range 3 {
		srv.Do(t, "PUT", fmt.Sprintf("%sd%d", src, i), map[string]any{"i": i}, 201)
	}
	dir := t.TempDir()
	ini := func(name, extra string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, fmt.Appendf(nil, "[couchrep]\nwatch = %s\n%s[replicator]\ninterval = 1000\n", root, extra), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	first := startNode(t, nodeOptions{name: "first", config: ini("first.ini", "")})
	marker := srv.DBURL("_replicator") + "_local/couchrep-stores"
	waitFor(t, 30*time.Second, "the first store's marker", func() error {
		if r := apiNoFail(marker); r.status != 200 || !strings.Contains(string(r.body), `"node":"first"`) {
			return fmt.Errorf("GET _local/couchrep-stores: %d %s", r.status, r.body)
		}
		return nil
	})
	second := startNode(t, nodeOptions{name: "second", config: ini("second.ini", "on_competing_replicator = refuse\n")})
	waitFor(t, 30*time.Second, "the second node's check", func() error {
		if c := upCompeting(t, second); len(c) != 1 || c[0].Status != "competing" || len(c[0].OtherStores) != 1 || !strings.HasSuffix(c[0].OtherStores[0], "(node first)") {
			return fmt.Errorf("competing_replicators %+v", c)
		}
		return nil
	})

	rdb := srv.DBURL("_replicator")
	state := func(id string) func() bool {
		return func() bool { return docField(t, srv, "_replicator", id, "_replication_state") == "completed" }
	}
	srv.Do(t, "PUT", rdb+"one", map[string]any{"source": src, "target": srv.DBURL("one"), "create_target": true}, 201)
	waitUntil(t, "one completed by the first store", 30*time.Second, state("one"))
	// The second node was held back from its start (before its first
	// check, then by the marker): it never made a job.
	var jobs messages.ListJobsResponse
	ctlJSON(t, second, &jobs, "jobs")
	if len(jobs.GetJobs()) != 0 {
		t.Fatalf("the refusing node made jobs: %v", jobs.GetJobs())
	}
	if len(second.logLines("competing replicator: another replicator works on this _replicator database", "leaving it alone", `"other_stores":["store `)) == 0 {
		t.Fatalf("no warning naming the other store:\n%s", second.logs.String())
	}

	// The first store stops: the second takes over.
	if err := first.stop(syscall.SIGTERM, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	srv.Do(t, "PUT", rdb+"two", map[string]any{"source": src, "target": srv.DBURL("two"), "create_target": true}, 201)
	waitUntil(t, "two completed by the second store", 60*time.Second, state("two"))
	if len(second.logLines("competing replicator stopped")) == 0 {
		t.Fatalf("no log line for the other store stopping:\n%s", second.logs.String())
	}
}

// TestRefuseStopsRunningJobs is issue 32's item 6: with
// on_competing_replicator = refuse, couchrep's running job of a
// _replicator document stops when the server's own replicator comes back
// on ([replicator] max_jobs "500", where PouchDB Server keeps its
// configuration), so that the two never copy the same writes; couchrepctl
// nodes says what happened and the next step; once max_jobs is "0" again
// the job comes back by itself and resumes from its checkpoint.
func TestRefuseStopsRunningJobs(t *testing.T) {
	skipShort(t)
	srv := testserver.StartPouchDB(t)
	plainReplicatorDB(t, srv, true)
	root := strings.TrimSuffix(srv.URL, "/")
	maxJobs := srv.URL + "_config/replicator/max_jobs"
	srv.Do(t, "PUT", maxJobs, []byte(`"0"`), 200)
	src := srv.CreateDB(t, "src")
	tgt := srv.DBURL("tgt")
	srv.PutDocs(t, src, map[string]any{"_id": "a"})
	cfg := filepath.Join(t.TempDir(), "couchrep.ini")
	if err := os.WriteFile(cfg, fmt.Appendf(nil, "[couchrep]\nwatch = %s\non_competing_replicator = refuse\n[replicator]\ninterval = 1000\n", root), 0o600); err != nil {
		t.Fatal(err)
	}
	n := startNode(t, nodeOptions{name: "refuser", config: cfg})
	srv.Do(t, "PUT", srv.DBURL("_replicator")+"live", map[string]any{"source": src, "target": tgt, "create_target": true, "continuous": true}, 201)
	copied := func(id string) func() bool {
		return func() bool { _, st, _ := srv.Request("GET", tgt+id, nil); return st == 200 }
	}
	waitUntil(t, "a copied by couchrep", 60*time.Second, copied("a"))
	jobsOf := func() []*messages.JobSummary {
		var jobs messages.ListJobsResponse
		ctlJSON(t, n, &jobs, "jobs")
		var out []*messages.JobSummary
		for _, j := range jobs.GetJobs() {
			if j.GetDocId() == "live" {
				out = append(out, j)
			}
		}
		return out
	}
	if j := jobsOf(); len(j) != 1 {
		t.Fatalf("jobs of document live: %v", j)
	}

	// CouchDB's replicator comes back on: couchrep stops its job.
	srv.Do(t, "PUT", maxJobs, []byte(`"500"`), 200)
	waitFor(t, 60*time.Second, "couchrep's job of live stopped", func() error {
		if j := jobsOf(); len(j) != 0 {
			return fmt.Errorf("jobs of document live: %v", j)
		}
		return nil
	})
	out := ctlOK(t, n, "nodes")
	for _, want := range []string{
		"competing replicator on " + srv.URL + ": its own replicator is on: [replicator] max_jobs = 500",
		"couchrep stopped 1 job(s) of its _replicator documents and starts none while it runs (on_competing_replicator = refuse)",
		`next: stop it: curl -u ADMIN -X PUT ` + root + `/_node/_local/_config/replicator/max_jobs -d '"0"'`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("couchrepctl nodes lacks %q:\n%s", want, out)
		}
	}
	if len(n.logLines("competing replicator: stopped this store's jobs of this _replicator database", `"jobs_stopped":1`)) == 0 {
		t.Errorf("no log line for the stopped job:\n%s", n.logs.String())
	}
	if s := docField(t, srv, "_replicator", "live", "_replication_state"); s != nil {
		t.Fatalf("the document's state was written: %v", s)
	}

	// Off again: the job comes back and resumes from its checkpoint.
	srv.PutDocs(t, src, map[string]any{"_id": "b"})
	srv.Do(t, "PUT", maxJobs, []byte(`"0"`), 200)
	waitUntil(t, "b copied once couchrep took the document back", 60*time.Second, copied("b"))
	var j []*messages.JobSummary
	waitFor(t, 30*time.Second, "the job back reports what it wrote", func() error {
		if j = jobsOf(); len(j) != 1 || j[0].GetStats().GetStartFrom() == "" {
			return fmt.Errorf("jobs of document live: %v", j)
		}
		return nil
	})
	if st := j[0].GetStats(); st.GetStartFrom() != "checkpoint" || st.GetStartSeq() != "1" {
		t.Fatalf("the job back started from %s@%s, want its checkpoint at 1: %v", st.GetStartFrom(), st.GetStartSeq(), j)
	}
	if out := ctlOK(t, n, "nodes"); strings.Contains(out, "stopped") {
		t.Errorf("couchrepctl nodes still says stopped:\n%s", out)
	}
}
