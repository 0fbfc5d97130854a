package integration

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/couchrep/couchrep/internal/cluster"
	"github.com/couchrep/couchrep/internal/kv"
	"github.com/couchrep/couchrep/internal/kv/postgres"
	"github.com/couchrep/couchrep/internal/kv/postgres/pgtest"
	"github.com/couchrep/couchrep/internal/kv/sqlite"
	"github.com/couchrep/couchrep/messages"
)

// refusedStart runs couchrepd with args (and extra environment) and
// requires it to exit with code want within a bound (a node that starts
// instead is killed and fails the test); it returns stderr.
func refusedStart(t *testing.T, want int, env []string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(binDir, "couchrepd"), args...)
	cmd.Env = append(os.Environ(), env...)
	var out syncBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("couchrepd %v still ran after 30s, want it to refuse to start (exit %d):\n%s", args, want, out.String())
	}
	code := 0
	if exitErr, ok := err.(*exec.ExitError); ok {
		code = exitErr.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	if code != want {
		t.Fatalf("couchrepd %v: exit %d, want %d:\n%s", args, code, want, out.String())
	}
	return out.String()
}

func mustContain(t *testing.T, what, s string, wants ...string) {
	t.Helper()
	for _, w := range wants {
		if !strings.Contains(s, w) {
			t.Errorf("%s does not say %q:\n%s", what, w, s)
		}
	}
}

// nodeRecord returns the membership record of name as couchrepctl nodes
// shows it (asked of n).
func nodeRecord(t *testing.T, n *nodeProc, name string) *messages.NodeInfo {
	t.Helper()
	var resp messages.NodesResponse
	ctlJSON(t, n, &resp, "nodes")
	for _, ni := range resp.GetNodes() {
		if ni.GetName() == name {
			return ni
		}
	}
	t.Fatalf("couchrepctl nodes lists no %s: %v", name, &resp)
	return nil
}

// TestDataDirBelongsToOneProcess (issue 24, finding 3): a second couchrepd
// on a data directory in use exits 2 at once, naming the pid holding it,
// and the running node's membership record keeps its own addresses.
func TestDataDirBelongsToOneProcess(t *testing.T) {
	skipShort(t)
	dir := t.TempDir()
	first := startNode(t, nodeOptions{name: "only", dataDir: dir, env: []string{"COUCHREP_COUCHREP_HEARTBEAT_INTERVAL=300ms"}})
	pid := first.cmd.Process.Pid
	waitFor(t, 30*time.Second, "the node's admin address in its record", func() error {
		if got := nodeRecord(t, first, "only").GetAdminAddress(); got != first.admin {
			return fmt.Errorf("admin %q, want %q", got, first.admin)
		}
		return nil
	})
	if b, err := os.ReadFile(filepath.Join(dir, "couchrepd.lock")); err != nil || strings.TrimSpace(string(b)) != strconv.Itoa(pid) {
		t.Fatalf("<data>/couchrepd.lock holds %q, %v; want the node's pid %d", b, err, pid)
	}
	stderr := refusedStart(t, 2, nil, "--data", dir, "--admin", "127.0.0.1:0", "--http", "127.0.0.1:0", "--node-name", "only")
	mustContain(t, "the second couchrepd's stderr", stderr, "data directory", "in use", "pid "+strconv.Itoa(pid), "couchrepd.lock")

	rec := nodeRecord(t, first, "only")
	if !rec.GetAlive() || rec.GetAdminAddress() != first.admin {
		t.Fatalf("node record after the second start: alive %v, admin %q; want the first node's %q", rec.GetAlive(), rec.GetAdminAddress(), first.admin)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "admin.addr")); err != nil || strings.TrimSpace(string(b)) != first.admin {
		t.Fatalf("<data>/admin.addr = %q, %v; want the first node's %q", b, err, first.admin)
	}
	if !allRunning(first.tree().GetRoot()) {
		t.Fatal("the first node's tree is not whole")
	}
}

// TestSameNodeNameOnOneStore (issue 24, finding 3): two data directories
// on one store (SQLite, PostgreSQL) under one node name: the second node
// refuses to start while the first's membership lease runs (naming the
// node, its pid and when the lease expires), and starts once it expired.
// A node restarted on its own data directory after a SIGKILL need not wait
// for its old lease. A holder that resumes after its lease expired and
// another node took the name stops (exit 1) instead of running beside it.
func TestSameNodeNameOnOneStore(t *testing.T) {
	skipShort(t)
	for _, tc := range []struct {
		name  string
		store func(t *testing.T) string
	}{
		{"sqlite", func(t *testing.T) string { return filepath.Join(t.TempDir(), "shared.db") }},
		{"postgres", func(t *testing.T) string { return pgtest.Start(t).NewDatabase(t) }},
	} {
		t.Run(tc.name, func(t *testing.T) { testSameNodeName(t, tc.store(t)) })
	}
}

func testSameNodeName(t *testing.T, store string) {
	root := t.TempDir()
	// A lease of 3 s: long enough that a loaded machine does not make a
	// live node look gone, short enough to wait out twice.
	env := []string{"COUCHREP_COUCHREP_HEARTBEAT_INTERVAL=1s"}
	optsA := nodeOptions{name: "twin", dataDir: filepath.Join(root, "a"), store: store, env: env}
	optsB := nodeOptions{name: "twin", dataDir: filepath.Join(root, "b"), store: store, env: env}
	a := startNode(t, optsA)
	pid := a.cmd.Process.Pid
	// The record carries the admin address from the heartbeat after the
	// endpoint listens.
	waitFor(t, 30*time.Second, "the node's admin address in its record", func() error {
		if got := nodeRecord(t, a, "twin").GetAdminAddress(); got != a.admin {
			return fmt.Errorf("admin %q, want %q", got, a.admin)
		}
		return nil
	})

	stderr := refusedStart(t, 2, env, "--data", optsB.dataDir, "--store", store, "--admin", "127.0.0.1:0", "--http", "127.0.0.1:0", "--node-name", "twin")
	mustContain(t, "the second node's stderr", stderr, `node name "twin"`, "pid "+strconv.Itoa(pid), optsA.dataDir, "lease expires at")
	if _, err := os.Stat(filepath.Join(optsB.dataDir, "admin.addr")); err == nil {
		t.Fatal("the refused node started its admin endpoint")
	}
	if rec := nodeRecord(t, a, "twin"); rec.GetAdminAddress() != a.admin {
		t.Fatalf("the refused node changed the record: admin %q, want %q", rec.GetAdminAddress(), a.admin)
	}

	// Killed, the node comes back on its own data directory at once: its
	// lease is still running, but the process holding it is gone.
	a.kill()
	a = startNode(t, optsA)

	// Killed again, its lease runs out after three heartbeat intervals;
	// then the other data directory may take the name.
	a.kill()
	var db kv.Database
	var err error
	if postgres.IsDSN(store) {
		db, err = postgres.Open(context.Background(), store, postgres.Options{})
	} else {
		db, err = sqlite.Open(context.Background(), store, sqlite.Options{})
	}
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	reg := cluster.New(db, cluster.Options{})
	waitExpired := func(what string) {
		t.Helper()
		waitFor(t, 30*time.Second, what, func() error {
			ms, err := reg.Members(context.Background())
			if err == nil && (len(ms) != 1 || ms[0].Alive) {
				err = fmt.Errorf("members %v", ms)
			}
			return err
		})
	}
	waitExpired("the killed node's lease expiring")
	b := startNode(t, optsB)
	holder := func(n *nodeProc) {
		t.Helper()
		waitFor(t, 30*time.Second, "the holder's record", func() error {
			if rec := nodeRecord(t, n, "twin"); !rec.GetAlive() || rec.GetAdminAddress() != n.admin {
				return fmt.Errorf("alive %v, admin %q; want %q", rec.GetAlive(), rec.GetAdminAddress(), n.admin)
			}
			return nil
		})
	}
	holder(b)

	// A holder that comes back after its lease expired (paused here;
	// cut off from the store alike) finds its name taken and stops,
	// rather than run beside the new holder under one name.
	if err := syscall.Kill(b.cmd.Process.Pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	waitExpired("the paused node's lease expiring")
	c := startNode(t, optsA)
	holder(c)
	if err := syscall.Kill(b.cmd.Process.Pid, syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	select {
	case <-b.exited:
	case <-time.After(30 * time.Second):
		t.Fatalf("the paused node still runs 30 s after it resumed under a taken name:\n%s", b.logs.String())
	}
	if code := b.cmd.ProcessState.ExitCode(); code != 1 || len(b.logLines("node name taken over", "pid "+strconv.Itoa(c.cmd.Process.Pid))) == 0 {
		t.Fatalf("the resumed node exited %d; want 1 with a log naming the new holder's pid %d:\n%s", code, c.cmd.Process.Pid, b.logs.String())
	}
	holder(c)
}

// TestUUIDChangeIsRefusedUnlessAdopted (issue 24, finding 6): a node whose
// [couchdb] uuid is not the one its data directory and store recorded
// refuses to start (exit 2) saying both and how to proceed; adopting the
// uuid on purpose (--adopt-uuid UUID) starts it and says, at warn level and
// plainly on stderr, which jobs restart from zero; afterwards the
// configured uuid is the recorded one.
func TestUUIDChangeIsRefusedUnlessAdopted(t *testing.T) {
	skipShort(t)
	dir := t.TempDir()
	opts := nodeOptions{name: "uuid-node", dataDir: dir, config: writeConfig(t, dir, jobsConfig)}
	n := startNode(t, opts)
	generated, err := os.ReadFile(filepath.Join(dir, "couchdb_uuid"))
	if err != nil {
		t.Fatal(err)
	}
	old := strings.TrimSpace(string(generated))
	addr := n.httpAddr("")
	if r := api(t, addr, "POST", "/_replicate", unreachableContinuous); r.status != 202 {
		t.Fatalf("POST /_replicate: %d %s", r.status, r.body)
	}
	var jobs messages.ListJobsResponse
	ctlJSON(t, n, &jobs, "jobs")
	if len(jobs.GetJobs()) != 1 {
		t.Fatalf("jobs: %v, want one", &jobs)
	}
	jobID := jobs.GetJobs()[0].GetId()
	if err := n.stop(syscall.SIGTERM, time.Minute); err != nil {
		t.Fatalf("stop: %v", err)
	}

	const configured = "00112233445566778899aabbccddeeff"
	env := []string{"COUCHREP_COUCHDB_UUID=" + configured}
	stderr := refusedStart(t, 2, env, "--data", dir, "--config", opts.config, "--admin", "127.0.0.1:0", "--http", "127.0.0.1:0", "--node-name", opts.name)
	mustContain(t, "the refusal", stderr, old, configured, "--adopt-uuid "+configured, "remove [couchdb] uuid")

	adopted := opts
	adopted.env = env
	adopted.extra = []string{"--adopt-uuid", configured}
	n = startNode(t, adopted)
	waitFor(t, 30*time.Second, "the uuid change note on stderr", func() error {
		if !strings.Contains(n.logs.String(), "server uuid changed from "+old+" to "+configured) {
			return errors.New("not printed")
		}
		return nil
	})
	mustContain(t, "stderr", n.logs.String(), "1 unfinished job(s) restart from zero", "\n  "+jobID+"\n")
	lines := n.logLines(`"level":"warn"`, "server uuid replaced")
	if len(lines) != 1 {
		t.Fatalf("warn log lines about the uuid change: %d, want 1:\n%s", len(lines), n.logs.String())
	}
	var warn struct {
		Old  string   `json:"old_uuid"`
		New  string   `json:"new_uuid"`
		Jobs int      `json:"jobs"`
		IDs  []string `json:"job_ids"`
	}
	if err := json.Unmarshal([]byte(lines[0]), &warn); err != nil {
		t.Fatal(err)
	}
	if warn.Old != old || warn.New != configured || warn.Jobs != 1 || len(warn.IDs) != 1 || warn.IDs[0] != jobID {
		t.Fatalf("warn log %+v, want %s -> %s with job %s", warn, old, configured, jobID)
	}
	if err := n.stop(syscall.SIGTERM, time.Minute); err != nil {
		t.Fatalf("stop: %v", err)
	}

	// The configured uuid is now the recorded one: a plain start is quiet.
	plain := opts
	plain.env = env
	n = startNode(t, plain)
	if lines := n.logLines("server uuid"); len(lines) != 0 {
		t.Fatalf("a start with the recorded uuid logs a uuid change: %v", lines)
	}
}

// unreachableContinuous is a continuous replication whose endpoints refuse
// connections: its job stays unfinished.
const unreachableContinuous = `{"source":"http://127.0.0.1:1/a","target":"http://127.0.0.1:1/b","continuous":true}`

// TestVersion (issue 24, "Installable"): both binaries answer --version
// with the module version, the VCS revision they were built from (a
// commit of this repository), and the Go version, and exit 0.
func TestVersion(t *testing.T) {
	skipShort(t)
	// The package's binaries may be built without VCS stamping (GOFLAGS
	// -buildvcs=false); build a stamped pair as `make build` does by default.
	dir := t.TempDir()
	build := exec.Command("go", "build", "-buildvcs=true", "-o", dir+string(os.PathSeparator), "github.com/couchrep/couchrep/cmd/couchrepd", "github.com/couchrep/couchrep/cmd/couchrepctl")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build -buildvcs=true: %v\n%s", err, out)
	}
	line := regexp.MustCompile(`^(couchrepd|couchrepctl) (\S+) \(github\.com/couchrep/couchrep, revision ([0-9a-f]{40})(, dirty)?, [0-9T:Z+-]+, (go\S+)\)\n$`)
	var revs []string
	for _, bin := range []string{"couchrepd", "couchrepctl"} {
		for _, d := range []string{dir, binDir} {
			res := runCmd(t, filepath.Join(d, bin), "--version")
			if res.code != 0 || !strings.HasPrefix(res.stdout, bin+" ") || !strings.Contains(res.stdout, runtime.Version()) {
				t.Fatalf("%s --version (%s): exit %d, stdout %q, stderr %q; want exit 0 and the version with %s", bin, d, res.code, res.stdout, res.stderr, runtime.Version())
			}
			if d != dir {
				continue
			}
			m := line.FindStringSubmatch(res.stdout)
			if m == nil {
				t.Fatalf("%s --version = %q, want %s", bin, res.stdout, line)
			}
			if m[5] != runtime.Version() {
				t.Errorf("%s --version says %s, built with %s", bin, m[5], runtime.Version())
			}
			if m[4] != "" && !strings.HasSuffix(m[2], "+dirty") {
				t.Errorf("%s --version: dirty build, version %q without +dirty", bin, m[2])
			}
			if err := exec.Command("git", "cat-file", "-e", m[3]+"^{commit}").Run(); err != nil {
				t.Errorf("%s --version names revision %s, not a commit of this repository: %v", bin, m[3], err)
			}
			revs = append(revs, m[3])
		}
	}
	if len(revs) != 2 || revs[0] != revs[1] {
		t.Fatalf("revisions %v, want one revision for both binaries", revs)
	}
}
