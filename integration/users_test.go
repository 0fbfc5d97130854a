package integration

import (
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/couchrep/couchrep/internal/testserver"
)

// userReply is one answer of the HTTP API, with its cookies.
type userReply struct {
	status  int
	body    []byte
	cookies []*http.Cookie
	header  http.Header
}

func (r userReply) obj(t *testing.T) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(r.body, &m); err != nil {
		t.Fatalf("reply %d is not a JSON object: %v: %s", r.status, err, r.body)
	}
	return m
}

func (r userReply) cookie(name string) *http.Cookie {
	for _, c := range r.cookies {
		if c.Name == name {
			return c
		}
	}
	return nil
}

// userCall sends one request to a node's HTTP API as a user: Basic
// credentials (user != ""), a cookie (cookie != ""), or neither.
func userCall(t *testing.T, addr, method, path, ctype, body, user, pass, cookie string) userReply {
	t.Helper()
	req, err := http.NewRequest(method, "http://"+addr+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if ctype != "" {
		req.Header.Set("Content-Type", ctype)
	}
	if user != "" {
		req.SetBasicAuth(user, pass)
	}
	if cookie != "" {
		req.AddCookie(&http.Cookie{Name: "AuthSession", Value: cookie})
	}
	resp, err := (&http.Client{Timeout: 2 * time.Minute}).Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return userReply{status: resp.StatusCode, body: b, cookies: resp.Cookies(), header: resp.Header}
}

func wantError(t *testing.T, what string, r userReply, status int, code, reason string) {
	t.Helper()
	m := r.obj(t)
	if r.status != status || m["error"] != code || m["reason"] != reason {
		t.Fatalf("%s: %d %s; want %d {\"error\":%q,\"reason\":%q}", what, r.status, r.body, status, code, reason)
	}
}

// TestCouchDBUsers: PouchDB Server is the auth server ([couchrep]
// auth_server, no [admins]) of two couchrepd processes sharing one store.
// A user of its _users database (not an admin) may start a replication,
// which records him as its owner; another user cannot cancel it (CouchDB
// 3.4.3's 401 unauthorized "You are not a server admin."); admin-only paths
// answer him as CouchDB does (403 forbidden on _scheduler/*, 401 on
// _active_tasks); a wrong password gets 401 "Name or password is
// incorrect."; the server's admin is couchrep's admin; a cookie of POST
// /_session on one node works on the other, where the user cancels his own
// job with it. No password or cookie appears in any answer or log.
func TestCouchDBUsers(t *testing.T) {
	skipShort(t)
	srv := testserver.StartPouchDB(t)
	srv.AddAdmin(t, "adm", "adm-pw")
	for _, u := range []struct {
		name, pass string
		roles      []string
	}{{"joe", "erly-pw", []string{"erlanger"}}, {"ann", "ann-pw", []string{}}} {
		srv.Do(t, http.MethodPut, srv.URL+"_users/org.couchdb.user:"+u.name,
			map[string]any{"name": u.name, "password": u.pass, "roles": u.roles, "type": "user"}, http.StatusCreated)
	}
	src := srv.CreateDB(t, "usrc")
	srv.PutDocs(t, src, map[string]any{"_id": "a"}, map[string]any{"_id": "b"})
	tgt := srv.CreateDB(t, "utgt")
	withAdmin := func(db string) string {
		u, _ := url.Parse(db)
		u.User = url.UserPassword("adm", "adm-pw")
		return u.String()
	}

	store := filepath.Join(t.TempDir(), "shared.db")
	cfg := jobsConfig + "[couchdb]\nuuid = 5e55105e55105e55105e55105e55105e\n[couchrep]\nauth_server = " + srv.URL + "\n"
	aDir, bDir := t.TempDir(), t.TempDir()
	a := startNode(t, nodeOptions{name: "a", dataDir: aDir, store: store, config: writeConfig(t, aDir, cfg)})
	b := startNode(t, nodeOptions{name: "b", dataDir: bDir, store: store, config: writeConfig(t, bDir, cfg),
		env: []string{"COUCHREP_COUCHREP_NODE_TYPES=api_frontend"}})
	addrA, addrB := a.httpAddr(""), b.httpAddr("")
	var answers []userReply
	call := func(addr, method, path, ctype, body, user, pass, cookie string) userReply {
		t.Helper()
		r := userCall(t, addr, method, path, ctype, body, user, pass, cookie)
		answers = append(answers, r)
		return r
	}

	// joe (a CouchDB user, not an admin) replicates.
	rep := call(addrA, "POST", "/_replicate", "application/json",
		`{"source":"`+withAdmin(src)+`","target":"`+withAdmin(tgt)+`","continuous":true}`, "joe", "erly-pw", "")
	if rep.status != 202 {
		t.Fatalf("joe POST /_replicate: %d %s", rep.status, rep.body)
	}
	repID := rep.obj(t)["_local_id"].(string)

	// PouchDB Server's admin is a server admin here: sees the job, and its
	// owner.
	deadline := time.Now().Add(time.Minute)
	for {
		r := call(addrA, "GET", "/_scheduler/jobs/"+repID, "", "", "adm", "adm-pw", "")
		if r.status == 200 && r.obj(t)["user"] == "joe" && r.obj(t)["state"] == "running" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("joe's job as the admin sees it: %d %s", r.status, r.body)
		}
		time.Sleep(100 * time.Millisecond) // polling another process: no event reaches the test
	}

	// What a user who is not an admin gets, as from CouchDB 3.4.3.
	const notAdmin = "You are not a server admin."
	cancelBody := `{"replication_id":"` + repID + `","cancel":true}`
	wantError(t, "ann cancels joe's job", call(addrA, "POST", "/_replicate", "application/json", cancelBody, "ann", "ann-pw", ""),
		401, "unauthorized", notAdmin)
	wantError(t, "ann cancels joe's job by its body", call(addrA, "POST", "/_replicate", "application/json",
		`{"source":"`+withAdmin(src)+`","target":"`+withAdmin(tgt)+`","continuous":true,"cancel":true}`, "ann", "ann-pw", ""),
		401, "unauthorized", notAdmin)
	// ann POSTing joe's replication: CouchDB 3.4.3's check_authorization
	// (couch_replicator.erl): 401, and joe's job stays the only one.
	wantError(t, "ann POSTs joe's replication", call(addrA, "POST", "/_replicate", "application/json",
		`{"source":"`+withAdmin(src)+`","target":"`+withAdmin(tgt)+`","continuous":true}`, "ann", "ann-pw", ""),
		401, "unauthorized", notAdmin)
	if r := call(addrA, "GET", "/_scheduler/jobs", "", "", "adm", "adm-pw", ""); r.status != 200 ||
		r.obj(t)["total_rows"] != float64(1) || !strings.Contains(string(r.body), `"user":"joe"`) {
		t.Fatalf("after ann's POST, _scheduler/jobs: %d %s", r.status, r.body)
	}
	wantError(t, "joe reads _scheduler/jobs", call(addrA, "GET", "/_scheduler/jobs", "", "", "joe", "erly-pw", ""), 403, "forbidden", notAdmin)
	wantError(t, "joe reads _scheduler/docs", call(addrA, "GET", "/_scheduler/docs", "", "", "joe", "erly-pw", ""), 403, "forbidden", notAdmin)
	wantError(t, "joe reads _active_tasks", call(addrA, "GET", "/_active_tasks", "", "", "joe", "erly-pw", ""), 401, "unauthorized", notAdmin)
	wantError(t, "anonymous _replicate", call(addrA, "POST", "/_replicate", "application/json", cancelBody, "", "", ""),
		401, "unauthorized", "You are not an authenticated user")
	wantError(t, "a wrong password", call(addrA, "GET", "/_scheduler/jobs", "", "", "joe", "wrong-pw", ""),
		401, "unauthorized", "Name or password is incorrect.")
	wantError(t, "a wrong password at POST /_session", call(addrA, "POST", "/_session", "application/json", `{"name":"joe","password":"wrong-pw"}`, "", "", ""),
		401, "unauthorized", "Name or password is incorrect.")

	// Cookie login on node a (a form, as a browser sends it), used on node b.
	login := call(addrA, "POST", "/_session", "application/x-www-form-urlencoded", "name=joe&password=erly-pw", "", "", "")
	c := login.cookie("AuthSession")
	if login.status != 200 || c == nil || c.Value == "" || c.MaxAge != 600 || !c.HttpOnly {
		t.Fatalf("POST /_session: %d %s %q", login.status, login.body, login.header.Values("Set-Cookie"))
	}
	if m := login.obj(t); m["ok"] != true || m["name"] != "joe" {
		t.Fatalf("POST /_session answer %s", login.body)
	}
	sess := call(addrB, "GET", "/_session", "", "", "", "", c.Value)
	if m := sess.obj(t); sess.status != 200 || m["userCtx"].(map[string]any)["name"] != "joe" {
		t.Fatalf("GET /_session on node b with node a's cookie: %d %s", sess.status, sess.body)
	}
	wantError(t, "joe's cookie on _scheduler/jobs of node b", call(addrB, "GET", "/_scheduler/jobs", "", "", "", "", c.Value), 403, "forbidden", notAdmin)
	if r := call(addrB, "POST", "/_replicate", "application/json", cancelBody, "", "", c.Value); r.status != 200 || r.obj(t)["_local_id"] != repID {
		t.Fatalf("joe cancels his job on node b with his cookie: %d %s", r.status, r.body)
	}
	if r := call(addrB, "DELETE", "/_session", "", "", "", "", c.Value); r.status != 200 || r.cookie("AuthSession") == nil || r.cookie("AuthSession").Value != "" {
		t.Fatalf("DELETE /_session: %d %s", r.status, r.body)
	}

	// No credential anywhere.
	secrets := []string{"erly-pw", "ann-pw", "adm-pw", "wrong-pw", c.Value}
	for _, r := range answers {
		for _, s := range secrets {
			if strings.Contains(string(r.body), s) {
				t.Errorf("an answer holds %q: %s", s, r.body)
			}
		}
	}
	for _, n := range []*nodeProc{a, b} {
		logs := n.logs.String()
		for _, s := range secrets {
			if strings.Contains(logs, s) {
				t.Errorf("node %s logged %q", n.dataDir, s)
			}
		}
	}
}
