package integration

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/couchrep/couchrep/internal/testserver"
	"github.com/couchrep/couchrep/messages"
)

// ctlOK runs couchrepctl against n in human mode and requires exit 0.
func ctlOK(t *testing.T, n *nodeProc, args ...string) string {
	t.Helper()
	out, errOut, code := n.ctl(args...)
	if code != 0 {
		t.Fatalf("couchrepctl %v: exit %d: %s", args, code, errOut)
	}
	return out
}

// ctlJSON runs couchrepctl --json against n, requires exit 0 and decodes
// the reply into into.
func ctlJSON(t *testing.T, n *nodeProc, into proto.Message, args ...string) {
	t.Helper()
	out, errOut, code := n.ctl(append([]string{"--json"}, args...)...)
	if code != 0 {
		t.Fatalf("couchrepctl --json %v: exit %d: %s", args, code, errOut)
	}
	if err := protojson.Unmarshal([]byte(out), into); err != nil {
		t.Fatalf("couchrepctl --json %v: %v\n%s", args, err, out)
	}
}

// ctlFails runs couchrepctl and requires exit code want and stderr
// containing every one of substrs.
func ctlFails(t *testing.T, n *nodeProc, want int, substrs []string, args ...string) {
	t.Helper()
	_, errOut, code := n.ctl(args...)
	if code != want {
		t.Fatalf("couchrepctl %v: exit %d, want %d: %s", args, code, want, errOut)
	}
	for _, s := range substrs {
		if !strings.Contains(errOut, s) {
			t.Fatalf("couchrepctl %v: stderr %q does not mention %q", args, errOut, s)
		}
	}
}

// waitCtlJob polls `couchrepctl job show --json` until the job has status
// (the test talks to a separate process; there is no event to await).
func waitCtlJob(t *testing.T, n *nodeProc, id string, status messages.JobStatus) *messages.JobSummary {
	t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	var last messages.GetJobResponse
	for time.Now().Before(deadline) {
		ctlJSON(t, n, &last, "job", "show", id)
		if last.GetJob().GetStatus() == status {
			return last.GetJob()
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("job %s not %s after 90 s: %v", id, status, last.GetJob())
	return nil
}

// waitCtlJobs polls `couchrepctl jobs --json` with filter args until total
// jobs match.
func waitCtlJobs(t *testing.T, n *nodeProc, total uint32, args ...string) *messages.ListJobsResponse {
	t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	var last messages.ListJobsResponse
	for time.Now().Before(deadline) {
		ctlJSON(t, n, &last, append([]string{"jobs"}, args...)...)
		if last.GetTotal() == total {
			return &last
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("jobs %v: %d, want %d: %v", args, last.GetTotal(), total, last.GetJobs())
	return nil
}

// waitExit waits for the node process to exit on its own and returns its
// exit error.
func (n *nodeProc) waitExit(timeout time.Duration) error {
	n.t.Helper()
	select {
	case <-n.exited:
		return n.exitErr
	case <-time.After(timeout):
		n.t.Fatalf("couchrepd did not exit within %s", timeout)
		return nil
	}
}

func waitDocCount(t *testing.T, srv *testserver.Server, db string, want int) {
	t.Helper()
	waitUntil(t, fmt.Sprintf("%s has %d docs", db, want), 90*time.Second, func() bool { return jobsDocCount(t, srv, db) == want })
}

const (
	statusPending   = messages.JobStatus_JOB_STATUS_PENDING
	statusRunning   = messages.JobStatus_JOB_STATUS_RUNNING
	statusCompleted = messages.JobStatus_JOB_STATUS_COMPLETED
)

// TestCtlEverySubcommand drives one real couchrepd only through couchrepctl,
// every subcommand in both output modes, and checks exit codes and --help.
func TestCtlEverySubcommand(t *testing.T) {
	skipShort(t)
	srv := testserver.StartPouchDB(t)
	src, tgt, once := srv.CreateDB(t, "csrc"), srv.CreateDB(t, "ctgt"), srv.DBURL("conce")
	var docs []map[string]any
	for i := range 20 {
		docs = append(docs, map[string]any{"_id": fmt.Sprintf("d%02d", i), "n": i})
	}
	srv.PutDocs(t, src, docs...)
	dir := t.TempDir()
	n := startNode(t, nodeOptions{dataDir: dir, config: writeConfig(t, dir, jobsConfig), name: "ctl-node"})

	// replicate: a continuous job (text) and a one-shot one (JSON).
	out := ctlOK(t, n, "replicate", "--continuous", src, tgt)
	contID, ok := strings.CutPrefix(strings.TrimSpace(out), "added job ")
	if !ok || contID == "" {
		t.Fatalf("replicate printed %q", out)
	}
	var rep messages.ReplicateResponse
	ctlJSON(t, n, &rep, "replicate", "--create-target", src, once)
	oneID := rep.GetId()
	if oneID == "" || oneID == contID {
		t.Fatalf("replicate --json: %v", &rep)
	}
	done := waitCtlJob(t, n, oneID, statusCompleted)
	if done.GetStats().GetDocsWritten() != 20 || done.GetContinuous() {
		t.Fatalf("one-shot job: %v", done)
	}
	waitCtlJob(t, n, contID, statusRunning)
	waitDocCount(t, srv, tgt, 20)

	// jobs, both modes, with filters.
	out = ctlOK(t, n, "jobs")
	for _, want := range []string{"ID", "STATE", "DOCS_WRITTEN", contID, oneID, "running", "completed", "2 of 2 job(s)"} {
		if !strings.Contains(out, want) {
			t.Fatalf("jobs table lacks %q:\n%s", want, out)
		}
	}
	var list messages.ListJobsResponse
	ctlJSON(t, n, &list, "jobs", "--state", "completed")
	if list.GetTotal() != 1 || list.GetJobs()[0].GetId() != oneID {
		t.Fatalf("jobs --state completed: %v", &list)
	}
	ctlJSON(t, n, &list, "jobs", "--limit", "1", "--node-name", "ctl-node")
	if list.GetTotal() != 2 || len(list.GetJobs()) != 1 {
		t.Fatalf("jobs --limit 1: total %d, %d shown", list.GetTotal(), len(list.GetJobs()))
	}
	ctlFails(t, n, 2, []string{"unknown state"}, "jobs", "--state", "sleeping")

	// jobs --watch: successive tables with a rate column, or JSON lines.
	out = ctlOK(t, n, "jobs", "--watch", "--count", "2", "--interval", "50ms")
	if strings.Count(out, "of 2 job(s)") != 2 || !strings.Contains(out, "DOCS/S") {
		t.Fatalf("jobs --watch --count 2:\n%s", out)
	}
	out = ctlOK(t, n, "jobs", "--watch", "--json", "--count", "2", "--interval", "50ms")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 2 {
		t.Fatalf("jobs --watch --json: %d lines:\n%s", len(lines), out)
	}
	for _, l := range lines {
		var r messages.ListJobsResponse
		if err := protojson.Unmarshal([]byte(l), &r); err != nil || r.GetTotal() != 2 {
			t.Fatalf("jobs --watch --json line %q: %v", l, err)
		}
	}

	// job show, both modes.
	out = ctlOK(t, n, "job", "show", oneID)
	for _, want := range []string{"state", "completed", "docs_written", "20", "history (newest first)", "started", "added"} {
		if !strings.Contains(out, want) {
			t.Fatalf("job show lacks %q:\n%s", want, out)
		}
	}
	ctlFails(t, n, 1, []string{"not_found", "no-such-job"}, "job", "show", "no-such-job")
	ctlFails(t, n, 2, []string{"one job id"}, "job", "show")

	// job stop: the continuous job checkpoints, goes back to the queue, and
	// the node takes it again.
	out = ctlOK(t, n, "job", "stop", contID)
	if !strings.Contains(out, "stopped job "+contID) {
		t.Fatalf("job stop: %q", out)
	}
	got := waitCtlJob(t, n, contID, statusRunning)
	if !hasEvent(got, messages.JobEventType_JOB_EVENT_TYPE_STOPPED) {
		t.Fatalf("history after stop has no stopped event: %v", got.GetHistory())
	}
	var stopped messages.StopJobResponse
	ctlJSON(t, n, &stopped, "job", "stop", contID)
	if stopped.GetJob().GetId() != contID || !hasEvent(stopped.GetJob(), messages.JobEventType_JOB_EVENT_TYPE_STOPPED) {
		t.Fatalf("job stop --json: %v", &stopped)
	}
	waitCtlJob(t, n, contID, statusRunning)
	ctlFails(t, n, 1, []string{"failed_precondition", "not running"}, "job", "stop", oneID)

	// job restart: a completed one-shot job runs again; a running job is
	// stopped and requeued.
	out = ctlOK(t, n, "job", "restart", oneID)
	if !strings.Contains(out, "restarted job "+oneID) {
		t.Fatalf("job restart: %q", out)
	}
	waitCtlJob(t, n, oneID, statusCompleted)
	var restarted messages.RestartJobResponse
	ctlJSON(t, n, &restarted, "job", "restart", contID)
	if restarted.GetJob().GetId() != contID {
		t.Fatalf("job restart --json: %v", &restarted)
	}
	waitCtlJob(t, n, contID, statusRunning)

	// shares and config at run time.
	out = ctlOK(t, n, "shares", "set", "high/_replicator=200", "low/_replicator=50")
	if !strings.Contains(out, "high/_replicator  200") || !strings.Contains(out, "(any other)") {
		t.Fatalf("shares set:\n%s", out)
	}
	var shares messages.GetSharesResponse
	ctlJSON(t, n, &shares, "shares", "get")
	if shares.GetShares()["high/_replicator"] != 200 || shares.GetShares()["low/_replicator"] != 50 || shares.GetDefaultShares() != 100 {
		t.Fatalf("shares get --json: %v", &shares)
	}
	var setShares messages.SetSharesResponse
	ctlJSON(t, n, &setShares, "shares", "set", "low/_replicator=0")
	if _, still := setShares.GetShares()["low/_replicator"]; still || setShares.GetShares()["high/_replicator"] != 200 {
		t.Fatalf("shares set low=0 --json: %v", &setShares)
	}
	if out = ctlOK(t, n, "shares", "get"); !strings.Contains(out, "high/_replicator") || strings.Contains(out, "low/_replicator") {
		t.Fatalf("shares get:\n%s", out)
	}
	ctlFails(t, n, 2, []string{"KEY=SHARES"}, "shares", "set", "nonsense")
	var cfg messages.SetConfigResponse
	ctlJSON(t, n, &cfg, "config", "set", "max_jobs=7", "max_churn=3")
	if cfg.GetMaxJobs() != 7 || cfg.GetMaxChurn() != 3 {
		t.Fatalf("config set --json: %v", &cfg)
	}
	if out = ctlOK(t, n, "config", "set", "max_jobs=8"); !strings.Contains(out, "max_jobs = 8") || !strings.Contains(out, "max_churn = 3") {
		t.Fatalf("config set:\n%s", out)
	}
	var status messages.SchedulerStatusResponse
	sendJSON(t, n, &status, "scheduler", "couchrep.v1.SchedulerStatusRequest")
	if status.GetMaxJobs() != 8 || status.GetMaxChurn() != 3 {
		t.Fatalf("scheduler status after config set: %v", &status)
	}
	ctlFails(t, n, 2, []string{"unknown key"}, "config", "set", "max_cows=1")

	// nodes, both modes.
	var nodes messages.NodesResponse
	ctlJSON(t, n, &nodes, "nodes")
	self := nodeInfo(&nodes, "ctl-node")
	if self == nil || self.GetRunningJobs() != 1 || self.GetDraining() {
		t.Fatalf("nodes --json: %v", &nodes)
	}
	if out = ctlOK(t, n, "nodes"); !strings.Contains(out, "NODE") || !strings.Contains(out, "ctl-node") {
		t.Fatalf("nodes:\n%s", out)
	}

	// drain (text) hands the running job back; undrain (JSON) takes it
	// again; drain (JSON) reports the job id.
	out = ctlOK(t, n, "drain")
	if !strings.Contains(out, "1 job(s) handed back") || !strings.Contains(out, contID) {
		t.Fatalf("drain:\n%s", out)
	}
	if j := waitCtlJob(t, n, contID, statusPending); j.GetNode() != "" {
		t.Fatalf("drained job still on a node: %v", j)
	}
	ctlJSON(t, n, &nodes, "nodes")
	if self = nodeInfo(&nodes, "ctl-node"); !self.GetDraining() || self.GetRunningJobs() != 0 {
		t.Fatalf("nodes after drain: %v", self)
	}
	var undrained messages.UndrainResponse
	ctlJSON(t, n, &undrained, "undrain")
	waitCtlJob(t, n, contID, statusRunning)
	var drained messages.DrainResponse
	ctlJSON(t, n, &drained, "drain")
	if drained.GetReleased() != 1 || len(drained.GetJobIds()) != 1 || drained.GetJobIds()[0] != contID {
		t.Fatalf("drain --json: %v", &drained)
	}
	if out = ctlOK(t, n, "undrain"); !strings.Contains(out, "accepting jobs") {
		t.Fatalf("undrain: %q", out)
	}
	waitCtlJob(t, n, contID, statusRunning)

	// kill, both modes; the tree shows the restarts.
	if out = ctlOK(t, n, "kill", "scheduler", "chaos"); !strings.Contains(out, "killed couchrep_sup/scheduler") {
		t.Fatalf("kill: %q", out)
	}
	// rest_for_one restarts job_server too: wait for the tree to heal
	// before killing one of its children.
	waitUntil(t, "tree healed after killing the scheduler", 30*time.Second, func() bool {
		root := n.tree().GetRoot()
		return allRunning(root) && childrenByName(root)["job_server"].GetIncarnation() >= 2
	})
	var killed messages.KillResponse
	ctlJSON(t, n, &killed, "kill", "job_server/acceptor")
	if killed.GetPid() != "couchrep_sup/job_server/acceptor" {
		t.Fatalf("kill --json: %v", &killed)
	}
	waitUntil(t, "scheduler back", 30*time.Second, func() bool {
		return childrenByName(n.tree().GetRoot())["scheduler"].GetIncarnation() >= 2
	})
	out = ctlOK(t, n, "tree")
	for _, want := range []string{"node ctl-node", "couchrep_sup", "rest_for_one", "├─ scheduler", "└─ http_api", "jobs_sup"} {
		if !strings.Contains(out, want) {
			t.Fatalf("tree lacks %q:\n%s", want, out)
		}
	}

	// job cancel (text, JSON): a transient job is removed.
	if out = ctlOK(t, n, "job", "cancel", contID); !strings.Contains(out, "canceled job "+contID) {
		t.Fatalf("job cancel: %q", out)
	}
	ctlFails(t, n, 1, []string{"not_found"}, "job", "show", contID)
	var canceled messages.CancelJobResponse
	ctlJSON(t, n, &canceled, "job", "cancel", oneID)
	if canceled.GetId() != oneID {
		t.Fatalf("job cancel --json: %v", &canceled)
	}
	waitCtlJobs(t, n, 0)

	// Usage errors exit 2; every command has --help (exit 0).
	for _, args := range [][]string{{}, {"bogus"}, {"job"}, {"job", "frob", "x"}, {"shares"}, {"tree", "extra"},
		{"kill"}, {"replicate", "only-one"}, {"--no-such-flag", "tree"}, {"send", "scheduler"}} {
		if _, errOut, code := n.ctl(args...); code != 2 {
			t.Errorf("couchrepctl %v: exit %d, want 2: %s", args, code, errOut)
		}
	}
	for _, c := range []string{"tree", "jobs", "job show", "job stop", "job restart", "job cancel", "replicate", "kill",
		"shares get", "shares set", "config set", "drain", "undrain", "stop", "nodes", "send"} {
		out, errOut, code := runCtl(t, append(strings.Fields(c), "--help")...)
		if code != 0 || !strings.HasPrefix(out, "Usage: couchrepctl [flags] "+c) {
			t.Errorf("couchrepctl %s --help: exit %d, stdout %q, stderr %q", c, code, out, errOut)
		}
	}
	for _, args := range [][]string{{"--help"}, {"help"}, {"job", "--help"}} {
		if out, _, code := runCtl(t, args...); code != 0 || !strings.Contains(out, "Exit codes: 0 ok, 1 error, 2 usage") {
			t.Errorf("couchrepctl %v: exit %d:\n%s", args, code, out)
		}
	}
	// An unreachable node is an error (1), not a usage error.
	if _, errOut, code := runCtl(t, "--node", "127.0.0.1:1", "tree"); code != 1 || !strings.Contains(errOut, "not reachable") {
		t.Fatalf("tree on a closed port: exit %d: %s", code, errOut)
	}

	// stop: the daemon stops cleanly, as on SIGTERM, and exits 0.
	if out = ctlOK(t, n, "stop"); !strings.Contains(out, "node ctl-node stopping") {
		t.Fatalf("stop: %q", out)
	}
	if err := n.waitExit(60 * time.Second); err != nil {
		t.Fatalf("couchrepd after stop: %v", err)
	}
	if len(n.logLines("stop requested")) == 0 || len(n.logLines(`"child":"http_api"`, "child_exited")) == 0 {
		t.Fatalf("no clean stop in the logs")
	}
}

func hasEvent(j *messages.JobSummary, typ messages.JobEventType) bool {
	for _, e := range j.GetHistory() {
		if e.GetType() == typ {
			return true
		}
	}
	return false
}

func nodeInfo(r *messages.NodesResponse, name string) *messages.NodeInfo {
	for _, n := range r.GetNodes() {
		if n.GetName() == name {
			return n
		}
	}
	return nil
}

// sendJSON sends a message with `couchrepctl --json send` and decodes the
// reply.
func sendJSON(t *testing.T, n *nodeProc, into proto.Message, args ...string) {
	t.Helper()
	ctlJSON(t, n, into, append([]string{"send"}, args...)...)
}

// changesProxy forwards to a CouchDB-protocol server, counting per document
// how often it was fetched (_bulk_get, GET ?open_revs) and recording the
// since= of every _changes request.
type changesProxy struct {
	*httptest.Server
	mu      sync.Mutex
	fetched map[string]int
	since   []string
}

func newChangesProxy(t *testing.T, target string) *changesProxy {
	u, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	rp := httputil.NewSingleHostReverseProxy(u)
	p := &changesProxy{fetched: map[string]int{}}
	p.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p.mu.Lock()
		switch {
		case strings.HasSuffix(r.URL.Path, "/_bulk_get") && r.Method == http.MethodPost:
			var body bytes.Buffer
			_, _ = body.ReadFrom(r.Body)
			var q struct {
				Docs []struct{ ID string } `json:"docs"`
			}
			_ = json.Unmarshal(body.Bytes(), &q)
			for _, d := range q.Docs {
				p.fetched[d.ID]++
			}
			r.Body = io.NopCloser(bytes.NewReader(body.Bytes()))
			r.ContentLength = int64(body.Len())
		case r.URL.Query().Get("open_revs") != "":
			parts := strings.SplitN(strings.TrimPrefix(r.URL.Path, "/"), "/", 2)
			if len(parts) == 2 {
				p.fetched[parts[1]]++
			}
		case strings.HasSuffix(r.URL.Path, "/_changes"):
			p.since = append(p.since, r.URL.Query().Get("since"))
		}
		p.mu.Unlock()
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(p.Close)
	return p
}

// mark returns how many _changes requests were seen so far.
func (p *changesProxy) mark() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.since)
}

// sinceAfter returns the since= values of the _changes requests after mark.
func (p *changesProxy) sinceAfter(mark int) []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.since[mark:]...)
}

func (p *changesProxy) fetchCounts() map[string]int {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[string]int, len(p.fetched))
	for k, v := range p.fetched {
		out[k] = v
	}
	return out
}

// seqNumber reads a PouchDB sequence ("12", 12, "\"12\"").
func seqNumber(s string) (int, bool) {
	n, err := strconv.Atoi(strings.Trim(s, `"`))
	return n, err == nil
}

// TestCtlDrainHandsJobsToAnotherNode: two couchrepd processes share one
// store; draining the first (through couchrepctl only) hands its running
// continuous jobs back to the queue checkpointed, the second takes them and
// resumes from the checkpoint: nothing is lost, no document is fetched
// twice, and no _changes request after the handover starts before the
// checkpoint.
func TestCtlDrainHandsJobsToAnotherNode(t *testing.T) {
	skipShort(t)
	srv := testserver.StartPouchDB(t)
	srcDB := srv.CreateDB(t, "dsrc")
	const before, after, nJobs = 200, 100, 3
	put := func(from, to int) {
		var docs []map[string]any
		for i := from; i < to; i++ {
			docs = append(docs, map[string]any{"_id": fmt.Sprintf("doc%04d", i), "n": i})
		}
		srv.PutDocs(t, srcDB, docs...)
	}
	put(0, before)
	proxy := newChangesProxy(t, srv.URL)
	src := proxy.URL + "/dsrc"

	store := filepath.Join(t.TempDir(), "shared.db")
	dirA, dirB := t.TempDir(), t.TempDir()
	// Nodes sharing a store must share [couchdb] uuid: it is part of every
	// replication id, hence of the checkpoint a job resumes from. (Each data
	// directory otherwise gets its own generated uuid, and a job moving to
	// the other node would start over.)
	cfg := jobsConfig + "[couchdb]\nuuid = 5e0c1d2a7f3b4c6d8e9fa0b1c2d3e4f5\n"
	a := startNode(t, nodeOptions{name: "drain-a", dataDir: dirA, store: store, config: writeConfig(t, dirA, cfg)})
	var ids, targets []string
	for i := range nJobs {
		tgt := srv.CreateDB(t, fmt.Sprintf("dtgt%d", i))
		var rep messages.ReplicateResponse
		ctlJSON(t, a, &rep, "replicate", "--continuous", src, tgt)
		ids, targets = append(ids, rep.GetId()), append(targets, tgt)
	}
	for i, id := range ids {
		if j := waitCtlJob(t, a, id, statusRunning); j.GetNode() != "drain-a" {
			t.Fatalf("job %s runs on %q", id, j.GetNode())
		}
		waitDocCount(t, srv, targets[i], before)
	}
	b := startNode(t, nodeOptions{name: "drain-b", dataDir: dirB, store: store, config: writeConfig(t, dirB, cfg)})

	mark := proxy.mark()
	var drained messages.DrainResponse
	ctlJSON(t, a, &drained, "drain")
	if drained.GetReleased() != nJobs {
		t.Fatalf("drain released %d jobs, want %d: %v", drained.GetReleased(), nJobs, &drained)
	}
	// Each job went back checkpointed at the source's end.
	minCheckpoint := before
	for _, id := range drained.GetJobIds() {
		var show messages.GetJobResponse
		ctlJSON(t, b, &show, "job", "show", id)
		cp, ok := seqNumber(show.GetJob().GetStats().GetCheckpointedSourceSeq())
		if !ok || cp < before {
			t.Fatalf("job %s handed back with checkpoint %q, want >= %d", id, show.GetJob().GetStats().GetCheckpointedSourceSeq(), before)
		}
		minCheckpoint = min(minCheckpoint, cp)
	}
	// The other node takes all of them; the drained one runs none.
	list := waitCtlJobs(t, b, nJobs, "--state", "running", "--node-name", "drain-b")
	for _, j := range list.GetJobs() {
		if j.GetNode() != "drain-b" {
			t.Fatalf("job %s runs on %q", j.GetId(), j.GetNode())
		}
	}
	var onA messages.ListJobsResponse
	ctlJSON(t, a, &onA, "jobs", "--state", "running", "--node-name", "drain-a")
	if onA.GetTotal() != 0 {
		t.Fatalf("drained node still runs %v", onA.GetJobs())
	}
	// New documents reach every target through the new node.
	put(before, before+after)
	for _, tgt := range targets {
		waitDocCount(t, srv, tgt, before+after)
	}
	// Nothing copied twice: each document fetched once per job, and the
	// new node read the feed from the checkpoint on, not from the start.
	counts := proxy.fetchCounts()
	for i := range before + after {
		id := fmt.Sprintf("doc%04d", i)
		if counts[id] > nJobs {
			t.Errorf("%s fetched %d times by %d jobs", id, counts[id], nJobs)
		}
	}
	sinces := proxy.sinceAfter(mark)
	if len(sinces) == 0 {
		t.Fatal("no _changes request after the drain")
	}
	for _, s := range sinces {
		if n, ok := seqNumber(s); !ok || n < minCheckpoint {
			t.Errorf("a _changes request after the drain started at since=%q, before the checkpoint %d", s, minCheckpoint)
		}
	}
	var stoppedB messages.StopNodeResponse
	ctlJSON(t, b, &stoppedB, "stop")
	if stoppedB.GetNode() != "drain-b" {
		t.Fatalf("stop --json: %v", &stoppedB)
	}
	if err := b.waitExit(60 * time.Second); err != nil {
		t.Fatalf("drain-b after stop: %v", err)
	}
	ctlOK(t, a, "stop")
	if err := a.waitExit(60 * time.Second); err != nil {
		t.Fatalf("drain-a after stop: %v", err)
	}
}
