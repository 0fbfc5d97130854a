package integration

import (
	"bufio"
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	"github.com/couchrep/couchrep/messages"
)

// binDir holds couchrepd and couchrepctl built once for the whole package.
var binDir string

func TestMain(m *testing.M) {
	flag.Parse()
	if testing.Short() {
		os.Exit(m.Run())
	}
	dir, err := os.MkdirTemp("", "couchrep-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	cmd := exec.Command("go", "build", "-o", dir+string(os.PathSeparator), "github.com/couchrep/couchrep/cmd/couchrepd", "github.com/couchrep/couchrep/cmd/couchrepctl")
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "building binaries:", err)
		os.Exit(1)
	}
	binDir = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

func skipShort(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("integration test: skipped with -short")
	}
}

// nodeProc is a real couchrepd process.
type nodeProc struct {
	t       testing.TB
	cmd     *exec.Cmd
	dataDir string
	admin   string
	logs    *syncBuffer
	exited  chan struct{}
	exitErr error
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// nodeOptions configure startNode.
type nodeOptions struct {
	name    string
	dataDir string   // default: a new temp dir
	store   string   // default: <data>/couchrep.db
	config  string   // an ini file, optional
	extra   []string // more flags
	env     []string // more environment variables
	// logFile, if set, gets a copy of the node's output as it comes (for
	// watching a long benchmark; the test's copy is printed on failure).
	logFile string
}

// startNode starts couchrepd and waits until its admin endpoint is up (the
// node writes <data>/admin.addr once it listens).
func startNode(t testing.TB, o nodeOptions) *nodeProc {
	t.Helper()
	if o.dataDir == "" {
		o.dataDir = t.TempDir()
	}
	if o.name == "" {
		o.name = "node-" + filepath.Base(o.dataDir)
	}
	args := []string{"--data", o.dataDir, "--admin", "127.0.0.1:0", "--http", "127.0.0.1:0", "--node-name", o.name, "--log-level", "debug"}
	if o.store != "" {
		args = append(args, "--store", o.store)
	}
	if o.config != "" {
		args = append(args, "--config", o.config)
	}
	args = append(args, o.extra...)
	_ = os.Remove(filepath.Join(o.dataDir, "admin.addr"))
	n := &nodeProc{t: t, dataDir: o.dataDir, logs: &syncBuffer{}, exited: make(chan struct{})}
	n.cmd = exec.Command(filepath.Join(binDir, "couchrepd"), args...)
	n.cmd.Stdout, n.cmd.Stderr = n.logs, n.logs
	if o.logFile != "" {
		f, err := os.OpenFile(o.logFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		w := io.MultiWriter(n.logs, f)
		n.cmd.Stdout, n.cmd.Stderr = w, w
	}
	n.cmd.Env = append(os.Environ(), o.env...)
	n.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := n.cmd.Start(); err != nil {
		t.Fatalf("start couchrepd: %v", err)
	}
	go func() {
		n.exitErr = n.cmd.Wait()
		close(n.exited)
	}()
	t.Cleanup(func() {
		n.kill()
		if t.Failed() {
			t.Log(failedNodeLogs(t, o.name, n.logs.String()))
		}
	})
	deadline := time.Now().Add(30 * time.Second)
	for {
		if b, err := os.ReadFile(filepath.Join(o.dataDir, "admin.addr")); err == nil && bytes.HasSuffix(b, []byte("\n")) {
			n.admin = strings.TrimSpace(string(b))
			return n
		}
		select {
		case <-n.exited:
			t.Fatalf("couchrepd exited before it was ready (%v):\n%s", n.exitErr, n.logs.String())
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("couchrepd not ready after 30s:\n%s", n.logs.String())
		}
	}
}

// failedNodeLogs keeps a failed test's node logs whole in a file under
// $COUCHREP_TEST_LOGS (default: the system's temporary directory) and
// returns their last lines and the file's path: CI shows the tail of the
// output, and a node's full log would push the test's own failure
// messages (printed before it) out of sight.
func failedNodeLogs(t testing.TB, node, logs string) string {
	const tail = 40
	dir := os.Getenv("COUCHREP_TEST_LOGS")
	if dir == "" {
		dir = filepath.Join(os.TempDir(), "couchrep-test-logs")
	}
	name := strings.NewReplacer("/", "_", " ", "_").Replace(t.Name()) + "-" + node + ".log"
	path := filepath.Join(dir, name)
	saved := "kept whole in " + path
	if err := os.MkdirAll(dir, 0o755); err != nil {
		saved = "not saved: " + err.Error()
	} else if err := os.WriteFile(path, []byte(logs), 0o644); err != nil {
		saved = "not saved: " + err.Error()
	}
	lines := strings.Split(strings.TrimRight(logs, "\n"), "\n")
	if len(lines) > tail {
		lines = lines[len(lines)-tail:]
	}
	return fmt.Sprintf("couchrepd %s logs (%s), the last %d lines:\n%s", node, saved, len(lines), strings.Join(lines, "\n"))
}

// kill sends SIGKILL (if still running) and waits for the exit.
func (n *nodeProc) kill() {
	select {
	case <-n.exited:
		return
	default:
	}
	_ = syscall.Kill(-n.cmd.Process.Pid, syscall.SIGKILL)
	<-n.exited
}

// signal sends sig and waits up to timeout for the process to exit.
func (n *nodeProc) stop(sig syscall.Signal, timeout time.Duration) error {
	n.t.Helper()
	if err := n.cmd.Process.Signal(sig); err != nil {
		return err
	}
	select {
	case <-n.exited:
		return n.exitErr
	case <-time.After(timeout):
		return fmt.Errorf("couchrepd did not exit within %s after %v", timeout, sig)
	}
}

// ctl runs couchrepctl against the node and returns stdout, stderr, exit code.
func (n *nodeProc) ctl(args ...string) (string, string, int) {
	n.t.Helper()
	return runCtl(n.t, append([]string{"--node", n.admin}, args...)...)
}

func runCtl(t testing.TB, args ...string) (string, string, int) {
	t.Helper()
	r := runCmd(t, filepath.Join(binDir, "couchrepctl"), args...)
	return r.stdout, r.stderr, r.code
}

// tree asks the node for its supervision tree through couchrepctl --json.
func (n *nodeProc) tree() *messages.TreeResponse {
	n.t.Helper()
	return runCtlTree(n.t, "--node", n.admin)
}

// runCtlTree runs couchrepctl [flags] --json tree and decodes the reply.
func runCtlTree(t testing.TB, flags ...string) *messages.TreeResponse {
	t.Helper()
	out, errOut, code := runCtl(t, append(flags, "--json", "tree")...)
	if code != 0 {
		t.Fatalf("couchrepctl tree: exit %d: %s", code, errOut)
	}
	var resp messages.TreeResponse
	if err := protojson.Unmarshal([]byte(out), &resp); err != nil {
		t.Fatalf("couchrepctl tree --json: %v\n%s", err, out)
	}
	return &resp
}

// logLines returns the node's JSON log lines that contain all of substrs.
func (n *nodeProc) logLines(substrs ...string) []string {
	var out []string
	sc := bufio.NewScanner(strings.NewReader(n.logs.String()))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
next:
	for sc.Scan() {
		for _, s := range substrs {
			if !strings.Contains(sc.Text(), s) {
				continue next
			}
		}
		out = append(out, sc.Text())
	}
	return out
}

type execResult struct {
	stdout, stderr string
	code           int
}

// runCmd runs a command to completion (at most a minute).
func runCmd(t testing.TB, name string, args ...string) execResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	res := execResult{stdout: stdout.String(), stderr: stderr.String()}
	if err != nil {
		exitErr, ok := err.(*exec.ExitError)
		if !ok {
			t.Fatalf("%s %v: %v", name, args, err)
		}
		res.code = exitErr.ExitCode()
	}
	return res
}
