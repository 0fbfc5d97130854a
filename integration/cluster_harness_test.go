package integration

import (
	"bytes"
	"cmp"
	"context"
	"database/sql"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/rs/zerolog"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/couchrep/couchrep/internal/admin"
	"github.com/couchrep/couchrep/internal/config"
	"github.com/couchrep/couchrep/internal/jobqueue"
	"github.com/couchrep/couchrep/internal/kv"
	"github.com/couchrep/couchrep/internal/kv/postgres"
	"github.com/couchrep/couchrep/internal/kv/sqlite"
	"github.com/couchrep/couchrep/internal/repjob"
	"github.com/couchrep/couchrep/messages"
	"github.com/couchrep/couchrep/messages/messagesconnect"
)

// clusterConfig is the configuration every node of a test cluster shares.
type clusterConfig struct {
	// ActivityTimeout is [couchrep] activity_timeout: how long a dead
	// node's jobs stay with it.
	ActivityTimeout time.Duration
	// MaxJobs is [replicator] max_jobs per node.
	MaxJobs int
	// Watch is the servers whose _replicator databases the api_frontend
	// nodes follow.
	Watch []string
	// Store is the job store the nodes share: "" for an embedded store
	// file in the test's directory, or a postgres:// URL.
	Store string
	// Env is more environment variables for every node (they win over
	// the harness's).
	Env []string
	// LogLevel is the nodes' log level ("" for info).
	LogLevel string
}

// monitorInterval is the activity monitor's check interval for a timeout
// (jobs.MonitorOptions: a quarter of it, at most 5 s).
func monitorInterval(timeout time.Duration) time.Duration {
	return max(min(5*time.Second, timeout/4), 10*time.Millisecond)
}

// failoverBound is how long a SIGKILLed node's jobs may take to run
// elsewhere: the activity timeout, plus up to one monitor interval before a
// sample covers the job's last update and one more until the check that
// finds it stale (each with the monitor's ±10 % jitter), plus slack for a
// loaded machine (the other node's accept is woken by a watch).
func failoverBound(timeout time.Duration) time.Duration {
	return timeout + monitorInterval(timeout)*22/10 + 3*time.Second
}

// clusterNode is one node of a test cluster: its options survive restarts.
type clusterNode struct {
	name  string
	types []string
	opts  nodeOptions
	proc  *nodeProc // nil while down
	// starts counts process starts.
	starts int
}

func (n *clusterNode) has(typ string) bool { return slices.Contains(n.types, typ) }

func (n *clusterNode) up() bool {
	if n.proc == nil {
		return false
	}
	select {
	case <-n.proc.exited:
		return false
	default:
		return true
	}
}

// testCluster is N couchrepd processes sharing one store: a file, or a
// PostgreSQL database (clusterConfig.Store).
type testCluster struct {
	t         testing.TB
	cfg       clusterConfig
	storePath string // the file or the postgres:// URL
	uuid      string
	nodes     []*clusterNode
	db        kv.Database
	queue     *jobqueue.Queue
	store     *repjob.Store

	mu  sync.Mutex
	log []string // what the harness did, for the failure report
}

// startCluster starts one node per entry of types (each a node_types list)
// on one shared store, with the short timeouts of cfg.
func startCluster(t testing.TB, cfg clusterConfig, types ...[]string) *testCluster {
	t.Helper()
	dir := t.TempDir()
	c := &testCluster{t: t, cfg: cfg, storePath: filepath.Join(dir, "shared.db"), uuid: "c4a05c1ba1ef00d5c4a05c1ba1ef00d5"}
	if cfg.Store != "" {
		c.storePath = cfg.Store
	}
	for i, ty := range types {
		name := fmt.Sprintf("n%d", i)
		data := filepath.Join(dir, name)
		if err := os.MkdirAll(data, 0o755); err != nil {
			t.Fatal(err)
		}
		env := []string{
			"COUCHREP_COUCHREP_NODE_TYPES=" + strings.Join(ty, ","),
			"COUCHREP_COUCHREP_ACTIVITY_TIMEOUT=" + cfg.ActivityTimeout.String(),
			"COUCHREP_COUCHREP_HEARTBEAT_INTERVAL=250ms",
			"COUCHREP_COUCHREP_CLUSTER_QUIET_PERIOD=1s",
			"COUCHREP_COUCHREP_RUN_LOG=true",
			"COUCHREP_COUCHDB_UUID=" + c.uuid,
			fmt.Sprintf("COUCHREP_REPLICATOR_MAX_JOBS=%d", cfg.MaxJobs),
			"COUCHREP_REPLICATOR_INTERVAL=1000",
			"COUCHREP_REPLICATOR_STARTUP_JITTER=100",
			"COUCHREP_REPLICATOR_CHECKPOINT_INTERVAL=1000",
			"COUCHREP_REPLICATOR_MIN_BACKOFF_PENALTY_SEC=2",
			"COUCHREP_REPLICATOR_MAX_BACKOFF_PENALTY_SEC=4",
			"COUCHREP_REPLICATOR_CLUSTER_START_PERIOD=0",
			"COUCHREP_LOG_LEVEL=info",
		}
		if slices.Contains(ty, config.NodeTypeAPIFrontend) && len(cfg.Watch) > 0 {
			env = append(env, "COUCHREP_COUCHREP_WATCH="+strings.Join(cfg.Watch, ","))
		}
		env = append(env, cfg.Env...)
		level := cmp.Or(cfg.LogLevel, "info")
		c.nodes = append(c.nodes, &clusterNode{name: name, types: ty,
			opts: nodeOptions{name: name, dataDir: data, store: c.storePath, env: env, extra: []string{"--log-level", level}}})
		if d := os.Getenv("COUCHREP_HARNESS_LOGDIR"); d != "" {
			// Kept after the run (the test's directory is removed): a
			// benchmark's node logs, to explain its findings.
			c.nodes[i].opts.logFile = filepath.Join(d, name+".log")
		} else if os.Getenv("COUCHREP_HARNESS_ECHO") != "" {
			c.nodes[i].opts.logFile = filepath.Join(data, "node.log")
		}
	}
	for _, n := range c.nodes {
		c.start(n)
	}
	var db kv.Database
	var err error
	if postgres.IsDSN(c.storePath) {
		db, err = postgres.Open(context.Background(), c.storePath, postgres.Options{})
	} else {
		db, err = sqlite.Open(context.Background(), c.storePath, sqlite.Options{})
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	c.db = db
	c.queue = jobqueue.New(db, jobqueue.Options{NodeName: "test", Logger: zerolog.Nop()})
	c.store = repjob.New(c.queue, db, repjob.Options{ServerUUID: c.uuid, ActivityTimeout: cfg.ActivityTimeout})
	t.Cleanup(func() {
		if t.Failed() {
			c.mu.Lock()
			t.Logf("harness log:\n%s", strings.Join(c.log, "\n"))
			c.mu.Unlock()
		}
	})
	return c
}

func (c *testCluster) logf(format string, args ...any) {
	line := time.Now().Format("15:04:05.000") + " " + fmt.Sprintf(format, args...)
	c.mu.Lock()
	c.log = append(c.log, line)
	c.mu.Unlock()
	if os.Getenv("COUCHREP_HARNESS_ECHO") != "" {
		// A long benchmark's progress, as it happens (each node's output
		// goes to node.log in its data directory then).
		fmt.Fprintln(os.Stderr, "harness:", line)
	}
}

// start starts n's process (it must be down).
func (c *testCluster) start(n *clusterNode) {
	c.t.Helper()
	n.proc = startNode(c.t, n.opts)
	n.starts++
	c.logf("started %s (%d)", n.name, n.proc.cmd.Process.Pid)
}

// kill SIGKILLs n.
func (c *testCluster) kill(n *clusterNode) {
	n.proc.kill()
	c.logf("SIGKILL %s", n.name)
}

// drain stops n cleanly (SIGTERM): its jobs checkpoint and go back to the
// queue, its membership record says it left.
func (c *testCluster) drain(n *clusterNode) error {
	err := n.proc.stop(syscall.SIGTERM, 90*time.Second)
	c.logf("SIGTERM %s: %v", n.name, err)
	return err
}

// live returns the nodes that are up.
func (c *testCluster) live() []*clusterNode {
	var out []*clusterNode
	for _, n := range c.nodes {
		if n.up() {
			out = append(out, n)
		}
	}
	return out
}

// admin is a client of n's admin endpoint.
func (n *clusterNode) admin() messagesconnect.AdminServiceClient {
	return messagesconnect.NewAdminServiceClient(http.DefaultClient, "http://"+n.proc.admin,
		connect.WithInterceptors(connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
			return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
				req.Header().Set(admin.VersionHeader, admin.Version)
				return next(ctx, req)
			}
		})))
}

// nodes asks n for the cluster view: `couchrepctl nodes` when this
// couchrepctl has the command, else the same request in a Send envelope
// addressed to the clustering actor.
func (c *testCluster) nodesView(n *clusterNode) (*messages.NodesResponse, error) {
	out, _, code := n.proc.ctl("--json", "nodes")
	if code == 0 {
		var resp messages.NodesResponse
		if err := protojson.Unmarshal([]byte(out), &resp); err == nil {
			return &resp, nil
		}
	}
	inner, err := anypb.New(&messages.NodesRequest{})
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := n.admin().Send(ctx, connect.NewRequest(&messages.SendRequest{Actor: "clustering", Message: inner}))
	if err != nil {
		return nil, fmt.Errorf("nodes from %s: %w", n.name, err)
	}
	var resp messages.NodesResponse
	if err := res.Msg.GetReply().UnmarshalTo(&resp); err != nil {
		return nil, err
	}
	return &resp, nil
}

// actorPaths lists every actor of n's tree (paths relative to the root,
// "job_server/jobs_sup/..."), the root excluded.
func actorPaths(tr *messages.TreeResponse) []string {
	var out []string
	var walk func(prefix string, t *messages.TreeNode)
	walk = func(prefix string, t *messages.TreeNode) {
		for _, ch := range t.GetChildren() {
			p := ch.GetName()
			if prefix != "" {
				p = prefix + "/" + p
			}
			out = append(out, p)
			walk(p, ch)
		}
	}
	walk("", tr.GetRoot())
	return out
}

// treeWhole checks that every actor of a node's tree is running and that
// the node has every top-level child of the design's tree.
func treeWhole(tr *messages.TreeResponse) error {
	want := []string{"event_bus", "clustering", "connection_pool", "rate_limiter", "scheduler", "job_server",
		"activity_monitor", "doc_processor", "http_api"}
	var got []string
	for _, ch := range tr.GetRoot().GetChildren() {
		got = append(got, ch.GetName())
	}
	if !slices.Equal(got, want) {
		return fmt.Errorf("top-level children %v, want %v", got, want)
	}
	var bad []string
	var walk func(path string, t *messages.TreeNode)
	walk = func(path string, t *messages.TreeNode) {
		if t.GetState() != messages.ChildState_CHILD_STATE_RUNNING {
			bad = append(bad, path+"="+t.GetState().String())
		}
		for _, ch := range t.GetChildren() {
			walk(path+"/"+ch.GetName(), ch)
		}
	}
	walk(tr.GetRoot().GetName(), tr.GetRoot())
	if len(bad) > 0 {
		return fmt.Errorf("actors not running: %v", bad)
	}
	return nil
}

// integrityCheck runs SQLite's integrity check on the store file (a
// PostgreSQL store has its own guarantees: nothing to check).
func integrityCheck(path string) error {
	if postgres.IsDSN(path) {
		return nil
	}
	db, err := sql.Open("sqlite", "file:"+path+"?mode=ro")
	if err != nil {
		return err
	}
	defer db.Close()
	var res string
	if err := db.QueryRow("PRAGMA integrity_check").Scan(&res); err != nil {
		return err
	}
	if res != "ok" {
		return fmt.Errorf("integrity_check: %s", res)
	}
	return nil
}

// pick returns a random element of xs.
func pick[T any](rng *rand.Rand, xs []T) T { return xs[rng.IntN(len(xs))] }

// TestNodeStoreFailures: a node given a store it cannot open exits at once
// with an error naming the store and the reason, writes nothing to that
// file, and leaves the store the other nodes share intact; a node whose
// store turns to garbage under it stops with an error naming the store.
func TestNodeStoreFailures(t *testing.T) {
	skipShort(t)
	dir := t.TempDir()
	shared := filepath.Join(dir, "shared.db")
	good := startNode(t, nodeOptions{name: "good", store: shared})

	garbage := filepath.Join(dir, "garbage.db")
	junk := bytes.Repeat([]byte("not a database "), 4096)
	if err := os.WriteFile(garbage, junk, 0o644); err != nil {
		t.Fatal(err)
	}
	asDir := filepath.Join(dir, "a-directory.db")
	if err := os.Mkdir(asDir, 0o755); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, store, want string
	}{
		{"not an SQLite file", garbage, "not an SQLite file"},
		{"a directory", asDir, "is a directory"},
		{"missing parent directory", filepath.Join(dir, "nope", "x.db"), "x.db"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := runCmd(t, filepath.Join(binDir, "couchrepd"), "--data", t.TempDir(), "--admin", "127.0.0.1:0",
				"--http", "127.0.0.1:0", "--node-name", "bad", "--store", tc.store)
			if r.code == 0 || !strings.Contains(r.stderr+r.stdout, tc.want) || !strings.Contains(r.stderr+r.stdout, "job store") {
				t.Fatalf("exit %d, want a failure naming the job store and %q:\n%s%s", r.code, tc.want, r.stdout, r.stderr)
			}
		})
	}
	if b, err := os.ReadFile(garbage); err != nil || !bytes.Equal(b, junk) {
		t.Fatalf("the node wrote to a file that is not its store (%v)", err)
	}
	if err := integrityCheck(shared); err != nil {
		t.Fatalf("shared store after the failed starts: %v", err)
	}
	if tr := good.tree(); treeWhole(tr) != nil {
		t.Fatalf("good node: %v", treeWhole(tr))
	}

	// Mid-run: the victim's own store file is overwritten with garbage in
	// place (same inode, so the open handles see it).
	vdir := t.TempDir()
	vstore := filepath.Join(vdir, "victim.db")
	victim := startNode(t, nodeOptions{name: "victim", dataDir: vdir, store: vstore,
		env: []string{"COUCHREP_COUCHREP_ACTIVITY_TIMEOUT=2s", "COUCHREP_COUCHREP_HEARTBEAT_INTERVAL=200ms"}})
	for _, f := range []string{vstore, vstore + "-wal"} {
		st, err := os.Stat(f)
		if err != nil {
			continue
		}
		fh, err := os.OpenFile(f, os.O_WRONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := fh.WriteAt(bytes.Repeat([]byte{0x5a}, int(st.Size())), 0); err != nil {
			t.Fatal(err)
		}
		fh.Close()
	}
	select {
	case <-victim.exited:
	case <-time.After(90 * time.Second):
		t.Fatalf("node still running 90 s after its store turned to garbage:\n%s", victim.logs.String())
	}
	if victim.exitErr == nil || !strings.Contains(victim.logs.String(), "job store unavailable") {
		t.Fatalf("exit %v; want a failure naming the job store:\n%s", victim.exitErr, victim.logs.String())
	}
	if err := integrityCheck(shared); err != nil {
		t.Fatalf("shared store: %v", err)
	}
}
