package kvtest

import (
	"bufio"
	"context"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/couchrep/couchrep/internal/kv"
	"github.com/couchrep/couchrep/internal/kv/tuple"
)

// Environment variables that turn a test binary into a child process.
const (
	// EnvRole names the child's role; its presence makes IsChild true.
	EnvRole = "KVTEST_ROLE"
	// EnvLocation is the store location handed to the child's open function.
	EnvLocation = "KVTEST_LOCATION"
	envPrefix   = "KVTEST_PREFIX"
	envCount    = "KVTEST_COUNT"
)

// IsChild reports whether this process was started as a kvtest child.
func IsChild() bool { return os.Getenv(EnvRole) != "" }

// Roles a child can play; backends may add their own through RunChildRoles.
var roles = map[string]func(ctx context.Context, db kv.Database, s tuple.Subspace, n int) error{
	// counter: n read-modify-write increments of one counter.
	"counter": func(ctx context.Context, db kv.Database, s tuple.Subspace, n int) error {
		for range n {
			if err := increment(ctx, db, k(s, "counter")); err != nil {
				return err
			}
		}
		return nil
	},
	// stamps: n sequence-numbered, versionstamped commits.
	"stamps": func(ctx context.Context, db kv.Database, s tuple.Subspace, n int) error {
		for range n {
			if _, _, err := stampedCommit(ctx, db, s); err != nil {
				return err
			}
		}
		return nil
	},
	// set: one write of the key "w".
	"set": func(ctx context.Context, db kv.Database, s tuple.Subspace, n int) error {
		return db.Transact(ctx, func(tx kv.Tx) error {
			tx.Set(k(s, "w"), []byte("from child "+strconv.Itoa(os.Getpid())))
			return nil
		})
	},
}

// ChildRole is a role a backend adds for its own multi-process tests. It
// may print lines on out; the parent reads them with Child.Lines.
type ChildRole func(ctx context.Context, db kv.Database, out io.Writer) error

// RunChild runs the child role named by the environment with the store
// opened by open, and returns the process exit code: 0 on success.
func RunChild(open func(ctx context.Context, location string) (kv.Database, error)) int {
	return RunChildRoles(open, nil)
}

// RunChildRoles is RunChild with additional backend-specific roles.
func RunChildRoles(open func(ctx context.Context, location string) (kv.Database, error), extra map[string]ChildRole) int {
	ctx, cancel := context.WithTimeout(context.Background(), caseTimeout)
	defer cancel()
	db, err := open(ctx, os.Getenv(EnvLocation))
	if err != nil {
		fmt.Fprintln(os.Stderr, "kvtest child: open:", err)
		return 2
	}
	defer db.Close()
	role := os.Getenv(EnvRole)
	if r, ok := extra[role]; ok {
		err = r(ctx, db, os.Stdout)
	} else if r, ok := roles[role]; ok {
		var s tuple.Subspace
		if s, err = parsePrefix(os.Getenv(envPrefix)); err == nil {
			n, _ := strconv.Atoi(os.Getenv(envCount))
			err = r(ctx, db, s, n)
		}
	} else {
		err = fmt.Errorf("unknown role %q", role)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "kvtest child:", role, err)
		return 1
	}
	return 0
}

// Child is a running child process.
type Child struct {
	Cmd    *exec.Cmd
	stdout io.ReadCloser
	lines  *bufio.Scanner
	stderr strings.Builder
}

// StartChild starts the test binary as a child playing role on the store
// at location, with extra environment entries ("K=V").
func StartChild(t testing.TB, role, location string, env ...string) *Child {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), append([]string{EnvRole + "=" + role, EnvLocation + "=" + location}, env...)...)
	c := &Child{Cmd: cmd}
	cmd.Stderr = &c.stderr
	var err error
	if c.stdout, err = cmd.StdoutPipe(); err != nil {
		t.Fatal(err)
	}
	c.lines = bufio.NewScanner(c.stdout)
	if err := cmd.Start(); err != nil {
		t.Fatalf("start child %s: %v", role, err)
	}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})
	return c
}

// Line returns the child's next output line, or false at its end.
func (c *Child) Line() (string, bool) {
	if c.lines.Scan() {
		return c.lines.Text(), true
	}
	return "", false
}

// Wait waits for the child and fails the test if it did not succeed.
func (c *Child) Wait(t testing.TB) {
	t.Helper()
	_, _ = io.Copy(io.Discard, c.stdout)
	if err := c.Cmd.Wait(); err != nil {
		t.Fatalf("child %v: %v\n%s", c.Cmd.Env[len(c.Cmd.Env)-1], err, c.stderr.String())
	}
}

// RunMultiProcess runs the multi-process conformance cases: two OS
// processes doing read-modify-write on one counter lose no increment,
// versionstamps from two processes are strictly increasing in commit order,
// and a watch fires on a commit made by another process. db is the parent's
// handle on the store at location, which children open with the function
// given to RunChild.
func RunMultiProcess(t *testing.T, db kv.Database, location string) {
	if testing.Short() {
		t.Skip("multi-process cases start processes; skipped in -short")
	}
	t.Run("Counter", func(t *testing.T) {
		s := newSpace(t)
		const n = 300
		runTwo(t, "counter", location, s, n)
		if got := kv.Int64LE(get(t, db, k(s, "counter"))); got != 2*n {
			t.Fatalf("counter = %d after 2×%d increments from two processes", got, n)
		}
	})
	t.Run("Versionstamps", func(t *testing.T) {
		s := newSpace(t)
		const n = 200
		runTwo(t, "stamps", location, s, n)
		if err := checkStampLog(testCtx(t), db, s, 2*n); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("Watch", func(t *testing.T) {
		s := newSpace(t)
		w := watchKey(t, db, k(s, "w"))
		c := StartChild(t, "set", location, envPrefix+"="+prefixHex(s))
		c.Wait(t)
		ctx, cancel := context.WithTimeout(testCtx(t), time.Minute)
		defer cancel()
		if err := w.Wait(ctx); err != nil {
			t.Fatalf("watch on a key another process changed: %v", err)
		}
	})
}

// runTwo runs role n times on subspace s in two child processes at once
// and waits for both.
func runTwo(t *testing.T, role, location string, s tuple.Subspace, n int) {
	t.Helper()
	env := []string{envPrefix + "=" + prefixHex(s), envCount + "=" + strconv.Itoa(n)}
	a, b := StartChild(t, role, location, env...), StartChild(t, role, location, env...)
	a.Wait(t)
	b.Wait(t)
}

// prefixHex and parsePrefix move a subspace to child processes.
func prefixHex(s tuple.Subspace) string { return hex.EncodeToString(s.Bytes()) }

func parsePrefix(h string) (tuple.Subspace, error) {
	b, err := hex.DecodeString(h)
	if err != nil {
		return tuple.Subspace{}, err
	}
	return tuple.NewSubspace(b, nil), nil
}
