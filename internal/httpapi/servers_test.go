package httpapi_test

import (
	"context"
	"net/url"
	"strings"
	"testing"

	"github.com/couchrep/couchrep/internal/httpapi"
	"github.com/couchrep/couchrep/internal/repjob"
)

// TestSchedulerDocsSeveralServers: documents with the same id on two
// watched servers are two jobs; _scheduler/docs names each one's server,
// refuses the ambiguous CouchDB path naming both servers, and ?server=
// (URL with or without credentials, or host:port) picks one; the path
// stays CouchDB's for a document only one server has. No answer holds a
// password.
func TestSchedulerDocsSeveralServers(t *testing.T) {
	const a, b = "http://couch-a.example:5984", "http://couch-b.example:5984"
	e := newEnvWith(t, httpapi.Options{Servers: []string{"http://admin:pw-a@couch-a.example:5984/", "http://admin:pw-b@couch-b.example:5984"}})
	ctx := context.Background()
	add := func(server, id, tgt string) {
		t.Helper()
		doc := repjob.PersistentDoc{Server: server, DB: "_replicator", DocID: id,
			Body: []byte(`{"source":"` + srcURL + `","target":"http://b.example:5984/` + tgt + `"}`)}
		if _, err := e.store.AddPersistent(ctx, doc); err != nil {
			t.Fatal(err)
		}
	}
	add(a, "backup", "ta")
	add(b, "backup", "tb")
	add(b, "only-b", "tc")

	for _, tc := range []struct {
		name, path string
		status     int
		server     string
		says       []string
	}{
		{"ambiguous", "/_scheduler/docs/_replicator/backup", 400, "", []string{"on 2 servers", a, b, "?server="}},
		{"server URL", "/_scheduler/docs/_replicator/backup?server=" + url.QueryEscape(a), 200, a, nil},
		{"server URL with credentials and slash", "/_scheduler/docs/_replicator/backup?server=" + url.QueryEscape("http://admin:pw-b@couch-b.example:5984/"), 200, b, nil},
		{"host:port", "/_scheduler/docs/_replicator/backup?server=couch-b.example:5984", 200, b, nil},
		{"unambiguous CouchDB path", "/_scheduler/docs/_replicator/only-b", 200, b, nil},
		{"not on that server", "/_scheduler/docs/_replicator/only-b?server=couch-a.example:5984", 404, "", []string{"only-b", a}},
		{"unknown server", "/_scheduler/docs/_replicator/backup?server=nowhere:1", 400, "", []string{"unknown server", a, b}},
		{"unknown server with a password", "/_scheduler/docs/_replicator/backup?server=" + url.QueryEscape("admin:pw-x@nowhere:1"), 400, "", []string{"unknown server", "nowhere:1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := e.get(tc.path)
			if strings.Contains(string(r.body), "pw-") {
				t.Fatalf("answer holds a password: %s", r.body)
			}
			if r.status != tc.status {
				t.Fatalf("%d %s, want %d", r.status, r.body, tc.status)
			}
			m := r.json(t)
			if tc.server != "" && m["server"] != tc.server {
				t.Fatalf("server %v, want %s: %s", m["server"], tc.server, r.body)
			}
			for _, s := range tc.says {
				if !strings.Contains(string(r.body), s) {
					t.Errorf("answer %s does not say %q", r.body, s)
				}
			}
		})
	}

	// The lists: three jobs, each naming its server; ?server= filters.
	list := func(path string) []map[string]any {
		t.Helper()
		r := e.get(path)
		if r.status != 200 {
			t.Fatalf("GET %s: %d %s", path, r.status, r.body)
		}
		var out []map[string]any
		for _, d := range r.json(t)["docs"].([]any) {
			out = append(out, d.(map[string]any))
		}
		return out
	}
	all := list("/_scheduler/docs")
	if len(all) != 3 {
		t.Fatalf("_scheduler/docs: %v", all)
	}
	for _, d := range all {
		if d["server"] != a && d["server"] != b {
			t.Errorf("entry names no server: %v", d)
		}
	}
	for path, want := range map[string]int{"/_scheduler/docs?server=couch-b.example:5984": 2, "/_scheduler/docs/_replicator?server=" + url.QueryEscape(a): 1} {
		if got := list(path); len(got) != want {
			t.Errorf("GET %s: %d docs, want %d: %v", path, len(got), want, got)
		}
	}
	// _scheduler/jobs names the server too.
	r := e.get("/_scheduler/jobs/" + url.PathEscape(repjob.PersistentJobID(b, "_replicator", "backup")))
	if r.status != 200 || r.json(t)["server"] != b {
		t.Fatalf("_scheduler/jobs of b's backup: %d %s", r.status, r.body)
	}

	// Metrics: one series per server, no password.
	m := string(e.get("/metrics").body)
	for _, want := range []string{
		`couchrep_replication_jobs{database="_replicator",kind="persistent",server="` + a + `",state="pending"} 1`,
		`couchrep_replication_jobs{database="_replicator",kind="persistent",server="` + b + `",state="pending"} 2`,
	} {
		if !strings.Contains(m, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
	if strings.Contains(m, "pw-") {
		t.Fatal("metrics hold a password")
	}
}
