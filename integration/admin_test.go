package integration

import (
	"net"
	"path/filepath"
	"strings"
	"testing"
)

// TestAdminOffLoopbackNeedsToken: an admin endpoint bound beyond loopback
// refuses to start without a token, and with one it refuses requests that
// do not carry it.
func TestAdminOffLoopbackNeedsToken(t *testing.T) {
	skipShort(t)
	dir := t.TempDir()
	res := runCmd(t, filepath.Join(binDir, "couchrepd"), "--data", dir, "--admin", "0.0.0.0:0", "--http", "127.0.0.1:0")
	if res.code == 0 || !strings.Contains(res.stderr, "token") {
		t.Fatalf("couchrepd on 0.0.0.0 without a token: exit %d, stderr %q; want a refusal naming the token", res.code, res.stderr)
	}

	n := startNode(t, nodeOptions{extra: []string{"--admin", "0.0.0.0:0"}, env: []string{"COUCHREP_ADMIN_TOKEN=s3cret"}})
	_, port, err := net.SplitHostPort(n.admin)
	if err != nil {
		t.Fatal(err)
	}
	addr := "127.0.0.1:" + port
	_, errOut, code := runCtl(t, "--node", addr, "kill", "connection_pool")
	if code != 1 || !strings.Contains(errOut, "unauthenticated") {
		t.Fatalf("kill without token: exit %d, stderr %q; want exit 1, unauthenticated", code, errOut)
	}
	_, errOut, code = runCtl(t, "--node", addr, "--token", "wrong", "kill", "connection_pool")
	if code != 1 || !strings.Contains(errOut, "unauthenticated") {
		t.Fatalf("kill with a wrong token: exit %d, stderr %q; want exit 1, unauthenticated", code, errOut)
	}
	// Nothing was killed.
	tree := runCtlTree(t, "--node", addr, "--token", "s3cret")
	if cp := childrenByName(tree.GetRoot())["connection_pool"]; cp.GetIncarnation() != 1 {
		t.Fatalf("connection_pool incarnation %d after refused kills, want 1", cp.GetIncarnation())
	}
	if _, errOut, code = runCtl(t, "--node", addr, "--token", "s3cret", "kill", "connection_pool"); code != 0 {
		t.Fatalf("kill with the token: exit %d: %s", code, errOut)
	}
}

// TestAdminSendUnknownActorOrTypeIsAClearError: the generic Send envelope
// naming an actor the node does not have, or carrying a message type no
// actor knows (or the named actor does not handle), is answered with a
// clear error and exit 1; the node is unharmed and still answers.
func TestAdminSendUnknownActorOrTypeIsAClearError(t *testing.T) {
	skipShort(t)
	n := startNode(t, nodeOptions{})
	for _, tc := range []struct {
		name string
		args []string
		want []string
	}{
		{"unknown actor", []string{"send", "no_such_actor", "couchrep.v1.TreeRequest"},
			[]string{"not_found", "unknown actor", "no_such_actor"}},
		{"unknown type to an actor", []string{"send", "scheduler", "couchrep.v1.NoSuchMessage"},
			[]string{"unimplemented", "unknown request type", "couchrep.v1.NoSuchMessage"}},
		{"unknown type to the node", []string{"send", "", "couchrep.v1.NoSuchMessage"},
			[]string{"unimplemented", "unknown request type", "couchrep.v1.NoSuchMessage"}},
		{"type the actor does not handle", []string{"send", "scheduler", "couchrep.v1.DrainRequest"},
			[]string{"unimplemented", "scheduler does not handle couchrep.v1.DrainRequest"}},
		{"type no actor handles", []string{"send", "", "couchrep.v1.JobEvent"},
			[]string{"unimplemented", "unknown request type", "couchrep.v1.JobEvent"}},
		{"supervisor", []string{"send", "job_server", "couchrep.v1.SchedulerStatusRequest"},
			[]string{"unimplemented", "is a supervisor"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, errOut, code := n.ctl(tc.args...)
			if code != 1 {
				t.Fatalf("exit %d, want 1: %s", code, errOut)
			}
			for _, w := range tc.want {
				if !strings.Contains(errOut, w) {
					t.Fatalf("stderr %q does not mention %q", errOut, w)
				}
			}
		})
	}
	// A known type to the actor that handles it still works, and the tree
	// is whole: nothing crashed.
	out, errOut, code := n.ctl("send", "scheduler", "couchrep.v1.SchedulerStatusRequest")
	if code != 0 || !strings.Contains(out, "couchrep.v1.SchedulerStatusResponse") {
		t.Fatalf("send SchedulerStatusRequest: exit %d: %s%s", code, out, errOut)
	}
	if !allRunning(n.tree().GetRoot()) {
		t.Fatal("tree not whole after bad Send requests")
	}
	if lines := n.logLines("panic"); len(lines) > 0 {
		t.Fatalf("the node logged a panic: %v", lines)
	}
}
