package testserver

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// ClusterEnv names the variable listing the nodes of an Apache CouchDB
// cluster the tests may use (`make test-couchdb COUCH_CLUSTER=…`): their
// URLs, comma-separated, each with a server admin's credentials.
const ClusterEnv = "COUCHREP_TEST_COUCH_CLUSTER"

// ClusterCmdEnv names the command that stops and starts one node of that
// cluster: it is run as `<cmd> stop N` and `<cmd> start N` (N counts from
// 1 in ClusterEnv's order) and must return once the node is gone, or
// answers GET /_up again.
const ClusterCmdEnv = "COUCHREP_TEST_COUCH_CLUSTER_CMD"

// Cluster is a CouchDB cluster the tests did not start. Its Nodes share
// one database prefix: Nodes[i].DBURL(name) is the same database seen
// through node i+1. Databases named through any node are deleted when the
// test ends, and a node the test stopped is started again first.
type Cluster struct {
	Nodes []*Server
	cmd   string

	mu      sync.Mutex
	stopped map[int]bool
}

// CouchCluster returns the cluster of COUCHREP_TEST_COUCH_CLUSTER and
// COUCHREP_TEST_COUCH_CLUSTER_CMD. Without them the test is skipped: a
// cluster is not something a test can start (make test-couchdb says how to
// point the tests at one).
func CouchCluster(t testing.TB) *Cluster {
	t.Helper()
	raw, cmd := os.Getenv(ClusterEnv), os.Getenv(ClusterCmdEnv)
	if raw == "" || cmd == "" {
		t.Skipf("needs a CouchDB cluster: make test-couchdb COUCH_CLUSTER=url1,url2,url3 COUCH_CLUSTER_CMD=<cmd taking stop N / start N> (%s, %s)", ClusterEnv, ClusterCmdEnv)
	}
	var rnd [4]byte
	_, _ = rand.Read(rnd[:])
	prefix := "couchrep-test-" + hex.EncodeToString(rnd[:]) + "-"
	c := &Cluster{cmd: cmd, stopped: map[int]bool{}}
	for _, u := range strings.Split(raw, ",") {
		if u = strings.TrimSpace(u); u != "" {
			c.Nodes = append(c.Nodes, externalWithPrefix(t, u, prefix))
		}
	}
	if len(c.Nodes) < 2 {
		t.Fatalf("testserver: %s lists %d node(s), want at least 2", ClusterEnv, len(c.Nodes))
	}
	t.Cleanup(func() {
		c.mu.Lock()
		var down []int
		for n := range c.stopped {
			down = append(down, n)
		}
		c.mu.Unlock()
		for _, n := range down {
			if err := c.run("start", n); err != nil {
				t.Errorf("testserver: starting CouchDB node %d again: %v", n, err)
			}
		}
		// Names used through any node, deleted through one that answers.
		names := map[string]bool{}
		for _, s := range c.Nodes {
			s.mu.Lock()
			for name := range s.named {
				names[name] = true
			}
			s.named = map[string]bool{}
			s.mu.Unlock()
		}
		for name := range names {
			for _, s := range c.Nodes {
				if _, status, err := s.do(http.MethodDelete, s.DBURL(name), nil); err == nil && status < 500 {
					break
				}
			}
		}
		for _, s := range c.Nodes {
			s.mu.Lock()
			s.named = map[string]bool{}
			s.mu.Unlock()
		}
	})
	return c
}

// Stop stops node n (1-based) with the cluster's command.
func (c *Cluster) Stop(t testing.TB, n int) {
	t.Helper()
	c.mu.Lock()
	c.stopped[n] = true
	c.mu.Unlock()
	if err := c.run("stop", n); err != nil {
		t.Fatalf("testserver: stopping CouchDB node %d: %v", n, err)
	}
}

// Start starts node n (1-based) again and returns once it answers.
func (c *Cluster) Start(t testing.TB, n int) {
	t.Helper()
	if err := c.run("start", n); err != nil {
		t.Fatalf("testserver: starting CouchDB node %d: %v", n, err)
	}
	c.mu.Lock()
	delete(c.stopped, n)
	c.mu.Unlock()
}

func (c *Cluster) run(verb string, n int) error {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "sh", "-c", c.cmd+" "+verb+" "+strconv.Itoa(n))
	// A command that leaves a process holding its output (the node it
	// started) must not hold the test: its output is read until it exits.
	cmd.WaitDelay = 5 * time.Second
	out, err := cmd.CombinedOutput()
	if err != nil && !errors.Is(err, exec.ErrWaitDelay) {
		return &cmdError{cmd: c.cmd + " " + verb + " " + strconv.Itoa(n), out: string(out), err: err}
	}
	return nil
}

type cmdError struct {
	cmd, out string
	err      error
}

func (e *cmdError) Error() string {
	return e.cmd + ": " + e.err.Error() + ": " + tail([]byte(e.out), 1024)
}
func (e *cmdError) Unwrap() error { return e.err }
