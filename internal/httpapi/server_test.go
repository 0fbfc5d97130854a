package httpapi_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/couchrep/couchrep/internal/dbupdates"
	"github.com/couchrep/couchrep/internal/httpapi"
	"github.com/couchrep/couchrep/internal/jobqueue"
	"github.com/couchrep/couchrep/internal/kv/sqlite"
	"github.com/couchrep/couchrep/internal/repjob"
	"github.com/couchrep/couchrep/internal/replicate"
	"github.com/couchrep/couchrep/internal/schedpolicy"
)

const uuid = "0123456789abcdef0123456789abcdef"

// env is an API server over a real repjob store in a temporary SQLite file.
type env struct {
	t     *testing.T
	store *repjob.Store
	srv   *httptest.Server
	api   *httpapi.Server
}

func newEnv(t *testing.T, admins map[string]string) *env {
	t.Helper()
	return newEnvWith(t, httpapi.Options{Admins: admins, MaxBodyBytes: 64 << 10})
}

// newEnvWith is newEnv with o's options (Store is set here).
func newEnvWith(t *testing.T, o httpapi.Options) *env {
	t.Helper()
	db, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "store.db"), sqlite.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	q := jobqueue.New(db, jobqueue.Options{NodeName: "n1", AcceptSpread: 1})
	st := repjob.New(q, db, repjob.Options{ServerUUID: uuid, Policy: schedpolicy.DefaultPolicy()})
	o.Store = httpapi.NewRepjobStore(st, uuid)
	api := httpapi.New(o)
	srv := httptest.NewServer(api)
	t.Cleanup(srv.Close)
	return &env{t: t, store: st, srv: srv, api: api}
}

type reply struct {
	status int
	header http.Header
	body   []byte
}

func (r reply) json(t *testing.T) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(r.body, &m); err != nil {
		t.Fatalf("reply %d is not a JSON object: %v\n%s", r.status, err, r.body)
	}
	return m
}

func (e *env) do(method, path, ctype string, body []byte, auth ...string) reply {
	e.t.Helper()
	req, err := http.NewRequest(method, e.srv.URL+path, bytes.NewReader(body))
	if err != nil {
		e.t.Fatal(err)
	}
	if ctype != "" {
		req.Header.Set("Content-Type", ctype)
	}
	if len(auth) == 2 {
		req.SetBasicAuth(auth[0], auth[1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return reply{status: resp.StatusCode, header: resp.Header, body: b}
}

func (e *env) post(body string, auth ...string) reply {
	e.t.Helper()
	return e.do("POST", "/_replicate", "application/json", []byte(body), auth...)
}

func (e *env) get(path string, auth ...string) reply {
	e.t.Helper()
	return e.do("GET", path, "", nil, auth...)
}

func assertError(t *testing.T, r reply, status int, code, reasonPart string) {
	t.Helper()
	if r.status != status {
		t.Fatalf("status %d, want %d: %s", r.status, status, r.body)
	}
	m := r.json(t)
	if code == "not found" {
		// CouchDB's cancel of an unknown replication: the name alone.
		if len(m) != 1 || m["error"] != code {
			t.Fatalf("got %s, want exactly {\"error\":%q}", r.body, code)
		}
		return
	}
	if reason, _ := m["reason"].(string); m["error"] != code || !strings.Contains(reason, reasonPart) {
		t.Fatalf("got %s, want error %q with reason containing %q", r.body, code, reasonPart)
	}
}

const (
	srcURL = "http://a.example:5984/src"
	tgtURL = "http://b.example:5984/tgt"
)

func TestBadInput(t *testing.T) {
	e := newEnv(t, nil)
	ok := `"source":"` + srcURL + `","target":"` + tgtURL + `"`
	for _, tc := range []struct {
		name, method, path, ctype, body string
		status                          int
		code, reason                    string
	}{
		{"malformed json", "POST", "/_replicate", "application/json", `{"source":`, 400, "bad_request", "invalid JSON at byte 10: the body ends inside a value"},
		{"syntax error", "POST", "/_replicate", "application/json", `{"source" 1}`, 400, "bad_request", "invalid JSON at byte 10: invalid character '1' after object key"},
		{"invalid utf-8", "POST", "/_replicate", "application/json", "{\"source\":\"\xff\"}", 400, "bad_request", "invalid UTF-8 at byte 11 of the JSON body"},
		{"too deep", "POST", "/_replicate", "application/json", strings.Repeat("[", 30000) + strings.Repeat("]", 30000), 400, "bad_request", "Request body must be a JSON object, got an array"},
		{"too deep in an object", "POST", "/_replicate", "application/json", `{"a":` + strings.Repeat("[", 30000) + strings.Repeat("]", 30000) + `}`, 400, "bad_request", "JSON body nested too deeply: more than 64 levels"},
		{"too deep object", "POST", "/_replicate", "application/json", `{"a":` + strings.Repeat(`{"b":`, 100) + `1` + strings.Repeat("}", 101), 400, "bad_request", "JSON body nested too deeply: more than 64 levels of arrays and objects (at $.a.b.b."},
		{"duplicate key", "POST", "/_replicate", "application/json", `{` + ok + `,"source":"http://c.example/db"}`, 400, "bad_request", `duplicate key "source" in the JSON object at $`},
		{"nested duplicate key", "POST", "/_replicate", "application/json", `{` + ok + `,"query_params":{"a":1,"a":2}}`, 400, "bad_request", `duplicate key "a" in the JSON object at $.query_params`},
		{"trailing data", "POST", "/_replicate", "application/json", `{` + ok + `} {}`, 400, "bad_request", "data after the JSON object"},
		{"string body", "POST", "/_replicate", "application/json", `"x"`, 400, "bad_request", "Request body must be a JSON object, got a string"},
		{"integer too large", "POST", "/_replicate", "application/json", `{` + ok + `,"worker_processes":99999999999999999999999}`, 400, "bad_request", "parameter `worker_processes` is too large"},
		{"timeout too large", "POST", "/_replicate", "application/json", `{` + ok + `,"connection_timeout":9999999999999999}`, 400, "bad_request", "parameter `connection_timeout` is too large"},
		{"empty body", "POST", "/_replicate", "application/json", ``, 400, "bad_request", "Request body must be a JSON object"},
		{"array body", "POST", "/_replicate", "application/json", `[]`, 400, "bad_request", "Request body must be a JSON object"},
		{"form content type", "POST", "/_replicate", "application/x-www-form-urlencoded", `{` + ok + `}`, 415, "bad_content_type", "Content-Type must be application/json"},
		{"huge body", "POST", "/_replicate", "application/json", `{` + ok + `,"x":"` + strings.Repeat("a", 70<<10) + `"}`, 413, "too_large", "limit of 65536 bytes"},
		{"missing source", "POST", "/_replicate", "application/json", `{"target":"` + tgtURL + `"}`, 400, "bad_request", "Missing `source` field"},
		{"missing target", "POST", "/_replicate", "", `{"source":"` + srcURL + `"}`, 400, "bad_request", "Missing `target` field"},
		{"bad url", "POST", "/_replicate", "application/json", `{"source":"ftp://x/db","target":"` + tgtURL + `"}`, 400, "invalid_replication", "`source`: endpoint has an invalid url"},
		{"local endpoint", "POST", "/_replicate", "application/json", `{"source":"db","target":"` + tgtURL + `"}`, 400, "bad_request", "local endpoints are not supported"},
		{"doc_ids not a list", "POST", "/_replicate", "application/json", `{` + ok + `,"doc_ids":"a"}`, 400, "bad_request", "parameter `doc_ids` must be an array"},
		{"doc_ids not strings", "POST", "/_replicate", "application/json", `{` + ok + `,"doc_ids":[1]}`, 400, "bad_request", "parameter `doc_ids` must be an array of strings"},
		{"filter and doc_ids", "POST", "/_replicate", "application/json", `{` + ok + `,"doc_ids":["a"],"filter":"d/f"}`, 400, "bad_request", "`doc_ids`,`filter`,`selector` are mutually exclusive"},
		{"bad filter", "POST", "/_replicate", "application/json", `{` + ok + `,"filter":"f"}`, 400, "bad_request", "Invalid filter. Must match `ddocname/filtername`."},
		{"option type", "POST", "/_replicate", "application/json", `{` + ok + `,"worker_processes":"many"}`, 400, "bad_request", "parameter `worker_processes` must be a positive integer"},
		{"continuous not boolean", "POST", "/_replicate", "application/json", `{` + ok + `,"continuous":"yes"}`, 400, "bad_request", "parameter `continuous` must be a boolean"},
		{"cancel not boolean", "POST", "/_replicate", "application/json", `{` + ok + `,"cancel":"yes"}`, 400, "bad_request", "parameter `cancel` must be a boolean"},
		{"proxies exclusive", "POST", "/_replicate", "application/json", `{` + ok + `,"proxy":"http://p:1","source_proxy":"http://q:1"}`, 400, "bad_request", "`proxy` is mutually exclusive with `source_proxy`"},
		{"proxy bad url", "POST", "/_replicate", "application/json", `{` + ok + `,"proxy":"gopher://p:1"}`, 400, "invalid_replication", "`proxy`: proxy has an invalid url"},
		{"cancel unknown id", "POST", "/_replicate", "application/json", `{"replication_id":"nope","cancel":true}`, 404, "not found", ""},
		{"cancel unknown body", "POST", "/_replicate", "application/json", `{` + ok + `,"cancel":true}`, 404, "not found", ""},
		{"unknown endpoint", "GET", "/_nope", "", ``, 404, "not_found", "unknown endpoint /_nope"},
		{"root post", "POST", "/", "application/json", `{}`, 405, "method_not_allowed", "Only GET,HEAD allowed"},
		{"status page unknown", "GET", "/_status/nope", "", ``, 404, "not_found", "unknown endpoint"},
		{"wrong method", "GET", "/_replicate", "", ``, 405, "method_not_allowed", "Only POST allowed"},
		{"post to jobs", "POST", "/_scheduler/jobs", "application/json", `{}`, 405, "method_not_allowed", "Only GET,HEAD allowed"},
		{"bad limit", "GET", "/_scheduler/jobs?limit=x", "", ``, 400, "query_parse_error", `Invalid value for integer: "x"`},
		{"negative skip", "GET", "/_scheduler/docs?skip=-1", "", ``, 400, "query_parse_error", `Invalid value for positive integer: "-1"`},
		{"bad state", "GET", "/_scheduler/docs?states=running,bogus", "", ``, 400, "query_parse_error", `Unknown states "bogus". States must be one or more of`},
		{"not a replicator db", "GET", "/_scheduler/docs/mydb", "", ``, 400, "bad_request", "mydb is not a _replicator database"},
		{"unknown job", "GET", "/_scheduler/jobs/abc+continuous", "", ``, 404, "not_found", "unknown job abc+continuous"},
		{"unknown doc", "GET", "/_scheduler/docs/_replicator/nodoc", "", ``, 404, "not_found", "no replication document nodoc in _replicator"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := e.do(tc.method, tc.path, tc.ctype, []byte(tc.body))
			assertError(t, r, tc.status, tc.code, tc.reason)
			if r.header.Get("Content-Type") != "application/json" {
				t.Errorf("Content-Type = %q", r.header.Get("Content-Type"))
			}
		})
	}
	// The server is unharmed and nothing was added.
	if r := e.get("/_up"); r.status != 200 || r.json(t)["status"] != "ok" {
		t.Fatalf("/_up after bad input: %d %s", r.status, r.body)
	}
	if recs, err := e.store.List(context.Background(), repjob.Filter{}); err != nil || len(recs) != 0 {
		t.Fatalf("jobs after bad input: %v %v", recs, err)
	}
}

func TestAuth(t *testing.T) {
	e := newEnv(t, map[string]string{
		"plain":  "s3cret",
		"hashed": "-pbkdf2-1c8e4c8bb6e4d6a0b1f0a5c2f8e1b8cd3b2e0a64,salt,10", // not the password "x"
		"pb":     pbkdf2Hash(t, "pw", "abc", 10),
	})
	for _, tc := range []struct {
		name   string
		path   string
		auth   []string
		status int
	}{
		{"no credentials", "/_scheduler/jobs", nil, 401},
		{"wrong password", "/_scheduler/jobs", []string{"plain", "nope"}, 401},
		{"unknown user", "/_active_tasks", []string{"who", "s3cret"}, 401},
		{"plain password", "/_scheduler/jobs", []string{"plain", "s3cret"}, 200},
		{"pbkdf2 password", "/_scheduler/docs", []string{"pb", "pw"}, 200},
		{"pbkdf2 wrong password", "/_scheduler/docs", []string{"hashed", "x"}, 401},
		{"metrics need auth", "/metrics", nil, 401},
		{"_up is open", "/_up", nil, 200},
		{"welcome is open", "/", nil, 200},
		{"status page needs auth", "/_status", nil, 401},
		{"status data needs auth", "/_status/data", nil, 401},
		{"status page with auth", "/_status", []string{"plain", "s3cret"}, 200},
		{"status script is open", "/_status/status.js", nil, 200},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := e.get(tc.path, tc.auth...)
			if r.status != tc.status {
				t.Fatalf("status %d, want %d: %s", r.status, tc.status, r.body)
			}
			if tc.status == 401 {
				assertError(t, r, 401, "unauthorized", "")
				if r.header.Get("WWW-Authenticate") == "" {
					t.Error("401 without WWW-Authenticate")
				}
			}
		})
	}
}

func TestPasswordMatches(t *testing.T) {
	for _, tc := range []struct {
		stored, pw string
		want       bool
	}{
		{"secret", "secret", true},
		{"secret", "Secret", false},
		{pbkdf2Hash(t, "pw", "salty", 3), "pw", true},
		{pbkdf2Hash(t, "pw", "salty", 3), "pw2", false},
		// CouchDB 1.x "-hashed-": sha1("pw" + "salt").
		{"-hashed-" + sha1Hex("pwsalt") + ",salt", "pw", true},
		{"-hashed-" + sha1Hex("pwsalt") + ",salt", "p", false},
		{"-pbkdf2-zz,salt,10", "pw", false},
		{"-pbkdf2-abcd,salt", "pw", false},
	} {
		if got := httpapi.PasswordMatches(tc.stored, tc.pw); got != tc.want {
			t.Errorf("PasswordMatches(%q, %q) = %v, want %v", tc.stored, tc.pw, got, tc.want)
		}
	}
}

// worker runs the job side through repjob's worker API, as a node's job
// actor does.
func accept(t *testing.T, st *repjob.Store) *repjob.Run {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	run, err := st.Accept(ctx, true)
	if err != nil {
		t.Fatalf("accept: %v", err)
	}
	if err := run.Start(ctx, "n1"); err != nil {
		t.Fatalf("start: %v", err)
	}
	return run
}

func TestContinuousLifecycle(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	body := `{"source":"http://bob:hunter2@a.example:5984/src","target":"` + tgtURL + `","continuous":true}`
	r := e.post(body)
	if r.status != 202 {
		t.Fatalf("POST continuous: %d %s", r.status, r.body)
	}
	m := r.json(t)
	localID, _ := m["_local_id"].(string)
	if m["ok"] != true || !strings.HasSuffix(localID, "+continuous") {
		t.Fatalf("reply %s", r.body)
	}
	// Re-posting the same replication is a no-op with the same id.
	if r2 := e.post(body); r2.status != 202 || r2.json(t)["_local_id"] != localID {
		t.Fatalf("second POST: %d %s", r2.status, r2.body)
	}

	jobsList := func() []any {
		r := e.get("/_scheduler/jobs")
		if r.status != 200 {
			t.Fatalf("_scheduler/jobs: %d %s", r.status, r.body)
		}
		m := r.json(t)
		return m["jobs"].([]any)
	}
	js := jobsList()
	if len(js) != 1 {
		t.Fatalf("jobs = %v", js)
	}
	j := js[0].(map[string]any)
	if j["id"] != localID || j["state"] != "pending" || j["pid"] != nil || j["database"] != nil {
		t.Fatalf("pending job = %v", j)
	}
	if s := j["source"].(string); strings.Contains(s, "hunter2") || !strings.Contains(s, "a.example:5984/src") {
		t.Fatalf("source not redacted: %q", s)
	}

	run := accept(t, e.store)
	if err := run.Progress(ctx, replicate.Stats{DocsWritten: 7, DocsRead: 7}); err != nil {
		t.Fatal(err)
	}
	r = e.get("/_scheduler/jobs/" + localID)
	j = r.json(t)
	if r.status != 200 || j["state"] != "running" || j["node"] != "n1" || j["pid"] == nil {
		t.Fatalf("running job: %d %s", r.status, r.body)
	}
	if info := j["info"].(map[string]any); info["docs_written"] != 7.0 || info["through_seq"] != "0" {
		t.Fatalf("running info = %v", info)
	}
	tasks := e.get("/_active_tasks")
	var ts []map[string]any
	if err := json.Unmarshal(tasks.body, &ts); err != nil || len(ts) != 1 {
		t.Fatalf("_active_tasks: %v %s", err, tasks.body)
	}
	if ts[0]["type"] != "replication" || ts[0]["replication_id"] != localID || ts[0]["continuous"] != true ||
		ts[0]["docs_written"] != 7.0 || ts[0]["checkpoint_interval"] != 30000.0 || strings.Contains(string(tasks.body), "hunter2") {
		t.Fatalf("_active_tasks entry %v", ts[0])
	}

	// Metrics see the running job.
	mr := e.get("/metrics")
	if !strings.Contains(string(mr.body), `couchrep_replication_jobs{database="",kind="transient",server="",state="running"} 1`) ||
		!strings.Contains(string(mr.body), `couchrep_http_requests_total{code="202",endpoint="replicate",method="POST"} 2`) {
		t.Fatalf("metrics lack the running job or the requests:\n%s", mr.body)
	}

	// Crash: crashing with the reason, credentials masked.
	if _, err := run.Crash(ctx, "db_not_found: could not open http://bob:hunter2@a.example:5984/src/"); err != nil {
		t.Fatal(err)
	}
	r = e.get("/_scheduler/jobs/" + localID)
	j = r.json(t)
	if j["state"] != "crashing" || !strings.Contains(j["info"].(map[string]any)["error"].(string), "bob:*****@") {
		t.Fatalf("crashing job %s", r.body)
	}

	// Cancel by id (space as CouchDB's "+" fix-up), then again: 404.
	r = e.post(`{"replication_id":"` + strings.Replace(localID, "+", " ", 1) + `","cancel":true}`)
	if r.status != 200 || r.json(t)["_local_id"] != localID {
		t.Fatalf("cancel: %d %s", r.status, r.body)
	}
	assertError(t, e.post(`{"replication_id":"`+localID+`","cancel":true}`), 404, "not found", "")
	if js := jobsList(); len(js) != 0 {
		t.Fatalf("jobs after cancel = %v", js)
	}
}

func TestOneShotWaitsForCompletion(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	done := make(chan reply, 1)
	go func() { done <- e.post(`{"source":"` + srcURL + `","target":"` + tgtURL + `"}`) }()
	run := accept(t, e.store)
	select {
	case r := <-done:
		t.Fatalf("one-shot replied before it finished: %d %s", r.status, r.body)
	default:
	}
	want := `{"ok":true,"session_id":"s1","source_last_seq":"3","replication_id_version":4,"history":[]}`
	if err := run.Complete(ctx, replicate.Result{Body: json.RawMessage(want), Stats: replicate.Stats{DocsWritten: 3}}); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.status != 200 || strings.TrimSpace(string(r.body)) != want {
		t.Fatalf("one-shot reply %d %s, want 200 %s", r.status, r.body, want)
	}
	// Finished jobs leave the list but stay readable by id.
	if r := e.get("/_scheduler/jobs"); r.json(t)["total_rows"] != 0.0 {
		t.Fatalf("jobs list after completion: %s", r.body)
	}
	rec, err := e.store.List(ctx, repjob.Filter{})
	if err != nil || len(rec) != 1 {
		t.Fatalf("records: %v %v", rec, err)
	}
	r = e.get("/_scheduler/jobs/" + rec[0].GetRepId())
	if j := r.json(t); j["state"] != "completed" {
		t.Fatalf("completed job %s", r.body)
	}
}

func TestOneShotFailure(t *testing.T) {
	e := newEnv(t, nil)
	done := make(chan reply, 1)
	go func() { done <- e.post(`{"source":"` + srcURL + `","target":"` + tgtURL + `"}`) }()
	run := accept(t, e.store)
	if err := run.Fail(context.Background(), "db_not_found: could not open "+srcURL+"/"); err != nil {
		t.Fatal(err)
	}
	assertError(t, <-done, 404, "db_not_found", "could not open "+srcURL)
}

func TestOneShotCrashIsAnErrorAndRemovesTheJob(t *testing.T) {
	e := newEnv(t, nil)
	done := make(chan reply, 1)
	go func() { done <- e.post(`{"source":"` + srcURL + `","target":"` + tgtURL + `"}`) }()
	run := accept(t, e.store)
	if _, err := run.Crash(context.Background(), "unauthorized: unauthorized to access or create database "+tgtURL+"/"); err != nil {
		t.Fatal(err)
	}
	assertError(t, <-done, 401, "unauthorized", "unauthorized to access or create database")
	if recs, err := e.store.List(context.Background(), repjob.Filter{}); err != nil || len(recs) != 0 {
		t.Fatalf("jobs after the crash reply: %v %v", recs, err)
	}
}

func TestSchedulerDocs(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	add := func(db, id string, extra string) {
		t.Helper()
		_, err := e.store.AddPersistent(ctx, repjob.PersistentDoc{Server: "http://couch.example:5984/", DB: db, DocID: id,
			Body: []byte(`{"source":"` + srcURL + `","target":"` + tgtURL + `/` + id + `"` + extra + `}`)})
		if err != nil {
			t.Fatal(err)
		}
	}
	add("_replicator", "a", `,"continuous":true`)
	add("_replicator", "b", `,"proxy":"http://proxy.example:3128"`)
	add("other/_replicator", "c/d", "")
	run := accept(t, e.store) // the lowest deadline: one of them runs
	running := run.Record().GetDocId()

	r := e.get("/_scheduler/docs")
	m := r.json(t)
	if m["total_rows"] != 3.0 || m["offset"] != 0.0 {
		t.Fatalf("docs: %s", r.body)
	}
	for _, tc := range []struct {
		path  string
		total float64
		ids   []string
	}{
		{"/_scheduler/docs/_replicator", 2, []string{"a", "b"}},
		{"/_scheduler/docs/other/_replicator", 1, []string{"c/d"}},
		{"/_scheduler/docs/other%2F_replicator", 1, []string{"c/d"}},
		{"/_scheduler/docs?limit=1&skip=1", 3, []string{"b"}},
		{"/_scheduler/docs?states=running", 1, []string{running}},
		{"/_scheduler/docs?states=completed,failed", 0, nil},
	} {
		r := e.get(tc.path)
		m := r.json(t)
		var ids []string
		for _, d := range m["docs"].([]any) {
			ids = append(ids, d.(map[string]any)["doc_id"].(string))
		}
		if r.status != 200 || m["total_rows"] != tc.total || strings.Join(ids, ",") != strings.Join(tc.ids, ",") {
			t.Errorf("%s: %d total %v ids %v, want %v %v", tc.path, r.status, m["total_rows"], ids, tc.total, tc.ids)
		}
	}
	for _, path := range []string{"/_scheduler/docs/other/_replicator/c/d", "/_scheduler/docs/other%2F_replicator/c%2Fd"} {
		r := e.get(path)
		d := r.json(t)
		if r.status != 200 || d["doc_id"] != "c/d" || d["database"] != "other/_replicator" {
			t.Errorf("%s: %d %s", path, r.status, r.body)
		}
	}
	d := e.get("/_scheduler/docs/_replicator/b").json(t)
	if _, hasProxy := d["source_proxy"]; !hasProxy || (d["state"] == "pending" && d["source_proxy"] != "http://proxy.example:3128") {
		t.Errorf("doc b = %v", d)
	}
	// A failed document: id null, no node, the reason in info.
	if err := run.Fail(ctx, "Duplicate job"); err != nil {
		t.Fatal(err)
	}
	d = e.get("/_scheduler/docs/" + map[string]string{"a": "_replicator/a", "b": "_replicator/b", "c/d": "other/_replicator/c/d"}[running]).json(t)
	if _, hasNode := d["node"]; d["state"] != "failed" || d["id"] != nil || hasNode || d["info"].(map[string]any)["error"] != "Duplicate job" || d["error_count"] != 1.0 {
		t.Errorf("failed doc = %v", d)
	}
}

// panicStore panics on every read: the API must answer 500 and live on.
type panicStore struct{ httpapi.Store }

func (panicStore) List(context.Context) ([]*httpapi.Job, error) { panic("boom") }

func TestHandlerPanicIsA500(t *testing.T) {
	srv := httptest.NewServer(httpapi.New(httpapi.Options{Store: panicStore{}}))
	defer srv.Close()
	for i := 0; i < 2; i++ {
		resp, err := http.Get(srv.URL + "/_scheduler/jobs")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 500 || !strings.Contains(string(b), `"error":"unknown_error"`) {
			t.Fatalf("got %d %s", resp.StatusCode, b)
		}
	}
}

// TestUpWarnings: GET /_up lists the node's warnings (such as an open file
// limit below its budget) and stays "ok"; without warnings it has none.
func TestUpWarnings(t *testing.T) {
	for _, tc := range []struct {
		name     string
		warnings []string
	}{
		{"none", nil},
		{"file limit", []string{"open file limit (ulimit -n) 1024 is below the 1256 this node may need"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnvWith(t, httpapi.Options{Warnings: tc.warnings})
			r := e.get("/_up")
			m := r.json(t)
			if r.status != 200 || m["status"] != "ok" {
				t.Fatalf("/_up: %d %s", r.status, r.body)
			}
			got, _ := m["warnings"].([]any)
			if len(got) != len(tc.warnings) || (len(got) > 0 && got[0] != tc.warnings[0]) {
				t.Fatalf("/_up warnings %v, want %v", m["warnings"], tc.warnings)
			}
		})
	}
}

// TestUpDBUpdates: GET /_up shows each source server's _db_updates state
// (a server with two credentials once, its worst state, watches added;
// credentials the server refused with 401/403 counted, never shown as the
// server's state while other credentials read its feed), and /metrics the
// feeds, watches, unsupported servers, refused credentials and wake-ups.
func TestUpDBUpdates(t *testing.T) {
	m := httpapi.NewMetrics(nil)
	since := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	m.ObserveDBUpdates(func() dbupdates.Stats {
		return dbupdates.Stats{Feeds: 3, Watches: 10, Unsupported: 1, NotAdmin: 2, Wakes: 12, Servers: []dbupdates.ServerStats{
			{Name: "http://a.example/", State: dbupdates.StateOK, Since: since, Watches: 5},
			{Name: "http://a.example/", State: dbupdates.StateRetrying, Reason: "503 Service Unavailable", Since: since, Watches: 2},
			{Name: "http://b.example/", State: dbupdates.StateUnsupported, Reason: "404 not_found: Database does not exist.", Since: since},
			{Name: "http://c.example/", State: dbupdates.StateNotAdmin, Reason: "401 unauthorized: You are not a server admin.", Since: since},
			{Name: "http://c.example/", State: dbupdates.StateOK, Since: since, Watches: 3},
			{Name: "http://d.example/", State: dbupdates.StateNotAdmin, Reason: "401 unauthorized: You are not a server admin.", Since: since},
		}}
	})
	e := newEnvWith(t, httpapi.Options{Metrics: m})
	r := e.get("/_up")
	var up struct {
		Status    string
		DBUpdates map[string]struct {
			State    string
			Reason   string
			Watches  int
			NotAdmin int `json:"not_admin_credentials"`
		} `json:"db_updates"`
	}
	if err := json.Unmarshal(r.body, &up); err != nil || r.status != 200 || up.Status != "ok" {
		t.Fatalf("/_up: %d %s %v", r.status, r.body, err)
	}
	a, b := up.DBUpdates["http://a.example/"], up.DBUpdates["http://b.example/"]
	c, d := up.DBUpdates["http://c.example/"], up.DBUpdates["http://d.example/"]
	if len(up.DBUpdates) != 4 || a.State != "retrying" || a.Reason != "503 Service Unavailable" || a.Watches != 7 ||
		b.State != "unsupported" || b.Reason != "404 not_found: Database does not exist." ||
		c.State != "ok" || c.Reason != "" || c.Watches != 3 || c.NotAdmin != 1 ||
		d.State != "not_admin" || d.Reason != "401 unauthorized: You are not a server admin." || d.NotAdmin != 1 {
		t.Fatalf("/_up db_updates: %s", r.body)
	}
	mr := string(e.get("/metrics").body)
	for _, want := range []string{"couchrep_db_updates_feeds 3", "couchrep_db_updates_watches 10",
		"couchrep_db_updates_servers_unsupported 1", "couchrep_db_updates_credentials_not_admin 2", "couchrep_db_updates_wakes_total 12"} {
		if !strings.Contains(mr, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	// Without a hub (use_db_updates off) there is no db_updates.
	if r := newEnv(t, nil).get("/_up"); strings.Contains(string(r.body), "db_updates") {
		t.Fatalf("/_up without a hub: %s", r.body)
	}
}
