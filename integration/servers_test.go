package integration

import (
	"encoding/json"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/couchrep/couchrep/internal/testserver"
	"github.com/couchrep/couchrep/messages"
)

// TestTwoServersOneNode runs a real couchrepd watching two PouchDB Servers
// (PouchDB Server's own replicator off) that both have a _replicator
// document "backup", each replicating its own database (issue 24,
// finding 8):
//   - they are two jobs, each runs and copies its own server's documents;
//   - couchrepctl jobs, _scheduler/docs, _scheduler/jobs, _active_tasks,
//     the status page (jobs and the fair-share table) and /metrics name
//     each job's server, as its URL without credentials;
//   - CouchDB's /_scheduler/docs/_replicator/backup is refused naming
//     both servers while it is ambiguous, ?server= (host:port or URL)
//     picks each one, and it is CouchDB's path again once only one server
//     has the document;
//   - deleting the document on one server ends that server's job only;
//   - no answer or output holds the second server's password.
func TestTwoServersOneNode(t *testing.T) {
	skipShort(t)
	const pass = "s3cret-two-servers"
	srv1 := testserver.StartPouchDB(t)
	srv2 := testserver.StartPouchDB(t)
	plainReplicatorDB(t, srv1, true)
	plainReplicatorDB(t, srv2, true)
	srv2.AddAdmin(t, "admin", pass)
	name1 := strings.TrimSuffix(srv1.URL, "/")
	name2 := strings.TrimSuffix(srv2.URL, "/")
	host2 := strings.TrimPrefix(name2, "http://")
	watch2 := withUserinfo(t, srv2, "admin", pass)

	src1, src2 := srv1.CreateDB(t, "src"), srv2.CreateDB(t, "src")
	for i := range 3 {
		srv1.PutDocs(t, src1, map[string]any{"_id": fmt.Sprintf("one-%d", i)})
	}
	for i := range 4 {
		srv2.PutDocs(t, src2, map[string]any{"_id": fmt.Sprintf("two-%d", i)})
	}
	srv1.CreateDB(t, "tgt")
	srv2.CreateDB(t, "tgt")

	dir := t.TempDir()
	cfg := fmt.Sprintf("[couchrep]\nwatch = %s,%s\n%s", name1, watch2, jobsConfig)
	n := startNode(t, nodeOptions{dataDir: dir, config: writeConfig(t, dir, cfg), name: "two"})
	addr := n.httpAddr("")
	t.Cleanup(func() {
		if strings.Contains(n.logs.String(), pass) {
			t.Error("the node's log holds the password")
		}
	})
	get := func(t *testing.T, path string) apiReply {
		t.Helper()
		r := api(t, addr, "GET", path, "")
		if strings.Contains(string(r.body), pass) {
			t.Fatalf("GET %s shows the password: %s", path, r.body)
		}
		return r
	}

	srv1.Do(t, "PUT", srv1.DBURL("_replicator")+"backup",
		map[string]any{"source": src1, "target": srv1.DBURL("tgt"), "continuous": true}, 201)
	srv2.Do(t, "PUT", srv2.DBURL("_replicator")+"backup",
		map[string]any{"source": watch2 + "/src", "target": watch2 + "/tgt", "continuous": true}, 201)
	waitDocCount(t, srv1, srv1.DBURL("tgt"), 3)
	waitDocCount(t, srv2, srv2.DBURL("tgt"), 4)

	// Two jobs, each naming its server.
	list := waitCtlJobs(t, n, 2, "--state", "running")
	ids := map[string]bool{}
	for _, j := range list.GetJobs() {
		ids[j.GetId()] = true
	}
	if !ids[name1+"|_replicator|backup"] || !ids[name2+"|_replicator|backup"] {
		t.Fatalf("couchrepctl jobs: %v", list.GetJobs())
	}
	out, errOut, _ := n.ctl("jobs")
	if strings.Contains(out+errOut, pass) {
		t.Fatalf("couchrepctl jobs shows the password:\n%s", out)
	}

	t.Run("scheduler docs", func(t *testing.T) {
		r := get(t, "/_scheduler/docs/_replicator/backup")
		if r.status != 400 || !strings.Contains(string(r.body), name1) || !strings.Contains(string(r.body), name2) || !strings.Contains(string(r.body), "?server=") {
			t.Fatalf("ambiguous document: %d %s", r.status, r.body)
		}
		for q, want := range map[string]string{"?server=" + host2: name2, "?server=" + url.QueryEscape(name1+"/"): name1, "?server=" + url.QueryEscape(watch2): name2} {
			r := get(t, "/_scheduler/docs/_replicator/backup"+q)
			if r.status != 200 {
				t.Fatalf("%s: %d %s", q, r.status, r.body)
			}
			m := r.obj(t)
			if m["server"] != want || m["state"] != "running" || !strings.HasPrefix(m["target"].(string), want) {
				t.Fatalf("%s: %s", q, r.body)
			}
		}
		r = get(t, "/_scheduler/docs")
		var docs struct {
			Docs []map[string]any `json:"docs"`
		}
		decode(t, r, &docs)
		servers := map[any]int{}
		for _, d := range docs.Docs {
			servers[d["server"]]++
		}
		if len(docs.Docs) != 2 || servers[name1] != 1 || servers[name2] != 1 {
			t.Fatalf("_scheduler/docs: %s", r.body)
		}
	})

	t.Run("jobs, active tasks, status page, metrics", func(t *testing.T) {
		r := get(t, "/_scheduler/jobs/"+url.PathEscape(name2+"|_replicator|backup"))
		if r.status != 200 || r.obj(t)["server"] != name2 {
			t.Fatalf("_scheduler/jobs: %d %s", r.status, r.body)
		}
		r = get(t, "/_active_tasks")
		var tasks []map[string]any
		decode(t, r, &tasks)
		if len(tasks) != 2 || tasks[0]["server"] == tasks[1]["server"] {
			t.Fatalf("_active_tasks: %s", r.body)
		}
		r = get(t, "/_status/data")
		var st struct {
			Jobs   []map[string]any `json:"jobs"`
			Shares []struct {
				Database string   `json:"database"`
				Servers  []string `json:"servers"`
			} `json:"shares"`
		}
		decode(t, r, &st)
		if len(st.Jobs) != 2 || st.Jobs[0]["server"] == st.Jobs[1]["server"] {
			t.Fatalf("status page jobs: %s", r.body)
		}
		if len(st.Shares) != 1 || st.Shares[0].Database != "_replicator" || len(st.Shares[0].Servers) != 2 {
			t.Fatalf("status page shares: %s", r.body)
		}
		m := string(get(t, "/metrics").body)
		for _, name := range []string{name1, name2} {
			want := `couchrep_replication_jobs{database="_replicator",kind="persistent",server="` + name + `",state="running"} 1`
			if !strings.Contains(m, want) {
				t.Errorf("metrics lack %s", want)
			}
		}
	})

	t.Run("deleting one server's document ends that job only", func(t *testing.T) {
		var doc map[string]any
		srv1.GetJSON(t, srv1.DBURL("_replicator")+"backup", &doc)
		srv1.Do(t, "DELETE", srv1.DBURL("_replicator")+"backup?rev="+doc["_rev"].(string), nil, 200)
		waitCtlJobs(t, n, 1)
		var left messages.ListJobsResponse
		ctlJSON(t, n, &left, "jobs")
		if left.GetJobs()[0].GetId() != name2+"|_replicator|backup" {
			t.Fatalf("jobs after the delete: %v", left.GetJobs())
		}
		// One server has the document: CouchDB's path answers again.
		waitUntil(t, "the unambiguous path", 30*time.Second, func() bool {
			r := get(t, "/_scheduler/docs/_replicator/backup")
			return r.status == 200 && r.obj(t)["server"] == name2
		})
	})
}

// decode unmarshals a 200 reply's JSON body into into.
func decode(t *testing.T, r apiReply, into any) {
	t.Helper()
	if r.status != 200 {
		t.Fatalf("status %d: %s", r.status, r.body)
	}
	if err := json.Unmarshal(r.body, into); err != nil {
		t.Fatalf("reply is not what it should be: %v: %s", err, r.body)
	}
}
