// Package testserver starts real CouchDB-protocol servers for tests: PouchDB
// Server (npm pouchdb-server, pinned in integration/package.json and
// installed by `make testdeps`) in memory on a free loopback port, one
// process per call, killed with its process group when the test ends.
//
// It also has small helpers to create databases and to store documents with
// given revision histories, conflicts and attachments (new_edits=false), so
// tests can build a source exactly. The helpers use plain net/http, not the
// code under test.
//
// PouchDB Server's differences from Apache CouchDB are listed in
// integration/README.md; work around them in tests, never in the product.
package testserver

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Server is one running pouchdb-server process.
type Server struct {
	// URL is the server root, "http://127.0.0.1:<port>/".
	URL string

	cmd     *exec.Cmd
	logPath string
	exited  chan struct{} // closed when the process has exited
	waitErr error
	mu      sync.Mutex
	stopped bool
	client  *http.Client
	// admin credentials the helpers send once AddAdmin made an account.
	adminUser, adminPass string
	// external is set for a server the tests did not start
	// (COUCHREP_TEST_COUCH_URL): its databases' names carry prefix, and
	// the ones named through DBURL are deleted when the test ends.
	external bool
	prefix   string
	named    map[string]bool
}

// AddAdmin creates a server admin (PUT /_config/admins/<user>), so that
// /_session issues cookies for it. Afterwards the helpers authenticate as
// that admin: pouchdb-server crashes on an anonymous PUT /db once an admin
// exists (integration/README.md).
func (s *Server) AddAdmin(t testing.TB, user, pass string) {
	t.Helper()
	b, _ := json.Marshal(pass)
	config := "_config/"
	if s.external {
		config = "_node/_local/_config/" // CouchDB 2 and later
	}
	s.Do(t, http.MethodPut, s.URL+config+"admins/"+url.PathEscape(user), b, http.StatusOK)
	if s.external { // a server others use keeps no admin of a test's
		admin, pass := s.adminUser, s.adminPass
		t.Cleanup(func() {
			s.mu.Lock()
			s.adminUser, s.adminPass = admin, pass
			s.mu.Unlock()
			_, _, _ = s.do(http.MethodDelete, s.URL+config+"admins/"+url.PathEscape(user), nil)
		})
	}
	s.mu.Lock()
	s.adminUser, s.adminPass = user, pass
	s.mu.Unlock()
}

// startTimeout bounds the wait for a fresh server to answer GET /; Node
// needs a few seconds on a loaded 2-core machine.
const startTimeout = 60 * time.Second

// PouchDBServerBin returns the path of the pinned pouchdb-server binary,
// found by walking up from the working directory to integration/.
func PouchDBServerBin() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "integration", "package.json")); err == nil {
			return filepath.Join(dir, "integration", "node_modules", ".bin", "pouchdb-server"), nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("testserver: integration/package.json not found above the working directory")
		}
		dir = parent
	}
}

// StartPouchDB starts an in-memory pouchdb-server on a free loopback port
// and waits until it answers. The process is killed when the test ends;
// if it died on its own before that (pouchdb-server crashes on some
// requests), the test fails with the tail of its log.
//
// Without integration/node_modules the test fails: run `make testdeps`.
//
// With COUCHREP_TEST_COUCH_URL set (`make test-couchdb COUCH_URL=…`), it
// starts nothing and returns that server instead, an Apache CouchDB whose
// URL carries a server admin's credentials: the tests' databases are named
// with a prefix of their own and deleted when the test ends. Such a server
// cannot be stopped or crash-checked: the tests that do either are not
// among those `make test-couchdb` runs.
func StartPouchDB(t testing.TB) *Server {
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
	var lastErr error
	for range 3 { // a port picked free may be taken before the server binds it
		s, err := start(t, bin)
		if err == nil {
			return s
		}
		lastErr = err
	}
	t.Fatalf("testserver: pouchdb-server did not start: %v", lastErr)
	return nil
}

func start(t testing.TB, bin string) (*Server, error) {
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
	// An explicit config file and data dir keep pouchdb-server from writing
	// config.json or log.txt into the repository.
	cmd := exec.Command(bin, "--in-memory", "--no-color",
		"--host", "127.0.0.1", "--port", strconv.Itoa(port),
		"--dir", dir, "--config", filepath.Join(dir, "config.json"))
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("testserver: starting %s: %w", bin, err)
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
			t.Errorf("testserver: pouchdb-server at %s exited on its own (%v); log tail:\n%s", s.URL, s.waitErr, s.LogTail(4096))
		}
		s.Stop()
	})
	return s, nil
}

// ExternalURLEnv names the variable that points the tests at a server
// they do not start (StartPouchDB).
const ExternalURLEnv = "COUCHREP_TEST_COUCH_URL"

// external is the server at rawURL, for one test.
func external(t testing.TB, rawURL string) *Server {
	var rnd [4]byte
	_, _ = rand.Read(rnd[:])
	return externalWithPrefix(t, rawURL, "couchrep-test-"+hex.EncodeToString(rnd[:])+"-")
}

// externalWithPrefix is external with the databases' name prefix given
// (the nodes of one cluster share one).
func externalWithPrefix(t testing.TB, rawURL, prefix string) *Server {
	u, err := url.Parse(rawURL)
	if err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
		t.Fatalf("testserver: %q is not an http(s):// server URL", redactURL(rawURL))
	}
	u.Path, u.RawPath, u.RawQuery = "/", "", ""
	s := &Server{
		URL: u.String(), external: true, exited: make(chan struct{}),
		prefix: prefix, named: map[string]bool{},
		client: &http.Client{Timeout: 60 * time.Second},
	}
	if u.User != nil {
		s.adminUser = u.User.Username()
		s.adminPass, _ = u.User.Password()
	}
	if err := s.awaitReady(); err != nil {
		t.Fatalf("testserver: %s: %v", redactURL(rawURL), err)
	}
	t.Cleanup(func() {
		s.mu.Lock()
		names := make([]string, 0, len(s.named))
		for name := range s.named {
			names = append(names, name)
		}
		s.mu.Unlock()
		for _, name := range names {
			_, _, _ = s.do(http.MethodDelete, s.DBURL(name), nil)
		}
		// No process ends to close its keep-alive connections (goleak).
		s.client.CloseIdleConnections()
	})
	return s
}

func redactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(unparsable)"
	}
	return u.Redacted()
}

// External reports whether the server is one the tests did not start
// (COUCHREP_TEST_COUCH_URL).
func (s *Server) External() bool { return s.external }

// Clustered reports whether the server is a CouchDB cluster (GET
// /_membership lists more than one node). Its _changes and _all_docs read
// one copy of each shard range, which may not yet have a write another
// client's quorum (2 of 3) acknowledged, and its sequences are opaque per
// read (they name the copies read).
func (s *Server) Clustered(t testing.TB) bool {
	t.Helper()
	if !s.external {
		return false
	}
	var m struct {
		ClusterNodes []string `json:"cluster_nodes"`
	}
	s.GetJSON(t, s.URL+"_membership", &m)
	return len(m.ClusterNodes) > 1
}

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago, for
// a server that takes its port on the command line.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// awaitReady polls GET / until the server answers, it exits, or the
// deadline passes.
func (s *Server) awaitReady() error {
	if s.external {
		b, status, err := s.do(http.MethodGet, s.URL, nil)
		if err != nil || status != http.StatusOK {
			return fmt.Errorf("GET /: %d %.200s %v", status, b, err)
		}
		return nil
	}
	deadline := time.Now().Add(startTimeout)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, s.URL, nil)
		resp, err := s.client.Do(req)
		cancel()
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-s.exited:
			return fmt.Errorf("testserver: pouchdb-server exited during start (%v): %s", s.waitErr, s.LogTail(2048))
		case <-tick.C:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("testserver: pouchdb-server not answering on %s after %s: %s", s.URL, startTimeout, s.LogTail(2048))
		}
	}
}

// Crashed reports whether the process exited without Stop being called.
func (s *Server) Crashed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped || s.external {
		return false
	}
	select {
	case <-s.exited:
		return true
	default:
		return false
	}
}

// Exited is closed when the process has exited (crash or Stop).
func (s *Server) Exited() <-chan struct{} { return s.exited }

// Stop kills the server's process group and waits for it. Safe to call
// more than once; the test's cleanup calls it too.
func (s *Server) Stop() {
	s.mu.Lock()
	s.stopped = true
	s.mu.Unlock()
	s.kill()
}

func (s *Server) kill() {
	if s.external {
		return
	}
	if s.cmd.Process != nil {
		_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
	}
	<-s.exited
}

// LogTail returns up to n bytes from the end of the server's output.
func (s *Server) LogTail(n int) string {
	if s.external {
		return "(a server the tests did not start: no log)"
	}
	b, err := os.ReadFile(s.logPath)
	if err != nil {
		return err.Error()
	}
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}

// DBURL returns the URL of database name (escaped, trailing slash). On an
// external server a name not starting with "_" gets the test's prefix.
func (s *Server) DBURL(name string) string {
	if s.external && !strings.HasPrefix(name, "_") {
		s.mu.Lock()
		s.named[name] = true
		s.mu.Unlock()
		name = s.prefix + name
	}
	return s.URL + url.PathEscape(name) + "/"
}

// CreateDB creates database name and returns its URL. Avoid "/" in names:
// pouchdb-server strips it.
func (s *Server) CreateDB(t testing.TB, name string) string {
	t.Helper()
	u := s.DBURL(name)
	if s.external {
		// A CouchDB cluster answers 202 when not every copy was written yet.
		if b, status, err := s.do(http.MethodPut, u, nil); err != nil || (status != http.StatusCreated && status != http.StatusAccepted) {
			t.Fatalf("testserver: PUT %s: %d %s %v", redactURL(u), status, b, err)
		}
		return u
	}
	s.Do(t, http.MethodPut, u, nil, http.StatusCreated)
	return u
}

// DeleteDB deletes database name: 200, or 202 from a CouchDB that has not
// written every copy yet.
func (s *Server) DeleteDB(t testing.TB, name string) {
	t.Helper()
	u := s.DBURL(name)
	if b, status, err := s.do(http.MethodDelete, u, nil); err != nil || (status != http.StatusOK && status != http.StatusAccepted) {
		t.Fatalf("testserver: DELETE %s: %d %s %v", redactURL(u), status, b, err)
	}
}

// Do sends a JSON request (body marshalled unless it is []byte or nil) and
// fails the test unless the status is want; it returns the response body.
func (s *Server) Do(t testing.TB, method, u string, body any, want int) []byte {
	t.Helper()
	b, status, err := s.do(method, u, body)
	if err != nil {
		t.Fatalf("testserver: %s %s: %v", method, redactURL(u), err)
	}
	if status != want {
		t.Fatalf("testserver: %s %s: status %d, want %d: %s", method, redactURL(u), status, want, b)
	}
	return b
}

// Request sends a request as Do does (JSON body, the admin's credentials
// once AddAdmin made one or the external server's URL carries them) and
// returns the body and status without judging them.
func (s *Server) Request(method, u string, body any) ([]byte, int, error) {
	return s.do(method, u, body)
}

func (s *Server) do(method, u string, body any) ([]byte, int, error) {
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case []byte:
		rd = bytes.NewReader(b)
	default:
		j, err := json.Marshal(b)
		if err != nil {
			return nil, 0, err
		}
		rd = bytes.NewReader(j)
	}
	req, err := http.NewRequest(method, u, rd)
	if err != nil {
		return nil, 0, err
	}
	req.Header.Set("Accept", "application/json")
	if rd != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	s.mu.Lock()
	if s.adminUser != "" {
		req.SetBasicAuth(s.adminUser, s.adminPass)
	}
	s.mu.Unlock()
	resp, err := s.client.Do(req)
	if err != nil {
		return nil, 0, err
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	return out, resp.StatusCode, err
}

// Doc builds a document revision for PutRevs: id, body fields, and a
// revision history newest first ("3-c", "2-b", "1-a"; the generations
// must count down by one).
func Doc(id string, history []string, fields map[string]any) map[string]any {
	d := make(map[string]any, len(fields)+3)
	for k, v := range fields {
		d[k] = v
	}
	d["_id"] = id
	if len(history) > 0 {
		gen, _, _ := strings.Cut(history[0], "-")
		start, _ := strconv.Atoi(gen)
		ids := make([]string, len(history))
		for i, r := range history {
			_, ids[i], _ = strings.Cut(r, "-")
		}
		d["_rev"] = history[0]
		d["_revisions"] = map[string]any{"start": start, "ids": ids}
	}
	return d
}

// Deleted marks a document built by Doc as a tombstone.
func Deleted(d map[string]any) map[string]any {
	d["_deleted"] = true
	return d
}

// WithAttachment adds an inline attachment to a document built by Doc.
func WithAttachment(d map[string]any, name, contentType string, data []byte) map[string]any {
	atts, _ := d["_attachments"].(map[string]any)
	if atts == nil {
		atts = map[string]any{}
		d["_attachments"] = atts
	}
	atts[name] = map[string]any{"content_type": contentType, "data": base64.StdEncoding.EncodeToString(data)}
	return d
}

// PutRevs stores document revisions exactly as given (POST _bulk_docs
// with new_edits=false): several revisions of one id make conflicts.
func (s *Server) PutRevs(t testing.TB, dbURL string, docs ...map[string]any) {
	t.Helper()
	body := map[string]any{"new_edits": false, "docs": docs}
	out := s.bulkDocs(t, dbURL, body)
	var res []map[string]any
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatalf("testserver: _bulk_docs answer %s: %v", out, err)
	}
	for _, r := range res {
		if r["error"] != nil {
			t.Fatalf("testserver: _bulk_docs rejected %v", r)
		}
	}
}

// bulkDocs posts a _bulk_docs body. On a server the tests did not start it
// asks for every copy (w=3): a CouchDB cluster's _changes and _all_docs
// read one copy of each shard range, so a write acknowledged by a quorum
// of 2 may not show in the read that follows. 202 is then fine: a single
// node has fewer copies, a cluster with a node down too.
func (s *Server) bulkDocs(t testing.TB, dbURL string, body any) []byte {
	t.Helper()
	if !s.external {
		return s.Do(t, http.MethodPost, dbURL+"_bulk_docs", body, http.StatusCreated)
	}
	u := dbURL + "_bulk_docs?w=3"
	b, status, err := s.do(http.MethodPost, u, body)
	if err != nil || (status != http.StatusCreated && status != http.StatusAccepted) {
		t.Fatalf("testserver: POST %s: %d %s %v", redactURL(u), status, b, err)
	}
	return b
}

// PutDocs writes new documents the normal way (new edits; the server
// assigns revisions) and returns their revisions in order.
func (s *Server) PutDocs(t testing.TB, dbURL string, docs ...map[string]any) []string {
	t.Helper()
	out := s.bulkDocs(t, dbURL, map[string]any{"docs": docs})
	var res []struct {
		ID, Rev, Error, Reason string
	}
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatalf("testserver: _bulk_docs answer %s: %v", out, err)
	}
	revs := make([]string, len(res))
	for i, r := range res {
		if r.Error != "" {
			t.Fatalf("testserver: _bulk_docs: %s: %s %s", r.ID, r.Error, r.Reason)
		}
		revs[i] = r.Rev
	}
	return revs
}

// PutAttachment adds an attachment to revision rev of document id with
// PUT /db/id/name and returns the new revision.
func (s *Server) PutAttachment(t testing.TB, dbURL, id, rev, name, contentType string, data []byte) string {
	t.Helper()
	u := dbURL + url.PathEscape(id) + "/" + url.PathEscape(name) + "?rev=" + url.QueryEscape(rev)
	if s.external {
		u += "&w=3" // every copy, as bulkDocs
	}
	req, err := http.NewRequest(http.MethodPut, u, bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", contentType)
	req.Header.Set("Accept", "application/json")
	resp, err := s.client.Do(req)
	if err != nil {
		t.Fatalf("testserver: PUT %s: %v", redactURL(u), err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusCreated && !(s.external && resp.StatusCode == http.StatusAccepted) {
		t.Fatalf("testserver: PUT %s: status %d: %s", redactURL(u), resp.StatusCode, b)
	}
	var r struct{ Rev string }
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatalf("testserver: PUT %s: %s: %v", redactURL(u), b, err)
	}
	return r.Rev
}

// GetJSON fetches u and decodes the JSON answer into v; it fails the test
// unless the status is 200.
func (s *Server) GetJSON(t testing.TB, u string, v any) {
	t.Helper()
	b := s.Do(t, http.MethodGet, u, nil, http.StatusOK)
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("testserver: GET %s: %s: %v", redactURL(u), b, err)
	}
}
