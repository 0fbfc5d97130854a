package integration

import (
	"bufio"
	"bytes"
	"crypto/md5"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/couchrep/couchrep/internal/testserver"
)

// hostileServer is an endpoint that misbehaves on command: it speaks raw
// HTTP/1.1 on TCP (well-behaved server libraries cannot send a 10 GB
// Content-Length with a small body, or headers one byte a second), and the
// first path segment — the database name — picks the misbehaviour. Some
// databases answer like a CouchDB until the request that goes wrong.
type hostileServer struct {
	ln, tlsLn net.Listener
	done      chan struct{}
	wg        sync.WaitGroup
	// bigDoc is the size of the "bigdoc" document; longLine of the
	// "longline" _changes row.
	bigDoc, longLine int
	requests         atomic.Int64
	// slowbody counts the requests of the "slowbody" endpoint.
	slowbody atomic.Int64
}

func startHostile(t *testing.T) *hostileServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	tlsLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	h := &hostileServer{ln: ln, tlsLn: tlsLn, done: make(chan struct{}), bigDoc: 50 << 20, longLine: 100 << 20}
	h.wg.Add(2)
	go h.accept(ln, h.serve)
	go h.accept(tlsLn, h.neverHandshake)
	t.Cleanup(func() {
		close(h.done)
		ln.Close()
		tlsLn.Close()
		h.wg.Wait()
	})
	return h
}

func (h *hostileServer) accept(ln net.Listener, serve func(net.Conn)) {
	defer h.wg.Done()
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		h.wg.Add(1)
		go func() {
			defer h.wg.Done()
			defer c.Close()
			go func() { <-h.done; c.Close() }() // unblock writes and reads when the test ends
			serve(c)
		}()
	}
}

// dbURL is the endpoint of a misbehaviour, with credentials that must
// never be shown.
func (h *hostileServer) dbURL(mode string) string {
	if mode == "tls" {
		return "https://hostile:hunter2@" + h.tlsLn.Addr().String() + "/tls/"
	}
	return "http://hostile:hunter2@" + h.ln.Addr().String() + "/" + mode + "/"
}

// neverHandshake reads the TLS ClientHello and answers nothing, ever.
func (h *hostileServer) neverHandshake(c net.Conn) {
	_, _ = io.Copy(io.Discard, c)
}

// hold keeps a connection open, silent, until the client or the test ends it.
func (h *hostileServer) hold(c net.Conn) {
	_, _ = io.Copy(io.Discard, c)
}

func (h *hostileServer) serve(c net.Conn) {
	req, err := http.ReadRequest(bufio.NewReader(c))
	if err != nil {
		return
	}
	h.requests.Add(1)
	_, _ = io.Copy(io.Discard, io.LimitReader(req.Body, 1<<20))
	path := strings.TrimPrefix(req.URL.Path, "/")
	mode, rest, _ := strings.Cut(path, "/")
	reply := func(status int, body string) {
		fmt.Fprintf(c, "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s",
			status, http.StatusText(status), len(body), body)
	}
	switch mode {
	case "garbage":
		reply(200, "<html><body>this is not JSON</body></html>")
		return
	case "truncated":
		fmt.Fprint(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 1000\r\nConnection: close\r\n\r\n{\"db_name\":\"trunc")
		return
	case "stall":
		fmt.Fprint(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n")
		h.hold(c)
		return
	case "trickle":
		for _, b := range []byte("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}") {
			if _, err := c.Write([]byte{b}); err != nil {
				return
			}
			select {
			case <-h.done:
				return
			case <-time.After(time.Second):
			}
		}
		return
	case "slowbody":
		// Headers at once, then a space of JSON whitespace every 200 ms,
		// forever: each read delivers well inside connection_timeout, so
		// only request_timeout can end the request.
		h.slowbody.Add(1)
		fmt.Fprint(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n{\"db_name\":\"slowbody\"")
		for {
			select {
			case <-h.done:
				return
			case <-time.After(200 * time.Millisecond):
			}
			if _, err := c.Write([]byte(" ")); err != nil {
				return
			}
		}
	case "hugelength":
		fmt.Fprint(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 10737418240\r\n\r\n{\"db_name\":\"hugelength\"")
		h.hold(c)
		return
	case "redirect":
		fmt.Fprintf(c, "HTTP/1.1 302 Found\r\nLocation: %s\r\nContent-Length: 0\r\nConnection: close\r\n\r\n", req.URL.RequestURI())
		return
	}
	// The rest answer like a CouchDB until the request that goes wrong.
	switch {
	case rest == "" && req.Method == http.MethodGet:
		reply(200, `{"db_name":"`+mode+`","update_seq":1,"doc_count":1,"doc_del_count":0,"instance_start_time":"0"}`)
	case strings.HasPrefix(rest, "_local/") && req.Method == http.MethodGet:
		reply(404, `{"error":"not_found","reason":"missing"}`)
	case strings.HasPrefix(rest, "_local/"):
		reply(201, `{"ok":true,"id":"`+rest+`","rev":"0-1"}`)
	case rest == "_ensure_full_commit":
		reply(201, `{"ok":true,"instance_start_time":"0"}`)
	case rest == "_changes":
		h.changes(c, mode, req)
	case rest == "_bulk_get":
		h.docs(c, mode, `{"results":[{"id":"doc","docs":[{"ok":`, `}]}]}`)
	case rest == "doc" && req.URL.Query().Has("open_revs"):
		h.docs(c, mode, `[{"ok":`, `}]`)
	case rest == "doc/a.bin" && req.Method == http.MethodGet:
		// No Content-Length: the bytes alone must be checked.
		fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nConnection: close\r\n\r\n%s", attachmentBody(mode))
	default:
		reply(404, `{"error":"not_found","reason":"no such thing here"}`)
	}
}

// changes lists one document, or (longline) starts a row that never ends.
func (h *hostileServer) changes(c net.Conn, mode string, req *http.Request) {
	continuous := req.URL.Query().Get("feed") == "continuous"
	fmt.Fprint(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n")
	if mode == "longline" {
		if !continuous {
			fmt.Fprint(c, `{"results":[`)
		}
		fmt.Fprint(c, `{"seq":1,"id":"`)
		chunk := bytes.Repeat([]byte("a"), 64<<10)
		for sent := 0; sent < h.longLine; sent += len(chunk) {
			if _, err := c.Write(chunk); err != nil {
				return
			}
		}
		fmt.Fprint(c, `","changes":[{"rev":"1-a"}]}`+"\n")
		h.hold(c)
		return
	}
	row := `{"seq":1,"id":"doc","changes":[{"rev":"1-a"}]}`
	if !continuous {
		fmt.Fprint(c, `{"results":[`+row+`],"last_seq":1,"pending":0}`)
		return
	}
	fmt.Fprint(c, row+"\n")
	for { // heartbeats until the client leaves
		select {
		case <-h.done:
			return
		case <-time.After(500 * time.Millisecond):
		}
		if _, err := c.Write([]byte("\n")); err != nil {
			return
		}
	}
}

// docs answers _bulk_get or open_revs with the mode's document between
// head and tail: 50 MB of JSON (bigdoc), _revisions that do not match
// _rev (badrevs), or a stub of an attachment it then sends wrong (att*).
func (h *hostileServer) docs(c net.Conn, mode, head, tail string) {
	fmt.Fprint(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n"+head)
	switch mode {
	case "bigdoc":
		fmt.Fprint(c, `{"_id":"doc","_rev":"1-a","_revisions":{"start":1,"ids":["a"]},"pad":"`)
		chunk := bytes.Repeat([]byte("b"), 64<<10)
		for sent := 0; sent < h.bigDoc; sent += len(chunk) {
			if _, err := c.Write(chunk); err != nil {
				return
			}
		}
		fmt.Fprint(c, `"}`)
	case "attlong", "attshort", "attdigest":
		sum := md5.Sum(hostileAttachment)
		fmt.Fprintf(c, `{"_id":"doc","_rev":"1-a","_revisions":{"start":1,"ids":["a"]},"_attachments":{"a.bin":`+
			`{"content_type":"application/octet-stream","revpos":1,"length":%d,"digest":"md5-%s","stub":true}}}`,
			len(hostileAttachment), base64.StdEncoding.EncodeToString(sum[:]))
	default: // badrevs
		fmt.Fprint(c, `{"_id":"doc","_rev":"1-a","_revisions":{"start":3,"ids":["a","x","y"]},"v":1}`)
	}
	fmt.Fprint(c, tail)
}

// rssBytes is a process's resident set size from /proc.
func rssBytes(pid int) (int64, error) {
	n := statusBytes(fmt.Sprintf("/proc/%d/status", pid), "VmRSS:")
	if n == 0 {
		return 0, fmt.Errorf("no VmRSS in /proc/%d/status", pid)
	}
	return int64(n), nil
}

// hostileCases: each misbehaviour, and what the job's error must say (one
// of the causes separated by "|": where the transport's own timeout, also
// connection_timeout, may fire first).
var hostileCases = []struct {
	mode  string
	cause string
}{
	{"garbage", "malformed response"},
	{"truncated", "unexpected EOF"},
	{"stall", "nothing received for 2s (in the response body"},
	{"trickle", "nothing received for 2s (waiting for the response headers|timeout awaiting response headers"},
	{"hugelength", "response body of 10737418240 bytes (Content-Length) is more than the limit"},
	{"bigdoc", "document is more than the limit of 16777216 bytes"},
	{"longline", "_changes row is more than the limit of 8388608 bytes"},
	{"redirect", "stopped after 10 redirects"},
	{"tls", "nothing received for 2s (waiting for the response headers|TLS handshake timeout"},
	{"badrevs", `_revisions (start 3, 3 ids, first "a") does not match _rev "1-a"`},
	// An attachment's bytes that do not match its stub (issue 27).
	{"attlong", `attachment "a.bin": the source sent more than its 1024 bytes`},
	{"attshort", `attachment "a.bin": the source sent 1000 of its 1024 bytes`},
	{"attdigest", `attachment "a.bin": md5 of the 1024 bytes sent is`},
}

// hostileAttachment is the 1 KiB attachment the att* endpoints' stubs
// describe.
var hostileAttachment = bytes.Repeat([]byte("0123456789abcdef"), 64)

// attachmentBody is what an att* endpoint sends for the attachment: more,
// fewer or other bytes than its stub says.
func attachmentBody(mode string) []byte {
	switch mode {
	case "attlong":
		return append(append([]byte{}, hostileAttachment...), "more"...)
	case "attshort":
		return hostileAttachment[:1000]
	default: // attdigest
		return bytes.ToUpper(hostileAttachment)
	}
}

// TestHostileEndpoints runs a continuous job against every misbehaving
// endpoint at once on one node, beside a real replication between two
// PouchDB databases. Every hostile job must crash with an error naming its
// endpoint (password masked) and the cause, be retried no sooner than the
// scheduler's backoff allows, and never show the password; the real job
// must keep replicating; the node must stay up with its RSS less than
// 200 MB above what it was before.
func TestHostileEndpoints(t *testing.T) {
	skipShort(t)
	srv := testserver.StartPouchDB(t)
	h := startHostile(t)
	cfg := filepath.Join(t.TempDir(), "couchrep.ini")
	if err := os.WriteFile(cfg, []byte("[replicator]\nmin_backoff_penalty_sec = 2\nmax_backoff_penalty_sec = 8\nstartup_jitter = 0\nmax_document_bytes = 16777216\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	n := startNode(t, nodeOptions{config: cfg})
	addr := n.httpAddr("")
	pid := n.cmd.Process.Pid
	baseline, err := rssBytes(pid)
	if err != nil {
		t.Fatal(err)
	}
	var peak atomic.Int64
	peak.Store(baseline)
	stopSampling := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			if rss, err := rssBytes(pid); err == nil && rss > peak.Load() {
				peak.Store(rss)
			}
			select {
			case <-stopSampling:
				return
			case <-time.After(50 * time.Millisecond):
			}
		}
	}()

	// The real replication beside them.
	src, tgt := srv.CreateDB(t, "realsrc"), srv.DBURL("realtgt")
	srv.PutDocs(t, src, testserver.Doc("before", nil, map[string]any{"v": 1}))
	r := api(t, addr, "POST", "/_replicate", fmt.Sprintf(`{"source":%q,"target":%q,"continuous":true,"create_target":true}`, src, tgt))
	if r.status != http.StatusAccepted {
		t.Fatalf("real job: %d %s", r.status, r.body)
	}
	waitDocs(t, tgt, 1)

	// COUCHREP_HOSTILE_CASES=bigdoc,stall runs only those (to measure one
	// case's memory for RELIABILITY.md).
	cases := hostileCases
	if only := os.Getenv("COUCHREP_HOSTILE_CASES"); only != "" {
		cases = nil
		for _, hc := range hostileCases {
			if slices.Contains(strings.Split(only, ","), hc.mode) {
				cases = append(cases, hc)
			}
		}
	}
	ids := map[string]string{}
	for _, hc := range cases {
		body := fmt.Sprintf(`{"source":%q,"target":%q,"continuous":true,"create_target":true,"connection_timeout":2000,"retries_per_request":1}`,
			h.dbURL(hc.mode), srv.DBURL("tgt"+hc.mode))
		r := api(t, addr, "POST", "/_replicate", body)
		if r.status != http.StatusAccepted {
			t.Fatalf("%s: POST /_replicate: %d %s", hc.mode, r.status, r.body)
		}
		ids[hc.mode] = r.obj(t)["_local_id"].(string)
	}

	// Every hostile job crashes, with its endpoint and cause in the error.
	for _, hc := range cases {
		t.Run(hc.mode, func(t *testing.T) {
			job := waitJobState(t, addr, ids[hc.mode], "crashing")
			info, _ := job["info"].(map[string]any)
			msg, _ := info["error"].(string)
			t.Logf("%s: crashing: %s", hc.mode, msg)
			endpoint := strings.TrimPrefix(strings.TrimPrefix(h.dbURL(hc.mode), "http://hostile:hunter2@"), "https://hostile:hunter2@")
			cause := false
			if v := os.Getenv("COUCHREP_REPLICATOR_MAX_DOCUMENT_BYTES"); v != "" { // overrides the file's 16 MiB
				hc.cause = strings.Replace(hc.cause, "16777216", v, 1)
			}
			for _, c := range strings.Split(hc.cause, "|") {
				cause = cause || strings.Contains(msg, c)
			}
			if !strings.Contains(msg, endpoint) || !cause {
				t.Errorf("error %q does not name the endpoint %s and the cause %q", msg, endpoint, hc.cause)
			}
			if src, _ := job["source"].(string); !strings.Contains(src, endpoint) || strings.Contains(src, "hunter2") {
				t.Errorf("source shown as %q, want the endpoint %s without its password", src, endpoint)
			}
		})
	}

	// Backoff: no hostile job starts again sooner than min_backoff after a
	// crash. The garbage job crashes at once on every start, so by the time
	// it has crashed three times the scheduler has waited twice.
	if garbage, ok := ids["garbage"]; ok {
		waitUntil(t, "the garbage job crashed three times", 2*time.Minute, func() bool {
			return countHistory(t, addr, garbage, "crashed") >= 3
		})
	}
	for mode, id := range ids {
		checkBackoff(t, addr, mode, id, 2*time.Second)
	}

	// The node and the real job keep going: new documents arrive.
	srv.PutDocs(t, src, testserver.Doc("after1", nil, map[string]any{"v": 2}), testserver.Doc("after2", nil, map[string]any{"v": 3}))
	waitDocs(t, tgt, 3)
	if r := api(t, addr, "GET", "/_up", ""); r.status != 200 {
		t.Fatalf("/_up: %d %s", r.status, r.body)
	}
	if err := treeWhole(n.tree()); err != nil {
		t.Fatalf("supervision tree: %v", err)
	}

	// Credentials appear nowhere: not in the API, not in the logs.
	all := api(t, addr, "GET", "/_scheduler/jobs", "")
	if bytes.Contains(all.body, []byte("hunter2")) || strings.Contains(n.logs.String(), "hunter2") {
		t.Fatalf("the endpoints' password leaked into _scheduler/jobs or the node's logs")
	}

	close(stopSampling)
	<-sampled
	grew := peak.Load() - baseline
	t.Logf("hostile endpoints: node RSS baseline %d MB, peak %d MB (+%d MB); hostile server answered %d requests",
		baseline>>20, peak.Load()>>20, grew>>20, h.requests.Load())
	if grew >= 200<<20 {
		t.Fatalf("node RSS grew by %d MB (baseline %d MB, peak %d MB), want < 200 MB", grew>>20, baseline>>20, peak.Load()>>20)
	}
}

type historyEntry struct {
	Timestamp string `json:"timestamp"`
	Type      string `json:"type"`
}

func jobHistory(t *testing.T, addr, id string) []historyEntry {
	t.Helper()
	r := api(t, addr, "GET", "/_scheduler/jobs/"+id, "")
	var j struct {
		History []historyEntry `json:"history"`
	}
	if r.status != 200 || json.Unmarshal(r.body, &j) != nil {
		t.Fatalf("GET /_scheduler/jobs/%s: %d %s", id, r.status, r.body)
	}
	return j.History
}

func countHistory(t *testing.T, addr, id, typ string) int {
	n := 0
	for _, e := range jobHistory(t, addr, id) {
		if e.Type == typ {
			n++
		}
	}
	return n
}

// checkBackoff asserts that every start after a crash came at least
// minBackoff after it (history timestamps have whole seconds: one second
// of slack).
func checkBackoff(t *testing.T, addr, mode, id string, minBackoff time.Duration) {
	t.Helper()
	h := jobHistory(t, addr, id) // newest first
	for i := len(h) - 1; i > 0; i-- {
		if h[i].Type != "crashed" || h[i-1].Type != "started" {
			continue
		}
		crashed, err1 := time.Parse(time.RFC3339, h[i].Timestamp)
		started, err2 := time.Parse(time.RFC3339, h[i-1].Timestamp)
		if err1 != nil || err2 != nil {
			t.Fatalf("%s: history timestamps %q, %q", mode, h[i].Timestamp, h[i-1].Timestamp)
		}
		if gap := started.Sub(crashed); gap < minBackoff-time.Second {
			t.Errorf("%s: started again %s after a crash, before the %s backoff", mode, gap, minBackoff)
		}
	}
}

// waitDocs waits until the database at u (which may not exist yet) holds
// want documents.
func waitDocs(t *testing.T, u string, want int) {
	t.Helper()
	waitUntil(t, fmt.Sprintf("%s holds %d documents", u, want), 2*time.Minute, func() bool {
		n, err := dbDocCount(u)
		return err == nil && n == want
	})
}

// TestRequestTimeoutEndpoint: with [replicator] request_timeout set, a
// source whose answer trickles forever (a byte every 200 ms, far inside
// connection_timeout) is sent the request again (retries_per_request),
// then the job crashes with a reason naming request_timeout and the
// endpoint, never its password; `couchrepd replicate --config` fails the
// same way. Without request_timeout such a job would stay running forever.
func TestRequestTimeoutEndpoint(t *testing.T) {
	skipShort(t)
	srv := testserver.StartPouchDB(t)
	h := startHostile(t)
	cfg := filepath.Join(t.TempDir(), "couchrep.ini")
	if err := os.WriteFile(cfg, []byte("[replicator]\nrequest_timeout = 1500\nmin_backoff_penalty_sec = 2\nstartup_jitter = 0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	n := startNode(t, nodeOptions{config: cfg})
	addr := n.httpAddr("")
	endpoint := strings.TrimPrefix(h.dbURL("slowbody"), "http://hostile:hunter2@")
	const cause = "no complete response within 1.5s (in the response body; request_timeout)"

	body := fmt.Sprintf(`{"source":%q,"target":%q,"continuous":true,"create_target":true,"connection_timeout":10000,"retries_per_request":1}`,
		h.dbURL("slowbody"), srv.DBURL("tgtslow"))
	r := api(t, addr, "POST", "/_replicate", body)
	if r.status != http.StatusAccepted {
		t.Fatalf("POST /_replicate: %d %s", r.status, r.body)
	}
	job := waitJobState(t, addr, r.obj(t)["_local_id"].(string), "crashing")
	info, _ := job["info"].(map[string]any)
	msg, _ := info["error"].(string)
	t.Logf("crashing: %s (%d requests to the endpoint)", msg, h.slowbody.Load())
	if !strings.Contains(msg, cause) || !strings.Contains(msg, endpoint) {
		t.Fatalf("error %q does not name the endpoint %s and the cause %q", msg, endpoint, cause)
	}
	if got := h.slowbody.Load(); got < 2 {
		t.Fatalf("%d requests to the endpoint before the crash, want the request sent again (>= 2)", got)
	}

	before := h.slowbody.Load()
	res := runCmd(t, filepath.Join(binDir, "couchrepd"), "replicate", "--config", cfg, "--retries-per-request", "1",
		"--connection-timeout", "10000", h.dbURL("slowbody"), srv.DBURL("tgtslowcli"))
	if res.code != 1 || !strings.Contains(res.stderr, "request_timeout") || !strings.Contains(res.stderr, endpoint) {
		t.Fatalf("couchrepd replicate: exit %d, stderr %q; want 1 and an error naming request_timeout and %s", res.code, res.stderr, endpoint)
	}
	if got := h.slowbody.Load() - before; got < 2 {
		t.Fatalf("couchrepd replicate sent %d requests, want the request sent again (>= 2)", got)
	}

	all := api(t, addr, "GET", "/_scheduler/jobs", "")
	if bytes.Contains(all.body, []byte("hunter2")) || strings.Contains(n.logs.String(), "hunter2") ||
		strings.Contains(res.stderr+res.stdout, "hunter2") {
		t.Fatalf("the endpoint's password leaked into _scheduler/jobs, the node's logs or couchrepd replicate's output")
	}
}
