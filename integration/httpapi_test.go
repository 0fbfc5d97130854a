package integration

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/couchrep/couchrep/internal/testserver"
)

// httpAddr waits for the node's HTTP API address (<data>/http.addr) that
// differs from not (to see a restarted listener) and returns it.
func (n *nodeProc) httpAddr(not string) string {
	n.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		b, err := os.ReadFile(filepath.Join(n.dataDir, "http.addr"))
		if a := strings.TrimSpace(string(b)); err == nil && bytes.HasSuffix(b, []byte("\n")) && a != not {
			return a
		}
		select {
		case <-n.exited:
			n.t.Fatalf("couchrepd exited (%v):\n%s", n.exitErr, n.logs.String())
		case <-time.After(20 * time.Millisecond):
		}
	}
	n.t.Fatalf("no http.addr after 30s:\n%s", n.logs.String())
	return ""
}

type apiReply struct {
	status int
	body   []byte
}

func (r apiReply) obj(t *testing.T) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(r.body, &m); err != nil {
		t.Fatalf("reply %d is not a JSON object: %v: %s", r.status, err, r.body)
	}
	return m
}

// api sends one request to the node's HTTP API.
func api(t *testing.T, addr, method, path, body string) apiReply {
	t.Helper()
	req, err := http.NewRequest(method, "http://"+addr+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	client := &http.Client{Timeout: 3 * time.Minute}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return apiReply{status: resp.StatusCode, body: b}
}

// waitJobState polls GET /_scheduler/jobs/{id} until the job is in state.
func waitJobState(t *testing.T, addr, id, state string) map[string]any {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	var last apiReply
	for time.Now().Before(deadline) {
		last = api(t, addr, "GET", "/_scheduler/jobs/"+id, "")
		if last.status == 200 && last.obj(t)["state"] == state {
			return last.obj(t)
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("job %s not %s after 2 min: %d %s", id, state, last.status, last.body)
	return nil
}

func TestHTTPAPIBadInputLeavesNodeUnharmed(t *testing.T) {
	skipShort(t)
	n := startNode(t, nodeOptions{})
	addr := n.httpAddr("")
	ok := `"source":"http://127.0.0.1:1/a","target":"http://127.0.0.1:1/b"`
	ids := make([]string, 10_000)
	for i := range ids {
		ids[i] = fmt.Sprintf(`"document-%06d"`, i)
	}
	manyIDs := "[" + strings.Join(ids, ",") + "]"
	for _, tc := range []struct {
		name, method, path, body string
		status                   int
		code, reason             string
	}{
		{"malformed json", "POST", "/_replicate", `{"source":`, 400, "bad_request", "invalid JSON at byte 10: the body ends inside a value"},
		{"100,000 levels deep", "POST", "/_replicate", `{"a":` + strings.Repeat("[", 100000) + strings.Repeat("]", 100000) + `}`, 400, "bad_request", "JSON body nested too deeply: more than 64 levels"},
		{"huge body", "POST", "/_replicate", `{` + ok + `,"pad":"` + strings.Repeat("x", 9<<20) + `"}`, 413, "too_large", "limit of 8388608 bytes"},
		{"missing source", "POST", "/_replicate", `{"target":"http://127.0.0.1:1/b"}`, 400, "bad_request", "Missing `source` field"},
		{"bad url", "POST", "/_replicate", `{"source":"ftp://h/a","target":"http://127.0.0.1:1/b"}`, 400, "invalid_replication", "`source`: endpoint has an invalid url"},
		{"doc_ids not strings", "POST", "/_replicate", `{` + ok + `,"doc_ids":[1,2]}`, 400, "bad_request", "parameter `doc_ids` must be an array of strings"},
		{"filter and doc_ids", "POST", "/_replicate", `{` + ok + `,"doc_ids":["a"],"filter":"d/f"}`, 400, "bad_request", "`doc_ids`,`filter`,`selector` are mutually exclusive"},
		{"cancel not boolean", "POST", "/_replicate", `{` + ok + `,"cancel":"true"}`, 400, "bad_request", "parameter `cancel` must be a boolean"},
		// More than a job store record holds (FDB's 100 kB value limit).
		{"10,000 doc_ids", "POST", "/_replicate", `{` + ok + `,"doc_ids":` + manyIDs + `}`, 400, "bad_request", "replication document is too large: 180077 bytes, at most 64000; its largest field `doc_ids` has 180001"},
		{"proxy", "POST", "/_replicate", `{` + ok + `,"proxy":"http://p:1","target_proxy":"http://q:1"}`, 400, "bad_request", "`proxy` is mutually exclusive with `target_proxy`"},
		{"unknown endpoint", "GET", "/_all_dbs", "", 404, "not_found", "unknown endpoint /_all_dbs"},
		{"bad states", "GET", "/_scheduler/docs?states=sleeping", "", 400, "query_parse_error", "Unknown states"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := api(t, addr, tc.method, tc.path, tc.body)
			m := r.obj(t)
			if r.status != tc.status || m["error"] != tc.code || !strings.Contains(m["reason"].(string), tc.reason) {
				t.Fatalf("got %d %s, want %d %s containing %q", r.status, r.body, tc.status, tc.code, tc.reason)
			}
		})
	}
	if r := api(t, addr, "GET", "/_up", ""); r.status != 200 || r.obj(t)["status"] != "ok" {
		t.Fatalf("/_up: %d %s", r.status, r.body)
	} else if _, ok := r.obj(t)["db_updates"].(map[string]any); !ok {
		// use_db_updates is on by default: the node has a hub, no server yet.
		t.Fatalf("/_up without db_updates: %s", r.body)
	}
	if r := api(t, addr, "GET", "/_scheduler/jobs", ""); r.status != 200 || r.obj(t)["total_rows"] != 0.0 {
		t.Fatalf("jobs after bad input: %d %s", r.status, r.body)
	}
	if !allRunning(n.tree().GetRoot()) {
		t.Fatalf("an actor is not running after bad input")
	}
	if lines := n.logLines(`"child":"http_api"`, "child_exited"); len(lines) != 0 {
		t.Fatalf("http_api exited: %v", lines)
	}
}

func TestHTTPAPIKilledRestartsListener(t *testing.T) {
	skipShort(t)
	n := startNode(t, nodeOptions{})
	addr := n.httpAddr("")
	if _, errOut, code := n.ctl("kill", "http_api"); code != 0 {
		t.Fatalf("couchrepctl kill http_api: %d %s", code, errOut)
	}
	addr2 := n.httpAddr(addr) // port 0: the new incarnation has a new port
	if r := api(t, addr2, "GET", "/_up", ""); r.status != 200 {
		t.Fatalf("/_up after restart: %d %s", r.status, r.body)
	}
	if _, err := http.Get("http://" + addr + "/_up"); err == nil {
		t.Fatalf("the killed incarnation's listener %s still accepts", addr)
	}
}

func TestHTTPAPIContinuousPendingAndCancel(t *testing.T) {
	skipShort(t)
	n := startNode(t, nodeOptions{})
	addr := n.httpAddr("")
	src, tgt := testserver.StartPouchDB(t), testserver.StartPouchDB(t)
	srcDB, tgtDB := src.CreateDB(t, "src"), tgt.CreateDB(t, "tgt")
	body := `{"source":"` + srcDB + `","target":"` + tgtDB + `","continuous":true}`
	r := api(t, addr, "POST", "/_replicate", body)
	m := r.obj(t)
	id, _ := m["_local_id"].(string)
	if r.status != 202 || m["ok"] != true || !strings.HasSuffix(id, "+continuous") {
		t.Fatalf("POST continuous: %d %s", r.status, r.body)
	}
	j := api(t, addr, "GET", "/_scheduler/jobs/"+id, "").obj(t)
	if j["id"] != id || (j["state"] != "pending" && j["state"] != "running") {
		t.Fatalf("job %v", j)
	}
	waitJobState(t, addr, id, "running")
	src.PutDocs(t, srcDB, map[string]any{"_id": "live", "n": 1})
	deadline := time.Now().Add(time.Minute)
	for {
		// tgtDB: prefixed, with credentials, on the CouchDB of make test-couchdb.
		if st, _ := getDoc(t, tgtDB, "live", ""); st == http.StatusOK {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("continuous replication did not copy a new doc within 1 min")
		}
		time.Sleep(50 * time.Millisecond)
	}
	tasks := api(t, addr, "GET", "/_active_tasks", "")
	if !strings.Contains(string(tasks.body), id) {
		t.Fatalf("_active_tasks lacks %s: %s", id, tasks.body)
	}
	// Cancel by body, then by id: 404.
	r = api(t, addr, "POST", "/_replicate", strings.TrimSuffix(body, "}")+`,"cancel":true}`)
	if r.status != 200 || r.obj(t)["_local_id"] != id {
		t.Fatalf("cancel: %d %s", r.status, r.body)
	}
	r = api(t, addr, "POST", "/_replicate", `{"replication_id":"`+id+`","cancel":true}`)
	if m := r.obj(t); r.status != 404 || m["error"] != "not found" || len(m) != 1 { // CouchDB's answer, naming no id
		t.Fatalf("second cancel: %d %s", r.status, r.body)
	}
	// The node's job server stopped the job's actor at once (a cancel
	// request through the store), not at the actor's next write.
	waitUntil(t, "the canceled job's actor stopped on request", time.Minute, func() bool {
		return len(n.logLines("stopping a job on request", `"requested_by":"http_api"`)) > 0 && countJobActors(n) == 0
	})
	if r := api(t, addr, "GET", "/_scheduler/jobs", ""); r.obj(t)["total_rows"] != 0.0 {
		t.Fatalf("jobs after cancel: %s", r.body)
	}
	met := api(t, addr, "GET", "/metrics", "")
	if !strings.Contains(string(met.body), `couchrep_http_requests_total{code="202",endpoint="replicate",method="POST"} 1`) {
		t.Fatalf("metrics lack the POST:\n%s", met.body)
	}
}

func TestHTTPAPIOneShotReplyIsCouchDBs(t *testing.T) {
	skipShort(t)
	n := startNode(t, nodeOptions{})
	addr := n.httpAddr("")
	src, tgt := testserver.StartPouchDB(t), testserver.StartPouchDB(t)
	srcDB, tgtDB := src.CreateDB(t, "src"), tgt.CreateDB(t, "tgt")
	var docs []map[string]any
	for i := 0; i < 20; i++ {
		docs = append(docs, map[string]any{"_id": "d" + string(rune('a'+i)), "i": i})
	}
	src.PutDocs(t, srcDB, docs...)
	r := api(t, addr, "POST", "/_replicate", `{"source":"`+srcDB+`","target":"`+tgtDB+`"}`)
	m := r.obj(t)
	if r.status != 200 || m["ok"] != true || m["session_id"] == nil || m["replication_id_version"] != 4.0 {
		t.Fatalf("one-shot reply %d %s", r.status, r.body)
	}
	hist, _ := m["history"].([]any)
	if len(hist) == 0 || hist[0].(map[string]any)["docs_written"] != 20.0 {
		t.Fatalf("history %v", m["history"])
	}
	var info struct {
		DocCount int `json:"doc_count"`
	}
	tgt.GetJSON(t, tgtDB, &info)
	if info.DocCount != 20 {
		t.Fatalf("target has %d docs, want 20", info.DocCount)
	}

	// A source that does not exist: the job fails and the reply says why.
	r = api(t, addr, "POST", "/_replicate", `{"source":"`+src.DBURL("missing")+`","target":"`+tgtDB+`"}`)
	if m := r.obj(t); r.status != 404 || m["error"] != "db_not_found" {
		t.Fatalf("missing source: %d %s", r.status, r.body)
	}
}

func TestHTTPAPICrashingContinuous(t *testing.T) {
	skipShort(t)
	n := startNode(t, nodeOptions{})
	addr := n.httpAddr("")
	src, tgt := testserver.StartPouchDB(t), testserver.StartPouchDB(t)
	tgtDB := tgt.CreateDB(t, "tgt")
	r := api(t, addr, "POST", "/_replicate", `{"source":"`+src.DBURL("missing")+`","target":"`+tgtDB+`","continuous":true}`)
	id, _ := r.obj(t)["_local_id"].(string)
	if r.status != 202 || id == "" {
		t.Fatalf("POST: %d %s", r.status, r.body)
	}
	j := waitJobState(t, addr, id, "crashing")
	info, _ := j["info"].(map[string]any)
	if e, _ := info["error"].(string); !strings.Contains(e, "db_not_found") {
		t.Fatalf("crashing job info %v", j["info"])
	}
	hist, _ := j["history"].([]any)
	if len(hist) == 0 || hist[0].(map[string]any)["type"] != "crashed" {
		t.Fatalf("history %v", j["history"])
	}
}

// BenchmarkHTTPAPIReplicateToFirstDoc measures the time from POST
// /_replicate (continuous) to the first document written on the target,
// through a real couchrepd and two PouchDB Servers.
func BenchmarkHTTPAPIReplicateToFirstDoc(b *testing.B) {
	if testing.Short() {
		b.Skip("integration benchmark")
	}
	bt := b
	addr := startBenchNode(b)
	src, tgt := testserver.StartPouchDB(bt), testserver.StartPouchDB(bt)
	srcDB := src.CreateDB(bt, "src")
	src.PutDocs(bt, srcDB, map[string]any{"_id": "first", "v": 1})
	client := &http.Client{Timeout: time.Minute}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		name := "tgt" + strconv.Itoa(i)
		tgtDB := tgt.CreateDB(bt, name)
		body := `{"source":"` + srcDB + `","target":"` + tgtDB + `","continuous":true}`
		b.StartTimer()
		resp, err := client.Post("http://"+addr+"/_replicate", "application/json", strings.NewReader(body))
		if err != nil {
			b.Fatal(err)
		}
		var rep map[string]any
		_ = json.NewDecoder(resp.Body).Decode(&rep)
		resp.Body.Close()
		if resp.StatusCode != 202 {
			b.Fatalf("POST: %d %v", resp.StatusCode, rep)
		}
		for {
			r, err := client.Get(tgtDB + "first")
			if err != nil {
				b.Fatal(err)
			}
			io.Copy(io.Discard, r.Body)
			r.Body.Close()
			if r.StatusCode == 200 {
				break
			}
			time.Sleep(2 * time.Millisecond)
		}
		b.StopTimer()
		cresp, err := client.Post("http://"+addr+"/_replicate", "application/json", strings.NewReader(`{"replication_id":"`+rep["_local_id"].(string)+`","cancel":true}`))
		if err != nil {
			b.Fatal(err)
		}
		cresp.Body.Close()
		b.StartTimer()
	}
}

// startBenchNode starts couchrepd for a benchmark and returns its HTTP API
// address.
func startBenchNode(b *testing.B) string {
	b.Helper()
	dir := b.TempDir()
	cmd := exec.Command(filepath.Join(binDir, "couchrepd"), "--data", dir, "--admin", "127.0.0.1:0", "--http", "127.0.0.1:0", "--log-level", "warning")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		_ = cmd.Wait()
	})
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if raw, err := os.ReadFile(filepath.Join(dir, "http.addr")); err == nil && bytes.HasSuffix(raw, []byte("\n")) {
			return strings.TrimSpace(string(raw))
		}
		time.Sleep(20 * time.Millisecond)
	}
	b.Fatal("couchrepd: no http.addr after 30s")
	return ""
}
