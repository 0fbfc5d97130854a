package integration

import (
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/couchrep/couchrep/internal/replicate"
	"github.com/couchrep/couchrep/internal/testserver"
)

// TestAdoptUUIDResumesFromCouchDBCheckpoints is the move from CouchDB's
// replicator (README "Replacing CouchDB's replicator"): a node started
// with --adopt-uuid computes the server's replication ids, so it resumes
// from checkpoints another replicator recorded (simulated: couchrep's own
// checkpoints with couchrep's mark removed are what CouchDB writes), and
// _scheduler/jobs and couchrepctl say where each run started.
func TestAdoptUUIDResumesFromCouchDBCheckpoints(t *testing.T) {
	skipShort(t)
	srv := testserver.StartPouchDB(t)
	root := strings.TrimSuffix(srv.URL, "/")
	uuid := serverUUIDOf(t, srv)
	src := srv.CreateDB(t, "src")
	tgt := srv.CreateDB(t, "tgt")
	put := func(ids ...string) {
		for _, id := range ids {
			srv.Do(t, "PUT", src+id, map[string]any{"v": id}, 201)
		}
	}
	put("a", "b", "c")

	dir := t.TempDir()
	n := startNode(t, nodeOptions{name: "adopter", dataDir: dir, extra: []string{"--adopt-uuid", root}})
	if b, err := os.ReadFile(filepath.Join(dir, "couchdb_uuid")); err != nil || strings.TrimSpace(string(b)) != uuid {
		t.Fatalf("<data>/couchdb_uuid = %q, %v; want the server's %q", b, err, uuid)
	}
	if len(n.logLines("adopted the server uuid", uuid)) != 1 {
		t.Fatalf("no log line for the adopted uuid")
	}
	addr := n.httpAddr("")
	body := fmt.Sprintf(`{"source":%q,"target":%q}`, src, tgt)
	p, err := replicate.ParseParams([]byte(body))
	if err != nil {
		t.Fatal(err)
	}
	base, ext, err := replicate.ID(p, uuid)
	if err != nil {
		t.Fatal(err)
	}

	// run replicates once and returns the job's info and the answer.
	run := func() (map[string]any, map[string]any) {
		t.Helper()
		r := api(t, addr, "POST", "/_replicate", body)
		if r.status != 200 {
			t.Fatalf("POST /_replicate: %d %s", r.status, r.body)
		}
		job := waitJobState(t, addr, base+ext, "completed")
		info, _ := job["info"].(map[string]any)
		return info, r.obj(t)
	}
	info, _ := run()
	if info["start_from"] != "zero" || info["docs_written"] != 3.0 {
		t.Fatalf("first run: info %v, want start_from zero and 3 docs written", info)
	}

	// CouchDB's replicator writes the same checkpoints without couchrep's
	// mark: make them so, as if CouchDB had copied a, b and c.
	for _, db := range []string{src, tgt} {
		var doc map[string]any
		srv.GetJSON(t, db+"_local/"+base, &doc)
		for _, e := range doc["history"].([]any) {
			delete(e.(map[string]any), "replicator")
		}
		srv.Do(t, "PUT", db+"_local/"+base, doc, 201)
	}
	put("d", "e")
	info, answer := run()
	if info["start_from"] != "couchdb_checkpoint" || info["start_seq"] != "3" {
		t.Fatalf("after CouchDB's checkpoint: info %v, want start_from couchdb_checkpoint at 3", info)
	}
	h := answer["history"].([]any)[0].(map[string]any)
	// Counters continue from the checkpoint's, as in CouchDB: 3 + 2.
	if h["docs_written"] != 5.0 || h["start_last_seq"] != 3.0 || h["replicator"] != "couchrep" {
		t.Fatalf("after CouchDB's checkpoint: history[0] %v, want a session from seq 3 writing 2 more docs", h)
	}

	put("f")
	if info, _ := run(); info["start_from"] != "checkpoint" || info["start_seq"] != "5" {
		t.Fatalf("after its own checkpoint: info %v, want start_from checkpoint at 5", info)
	}
	out := ctlOK(t, n, "jobs")
	if !strings.Contains(out, "STARTED_FROM") || !strings.Contains(out, "checkpoint@5") {
		t.Fatalf("couchrepctl jobs shows no start:\n%s", out)
	}
	if out := ctlOK(t, n, "job", "show", base+ext); !strings.Contains(out, "checkpoint@5") {
		t.Fatalf("couchrepctl job show shows no start:\n%s", out)
	}

	// Restarted without the flag, the node keeps the adopted uuid (from
	// the data directory and the store): nothing to do.
	if err := n.stop(syscall.SIGTERM, time.Minute); err != nil {
		t.Fatalf("stopping: %v", err)
	}
	n = startNode(t, nodeOptions{name: "adopter", dataDir: dir})
	addr = n.httpAddr("")
	r := api(t, addr, "POST", "/_replicate", body)
	if r.status != 200 || r.obj(t)["no_changes"] != true {
		t.Fatalf("after a restart without --adopt-uuid: %d %s, want no_changes (same replication id)", r.status, r.body)
	}

	// A server that is not there is a clear error, not a node with
	// another uuid.
	res := runCmd(t, filepath.Join(binDir, "couchrepd"), "--data", t.TempDir(), "--adopt-uuid", "http://user:secret@127.0.0.1:1")
	if res.code != 1 || !strings.Contains(res.stderr, "--adopt-uuid: GET http://127.0.0.1:1/") || strings.Contains(res.stderr, "secret") {
		t.Fatalf("unreachable server: exit %d, stderr %q", res.code, res.stderr)
	}
	var replicated map[string]any
	srv.GetJSON(t, tgt, &replicated)
	if replicated["doc_count"] != 6.0 {
		t.Fatalf("target has %v docs, want 6", replicated["doc_count"])
	}
}

// TestAdoptUUIDOverTLS: --adopt-uuid reaches a CouchDB behind TLS with a
// private CA and a required client certificate (nginx in front of PouchDB
// Server) with the [replicator] TLS settings replication jobs use
// (verify_ssl_certificates, ssl_trusted_certificates_file, cert_file,
// key_file, password), for the node and for `couchrepd replicate`; a CA
// that does not sign the server's certificate is a clear error. No
// credential — the endpoint's password, the key's password — appears in
// any output.
func TestAdoptUUIDOverTLS(t *testing.T) {
	skipShort(t)
	pki := testserver.NewPKI(t)
	srv := testserver.StartPouchDB(t)
	nginx := testserver.StartNginx(t, pki, srv.URL)
	uuid := serverUUIDOf(t, srv)
	src := srv.CreateDB(t, "src")
	srv.Do(t, "PUT", src+"a", map[string]any{"v": 1}, 201)
	const user, pass = "adopter", "adopt-secret-pw"
	srv.AddAdmin(t, user, pass)
	u, err := url.Parse(nginx.ClientCertURL)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword(user, pass)
	adoptURL := u.String()
	secrets := []string{pass, pki.ClientKeyPassword}
	writeConfig := func(ca string) string {
		path := filepath.Join(t.TempDir(), "couchrep.ini")
		ini := fmt.Sprintf("[replicator]\nverify_ssl_certificates = true\nssl_trusted_certificates_file = %s\ncert_file = %s\nkey_file = %s\npassword = %s\n",
			ca, pki.ClientCert, pki.ClientKeyEncrypted, pki.ClientKeyPassword)
		if err := os.WriteFile(path, []byte(ini), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	noSecrets := func(what, s string) {
		t.Helper()
		for _, secret := range secrets {
			if strings.Contains(s, secret) {
				t.Fatalf("%s shows a credential (%q):\n%s", what, secret, s)
			}
		}
	}

	// The node adopts the uuid through nginx's client-certificate server.
	cfg := writeConfig(pki.CAFile)
	dir := t.TempDir()
	n := startNode(t, nodeOptions{name: "tls-adopter", dataDir: dir, config: cfg, extra: []string{"--adopt-uuid", adoptURL}})
	if b, err := os.ReadFile(filepath.Join(dir, "couchdb_uuid")); err != nil || strings.TrimSpace(string(b)) != uuid {
		t.Fatalf("<data>/couchdb_uuid = %q, %v; want the server's %q", b, err, uuid)
	}
	if len(n.logLines("adopted the server uuid", uuid)) != 1 {
		t.Fatalf("no log line for the adopted uuid")
	}
	noSecrets("the node's log", n.logs.String())

	// couchrepd replicate --adopt-uuid: the checkpoint is under the
	// replication id made with the server's uuid. (The endpoints carry the
	// admin's credentials: an anonymous PUT /db kills pouchdb-server once
	// an admin exists.)
	withCreds := func(raw string) string {
		v, err := url.Parse(raw)
		if err != nil {
			t.Fatal(err)
		}
		v.User = url.UserPassword(user, pass)
		return v.String()
	}
	src, tgt := withCreds(src), withCreds(srv.DBURL("tgt"))
	res := runCmd(t, filepath.Join(binDir, "couchrepd"), "replicate", "--config", cfg, "--adopt-uuid", adoptURL, "--create-target", src, tgt)
	if res.code != 0 {
		t.Fatalf("couchrepd replicate --adopt-uuid: exit %d, stderr %s", res.code, res.stderr)
	}
	noSecrets("couchrepd replicate's output", res.stdout+res.stderr)
	p, err := replicate.ParseParams([]byte(fmt.Sprintf(`{"source":%q,"target":%q,"create_target":true}`, src, tgt)))
	if err != nil {
		t.Fatal(err)
	}
	base, _, err := replicate.ID(p, uuid)
	if err != nil {
		t.Fatal(err)
	}
	var ckpt map[string]any
	srv.GetJSON(t, srv.DBURL("tgt")+"_local/"+base, &ckpt)
	if ckpt["session_id"] == nil {
		t.Fatalf("target checkpoint _local/%s: %v, want the one of the adopted uuid's replication id", base, ckpt)
	}

	// A CA that did not sign the server's certificate: a certificate
	// error naming the server, and no node.
	res = runCmd(t, filepath.Join(binDir, "couchrepd"), "--data", t.TempDir(), "--config", writeConfig(pki.OtherCAFile), "--adopt-uuid", adoptURL)
	want := "--adopt-uuid: GET https://" + u.Host + "/"
	if res.code != 1 || !strings.Contains(res.stderr, want) || !strings.Contains(res.stderr, "certificate") {
		t.Fatalf("untrusted server: exit %d, stderr %q; want 1 and a certificate error after %q", res.code, res.stderr, want)
	}
	noSecrets("couchrepd's error", res.stdout+res.stderr)
}

// serverUUIDOf is the uuid of srv's GET /.
func serverUUIDOf(t *testing.T, srv *testserver.Server) string {
	t.Helper()
	var welcome struct {
		UUID string `json:"uuid"`
	}
	srv.GetJSON(t, srv.URL, &welcome)
	if welcome.UUID == "" {
		t.Fatalf("pouchdb-server's GET / has no uuid")
	}
	return welcome.UUID
}
