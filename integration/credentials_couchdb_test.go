package integration

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/couchrep/couchrep/internal/testserver"
)

// jwtMintScript is a credential helper of the kind the docs show: it
// prints an HS256 JWT valid for $2 seconds, signed with the key in file
// $1 (sh and openssl only), with CouchDB's _couchdb.roles claim, and notes
// each run in $3.
const jwtMintScript = `#!/bin/sh
set -eu
b64url() { base64 -w0 | tr '+/' '-_' | tr -d '='; }
key=$(cat "$1")
now=$(date +%s)
h=$(printf '{"alg":"HS256","typ":"JWT"}' | b64url)
p=$(printf '{"sub":"couchrep-jwt","iat":%d,"exp":%d,"_couchdb.roles":["_admin"]}' "$now" "$((now + $2))" | b64url)
s=$(printf '%s.%s' "$h" "$p" | openssl dgst -sha256 -hmac "$key" -binary | b64url)
echo "$now" >> "$3"
printf '%s.%s.%s\n' "$h" "$p" "$s"
`

// couchNodes are the names of the nodes of the CouchDB of s (one for a
// single node, every member of a cluster).
func couchNodes(t *testing.T, s *testserver.Server) []string {
	t.Helper()
	var m struct {
		AllNodes []string `json:"all_nodes"`
	}
	if err := json.Unmarshal(s.Do(t, http.MethodGet, s.URL+"_membership", nil, http.StatusOK), &m); err != nil || len(m.AllNodes) == 0 {
		t.Fatalf("_membership: %v %v", m, err)
	}
	return m.AllNodes
}

// withCouchJWT turns on CouchDB's jwt_authentication_handler with HMAC
// key secret on every node of s ([jwt_keys] hmac:_default, [chttpd]
// authentication_handlers, [jwt_auth] required_claims = exp; the handler
// list is read at start, so each node restarts), runs fn, and puts the
// configuration back (restarting again), holding the config lock all
// along.
func withCouchJWT(t *testing.T, s *testserver.Server, secret []byte, fn func()) {
	t.Helper()
	if p := os.Getenv(ConfigLockEnv); p != "" {
		f, err := os.OpenFile(p, os.O_CREATE|os.O_RDWR, 0o644)
		if err != nil {
			t.Fatalf("config lock %s: %v", p, err)
		}
		defer f.Close()
		if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
			t.Fatalf("config lock %s: %v", p, err)
		}
		defer func() { _ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN) }()
	}
	settings := [][3]string{
		{"jwt_keys", "hmac:_default", base64.StdEncoding.EncodeToString(secret)},
		{"jwt_auth", "required_claims", "exp"},
		{"chttpd", "authentication_handlers", "{chttpd_auth, cookie_authentication_handler}, {chttpd_auth, jwt_authentication_handler}, {chttpd_auth, default_authentication_handler}"},
	}
	nodes := couchNodes(t, s)
	var local struct {
		Name string `json:"name"`
	}
	if err := json.Unmarshal(s.Do(t, http.MethodGet, s.URL+"_node/_local", nil, http.StatusOK), &local); err != nil {
		t.Fatal(err)
	}
	restart := func() {
		// The node answering last: the others are asked through it.
		order := []string{}
		for _, n := range nodes {
			if n != local.Name {
				order = append(order, n)
			}
		}
		for _, n := range append(order, local.Name) {
			// The answer may not come: the node stops its listener.
			_, _, _ = s.Request(http.MethodPost, s.URL+"_node/"+url.PathEscape(n)+"/_restart", nil)
		}
		time.Sleep(500 * time.Millisecond) // the restart begins; what follows waits on /_up
		waitUntil(t, "CouchDB up after a restart, every node back", 2*time.Minute, func() bool {
			_, status, err := s.Request(http.MethodGet, s.URL+"_up", nil)
			if err != nil || status != http.StatusOK {
				return false
			}
			b, status, err := s.Request(http.MethodGet, s.URL+"_membership", nil)
			var m struct {
				AllNodes []string `json:"all_nodes"`
			}
			return err == nil && status == http.StatusOK && json.Unmarshal(b, &m) == nil && len(m.AllNodes) == len(nodes)
		})
	}
	type old struct {
		u   string
		had bool
		v   string
	}
	var olds []old
	defer func() {
		for _, o := range olds {
			if o.had {
				s.Do(t, http.MethodPut, o.u, o.v, http.StatusOK)
			} else {
				s.Do(t, http.MethodDelete, o.u, nil, http.StatusOK)
			}
		}
		restart()
	}()
	for _, n := range nodes {
		for _, kv := range settings {
			u := s.URL + "_node/" + url.PathEscape(n) + "/_config/" + kv[0] + "/" + kv[1]
			b, status, err := s.Request(http.MethodGet, u, nil)
			o := old{u: u, had: err == nil && status == http.StatusOK}
			if o.had {
				_ = json.Unmarshal(b, &o.v)
			}
			s.Do(t, http.MethodPut, u, kv[2], http.StatusOK)
			olds = append(olds, o)
		}
	}
	restart()
	fn()
}

// TestCouchDBJWTBearerCommand: a continuous job whose endpoints take their
// bearer token from a command minting 60-second JWTs replicates from and
// to CouchDB 3.4.3 (jwt_authentication_handler, an HMAC key, exp
// required) across token renewals without a crash; the replication id is
// the one CouchDB computes for the same document (the token is not part
// of it) and a new run of the job resumes from its checkpoint. The
// configuration is put back; COUCHREP_TEST_COUCH_CONFIG_LOCK is held
// meanwhile.
func TestCouchDBJWTBearerCommand(t *testing.T) {
	skipShort(t)
	if os.Getenv(testserver.ExternalURLEnv) == "" {
		t.Skip("needs CouchDB: make test-couchdb COUCH_URL=http://admin:password@host:5984")
	}
	lifetime, run := 60*time.Second, 110*time.Second
	s := testserver.StartPouchDB(t) // the CouchDB of COUCHREP_TEST_COUCH_URL
	src := s.CreateDB(t, "jwt-src")
	tgtName := "jwt-tgt-" + fmt.Sprint(time.Now().UnixNano()%100000)
	tgt := s.DBURL(tgtName) // created by the job (create_target): deleted when the test ends
	written := 0
	put := func(n int) {
		var docs []map[string]any
		for range n {
			docs = append(docs, map[string]any{"_id": fmt.Sprintf("doc-%05d", written)})
			written++
		}
		s.PutDocs(t, src, docs...)
	}
	put(10)
	var info struct {
		UUID string `json:"uuid"`
	}
	s.GetJSON(t, s.URL, &info)

	dir := t.TempDir()
	secret := []byte("couchrep-jwt-test-key-" + fmt.Sprint(time.Now().UnixNano()))
	keyFile, script, runs := filepath.Join(dir, "key"), filepath.Join(dir, "mint-jwt"), filepath.Join(dir, "runs")
	for f, b := range map[string][]byte{keyFile: secret, script: []byte(jwtMintScript)} {
		if err := os.WriteFile(f, b, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	endpoint := func(u string) string {
		return fmt.Sprintf(`{"url":%q,"auth":{"bearer":{"command":["sh",%q,%q,"%d",%q]}}}`,
			noCreds(u), script, keyFile, int(lifetime/time.Second), runs)
	}
	doc := `{"source":` + endpoint(src) + `,"target":` + endpoint(tgt) + `,"continuous":true,"create_target":true}`
	docCount := func(db string) int {
		b, status, err := s.Request(http.MethodGet, db, nil)
		var i struct {
			DocCount int `json:"doc_count"`
		}
		if err != nil || status != http.StatusOK || json.Unmarshal(b, &i) != nil {
			return -1
		}
		return i.DocCount
	}

	withCouchJWT(t, s, secret, func() {
		// CouchDB takes a JWT of the script and refuses an expired one.
		tok := runCmd(t, "sh", script, keyFile, "60", filepath.Join(dir, "probe")).stdout
		expired := runCmd(t, "sh", script, keyFile, "-5", filepath.Join(dir, "probe")).stdout
		for _, c := range []struct {
			tok  string
			want int
		}{{tok, http.StatusOK}, {expired, http.StatusUnauthorized}, {"", http.StatusUnauthorized}} {
			req, _ := http.NewRequest(http.MethodGet, noCreds(src), nil)
			if c.tok != "" {
				req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(c.tok))
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != c.want {
				t.Fatalf("GET the source with a JWT (%d chars): %d, want %d", len(c.tok), resp.StatusCode, c.want)
			}
		}

		// The id CouchDB computes for the same document (its replicator
		// is off: max_jobs = 0; the job is only added, then cancelled).
		couchID, _ := couchRequestJSON(t, s, http.MethodPost, s.URL+"_replicate", doc)["_local_id"].(string)
		if couchID == "" {
			t.Fatal("CouchDB gave no _local_id")
		}
		_, _, _ = s.Request(http.MethodPost, s.URL+"_replicate", map[string]any{"replication_id": couchID, "cancel": true})

		n := startNode(t, nodeOptions{name: "jwt", env: []string{"COUCHREP_COUCHDB_UUID=" + info.UUID,
			"COUCHREP_REPLICATOR_ALLOW_CREDENTIAL_COMMANDS=true", "COUCHREP_REPLICATOR_STARTUP_JITTER=0",
			"COUCHREP_REPLICATOR_CHECKPOINT_INTERVAL=5000", "COUCHREP_REPLICATOR_USE_DB_UPDATES=false"}})
		r := api(t, n.httpAddr(""), "POST", "/_replicate", doc)
		id, _ := r.obj(t)["_local_id"].(string)
		if r.status != 202 || id != couchID {
			t.Fatalf("POST /_replicate: %d %s; want 202 and CouchDB's id %s", r.status, r.body, couchID)
		}
		waitUntil(t, "the first documents on the target", 2*time.Minute, func() bool { return docCount(tgt) == written })
		start := time.Now()
		for time.Since(start) < run {
			put(1)
			time.Sleep(500 * time.Millisecond) // the pace of the writes
		}
		waitUntil(t, "every document on the target", 2*time.Minute, func() bool { return docCount(tgt) == written })
		b, _ := os.ReadFile(runs)
		mints := strings.Count(string(b), "\n")
		j := api(t, n.httpAddr(""), "GET", "/_scheduler/jobs/"+id, "").obj(t)
		t.Logf("%s of %s JWTs from CouchDB to CouchDB: %d docs, the command ran %d times, job %v, history %v",
			time.Since(start).Round(time.Second), lifetime, written, mints, j["state"], j["history"])
		if c := crashes(j); len(c) != 0 || j["state"] != "running" {
			t.Errorf("the job: state %v, crashes %q", j["state"], c)
		}
		if want := 1 + int(time.Since(start)/(lifetime*8/10)); mints < want || mints > want+2 {
			t.Errorf("the command ran %d times in %s of %s tokens, want %d-%d", mints, time.Since(start).Round(time.Second), lifetime, want, want+2)
		}
		// A new run of the job (cancelled, posted again) resumes from
		// its checkpoint: a renewed token changed nothing of its id.
		api(t, n.httpAddr(""), "POST", "/_replicate", `{"replication_id":"`+id+`","cancel":true}`)
		put(1)
		r = api(t, n.httpAddr(""), "POST", "/_replicate", doc)
		if id2, _ := r.obj(t)["_local_id"].(string); id2 != id {
			t.Fatalf("the same document again: id %q, want %q", id2, id)
		}
		waitUntil(t, "the last document on the target", 2*time.Minute, func() bool { return docCount(tgt) == written })
		j = api(t, n.httpAddr(""), "GET", "/_scheduler/jobs/"+id, "").obj(t)
		ji, _ := j["info"].(map[string]any)
		if ji["start_from"] == "zero" || ji["start_seq"] == "0" {
			t.Errorf("the second run started from zero: %v", ji)
		}
		api(t, n.httpAddr(""), "POST", "/_replicate", `{"replication_id":"`+id+`","cancel":true}`)
	})
}

// couchRequestJSON sends a JSON body to the CouchDB of s and decodes its
// JSON object answer.
func couchRequestJSON(t *testing.T, s *testserver.Server, method, u, body string) map[string]any {
	t.Helper()
	b, status, err := s.Request(method, u, json.RawMessage(body))
	var m map[string]any
	if err != nil || json.Unmarshal(b, &m) != nil {
		t.Fatalf("%s %s: %d %v %s", method, noCreds(u), status, err, b)
	}
	return m
}
