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
