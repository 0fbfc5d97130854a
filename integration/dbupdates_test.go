package integration

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/couchrep/couchrep/internal/testserver"
)

// TestDBUpdatesStatus: couchrepd with one continuous job on PouchDB
// Server with a real _db_updates (read as its admin) and one on plain
// PouchDB Server (a 400 stub): GET /_up's "db_updates" shows the first
// server "ok" with its watch and the second "unsupported" with the 400,
// /metrics counts them, the node logs the unsupported server once, and the
// admin's password is in none of it. A third job on the first server, read
// with the credentials of a user who is not its admin, gets 401 for
// _db_updates: counted as credentials not_admin, never as the server
// unsupported while the admin's job reads its feed (issue 32 item 9).
func TestDBUpdatesStatus(t *testing.T) {
	skipShort(t)
	real := testserver.StartPouchDBWithDBUpdates(t)
	if real.External() {
		t.Skip("two servers of their own: not with COUCHREP_TEST_COUCH_URL")
	}
	stub := testserver.StartPouchDB(t)
	const pass = "dbu-s3cret"
	real.AddAdmin(t, "boss", pass)
	withAdmin := func(u string) string {
		p, err := url.Parse(u)
		if err != nil {
			t.Fatal(err)
		}
		p.User = url.UserPassword("boss", pass)
		return p.String()
	}
	for _, s := range []*testserver.Server{real, stub} {
		s.CreateDB(t, "user-a")
		s.CreateDB(t, "central")
	}
	real.CreateDB(t, "user-b")
	real.Do(t, http.MethodPut, real.URL+"_users/org.couchdb.user:joe",
		map[string]any{"name": "joe", "password": "joe-pw", "roles": []string{}, "type": "user"}, http.StatusCreated)
	asJoe := func(u string) string {
		p, err := url.Parse(u)
		if err != nil {
			t.Fatal(err)
		}
		p.User = url.UserPassword("joe", "joe-pw")
		return p.String()
	}
	dir := t.TempDir()
	n := startNode(t, nodeOptions{dataDir: dir, config: writeConfig(t, dir, "[replicator]\nstartup_jitter = 0\nidle_park_after = 3600\n")})
	addr := n.httpAddr("")
	for _, job := range []struct{ source, target string }{
		{withAdmin(real.DBURL("user-a")), withAdmin(real.DBURL("central"))},
		{stub.DBURL("user-a"), stub.DBURL("central")},
		{asJoe(real.DBURL("user-b")), withAdmin(real.DBURL("central"))},
	} {
		body := fmt.Sprintf(`{"source":%q,"target":%q,"continuous":true}`, job.source, job.target)
		if r := api(t, addr, "POST", "/_replicate", body); r.status != http.StatusAccepted {
			t.Fatalf("POST /_replicate: %d %s", r.status, r.body)
		}
	}
	realName, stubName := strings.TrimSuffix(real.URL, "/")+"/", strings.TrimSuffix(stub.URL, "/")+"/"
	type line struct {
		State    string
		Reason   string
		Watches  int
		NotAdmin int `json:"not_admin_credentials"`
	}
	var up struct {
		DBUpdates map[string]line `json:"db_updates"`
	}
	var raw []byte
	deadline := time.Now().Add(time.Minute)
	for {
		r := api(t, addr, "GET", "/_up", "")
		raw = r.body
		if err := json.Unmarshal(r.body, &up); err != nil {
			t.Fatalf("/_up: %d %s", r.status, r.body)
		}
		ok, bad := up.DBUpdates[realName], up.DBUpdates[stubName]
		if ok.State == "ok" && ok.Watches == 1 && ok.NotAdmin == 1 && bad.State == "unsupported" {
			if bad.Reason != "400 Bad Request" {
				t.Fatalf("the stub's reason %q, want 400 Bad Request: %s", bad.Reason, r.body)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/_up db_updates after a minute: %s", r.body)
		}
		time.Sleep(50 * time.Millisecond) // the jobs open their watches as they start: poll
	}
	if len(up.DBUpdates) != 2 {
		t.Fatalf("/_up db_updates lists %d servers, want 2: %s", len(up.DBUpdates), raw)
	}
	for name, want := range map[string]float64{"couchrep_db_updates_feeds": 1, "couchrep_db_updates_watches": 1,
		"couchrep_db_updates_servers_unsupported": 1, "couchrep_db_updates_credentials_not_admin": 1} {
		if got := metricSum(t, addr, metricPrefix(name)); got != want {
			t.Errorf("/metrics %s = %v, want %v", name, got, want)
		}
	}
	if l := n.logLines("its jobs keep _changes feeds of their own", "400 Bad Request"); len(l) != 1 {
		t.Errorf("%d log lines for the unsupported server, want 1:\n%s", len(l), strings.Join(l, "\n"))
	}
	if l := n.logLines("reading the server's _db_updates"); len(l) != 1 {
		t.Errorf("%d log lines for the server read, want 1:\n%s", len(l), strings.Join(l, "\n"))
	}
	if strings.Contains(string(raw), pass) || len(n.logLines(pass)) > 0 || strings.Contains(string(raw), "joe-pw") || len(n.logLines("joe-pw")) > 0 {
		t.Fatalf("the admin's password shows in /_up or the log")
	}
}
