package integration

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/couchrep/couchrep/internal/testserver"
)

// What the proxies and fakes of these tests answer in CouchDB's place.
// TestCouchDBAnswers sends the same requests to the CouchDB of make
// test-couchdb and checks that it answers the same.
const (
	// [chttpd] max_http_request_size exceeded (tooLargeProxy).
	couchTooLarge = `{"error":"too_large","reason":"the request entity is too large"}`
	// [couchdb] max_attachment_size exceeded by attachment "att"
	// (TestScenarioAttachmentsTooLarge).
	couchAttTooLarge = `{"error":"attachment_too_large","reason":"att"}`
	// An attachment named "_foo" (TestScenarioErrorReporting).
	couchBadAttName = `{"error":"bad_request","reason":"Attachment name '_foo' starts with prohibited character '_'"}`
	// A design document written by a user who is not the database's admin
	// (TestScenarioNonAdminUser).
	couchNotDBAdmin = `You are not a db or server admin.`
	// Any request of a user who is not a member (TestScenarioNonAdminUser).
	couchNotAllowedDB = `{"error":"forbidden","reason":"You are not allowed to access this db."}`
)

// ConfigLockEnv names a file that tests changing the shared CouchDB's
// configuration hold an exclusive flock(2) on while they do
// (make test-couchdb COUCH_CONFIG_LOCK=…).
const ConfigLockEnv = "COUCHREP_TEST_COUCH_CONFIG_LOCK"

// withCouchConfig sets section/key of every node of the CouchDB of s to value,
// runs fn and puts the old value back (deleting the key if it had none),
// holding the config lock if there is one.
func withCouchConfig(t *testing.T, s *testserver.Server, section, key, value string, fn func()) {
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
	// Every node of a cluster: a _node/_local change is one node's, and
	// CouchDB may run the job that needs it (a _replicate) on another.
	var members struct {
		ClusterNodes []string `json:"cluster_nodes"`
	}
	nodes := []string{"_local"}
	if b, status, err := s.Request(http.MethodGet, s.URL+"_membership", nil); err == nil && status == http.StatusOK &&
		json.Unmarshal(b, &members) == nil && len(members.ClusterNodes) > 0 {
		nodes = members.ClusterNodes
	}
	for _, node := range nodes {
		u := s.URL + "_node/" + url.PathEscape(node) + "/_config/" + section + "/" + key
		b, status, err := s.Request(http.MethodGet, u, nil)
		had := err == nil && status == http.StatusOK
		var old string
		if had {
			_ = json.Unmarshal(b, &old)
		}
		s.Do(t, http.MethodPut, u, value, http.StatusOK)
		defer func() {
			if had {
				s.Do(t, http.MethodPut, u, old, http.StatusOK)
			} else {
				s.Do(t, http.MethodDelete, u, nil, http.StatusOK)
			}
		}()
	}
	fn()
}

// addCouchUser creates a user of the CouchDB's _users with a name of its
// own (deleted when the test ends) and returns a function putting that
// user's credentials into a URL of the server.
func addCouchUser(t *testing.T, s *testserver.Server, base, pass string) func(string) string {
	t.Helper()
	var rnd [3]byte
	_, _ = rand.Read(rnd[:])
	name := "couchrep-test-" + base + "-" + hex.EncodeToString(rnd[:])
	u := s.URL + "_users/org.couchdb.user:" + name
	s.Do(t, http.MethodPut, u, map[string]any{"name": name, "password": pass, "roles": []string{}, "type": "user"}, http.StatusCreated)
	t.Cleanup(func() {
		var doc struct {
			Rev string `json:"_rev"`
		}
		if b, status, err := s.Request(http.MethodGet, u, nil); err == nil && status == http.StatusOK && json.Unmarshal(b, &doc) == nil {
			_, _, _ = s.Request(http.MethodDelete, u+"?rev="+doc.Rev, nil)
		}
	})
	return func(raw string) string {
		p, _ := url.Parse(raw)
		p.User = url.UserPassword(name, pass)
		return p.String()
	}
}

// couchAnswer is one request's answer.
type couchAnswer struct {
	status int
	header http.Header
	body   []byte
}

func (a couchAnswer) String() string { return fmt.Sprintf("%d %.300s", a.status, a.body) }

// couchRequest sends one request with the credentials in u (if any) and
// the given content type.
func couchRequest(t *testing.T, method, u, ctype string, body []byte, hdr ...string) couchAnswer {
	t.Helper()
	req, err := http.NewRequest(method, u, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if req.URL.User != nil {
		pass, _ := req.URL.User.Password()
		req.SetBasicAuth(req.URL.User.Username(), pass)
		req.URL.User = nil
	}
	req.Header.Set("Accept", "application/json")
	if ctype != "" {
		req.Header.Set("Content-Type", ctype)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := (&http.Client{Timeout: 30 * time.Second}).Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, noCreds(u), err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return couchAnswer{resp.StatusCode, resp.Header, b}
}

// sameJSON reports whether a and b are the same JSON value.
func sameJSON(a, b []byte) bool {
	var x, y any
	return json.Unmarshal(a, &x) == nil && json.Unmarshal(b, &y) == nil && reflect.DeepEqual(x, y)
}

func mustJSON(v any) []byte {
	b, _ := json.Marshal(v)
	return b
}

// TestCouchDBAnswers (issue 32): every answer a proxy or fake of these
// tests gives in CouchDB's place, and what integration/README.md says
// CouchDB answers where PouchDB Server differs, asked of the CouchDB of
// make test-couchdb (COUCHREP_TEST_COUCH_URL). Each case names the test
// whose fake it checks. Configuration it changes ([chttpd]
// max_http_request_size, [couchdb] max_attachment_size) is put back at
// once; with COUCHREP_TEST_COUCH_CONFIG_LOCK set it holds that lock
// meanwhile.
func TestCouchDBAnswers(t *testing.T) {
	skipShort(t)
	if os.Getenv(testserver.ExternalURLEnv) == "" {
		t.Skip("checks CouchDB's answers: make test-couchdb COUCH_URL=http://admin:password@host:5984")
	}
	s := testserver.StartPouchDB(t) // the CouchDB of COUCHREP_TEST_COUCH_URL
	db := s.CreateDB(t, "answers")
	s.PutRevs(t, db, testserver.Doc("d1", []string{"1-a"}, map[string]any{"v": 1}))
	att := func(id, name string, n int) map[string]any {
		return testserver.WithAttachment(testserver.Doc(id, []string{"1-x"}, nil), name, "app/binary", bytes.Repeat([]byte("x"), n))
	}
	// Failed logins use a name nobody has: CouchDB locks a user out of an
	// address after 5 ([chttpd_auth_lockout]).
	const nobody = "couchrep-test-nobody"
	wantBody := func(t *testing.T, got couchAnswer, status int, body string) {
		t.Helper()
		if got.status != status || !sameJSON(got.body, []byte(body)) {
			t.Errorf("answer %s, want %d %s", got, status, body)
		}
	}

	t.Run("413 too_large over max_http_request_size (tooLargeProxy)", func(t *testing.T) {
		withCouchConfig(t, s, "chttpd", "max_http_request_size", "10000", func() {
			body := mustJSON(map[string]any{"new_edits": false, "docs": []any{testserver.Doc("big", []string{"1-b"}, map[string]any{"x": strings.Repeat("x", 12000)})}})
			wantBody(t, couchRequest(t, http.MethodPost, db+"_bulk_docs", "application/json", body), http.StatusRequestEntityTooLarge, couchTooLarge)
		})
	})
	t.Run("413 attachment_too_large over max_attachment_size (TestScenarioAttachmentsTooLarge)", func(t *testing.T) {
		withCouchConfig(t, s, "couchdb", "max_attachment_size", "999", func() {
			body := mustJSON(map[string]any{"new_edits": false, "docs": []any{att("atl", "att", 1000)}})
			wantBody(t, couchRequest(t, http.MethodPost, db+"_bulk_docs", "application/json", body), http.StatusRequestEntityTooLarge, couchAttTooLarge)
			mp := "--XyZ\r\nContent-Type: application/json\r\n\r\n" +
				`{"_id":"atl2","_rev":"1-x","_revisions":{"start":1,"ids":["x"]},"_attachments":{"att":{"content_type":"app/binary","length":1000,"follows":true}}}` +
				"\r\n--XyZ\r\nContent-Disposition: attachment; filename=\"att\"\r\nContent-Type: app/binary\r\n\r\n" + strings.Repeat("x", 1000) + "\r\n--XyZ--"
			wantBody(t, couchRequest(t, http.MethodPut, db+"atl2?new_edits=false", `multipart/related; boundary="XyZ"`, []byte(mp)), http.StatusRequestEntityTooLarge, couchAttTooLarge)
			// 1,000 bytes pass a limit of 1,000 (should_succeed).
		})
	})
	t.Run("400 attachment name starting with _ (TestScenarioErrorReporting)", func(t *testing.T) {
		wantBody(t, couchRequest(t, http.MethodPut, db+"badatt?new_edits=false", "application/json", mustJSON(att("badatt", "_foo", 10))), http.StatusBadRequest, couchBadAttName)
	})
	t.Run("non-admin and non-member (TestScenarioNonAdminUser)", func(t *testing.T) {
		joe := addCouchUser(t, s, "joe", "erly")
		tgt := s.CreateDB(t, "answers-na")
		s.Do(t, http.MethodPut, tgt+"_security", map[string]any{"admins": map[string]any{"names": []string{"superman"}, "roles": []string{"god"}}}, http.StatusOK)
		ddoc := testserver.Doc("_design/foo", []string{"1-f"}, map[string]any{"language": "javascript"})
		a := couchRequest(t, http.MethodPost, joe(tgt)+"_bulk_docs", "application/json", mustJSON(map[string]any{"new_edits": false, "docs": []any{ddoc, testserver.Doc("plain", []string{"1-p"}, nil)}}))
		var rows []map[string]any
		_ = json.Unmarshal(a.body, &rows)
		// Session 9 found the proxy answering "unauthorized" and 401 here.
		if a.status != http.StatusCreated || len(rows) != 1 || rows[0]["id"] != "_design/foo" || rows[0]["rev"] != "1-f" || rows[0]["error"] != "forbidden" || rows[0]["reason"] != couchNotDBAdmin {
			t.Errorf("joe's _bulk_docs with a design document: %s, want 201 and one row: _design/foo 1-f forbidden %q (the plain document written: no row)", a, couchNotDBAdmin)
		}
		wantBody(t, couchRequest(t, http.MethodPut, joe(tgt)+"_design/foo?new_edits=false", "application/json", mustJSON(ddoc)), http.StatusForbidden, mustJSONString(map[string]string{"error": "forbidden", "reason": couchNotDBAdmin}))
		closed := s.CreateDB(t, "answers-members")
		s.Do(t, http.MethodPut, closed+"_security", map[string]any{"members": map[string]any{"names": []string{"john"}}}, http.StatusOK)
		wantBody(t, couchRequest(t, http.MethodGet, joe(closed), "", nil), http.StatusForbidden, couchNotAllowedDB)
	})
	t.Run("POST /_replicate of another user's replication (internal/httpapi TestUsersOwnJobs, repjob TestAddTransientAs)", func(t *testing.T) {
		joe := addCouchUser(t, s, "rjoe", "erly")
		ann := addCouchUser(t, s, "rann", "ann-pw")
		src := s.CreateDB(t, "answers-rep")
		body := mustJSON(map[string]any{"source": src, "target": s.DBURL("answers-rep-tgt"), "continuous": true})
		first := couchRequest(t, http.MethodPost, joe(s.URL)+"_replicate", "application/json", body)
		var started struct {
			OK      bool   `json:"ok"`
			LocalID string `json:"_local_id"`
		}
		if first.status != http.StatusAccepted || json.Unmarshal(first.body, &started) != nil || started.LocalID == "" {
			t.Fatalf("joe's POST /_replicate: %s, want 202", first)
		}
		t.Cleanup(func() {
			couchRequest(t, http.MethodPost, s.URL+"_replicate", "application/json",
				mustJSON(map[string]any{"replication_id": started.LocalID, "cancel": true}))
		})
		// Another user who is not an admin: check_authorization's 401.
		wantBody(t, couchRequest(t, http.MethodPost, ann(s.URL)+"_replicate", "application/json", body),
			http.StatusUnauthorized, `{"error":"unauthorized","reason":"You are not a server admin."}`)
		// An admin's POST of the same body: 202, the same id, joe's job
		// stays (existing_replication ignores the user).
		wantBody(t, couchRequest(t, http.MethodPost, s.URL+"_replicate", "application/json", body),
			http.StatusAccepted, mustJSONString(map[string]any{"ok": true, "_local_id": started.LocalID}))
		var jobs struct {
			Jobs []struct {
				ID   string `json:"id"`
				User string `json:"user"`
			} `json:"jobs"`
		}
		s.GetJSON(t, s.URL+"_scheduler/jobs", &jobs)
		n := 0
		for _, j := range jobs.Jobs {
			if j.ID == started.LocalID {
				n++
				if !strings.HasPrefix(j.User, "couchrep-test-rjoe-") {
					t.Errorf("the job's user is %q, want joe's", j.User)
				}
			}
		}
		if n != 1 {
			t.Errorf("%d jobs of %s in _scheduler/jobs, want 1", n, started.LocalID)
		}
	})
	t.Run("_session (internal/couch TestSessionCookies, httpapi users)", func(t *testing.T) {
		admin, _ := url.Parse(s.URL)
		pass, _ := admin.User.Password()
		form := func(name, pw string) []byte {
			return []byte(url.Values{"name": {name}, "password": {pw}}.Encode())
		}
		wantBody(t, couchRequest(t, http.MethodPost, noCreds(s.URL)+"_session", "application/x-www-form-urlencoded", form(nobody, pass)),
			http.StatusUnauthorized, `{"error":"unauthorized","reason":"Name or password is incorrect."}`)
		a := couchRequest(t, http.MethodPost, noCreds(s.URL)+"_session", "application/x-www-form-urlencoded", form(admin.User.Username(), pass))
		wantBody(t, a, http.StatusOK, mustJSONString(map[string]any{"ok": true, "name": admin.User.Username(), "roles": []string{"_admin"}}))
		c := a.header.Get("Set-Cookie")
		for _, part := range []string{"AuthSession=", "Version=1", "Path=/", "HttpOnly", "Max-Age=600"} {
			if !strings.Contains(c, part) {
				t.Errorf("Set-Cookie %q lacks %q", c, part)
			}
		}
		// An unknown cookie is no session: 401 on a database.
		wantBody(t, couchRequest(t, http.MethodGet, noCreds(db), "", nil, "Cookie", "AuthSession=YWRtaW46NjAwMDAwMDA6AAAAAAAAAAAAAAAAAAAAAAAA"),
			http.StatusUnauthorized, `{"error":"unauthorized","reason":"You are not authorized to access this db."}`)
	})
	t.Run("_session's refusals (internal/httpapi users_test: couchrep's own /_session answers as CouchDB)", func(t *testing.T) {
		base := noCreds(s.URL)
		for _, c := range []struct {
			name, ctype, body string
			status            int
			code, reason      string
		}{
			{"no content type", "", `{"name":"joe"}`, 415, "bad_content_type", "Content-Type must be 'application/x-www-form-urlencoded' or 'application/json'"},
			{"no username", "application/json", `{"password":"x"}`, 400, "bad_request", "request body must contain a username"},
			{"two usernames", "application/json", `{"name":"a","username":"b"}`, 400, "bad_request", "request body contains different usernames"},
			{"not JSON", "application/json", `{"name":`, 400, "bad_request", "invalid UTF-8 JSON"},
		} {
			wantBody(t, couchRequest(t, http.MethodPost, base+"_session", c.ctype, []byte(c.body)), c.status, mustJSONString(map[string]string{"error": c.code, "reason": c.reason}))
		}
		wantBody(t, couchRequest(t, http.MethodPut, base+"_session", "", nil), http.StatusMethodNotAllowed, `{"error":"method_not_allowed","reason":"Only GET,HEAD,POST,DELETE allowed"}`)
		// No session: 200 and a null name; wrong Basic credentials: 401.
		a := couchRequest(t, http.MethodGet, base+"_session", "", nil, "Cookie", "AuthSession=YWRtaW46NjAwMDAwMDA6AAAAAAAAAAAAAAAAAAAAAAAA")
		var sess struct {
			OK      bool `json:"ok"`
			UserCtx struct {
				Name  *string  `json:"name"`
				Roles []string `json:"roles"`
			} `json:"userCtx"`
		}
		if a.status != http.StatusOK || json.Unmarshal(a.body, &sess) != nil || !sess.OK || sess.UserCtx.Name != nil || len(sess.UserCtx.Roles) != 0 {
			t.Errorf("GET /_session with an unknown cookie: %s, want 200 and userCtx name null", a)
		}
		u, _ := url.Parse(base + "_session")
		u.User = url.UserPassword(nobody, "not-the-password")
		wantBody(t, couchRequest(t, http.MethodGet, u.String(), "", nil), http.StatusUnauthorized, `{"error":"unauthorized","reason":"Name or password is incorrect."}`)
		// A failed login and a logout clear the cookie (an empty AuthSession).
		for _, a := range []couchAnswer{
			couchRequest(t, http.MethodPost, base+"_session", "application/json", mustJSON(map[string]string{"name": nobody, "password": "not-the-password"})),
			couchRequest(t, http.MethodDelete, base+"_session", "", nil),
		} {
			if c := a.header.Get("Set-Cookie"); !strings.HasPrefix(c, "AuthSession=;") {
				t.Errorf("%s: Set-Cookie %q, want an empty AuthSession", a, c)
			}
		}
	})
	t.Run("databases (internal/replicate fakes)", func(t *testing.T) {
		wantBody(t, couchRequest(t, http.MethodGet, s.DBURL("answers-none"), "", nil), http.StatusNotFound, `{"error":"not_found","reason":"Database does not exist."}`)
		wantBody(t, couchRequest(t, http.MethodPut, db, "", nil), http.StatusPreconditionFailed, `{"error":"file_exists","reason":"The database could not be created, the file already exists."}`)
	})
	t.Run("_db_updates (internal/dbupdates, testserver's feed)", func(t *testing.T) {
		joe := addCouchUser(t, s, "joe", "erly")
		wantBody(t, couchRequest(t, http.MethodGet, joe(s.URL)+"_db_updates", "", nil), http.StatusUnauthorized, `{"error":"unauthorized","reason":"You are not a server admin."}`)
		wantBody(t, couchRequest(t, http.MethodGet, s.URL+"_db_updates?since=5", "", nil), http.StatusBadRequest, `{"error":"bad_request","reason":"Malformed sequence supplied in 'since' parameter."}`)
	})
	t.Run("_revs_limit and possible_ancestors (TestScenarioMissingStubs, internal/couch TestRevsDiff)", func(t *testing.T) {
		wantBody(t, couchRequest(t, http.MethodPut, db+"_revs_limit", "application/json", []byte("3")), http.StatusOK, `{"ok":true}`)
		wantBody(t, couchRequest(t, http.MethodGet, db+"_revs_limit", "", nil), http.StatusOK, `3`)
		wantBody(t, couchRequest(t, http.MethodPost, db+"_revs_diff", "application/json", []byte(`{"d1":["2-b"],"nope":["1-n"]}`)), http.StatusOK,
			`{"d1":{"missing":["2-b"],"possible_ancestors":["1-a"]},"nope":{"missing":["1-n"]}}`)
	})
	t.Run("missing_stub (internal/couch TestPutDoc)", func(t *testing.T) {
		// A stub of an attachment the target has not got: 412.
		d := testserver.Doc("stubby", []string{"2-s", "1-s"}, nil)
		d["_attachments"] = map[string]any{"a": map[string]any{"stub": true, "revpos": 1, "content_type": "app/binary", "length": 5, "digest": "md5-XUFAKrxLKna5cZ2REBfFkg=="}}
		a := couchRequest(t, http.MethodPut, db+"stubby?new_edits=false", "application/json", mustJSON(d))
		var e map[string]string
		_ = json.Unmarshal(a.body, &e)
		if a.status != http.StatusPreconditionFailed || e["error"] != "missing_stub" {
			t.Errorf("a stub of a missing attachment: %s, want 412 missing_stub", a)
		}
	})
	t.Run("the server's replicator (internal/takeover/takeovertest.Fake)", func(t *testing.T) {
		// [replicator] as a JSON object of strings (max_jobs "0" on the
		// servers of make test-couchdb; absent on a default install, which
		// internal/takeover reads as CouchDB's default 500).
		var cfg map[string]any
		a := couchRequest(t, http.MethodGet, s.URL+"_node/_local/_config/replicator", "", nil)
		if a.status != http.StatusOK || json.Unmarshal(a.body, &cfg) != nil {
			t.Fatalf("GET /_node/_local/_config/replicator: %s", a)
		}
		for k, v := range cfg {
			if _, ok := v.(string); !ok {
				t.Errorf("[replicator] %s = %v: not a string", k, v)
			}
		}
		var sched struct {
			TotalRows *int             `json:"total_rows"`
			Offset    *int             `json:"offset"`
			Docs      []map[string]any `json:"docs"`
		}
		a = couchRequest(t, http.MethodGet, s.URL+"_scheduler/docs", "", nil)
		if a.status != http.StatusOK || json.Unmarshal(a.body, &sched) != nil || sched.TotalRows == nil || sched.Offset == nil || sched.Docs == nil {
			t.Errorf("GET /_scheduler/docs: %s, want {total_rows, offset, docs}", a)
		}
		var tasks []map[string]any
		if a = couchRequest(t, http.MethodGet, s.URL+"_active_tasks", "", nil); a.status != http.StatusOK || json.Unmarshal(a.body, &tasks) != nil {
			t.Errorf("GET /_active_tasks: %s, want a JSON array", a)
		}
		joe := addCouchUser(t, s, "joe", "erly")
		for _, p := range []string{"_node/_local/_config/replicator", "_active_tasks"} {
			wantBody(t, couchRequest(t, http.MethodGet, joe(s.URL)+p, "", nil), http.StatusUnauthorized, `{"error":"unauthorized","reason":"You are not a server admin."}`)
		}
		// The store marker, a _local document: revisions 0-1, 0-2, …, and
		// no conflicts: a write with a stale _rev (or none) wins too, its
		// revision the one sent plus one (the fake answered 409 until
		// session 9).
		m := db + "_local/couchrep-stores"
		wantBody(t, couchRequest(t, http.MethodPut, m, "application/json", []byte(`{"stores":{}}`)), http.StatusCreated, `{"ok":true,"id":"_local/couchrep-stores","rev":"0-1"}`)
		wantBody(t, couchRequest(t, http.MethodPut, m, "application/json", []byte(`{"_rev":"0-1","stores":{}}`)), http.StatusCreated, `{"ok":true,"id":"_local/couchrep-stores","rev":"0-2"}`)
		wantBody(t, couchRequest(t, http.MethodPut, m, "application/json", []byte(`{"_rev":"0-1","stores":{"x":{}}}`)), http.StatusCreated, `{"ok":true,"id":"_local/couchrep-stores","rev":"0-2"}`)
		wantBody(t, couchRequest(t, http.MethodGet, m, "", nil), http.StatusOK, `{"_id":"_local/couchrep-stores","_rev":"0-2","stores":{"x":{}}}`)
		wantBody(t, couchRequest(t, http.MethodPut, m, "application/json", []byte(`{"stores":{}}`)), http.StatusCreated, `{"ok":true,"id":"_local/couchrep-stores","rev":"0-1"}`)
	})
	t.Run("README: where PouchDB Server differs", func(t *testing.T) {
		// PUT ?new_edits=false answers {"ok":true,"id","rev"}.
		wantBody(t, couchRequest(t, http.MethodPut, db+"e1?new_edits=false", "application/json", mustJSON(testserver.Doc("e1", []string{"1-e"}, nil))), http.StatusCreated, `{"ok":true,"id":"e1","rev":"1-e"}`)
		// _bulk_get of an unknown revision: an error row.
		a := couchRequest(t, http.MethodPost, db+"_bulk_get", "application/json", []byte(`{"docs":[{"id":"d1","rev":"9-z"}]}`))
		wantBody(t, a, http.StatusOK, `{"results":[{"id":"d1","docs":[{"error":{"id":"d1","rev":"9-z","error":"not_found","reason":"missing"}}]}]}`)
		// open_revs of an unknown document: 200 and a missing row, as
		// PouchDB Server (the README said 404 until session 9).
		wantBody(t, couchRequest(t, http.MethodGet, db+`nodoc?open_revs=["1-a"]`, "", nil), http.StatusOK, `[{"missing":"1-a"}]`)
		// open_revs=[unknown rev]&latest=true of an existing document: {"missing": rev}.
		wantBody(t, couchRequest(t, http.MethodGet, db+`d1?open_revs=["5-q"]&latest=true`, "", nil), http.StatusOK, `[{"missing":"5-q"}]`)
	})
}

func mustJSONString(v any) string { return string(mustJSON(v)) }
