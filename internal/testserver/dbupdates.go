package testserver

import (
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// DBUpdatesScript returns the path of the node script that starts the
// pinned pouchdb-server with a real /_db_updates feed
// (integration/testserver/pouchdb-server-db-updates.js).
func DBUpdatesScript() (string, error) {
	bin, err := PouchDBServerBin()
	if err != nil {
		return "", err
	}
	// bin is integration/node_modules/.bin/pouchdb-server
	integration := filepath.Dir(filepath.Dir(filepath.Dir(bin)))
	return filepath.Join(integration, "testserver", "pouchdb-server-db-updates.js"), nil
}

// StartPouchDBWithDBUpdates starts an in-memory pouchdb-server as
// StartPouchDB does (same arguments but --no-stdout-logs, same pinned
// package, same clean-up and crash check), except that its /_db_updates answers as Apache CouchDB
// 3.4.3's does instead of PouchDB Server's 400 stub: created, updated and
// deleted rows with opaque string seqs, the normal, longpoll, continuous
// and eventsource feeds, since, limit, timeout, heartbeat, server admins
// only (integration/README.md, "_db_updates"). StartPouchDB is unchanged.
//
// With COUCHREP_TEST_COUCH_URL set it starts nothing and returns that
// server, like StartPouchDB: an Apache CouchDB answers /_db_updates itself
// only when its _global_changes database exists (a single_node set-up does
// not create it; it answers 404 then).
func StartPouchDBWithDBUpdates(t testing.TB) *Server {
	t.Helper()
	if u := os.Getenv(ExternalURLEnv); u != "" {
		return external(t, u)
	}
	bin, err := PouchDBServerBin()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("testserver: %s not installed (run `make testdeps`)", bin)
	}
	script, err := DBUpdatesScript()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(script); err != nil {
		t.Fatalf("testserver: %v", err)
	}
	node, err := exec.LookPath("node")
	if err != nil {
		t.Fatalf("testserver: node not found (run `make testdeps`): %v", err)
	}
	var lastErr error
	for range 3 { // a port picked free may be taken before the server binds it
		s, err := startDBUpdates(t, node, script)
		if err == nil {
			return s
		}
		lastErr = err
	}
	t.Fatalf("testserver: pouchdb-server with _db_updates did not start: %v", lastErr)
	return nil
}

func startDBUpdates(t testing.TB, node, script string) (*Server, error) {
	port, err := FreePort()
	if err != nil {
		return nil, err
	}
	dir := t.TempDir()
	logPath := filepath.Join(dir, "server.log")
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	// StartPouchDB's arguments, the script hands them to pouchdb-server
	// unchanged, and --no-stdout-logs: the request log still goes to
	// log.txt in dir, but is not also tailed, parsed and printed to
	// server.log (a fifth of the server's CPU while 10,000 per-user
	// databases were created; a crash's stack trace goes to stderr, which
	// is server.log, as before).
	cmd := exec.Command(node, script, "--in-memory", "--no-color", "--no-stdout-logs",
		"--host", "127.0.0.1", "--port", strconv.Itoa(port),
		"--dir", dir, "--config", filepath.Join(dir, "config.json"))
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("testserver: starting %s: %w", script, err)
	}
	s := &Server{
		URL:     fmt.Sprintf("http://127.0.0.1:%d/", port),
		cmd:     cmd,
		logPath: logPath,
		exited:  make(chan struct{}),
		client:  &http.Client{Timeout: 60 * time.Second},
	}
	go func() {
		s.waitErr = cmd.Wait()
		close(s.exited)
	}()
	if err := s.awaitReady(); err != nil {
		s.kill()
		return nil, err
	}
	t.Cleanup(func() {
		if s.Crashed() {
			t.Errorf("testserver: pouchdb-server (_db_updates) at %s exited on its own (%v); log tail:\n%s", s.URL, s.waitErr, s.LogTail(4096))
		}
		s.Stop()
	})
	return s, nil
}
