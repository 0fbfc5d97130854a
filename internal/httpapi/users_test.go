package httpapi_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/couchrep/couchrep/internal/httpapi"
)

// couchDBCookie is a session cookie in CouchDB's own format that the fake
// auth server knows as joe's.
const couchDBCookie = "am9lOjY3NDg4MDAwOmZha2VobWFj"

// fakeCouch is the GET /_session of a CouchDB server, as CouchDB answers it:
// 200 with userCtx for good Basic credentials or a known cookie, 401
// "Name or password is incorrect." for wrong Basic credentials, 200 with
// name null for no (or an unknown) cookie.
type fakeCouch struct {
	srv *httptest.Server

	mu    sync.Mutex
	asked int
	auth  []string // the Authorization headers it got
	down  bool
}

var couchUsers = map[string]struct {
	password string
	roles    []string
}{
	"joe":  {"erly-pw", []string{"erlanger"}},
	"ann":  {"ann-pw", []string{}},
	"boss": {"boss-pw", []string{"_admin"}},
	"prom": {"prom-pw", []string{"_metrics"}},
}

func newFakeCouch(t *testing.T) *fakeCouch {
	f := &fakeCouch{}
	f.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		f.asked++
		f.auth = append(f.auth, r.Header.Get("Authorization"))
		down := f.down
		f.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		switch {
		case down:
			w.WriteHeader(http.StatusInternalServerError)
			io.WriteString(w, `{"error":"unknown_error","reason":"down"}`)
			return
		case r.URL.Path != "/_session" || r.Method != http.MethodGet:
			w.WriteHeader(http.StatusNotFound)
			io.WriteString(w, `{"error":"not_found","reason":"missing"}`)
			return
		}
		answer := func(name string, roles []string, handler string) {
			json.NewEncoder(w).Encode(map[string]any{"ok": true, "userCtx": map[string]any{"name": name, "roles": roles},
				"info": map[string]any{"authentication_handlers": []string{"cookie", "default"}, "authenticated": handler}})
		}
		if name, pass, ok := r.BasicAuth(); ok {
			if u, known := couchUsers[name]; known && u.password == pass {
				answer(name, u.roles, "default")
				return
			}
			w.WriteHeader(http.StatusUnauthorized)
			io.WriteString(w, `{"error":"unauthorized","reason":"Name or password is incorrect."}`)
			return
		}
		if c, err := r.Cookie("AuthSession"); err == nil && c.Value == couchDBCookie {
			answer("joe", couchUsers["joe"].roles, "cookie")
			return
		}
		io.WriteString(w, `{"ok":true,"userCtx":{"name":null,"roles":[]},"info":{"authentication_handlers":["cookie","default"]}}`)
	}))
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fakeCouch) count() int { f.mu.Lock(); defer f.mu.Unlock(); return f.asked }

func (f *fakeCouch) setDown(d bool) { f.mu.Lock(); f.down = d; f.mu.Unlock() }

// usersEnv is an API with a local admin and the fake CouchDB as auth
// server; its URL carries the server's own credentials, which must never
// reach the auth server with a user's request.
func usersEnv(t *testing.T, f *fakeCouch, logs io.Writer, secret []byte, mod func(*httpapi.Options)) *env {
	t.Helper()
	u, _ := url.Parse(f.srv.URL)
	u.User = url.UserPassword("svc", "svc-pw")
	o := httpapi.Options{Admins: map[string]string{"admin": "admin-pw"}, MaxBodyBytes: 64 << 10, UUID: uuid,
		Logger: zerolog.New(logs).Level(zerolog.DebugLevel),
		Users:  httpapi.UsersOptions{AuthServer: u.String(), CacheTTL: time.Minute}}
	if secret != nil {
		o.Users.SessionSecret = func(context.Context) ([]byte, error) { return secret, nil }
	}
	if mod != nil {
		mod(&o)
	}
	return newEnvWith(t, o)
}

// call is one request with optional Basic credentials and cookie.
type call struct {
	method, path, ctype, body string
	user, pass                string
	cookie                    string
}

func (e *env) call(c call) reply {
	e.t.Helper()
	if c.method == "" {
		c.method = http.MethodGet
	}
	req, err := http.NewRequest(c.method, e.srv.URL+c.path, strings.NewReader(c.body))
	if err != nil {
		e.t.Fatal(err)
	}
	if c.ctype != "" {
		req.Header.Set("Content-Type", c.ctype)
	}
	if c.user != "" {
		req.SetBasicAuth(c.user, c.pass)
	}
	if c.cookie != "" {
		req.AddCookie(&http.Cookie{Name: "AuthSession", Value: c.cookie})
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatalf("%s %s: %v", c.method, c.path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return reply{status: resp.StatusCode, header: resp.Header, body: b}
}

// sessionCookieOf returns the AuthSession cookie an answer sets.
func sessionCookieOf(t *testing.T, r reply) *http.Cookie {
	t.Helper()
	for _, c := range (&http.Response{Header: r.header}).Cookies() {
		if c.Name == "AuthSession" {
			return c
		}
	}
	return nil
}

// secrets are every password of the tests: no answer or log line may
// hold one.
var secrets = []string{"erly-pw", "ann-pw", "boss-pw", "prom-pw", "admin-pw", "svc-pw", "wrong-pw", couchDBCookie}

func assertNoSecret(t *testing.T, what string, b []byte) {
	t.Helper()
	for _, s := range secrets {
		if bytes.Contains(b, []byte(s)) {
			t.Errorf("%s holds %q: %s", what, s, b)
		}
	}
}

// TestUsersAuthorization: who may do what, and the answers of CouchDB
// 3.4.3 (chttpd_auth_request, chttpd_misc) for everyone else: admin-only
// paths refuse a logged-in user with 403 forbidden and an anonymous one
// with 401; _active_tasks refuses with 401 in its handler; the Prometheus
// endpoint admits the _metrics role; any user may POST /_replicate.
func TestUsersAuthorization(t *testing.T) {
	f := newFakeCouch(t)
	var logs syncBuffer
	e := usersEnv(t, f, &logs, nil, nil)
	const (
		notAdmin   = "You are not a server admin."
		notMetrics = "You are not a server admin or read-only metrics user"
	)
	for _, tc := range []struct {
		name         string
		c            call
		status       int
		code, reason string
	}{
		{"anonymous, scheduler jobs", call{path: "/_scheduler/jobs"}, 401, "unauthorized", notAdmin},
		{"anonymous, replicate", call{method: "POST", path: "/_replicate", ctype: "application/json", body: `{}`}, 401, "unauthorized", "You are not an authenticated user"},
		{"anonymous, prometheus", call{path: "/_node/_local/_prometheus"}, 401, "unauthorized", notMetrics},
		{"user, scheduler jobs", call{path: "/_scheduler/jobs", user: "joe", pass: "erly-pw"}, 403, "forbidden", notAdmin},
		{"user, scheduler job", call{path: "/_scheduler/jobs/abc", user: "joe", pass: "erly-pw"}, 403, "forbidden", notAdmin},
		{"user, scheduler docs", call{path: "/_scheduler/docs", user: "joe", pass: "erly-pw"}, 403, "forbidden", notAdmin},
		{"user, scheduler doc", call{path: "/_scheduler/docs/_replicator/d", user: "joe", pass: "erly-pw"}, 403, "forbidden", notAdmin},
		{"user, status page", call{path: "/_status", user: "joe", pass: "erly-pw"}, 403, "forbidden", notAdmin},
		{"user, active tasks", call{path: "/_active_tasks", user: "joe", pass: "erly-pw"}, 401, "unauthorized", notAdmin},
		{"user, metrics", call{path: "/metrics", user: "joe", pass: "erly-pw"}, 403, "forbidden", notMetrics},
		{"metrics user, scheduler jobs", call{path: "/_scheduler/jobs", user: "prom", pass: "prom-pw"}, 403, "forbidden", notAdmin},
		{"metrics user, prometheus", call{path: "/_node/_local/_prometheus", user: "prom", pass: "prom-pw"}, 200, "", ""},
		{"CouchDB admin, scheduler jobs", call{path: "/_scheduler/jobs", user: "boss", pass: "boss-pw"}, 200, "", ""},
		{"CouchDB admin, active tasks", call{path: "/_active_tasks", user: "boss", pass: "boss-pw"}, 200, "", ""},
		{"[admins] admin, scheduler docs", call{path: "/_scheduler/docs", user: "admin", pass: "admin-pw"}, 200, "", ""},
		{"wrong password", call{path: "/_scheduler/jobs", user: "joe", pass: "wrong-pw"}, 401, "unauthorized", "Name or password is incorrect."},
		{"unknown user", call{path: "/_active_tasks", user: "nobody", pass: "wrong-pw"}, 401, "unauthorized", "Name or password is incorrect."},
		{"[admins] name, wrong password", call{path: "/_active_tasks", user: "admin", pass: "wrong-pw"}, 401, "unauthorized", "Name or password is incorrect."},
		{"CouchDB's own cookie", call{path: "/_scheduler/jobs", cookie: couchDBCookie}, 403, "forbidden", notAdmin},
		{"a cookie nobody signed is anonymous", call{path: "/_scheduler/jobs", cookie: "bm9ib2R5OjA6MA"}, 401, "unauthorized", notAdmin},
		{"a forged couchrep cookie is anonymous", call{path: "/_scheduler/jobs", cookie: "eyJuIjoiam9lIiwiciI6WyJfYWRtaW4iXSwidCI6MH0.AAAA"}, 401, "unauthorized", notAdmin},
		{"_up stays open", call{path: "/_up"}, 200, "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := e.call(tc.c)
			if tc.code == "" {
				if r.status != tc.status {
					t.Fatalf("status %d, want %d: %s", r.status, tc.status, r.body)
				}
			} else {
				assertError(t, r, tc.status, tc.code, tc.reason)
				if m := r.json(t); m["reason"] != tc.reason {
					t.Fatalf("reason %q, want exactly %q", m["reason"], tc.reason)
				}
			}
			assertNoSecret(t, "the answer", r.body)
		})
	}
	f.mu.Lock()
	for _, a := range f.auth {
		if strings.Contains(a, "svc") || a == "Basic "+basic("svc", "svc-pw") {
			t.Errorf("the auth server got the server's own credentials: %q", a)
		}
	}
	f.mu.Unlock()
	assertNoSecret(t, "the log", logs.Bytes())
}

func basic(user, pass string) string {
	r, _ := http.NewRequest("GET", "http://x/", nil)
	r.SetBasicAuth(user, pass)
	return strings.TrimPrefix(r.Header.Get("Authorization"), "Basic ")
}

// TestUsersOwnJobs: a CouchDB user's replication records the user as its
// owner; another user who is not an admin cannot cancel it (CouchDB 3.4.3's
// couch_replicator:check_authorization: 401 unauthorized "You are not a
// server admin.", which its own replication_test.exs asserts); the owner
// and an admin can.
func TestUsersOwnJobs(t *testing.T) {
	f := newFakeCouch(t)
	var logs syncBuffer
	e := usersEnv(t, f, &logs, nil, nil)
	start := func(user, pass, src string) string {
		t.Helper()
		r := e.call(call{method: "POST", path: "/_replicate", ctype: "application/json", user: user, pass: pass,
			body: `{"source":"` + src + `","target":"` + tgtURL + `","continuous":true}`})
		if r.status != 202 {
			t.Fatalf("POST /_replicate as %s: %d %s", user, r.status, r.body)
		}
		return r.json(t)["_local_id"].(string)
	}
	joeJob := start("joe", "erly-pw", srcURL)
	bossJob := start("boss", "boss-pw", "http://c.example:5984/src")

	r := e.call(call{path: "/_scheduler/jobs/" + joeJob, user: "admin", pass: "admin-pw"})
	if r.status != 200 || r.json(t)["user"] != "joe" {
		t.Fatalf("joe's job as an admin sees it: %d %s", r.status, r.body)
	}
	cancel := func(id, user, pass string) reply {
		return e.call(call{method: "POST", path: "/_replicate", ctype: "application/json", user: user, pass: pass,
			body: `{"replication_id":"` + id + `","cancel":true}`})
	}
	// By body: the same replication id as another user's job is that job,
	// as in CouchDB.
	cancelBody := func(src, user, pass string) reply {
		return e.call(call{method: "POST", path: "/_replicate", ctype: "application/json", user: user, pass: pass,
			body: `{"source":"` + src + `","target":"` + tgtURL + `","continuous":true,"cancel":true}`})
	}
	// Another user who is not an admin POSTing the same replication:
	// CouchDB's check_authorization, 401, and still one job.
	again := e.call(call{method: "POST", path: "/_replicate", ctype: "application/json", user: "ann", pass: "ann-pw",
		body: `{"source":"` + srcURL + `","target":"` + tgtURL + `","continuous":true}`})
	assertError(t, again, 401, "unauthorized", "You are not a server admin.")
	if m := again.json(t); m["reason"] != "You are not a server admin." {
		t.Fatalf("reason %q", m["reason"])
	}
	jobsOf := func() map[string]int {
		t.Helper()
		r := e.call(call{path: "/_scheduler/jobs", user: "admin", pass: "admin-pw"})
		var v struct {
			Jobs []struct {
				ID   string `json:"id"`
				User string `json:"user"`
			} `json:"jobs"`
		}
		if err := json.Unmarshal(r.body, &v); err != nil {
			t.Fatal(err)
		}
		n := map[string]int{}
		for _, j := range v.Jobs {
			n[j.ID+" "+j.User]++
		}
		return n
	}
	if n := jobsOf(); len(n) != 2 || n[joeJob+" joe"] != 1 {
		t.Fatalf("after ann's POST of joe's replication, _scheduler/jobs: %v", n)
	}
	// An admin POSTing it: 202, and it stays joe's (CouchDB 3.4.3 keeps
	// the job: existing_replication ignores the user).
	if r := e.call(call{method: "POST", path: "/_replicate", ctype: "application/json", user: "admin", pass: "admin-pw",
		body: `{"source":"` + srcURL + `","target":"` + tgtURL + `","continuous":true}`}); r.status != 202 || r.json(t)["_local_id"] != joeJob {
		t.Fatalf("an admin POSTs joe's replication: %d %s", r.status, r.body)
	}
	if n := jobsOf(); len(n) != 2 || n[joeJob+" joe"] != 1 {
		t.Fatalf("after an admin's POST of joe's replication, _scheduler/jobs: %v", n)
	}
	assertError(t, cancel(joeJob, "ann", "ann-pw"), 401, "unauthorized", "You are not a server admin.")
	assertError(t, cancelBody(srcURL, "ann", "ann-pw"), 401, "unauthorized", "You are not a server admin.")
	assertError(t, cancel(bossJob, "joe", "erly-pw"), 401, "unauthorized", "You are not a server admin.")
	if r := cancel(joeJob, "joe", "erly-pw"); r.status != 200 || r.json(t)["_local_id"] != joeJob {
		t.Fatalf("joe cancels his job: %d %s", r.status, r.body)
	}
	if r := cancelBody("http://c.example:5984/src", "admin", "admin-pw"); r.status != 200 || r.json(t)["_local_id"] != bossJob {
		t.Fatalf("an admin cancels another's job by its body: %d %s", r.status, r.body)
	}
	assertError(t, cancel(joeJob, "joe", "erly-pw"), 404, "not found", "")
	assertError(t, cancelBody(srcURL, "ann", "ann-pw"), 404, "not found", "")
	assertNoSecret(t, "the log", logs.Bytes())
}

// TestSessionEndpoint: POST /_session (JSON and form) logs a user in with
// a cookie of CouchDB's attributes that another server of the same secret
// accepts; GET /_session says who a request is; DELETE clears the cookie;
// a wrong password gets CouchDB's 401 and counts against the client's
// failed-login limit (429 with Retry-After once it is reached).
func TestSessionEndpoint(t *testing.T) {
	f := newFakeCouch(t)
	var logs syncBuffer
	secret := []byte("a secret of this cluster, 32 b..")
	limit := func(o *httpapi.Options) { o.AuthFailureBurst, o.AuthFailureInterval = 3, time.Hour }
	e := usersEnv(t, f, &logs, secret, limit)
	other := usersEnv(t, f, &logs, secret, nil)
	stranger := usersEnv(t, f, &logs, []byte("another cluster's secret, 32 b.."), nil)

	for _, tc := range []struct {
		name, ctype, body string
	}{
		{"json name", "application/json", `{"name":"joe","password":"erly-pw"}`},
		{"json username", "application/json; charset=utf-8", `{"username":"joe","password":"erly-pw"}`},
		{"form", "application/x-www-form-urlencoded", `name=joe&password=erly-pw`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := e.call(call{method: "POST", path: "/_session", ctype: tc.ctype, body: tc.body})
			if r.status != 200 {
				t.Fatalf("login: %d %s", r.status, r.body)
			}
			m := r.json(t)
			if m["ok"] != true || m["name"] != "joe" || len(m["roles"].([]any)) != 1 || m["roles"].([]any)[0] != "erlanger" {
				t.Fatalf("login answer %s", r.body)
			}
			c := sessionCookieOf(t, r)
			if c == nil || c.MaxAge != 600 || !c.HttpOnly || c.Path != "/" || c.Value == "" {
				t.Fatalf("Set-Cookie %q: want AuthSession with Max-Age=600, HttpOnly, Path=/", r.header.Values("Set-Cookie"))
			}
			assertNoSecret(t, "the cookie", []byte(c.Value))
			for _, srv := range []*env{e, other} {
				r := srv.call(call{path: "/_session", cookie: c.Value})
				m := r.json(t)
				uc, _ := m["userCtx"].(map[string]any)
				info, _ := m["info"].(map[string]any)
				if r.status != 200 || uc["name"] != "joe" || info["authenticated"] != "cookie" {
					t.Fatalf("GET /_session with the cookie: %d %s", r.status, r.body)
				}
				// The cookie is a user's: joe may replicate, not list jobs.
				assertError(t, srv.call(call{path: "/_scheduler/jobs", cookie: c.Value}), 403, "forbidden", "You are not a server admin.")
			}
			assertError(t, stranger.call(call{path: "/_scheduler/jobs", cookie: c.Value}), 401, "unauthorized", "You are not a server admin.")
		})
	}

	// An admin's cookie is an admin's.
	r := e.call(call{method: "POST", path: "/_session", ctype: "application/json", body: `{"name":"boss","password":"boss-pw"}`})
	bossCookie := sessionCookieOf(t, r)
	if r.status != 200 || bossCookie == nil {
		t.Fatalf("admin login: %d %s", r.status, r.body)
	}
	if r := other.call(call{path: "/_scheduler/jobs", cookie: bossCookie.Value}); r.status != 200 {
		t.Fatalf("an admin's cookie on the other node: %d %s", r.status, r.body)
	}

	// Anonymous GET /_session, and ?basic=true.
	r = e.call(call{path: "/_session"})
	if m := r.json(t); r.status != 200 || m["userCtx"].(map[string]any)["name"] != nil {
		t.Fatalf("anonymous GET /_session: %d %s", r.status, r.body)
	}
	assertError(t, e.call(call{path: "/_session?basic=true"}), 401, "unauthorized", "Please login.")
	// Basic credentials on GET /_session.
	r = e.call(call{path: "/_session", user: "joe", pass: "erly-pw"})
	if m := r.json(t); r.status != 200 || m["userCtx"].(map[string]any)["name"] != "joe" || m["info"].(map[string]any)["authenticated"] != "default" {
		t.Fatalf("GET /_session with Basic: %d %s", r.status, r.body)
	}

	// DELETE clears the cookie.
	r = e.call(call{method: "DELETE", path: "/_session"})
	if c := sessionCookieOf(t, r); r.status != 200 || r.json(t)["ok"] != true || c == nil || c.Value != "" || c.MaxAge >= 0 {
		t.Fatalf("DELETE /_session: %d %s %q", r.status, r.body, r.header.Values("Set-Cookie"))
	}

	// Bad requests, as CouchDB answers them.
	for _, tc := range []struct {
		name, ctype, body string
		status            int
		code, reason      string
	}{
		{"no content type", "", `{"name":"joe"}`, 415, "bad_content_type", "Content-Type must be 'application/x-www-form-urlencoded' or 'application/json'"},
		{"no username", "application/json", `{"password":"x"}`, 400, "bad_request", "request body must contain a username"},
		{"two usernames", "application/json", `{"name":"a","username":"b"}`, 400, "bad_request", "request body contains different usernames"},
		{"not JSON", "application/json", `{"name":`, 400, "bad_request", ""},
	} {
		assertError(t, e.call(call{method: "POST", path: "/_session", ctype: tc.ctype, body: tc.body}), tc.status, tc.code, tc.reason)
	}
	assertError(t, e.call(call{method: "PUT", path: "/_session"}), 405, "method_not_allowed", "Only GET,HEAD,POST,DELETE allowed")

	// Wrong passwords: 401 with a cleared cookie, then 429.
	for i := range 3 {
		r := e.call(call{method: "POST", path: "/_session", ctype: "application/json", body: `{"name":"joe","password":"wrong-pw"}`})
		assertError(t, r, 401, "unauthorized", "Name or password is incorrect.")
		if c := sessionCookieOf(t, r); c == nil || c.Value != "" {
			t.Fatalf("failed login %d does not clear the cookie: %q", i, r.header.Values("Set-Cookie"))
		}
	}
	r = e.call(call{method: "POST", path: "/_session", ctype: "application/json", body: `{"name":"joe","password":"erly-pw"}`})
	assertError(t, r, 429, "too_many_requests", "too many failed logins")
	if r.header.Get("Retry-After") == "" {
		t.Fatal("429 without Retry-After")
	}
	assertError(t, e.call(call{path: "/_active_tasks", user: "joe", pass: "erly-pw"}), 429, "too_many_requests", "")
	assertNoSecret(t, "the log", logs.Bytes())
}

// TestAuthServerCache: one question to the auth server per credentials
// while its answer is fresh; none for [admins] or couchrep's own cookies;
// an auth server that is down is a 503 (not a failed login: the limit
// does not count it) and nothing is cached from it.
func TestAuthServerCache(t *testing.T) {
	f := newFakeCouch(t)
	var logs syncBuffer
	e := usersEnv(t, f, &logs, nil, func(o *httpapi.Options) { o.AuthFailureBurst, o.AuthFailureInterval = 1, time.Hour })
	for range 3 {
		if r := e.call(call{method: "POST", path: "/_replicate", ctype: "application/json", user: "joe", pass: "erly-pw", body: `{"source":"` + srcURL + `","target":"` + tgtURL + `","continuous":true}`}); r.status != 202 {
			t.Fatalf("joe replicates: %d %s", r.status, r.body)
		}
	}
	if n := f.count(); n != 1 {
		t.Fatalf("auth server asked %d times for one user's 3 requests, want 1", n)
	}
	if r := e.call(call{path: "/_active_tasks", user: "admin", pass: "admin-pw"}); r.status != 200 || f.count() != 1 {
		t.Fatalf("an [admins] admin: %d, auth server asked %d times", r.status, f.count())
	}
	f.setDown(true)
	for range 3 { // more than the burst: not counted as failures
		assertError(t, e.call(call{path: "/_scheduler/jobs", user: "ann", pass: "ann-pw"}), 503, "service_unavailable", "the auth server is unavailable")
	}
	if r := e.call(call{method: "POST", path: "/_session", ctype: "application/json", body: `{"name":"ann","password":"ann-pw"}`}); r.status != 503 {
		t.Fatalf("login while the auth server is down: %d %s", r.status, r.body)
	}
	f.setDown(false)
	assertError(t, e.call(call{path: "/_scheduler/jobs", user: "ann", pass: "ann-pw"}), 403, "forbidden", "You are not a server admin.")

	// A cookie the auth server does not know: asked once, then anonymous
	// from the cache.
	before := f.count()
	for range 3 {
		assertError(t, e.call(call{path: "/_scheduler/jobs", cookie: "c3RhbGU6MDow"}), 401, "unauthorized", "You are not a server admin.")
	}
	if n := f.count() - before; n != 1 {
		t.Fatalf("an unknown CouchDB cookie sent 3 times: auth server asked %d times, want 1", n)
	}

	// No cache: asked every time.
	g := newFakeCouch(t)
	n := usersEnv(t, g, &logs, nil, func(o *httpapi.Options) { o.Users.CacheTTL = 0 })
	for range 2 {
		n.call(call{path: "/_scheduler/jobs", user: "joe", pass: "erly-pw"})
	}
	if g.count() != 2 {
		t.Fatalf("without a cache the auth server was asked %d times for 2 requests", g.count())
	}
	assertNoSecret(t, "the log", logs.Bytes())
}

// TestAdminPartyUnchanged: no [admins] and no auth server is an admin
// party, as before: everyone may do everything, and GET /_session says so.
func TestAdminPartyUnchanged(t *testing.T) {
	e := newEnv(t, nil)
	for _, p := range []string{"/_scheduler/jobs", "/_active_tasks", "/metrics", "/_status"} {
		if r := e.get(p); r.status != 200 {
			t.Errorf("%s: %d %s", p, r.status, r.body)
		}
	}
	r := e.get("/_session")
	if m := r.json(t); r.status != 200 || m["userCtx"].(map[string]any)["roles"].([]any)[0] != "_admin" {
		t.Fatalf("GET /_session in an admin party: %d %s", r.status, r.body)
	}
}

// syncBuffer is a log sink several goroutines write.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) Bytes() []byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	return bytes.Clone(s.b.Bytes())
}
