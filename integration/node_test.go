package integration

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/couchrep/couchrep/messages"
)

// rootChildren are the children of couchrep_sup in start order (DESIGN.md §3).
var rootChildren = []string{
	"event_bus", "clustering", "connection_pool", "rate_limiter", "scheduler",
	"job_server", "activity_monitor", "doc_processor", "http_api",
}

func childrenByName(root *messages.TreeNode) map[string]*messages.TreeNode {
	m := map[string]*messages.TreeNode{}
	for _, c := range root.GetChildren() {
		m[c.GetName()] = c
	}
	return m
}

func allRunning(n *messages.TreeNode) bool {
	if n.GetState() != messages.ChildState_CHILD_STATE_RUNNING {
		return false
	}
	for _, c := range n.GetChildren() {
		if !allRunning(c) {
			return false
		}
	}
	return true
}

func TestNodeTreeListsChildrenInStartOrder(t *testing.T) {
	skipShort(t)
	n := startNode(t, nodeOptions{})
	tree := n.tree()
	root := tree.GetRoot()
	if root.GetName() != "couchrep_sup" || root.GetStrategy() != messages.Strategy_STRATEGY_REST_FOR_ONE {
		t.Fatalf("root = %s %s, want couchrep_sup rest_for_one", root.GetName(), root.GetStrategy())
	}
	var names []string
	for _, c := range root.GetChildren() {
		names = append(names, c.GetName())
	}
	if strings.Join(names, ",") != strings.Join(rootChildren, ",") {
		t.Fatalf("children = %v, want %v", names, rootChildren)
	}
	if !allRunning(root) {
		t.Fatalf("not every actor is running: %v", tree)
	}
	js := childrenByName(root)["job_server"]
	if len(js.GetChildren()) == 0 || js.GetChildren()[0].GetName() != "jobs_sup" ||
		js.GetChildren()[0].GetStrategy() != messages.Strategy_STRATEGY_SIMPLE_ONE_FOR_ONE {
		t.Fatalf("job_server children = %v, want jobs_sup (simple_one_for_one) first", js.GetChildren())
	}

	// The human form lists every actor too.
	out, errOut, code := n.ctl("tree")
	if code != 0 {
		t.Fatalf("couchrepctl tree: exit %d: %s", code, errOut)
	}
	for _, name := range append(rootChildren, "couchrep_sup", "jobs_sup") {
		if !strings.Contains(out, name) {
			t.Errorf("human tree output lacks %s:\n%s", name, out)
		}
	}
}

// TestKillConnectionPoolRestartsRestForOne is the foundation issue's
// acceptance test: killing connection_pool restarts exactly it and the
// children after it, while those before it keep running.
func TestKillConnectionPoolRestartsRestForOne(t *testing.T) {
	skipShort(t)
	n := startNode(t, nodeOptions{})
	before := childrenByName(n.tree().GetRoot())

	out, errOut, code := n.ctl("kill", "connection_pool")
	if code != 0 {
		t.Fatalf("couchrepctl kill: exit %d: %s", code, errOut)
	}
	if !strings.Contains(out, "couchrep_sup/connection_pool") {
		t.Fatalf("kill output %q does not name the actor", out)
	}

	// Wait until the tree has healed: the restarted actors report a new
	// incarnation and everything runs again.
	var after map[string]*messages.TreeNode
	deadline := time.Now().Add(30 * time.Second)
	for {
		tree := n.tree()
		after = childrenByName(tree.GetRoot())
		if allRunning(tree.GetRoot()) && after["http_api"].GetIncarnation() > before["http_api"].GetIncarnation() {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("tree did not heal within 30s: %v", tree)
		}
		time.Sleep(50 * time.Millisecond) // polling another process's state
	}
	killedAt := 2 // index of connection_pool
	for i, name := range rootChildren {
		b, a := before[name], after[name]
		if i < killedAt {
			if a.GetIncarnation() != b.GetIncarnation() || a.GetRestartCount() != b.GetRestartCount() {
				t.Errorf("%s (before connection_pool) was restarted: incarnation %d→%d, restarts %d→%d",
					name, b.GetIncarnation(), a.GetIncarnation(), b.GetRestartCount(), a.GetRestartCount())
			}
			continue
		}
		if a.GetIncarnation() != b.GetIncarnation()+1 || a.GetRestartCount() != b.GetRestartCount()+1 {
			t.Errorf("%s (connection_pool or after) not restarted once: incarnation %d→%d, restarts %d→%d",
				name, b.GetIncarnation(), a.GetIncarnation(), b.GetRestartCount(), a.GetRestartCount())
		}
		if a.GetPid() != b.GetPid() {
			t.Errorf("%s: name resolves to %s after restart, want the same id %s", name, a.GetPid(), b.GetPid())
		}
		if !a.GetStartedAt().AsTime().After(b.GetStartedAt().AsTime()) {
			t.Errorf("%s: start time did not move on restart", name)
		}
	}

	// The node logged the kill and the restarts with structured fields.
	if lines := n.logLines(`"child":"connection_pool"`, "killed"); len(lines) == 0 {
		t.Errorf("no log line records the kill of connection_pool")
	}
}

func TestKillUnknownActorIsAClearError(t *testing.T) {
	skipShort(t)
	n := startNode(t, nodeOptions{})
	_, errOut, code := n.ctl("kill", "no_such_actor")
	if code != 1 || !strings.Contains(errOut, "no_such_actor") || !strings.Contains(errOut, "unknown actor") {
		t.Fatalf("kill unknown actor: exit %d, stderr %q; want exit 1 naming the actor", code, errOut)
	}
	// The node is unharmed.
	if !allRunning(n.tree().GetRoot()) {
		t.Fatal("tree not whole after a bad kill request")
	}
}

func TestSIGTERMStopsChildrenInReverseOrder(t *testing.T) {
	skipShort(t)
	n := startNode(t, nodeOptions{})
	if err := n.stop(syscall.SIGTERM, 30*time.Second); err != nil {
		t.Fatalf("couchrepd after SIGTERM: %v\n%s", err, n.logs.String())
	}
	var stopped []string
	for _, line := range n.logLines(`"message":"supervisor"`, `"supervisor":"couchrep_sup"`, `"event":"child_exited"`) {
		var rec struct {
			Child string `json:"child"`
		}
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("log line is not JSON: %v: %s", err, line)
		}
		stopped = append(stopped, rec.Child)
	}
	want := make([]string, len(rootChildren))
	for i, c := range rootChildren {
		want[len(rootChildren)-1-i] = c
	}
	if strings.Join(stopped, ",") != strings.Join(want, ",") {
		t.Fatalf("stop order = %v, want %v", stopped, want)
	}
}

func TestBadConfigStopsTheNodeFromStarting(t *testing.T) {
	skipShort(t)
	dir := t.TempDir()
	cfg := filepath.Join(dir, "bad.ini")
	if err := os.WriteFile(cfg, []byte("[replicator]\nmax_jobs = 500\nmax_jobz = 3\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	res := runCmd(t, filepath.Join(binDir, "couchrepd"), "--config", cfg, "--data", dir, "--admin", "127.0.0.1:0", "--http", "127.0.0.1:0")
	if res.code != 2 {
		t.Fatalf("couchrepd with a bad config: exit %d, want 2\n%s", res.code, res.stderr)
	}
	for _, want := range []string{"bad.ini", ":3", "max_jobz"} {
		if !strings.Contains(res.stderr, want) {
			t.Errorf("error %q does not name %q", res.stderr, want)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "admin.addr")); err == nil {
		t.Error("the node started despite the bad config")
	}
}
