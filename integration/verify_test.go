package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/couchrep/couchrep/internal/replicate"
	"github.com/couchrep/couchrep/internal/testserver"
	cverify "github.com/couchrep/couchrep/internal/verify"
)

// verifyRun is one `couchrepd verify`: its difference lines, summary and
// exit code.
type verifyRun struct {
	lines   []cverify.Difference
	summary cverify.Summary
	errLine map[string]string
	code    int
	stdout  string
	stderr  string
	maxRSS  int64
}

// kinds is the run's differences as "kind id" strings, sorted.
func (r verifyRun) kinds() []string {
	out := make([]string, 0, len(r.lines))
	for _, d := range r.lines {
		out = append(out, string(d.Kind)+" "+d.ID)
	}
	sort.Strings(out)
	return out
}

// runVerifyCmd runs `couchrepd verify args...` and parses its output.
func runVerifyCmd(t testing.TB, args ...string) verifyRun {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(binDir, "couchrepd"), append([]string{"verify"}, args...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Start(); err != nil {
		t.Fatalf("couchrepd verify: %v", err)
	}
	// The child's peak RSS: its VmHWM, read until it exits (rusage's
	// ru_maxrss would count the test process's memory at the fork).
	var hwm atomic.Int64
	done := make(chan struct{})
	go func() {
		path := fmt.Sprintf("/proc/%d/status", cmd.Process.Pid)
		for {
			if v := int64(statusBytes(path, "VmHWM:")); v > hwm.Load() {
				hwm.Store(v)
			}
			select {
			case <-done:
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()
	err := cmd.Wait()
	close(done)
	r := verifyRun{stdout: stdout.String(), stderr: stderr.String(), maxRSS: hwm.Load()}
	if err != nil {
		exitErr, ok := err.(*exec.ExitError)
		if !ok {
			t.Fatalf("couchrepd verify: %v", err)
		}
		r.code = exitErr.ExitCode()
	}
	for _, l := range strings.Split(strings.TrimSpace(r.stdout), "\n") {
		if l == "" {
			continue
		}
		var probe map[string]json.RawMessage
		if err := json.Unmarshal([]byte(l), &probe); err != nil {
			t.Fatalf("couchrepd verify: not a JSON line: %q\nstderr: %s", l, r.stderr)
		}
		switch {
		case probe["summary"] != nil:
			if err := json.Unmarshal(probe["summary"], &r.summary); err != nil {
				t.Fatal(err)
			}
		case probe["error"] != nil:
			_ = json.Unmarshal([]byte(l), &r.errLine)
		default:
			var d cverify.Difference
			if err := json.Unmarshal([]byte(l), &d); err != nil {
				t.Fatal(err)
			}
			r.lines = append(r.lines, d)
		}
	}
	return r
}

// copyDB replicates src to tgt once with the engine.
func copyDB(t testing.TB, src, tgt string) {
	t.Helper()
	p, err := replicate.ParseParams([]byte(fmt.Sprintf(`{"source":%q,"target":%q}`, src, tgt)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, err := replicate.New(p, replicate.Options{}).Run(ctx); err != nil {
		t.Fatalf("replicating %s: %v", srcRedacted(src), err)
	}
}

func srcRedacted(u string) string {
	if p, err := url.Parse(u); err == nil {
		p.User = nil
		return p.String()
	}
	return "?"
}

// seedVerify fills db with what a verify must look at: plain documents,
// a conflicted one, a deleted one, documents with attachments.
func seedVerify(t testing.TB, s *testserver.Server, db string, n int) {
	t.Helper()
	docs := make([]map[string]any, 0, n)
	for i := range n {
		docs = append(docs, map[string]any{"_id": fmt.Sprintf("d%04d", i), "n": i})
	}
	s.PutDocs(t, db, docs...)
	s.PutRevs(t, db,
		testserver.Doc("conflicted", []string{"2-b", "1-a"}, map[string]any{"side": "b"}),
		testserver.Doc("conflicted", []string{"2-c", "1-a"}, map[string]any{"side": "c"}),
		testserver.Deleted(testserver.Doc("gone", []string{"2-dd", "1-d"}, nil)),
		testserver.WithAttachment(testserver.Doc("att-same", []string{"1-a1"}, map[string]any{"x": 1}), "a.txt", "text/plain", []byte("hello")),
		testserver.WithAttachment(testserver.Doc("att-missing", []string{"1-a2"}, map[string]any{"x": 2}), "a.txt", "text/plain", []byte("hello")),
		testserver.WithAttachment(testserver.Doc("att-different", []string{"1-a3"}, map[string]any{"x": 3}), "a.txt", "text/plain", []byte("hello")),
		testserver.WithAttachment(testserver.WithAttachment(
			testserver.Doc("att-conflict", []string{"2-x", "1-a4"}, map[string]any{"x": 4}), "b.bin", "application/octet-stream", []byte{1, 2, 3}),
			"c.txt", "text/plain", []byte("c")),
		testserver.WithAttachment(testserver.Doc("att-conflict", []string{"2-y", "1-a4"}, map[string]any{"x": 5}), "b.bin", "application/octet-stream", []byte{4, 5, 6}),
	)
}

// TestVerifyDifferences: a clean copy verifies clean (stemmed and
// compacted target included); each kind of difference injected by hand
// is found exactly once, with no false positive; extra_on_target and
// deleted_on_target only with --extra.
func TestVerifyDifferences(t *testing.T) {
	skipShort(t)
	s := testserver.StartPouchDB(t)
	src, tgt := s.CreateDB(t, "vsrc"), s.CreateDB(t, "vtgt")
	seedVerify(t, s, src, 300)
	// The target's own revisions of two attachment documents, written
	// before the copy (which then leaves them): same revision, an
	// attachment missing or different.
	s.PutRevs(t, tgt,
		testserver.Doc("att-missing", []string{"1-a2"}, map[string]any{"x": 2}),
		testserver.WithAttachment(testserver.Doc("att-different", []string{"1-a3"}, map[string]any{"x": 3}), "a.txt", "text/plain", []byte("hellO")),
	)
	copyDB(t, src, tgt)
	// A target that stems its history and compacted away old attachments
	// is no difference.
	if _, status, _ := s.Request(http.MethodPut, tgt+"_revs_limit", []byte("1")); status != http.StatusOK {
		t.Logf("target's _revs_limit not settable here (%d)", status)
	}
	if _, status, _ := s.Request(http.MethodPost, tgt+"_compact", []byte("{}")); status != http.StatusAccepted && status != http.StatusOK {
		t.Logf("target's _compact: %d", status)
	}

	// Only the two planted attachment differences.
	r := runVerifyCmd(t, src, tgt)
	want := []string{"attachment_different att-different", "attachment_missing att-missing"}
	if got := r.kinds(); fmt.Sprint(got) != fmt.Sprint(want) || r.code != 3 || r.summary.OK {
		t.Fatalf("verify: got %v (exit %d, ok %v), want %v\n%s\n%s", got, r.code, r.summary.OK, want, r.stdout, r.stderr)
	}
	if r.summary.DocsChecked != 300+6 || r.summary.AttachmentsChecked < 4 {
		t.Errorf("summary: %+v", r.summary)
	}
	for _, d := range r.lines {
		if d.Kind == cverify.AttachmentDifferent && (d.Source == nil || d.Target == nil || d.Source.Digest == d.Target.Digest) {
			t.Errorf("attachment_different without both digests: %+v", d)
		}
	}

	// Every other kind, injected by hand, each once. (With _revs_limit 1
	// kept, the target's deletion of d0003 would also forget the source's
	// leaf it extends, and the default verify would find d0003
	// deleted_on_target too: a target edit, rightly reported.)
	_, _, _ = s.Request(http.MethodPut, tgt+"_revs_limit", []byte("1000"))
	s.PutDocs(t, src, map[string]any{"_id": "only-src"})                                                           // missing
	s.PutRevs(t, src, testserver.Doc("d0001", []string{"2-zz", currentRev(t, s, src, "d0001")}, map[string]any{})) // leaf_missing
	s.Do(t, http.MethodDelete, src+"d0002?rev="+currentRev(t, s, src, "d0002"), nil, http.StatusOK)                // deleted_on_source
	s.Do(t, http.MethodDelete, tgt+"d0003?rev="+currentRev(t, s, tgt, "d0003"), nil, http.StatusOK)                // deleted_on_target (--extra)
	s.PutDocs(t, tgt, map[string]any{"_id": "only-tgt"})                                                           // extra_on_target (--extra)

	r = runVerifyCmd(t, src, tgt)
	want = []string{"attachment_different att-different", "attachment_missing att-missing",
		"deleted_on_source d0002", "leaf_missing d0001", "missing only-src"}
	if got := r.kinds(); fmt.Sprint(got) != fmt.Sprint(want) || r.code != 3 {
		t.Fatalf("verify: got %v (exit %d), want %v\n%s", got, r.code, want, r.stdout)
	}
	if r.summary.Differences != 5 || r.summary.Counts[cverify.Missing] != 1 {
		t.Errorf("summary: %+v", r.summary)
	}
	r = runVerifyCmd(t, "--extra", src, tgt)
	want = []string{"attachment_different att-different", "attachment_missing att-missing",
		"deleted_on_source d0002", "deleted_on_target d0003", "extra_on_target only-tgt", "leaf_missing d0001", "missing only-src"}
	if got := r.kinds(); fmt.Sprint(got) != fmt.Sprint(want) || r.code != 3 {
		t.Fatalf("verify --extra: got %v (exit %d), want %v\n%s", got, r.code, want, r.stdout)
	}

	// The replication's filter applies: doc_ids of clean documents only.
	r = runVerifyCmd(t, "--doc-ids", "d0005,d0006,conflicted,gone,att-same,att-conflict", src, tgt)
	if r.code != 0 || len(r.lines) != 0 || r.summary.DocsChecked != 6 {
		t.Fatalf("verify --doc-ids: exit %d, %v, %+v\n%s", r.code, r.kinds(), r.summary, r.stderr)
	}
}

// TestVerifyRepair: --repair replicates exactly the missing revisions with
// the engine and verifies again: clean.
func TestVerifyRepair(t *testing.T) {
	skipShort(t)
	s := testserver.StartPouchDB(t)
	src, tgt := s.CreateDB(t, "rsrc"), s.CreateDB(t, "rtgt")
	seedVerify(t, s, src, 200)
	copyDB(t, src, tgt)
	s.PutDocs(t, src, map[string]any{"_id": "new1"}, map[string]any{"_id": "new2"})
	s.PutRevs(t, src, testserver.Doc("conflicted", []string{"2-e", "1-a"}, map[string]any{"side": "e"}))
	s.Do(t, http.MethodDelete, src+"d0007?rev="+currentRev(t, s, src, "d0007"), nil, http.StatusOK)

	r := runVerifyCmd(t, "--repair", src, tgt)
	if r.code != 0 || !r.summary.OK || r.summary.Repair == nil {
		t.Fatalf("verify --repair: exit %d, %+v\n%s\n%s", r.code, r.summary, r.stdout, r.stderr)
	}
	rep := r.summary.Repair
	if rep.Docs != 4 || rep.MissingRevisionsFound != 4 || rep.DocsWritten != 4 || rep.Before[cverify.Missing] != 2 {
		t.Errorf("repair: %+v", rep)
	}
	if got := r.kinds(); fmt.Sprint(got) != fmt.Sprint([]string{"deleted_on_source d0007", "leaf_missing conflicted", "missing new1", "missing new2"}) {
		t.Errorf("lines: %v", got)
	}
	if r = runVerifyCmd(t, src, tgt); r.code != 0 || len(r.lines) != 0 {
		t.Fatalf("verify after repair: exit %d, %v", r.code, r.kinds())
	}
}

// TestVerifyLiveSource: documents written to the source after the verify
// began (new ones and new revisions, none on the target) are reported
// changed_since_start, never missing, and the verify passes.
func TestVerifyLiveSource(t *testing.T) {
	skipShort(t)
	s := testserver.StartPouchDB(t)
	src, tgt := s.CreateDB(t, "lsrc"), s.CreateDB(t, "ltgt")
	seedVerify(t, s, src, 500)
	copyDB(t, src, tgt)

	// The source through a proxy: the verify's first _changes request
	// (after it read the start seq) waits until the writer has written.
	su, _ := url.Parse(s.URL)
	var once sync.Once
	written := make(chan struct{})
	var wrote []string
	var writeErr error
	proxy := httputil.NewSingleHostReverseProxy(su)
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, "/_changes") {
			once.Do(func() {
				defer close(written)
				for i := range 5 {
					id, upd := fmt.Sprintf("live%d", i), fmt.Sprintf("d%04d", 10+i)
					var cur struct {
						Rev string `json:"_rev"`
					}
					b, _, err := s.Request(http.MethodGet, src+upd, nil)
					if err == nil {
						err = json.Unmarshal(b, &cur)
					}
					if err == nil {
						_, _, err = s.Request(http.MethodPost, src+"_bulk_docs", map[string]any{"docs": []map[string]any{
							{"_id": id}, {"_id": upd, "_rev": cur.Rev, "v": 2}}})
					}
					if err != nil {
						writeErr = err
						return
					}
					wrote = append(wrote, "changed_since_start "+id, "changed_since_start "+upd)
				}
			})
		}
		proxy.ServeHTTP(w, r)
	}))
	t.Cleanup(front.Close)
	fu, _ := url.Parse(front.URL)
	sp, _ := url.Parse(src)
	fu.User, fu.Path = sp.User, sp.Path // an external CouchDB's credentials
	srcVia := fu.String()

	r := runVerifyCmd(t, srcVia, tgt)
	select {
	case <-written:
	default:
		t.Fatal("the verify read no _changes through the proxy")
	}
	if writeErr != nil {
		t.Fatalf("writing to the source: %v", writeErr)
	}
	sort.Strings(wrote)
	if got := r.kinds(); fmt.Sprint(got) != fmt.Sprint(wrote) || r.code != 0 || !r.summary.OK {
		t.Fatalf("live source: got %v (exit %d), want %v\n%s\n%s", got, r.code, wrote, r.stdout, r.stderr)
	}
	if r.summary.Counts[cverify.ChangedSinceStart] != 10 || r.summary.Differences != 0 {
		t.Errorf("summary: %+v", r.summary)
	}
}

// TestVerifyBadInput: a missing database, an unreachable endpoint and
// wrong credentials give a clear CouchDB-style error (exit 1), with no
// password in any output.
func TestVerifyBadInput(t *testing.T) {
	skipShort(t)
	s := testserver.StartPouchDB(t)
	user, pass := "admin", "s3cret-pw"
	if s.External() { // the CouchDB of make test-couchdb: its admin
		su, _ := url.Parse(s.URL)
		user = su.User.Username()
		pass, _ = su.User.Password()
	} else {
		s.AddAdmin(t, user, pass)
	}
	src := s.CreateDB(t, "bsrc")
	s.PutDocs(t, src, map[string]any{"_id": "a"})
	withCreds := func(u, user, pass string) string {
		p, _ := url.Parse(u)
		p.User = url.UserPassword(user, pass)
		return p.String()
	}
	for _, tc := range []struct {
		name, src, tgt, errName, reason string
	}{
		{"missing database", withCreds(src, user, pass), withCreds(s.DBURL("nope"), user, pass), "db_not_found", "target"},
		{"unreachable", withCreds(src, user, pass), "http://" + user + ":" + pass + "@127.0.0.1:1/db", "db_not_found", "127.0.0.1:1"},
		{"wrong credentials", withCreds(src, user, "wrong-pw"), withCreds(src, user, pass), "unauthorized", "unauthorized to access"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := runVerifyCmd(t, "--retries-per-request", "1", tc.src, tc.tgt)
			if r.code != 1 || r.errLine["error"] != tc.errName || !strings.Contains(r.errLine["reason"], tc.reason) {
				t.Fatalf("exit %d, error line %v\n%s", r.code, r.errLine, r.stderr)
			}
			for _, out := range []string{r.stdout, r.stderr} {
				if strings.Contains(out, ":"+pass+"@") || strings.Contains(out, "wrong-pw") {
					t.Fatalf("a password in the output:\n%s", out)
				}
			}
		})
	}
	// A bad parameter is a usage error, named as /_replicate names it.
	r := runVerifyCmd(t, "--selector", `{"a":1}`, "--doc-ids", "a", withCreds(src, user, pass), src)
	if r.code != 2 || !strings.Contains(r.stderr, "mutually exclusive") {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
}

// TestVerifyGiantDocument: a 64 MB document on the source (not on the
// target) is reported missing; the verify's memory stays bounded (it
// reads the rest of that _changes page without documents, and no
// document above max_document_bytes).
func TestVerifyGiantDocument(t *testing.T) {
	skipShort(t)
	s := testserver.StartPouchDB(t)
	src, tgt := s.CreateDB(t, "gsrc"), s.CreateDB(t, "gtgt")
	seedVerify(t, s, src, 50)
	copyDB(t, src, tgt)
	big := strings.Repeat("x", 64<<20)
	s.PutRevs(t, src, testserver.Doc("giant", []string{"1-g"}, map[string]any{"big": big}))
	big = ""
	r := runVerifyCmd(t, src, tgt)
	if got := r.kinds(); fmt.Sprint(got) != "[missing giant]" || r.code != 3 {
		t.Fatalf("got %v (exit %d)\n%s\n%s", got, r.code, r.stdout, r.stderr)
	}
	// On the target too, same revision: clean, its attachments unchecked
	// (none: nothing to compare) and memory bounded.
	s.PutRevs(t, tgt, testserver.Doc("giant", []string{"1-g"}, map[string]any{"big": strings.Repeat("x", 64<<20)}))
	r = runVerifyCmd(t, src, tgt)
	if r.code != 0 || !r.summary.OK {
		t.Fatalf("exit %d, %v\n%s\n%s", r.code, r.kinds(), r.stdout, r.stderr)
	}
	t.Logf("verify with a 64 MB document: max RSS %.1f MB, lines %v", float64(r.maxRSS)/(1<<20), r.kinds())
	if r.maxRSS > 100<<20 {
		t.Errorf("max RSS %d MB", r.maxRSS>>20)
	}
}

// currentRev is the current revision of document id in the database at dbURL.
func currentRev(t testing.TB, s *testserver.Server, dbURL, id string) string {
	t.Helper()
	var d struct {
		Rev string `json:"_rev"`
	}
	s.GetJSON(t, dbURL+url.PathEscape(id), &d)
	return d.Rev
}

// TestVerifyNode: the node's entry points run the same verify —
// `couchrepctl verify` and `couchrepctl job verify` (admin RPC, streamed),
// POST /_verify (JSON lines; CouchDB-style errors) — with no credential in
// any answer or in the node's log.
func TestVerifyNode(t *testing.T) {
	skipShort(t)
	s := testserver.StartPouchDB(t)
	s.AddAdmin(t, "admin", "n0de-secret")
	src, tgt := s.CreateDB(t, "nsrc"), s.CreateDB(t, "ntgt")
	seedVerify(t, s, src, 100)
	withCreds := func(u string) string {
		p, _ := url.Parse(u)
		p.User = url.UserPassword("admin", "n0de-secret")
		return p.String()
	}
	copyDB(t, withCreds(src), withCreds(tgt))
	s.PutDocs(t, src, map[string]any{"_id": "only-src"}, map[string]any{"_id": "only-src2"})
	n := startNode(t, nodeOptions{})
	noSecret := func(what, out string) {
		t.Helper()
		if strings.Contains(out, "n0de-secret") {
			t.Fatalf("%s shows the password:\n%s", what, out)
		}
	}

	out, errOut, code := n.ctl("verify", withCreds(src), withCreds(tgt))
	if code != 3 || strings.Count(out, `"kind":"missing"`) != 2 || !strings.Contains(out, `"summary"`) {
		t.Fatalf("couchrepctl verify: exit %d\n%s\n%s", code, out, errOut)
	}
	noSecret("couchrepctl verify", out+errOut)
	out, errOut, code = n.ctl("verify", "--doc-ids", "d0001,d0002", withCreds(src), withCreds(tgt))
	if code != 0 || !strings.Contains(out, `"docs_checked":2`) {
		t.Fatalf("couchrepctl verify --doc-ids: exit %d\n%s\n%s", code, out, errOut)
	}
	_, errOut, code = n.ctl("verify", withCreds(src), withCreds(s.DBURL("nope")))
	if code != 1 || !strings.Contains(errOut, "db_not_found") {
		t.Fatalf("couchrepctl verify of a missing database: exit %d: %s", code, errOut)
	}
	noSecret("couchrepctl verify's error", errOut)

	// POST /_verify: the same body as POST /_replicate.
	api := "http://" + n.httpAddr("")
	body := fmt.Sprintf(`{"source":{"url":%q,"auth":{"basic":{"username":"admin","password":"n0de-secret"}}},"target":%q}`, src, withCreds(tgt))
	resp, err := http.Post(api+"/_verify", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	_, _ = b.ReadFrom(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/x-ndjson" ||
		strings.Count(b.String(), `"kind":"missing"`) != 2 || !strings.Contains(b.String(), `"ok":false`) {
		t.Fatalf("POST /_verify: %d %s\n%s", resp.StatusCode, resp.Header.Get("Content-Type"), b.String())
	}
	noSecret("POST /_verify", b.String())
	for _, tc := range []struct {
		body   string
		status int
		errStr string
	}{
		{fmt.Sprintf(`{"source":%q,"target":%q}`, withCreds(src), withCreds(s.DBURL("nope"))), 404, "db_not_found"},
		{fmt.Sprintf(`{"source":%q,"target":%q,"doc_ids":["a"],"selector":{"a":1}}`, withCreds(src), withCreds(tgt)), 400, "bad_request"},
		{fmt.Sprintf(`{"source":%q,"target":%q}`, strings.Replace(withCreds(src), "n0de-secret", "bad-n0de-secret", 1), withCreds(tgt)), 401, "unauthorized"},
		{fmt.Sprintf(`{"source":%q,"target":%q,"extra":"yes"}`, withCreds(src), withCreds(tgt)), 400, "bad_request"},
	} {
		resp, err := http.Post(api+"/_verify", "application/json", strings.NewReader(tc.body))
		if err != nil {
			t.Fatal(err)
		}
		var e map[string]string
		_ = json.NewDecoder(resp.Body).Decode(&e)
		resp.Body.Close()
		if resp.StatusCode != tc.status || e["error"] != tc.errStr || e["reason"] == "" {
			t.Errorf("POST /_verify %s: %d %v", tc.body, resp.StatusCode, e)
		}
		noSecret("POST /_verify's error", e["reason"])
	}

	// couchrepctl job verify: a continuous job with a doc_ids filter
	// verifies its own documents only.
	body = fmt.Sprintf(`{"source":%q,"target":%q,"continuous":true,"doc_ids":["d0003","only-src"]}`, withCreds(src), withCreds(tgt))
	resp, err = http.Post(api+"/_replicate", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	var added struct {
		LocalID string `json:"_local_id"`
	}
	_ = json.NewDecoder(resp.Body).Decode(&added)
	resp.Body.Close()
	if added.LocalID == "" {
		t.Fatalf("POST /_replicate: %d", resp.StatusCode)
	}
	deadline := time.Now().Add(time.Minute)
	for {
		out, errOut, code = n.ctl("job", "verify", added.LocalID)
		if code == 0 {
			break
		}
		if code != 3 || time.Now().After(deadline) {
			t.Fatalf("couchrepctl job verify: exit %d\n%s\n%s", code, out, errOut)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if !strings.Contains(out, `"docs_checked":2`) {
		t.Fatalf("couchrepctl job verify: %s", out)
	}
	if _, errOut, code = n.ctl("job", "verify", "nosuchjob"); code != 1 || !strings.Contains(errOut, "not_found") {
		t.Fatalf("job verify of no job: exit %d: %s", code, errOut)
	}
	noSecret("couchrepctl job verify", out)
	noSecret("the node's log", n.logs.String())
}

// TestCouchDBVerifiesItsOwnCopy: a copy made by CouchDB's own replicator
// (a one-shot POST /_replicate on the CouchDB of make test-couchdb, its
// replicator turned on for it: max_jobs 0 holds such a request forever)
// verifies clean, --extra included; then the injected differences are
// found there as on PouchDB Server (TestVerifyDifferences runs there too).
func TestCouchDBVerifiesItsOwnCopy(t *testing.T) {
	skipShort(t)
	if !strings.Contains(os.Getenv(testserver.ExternalURLEnv), "://") {
		t.Skip("needs a CouchDB: make test-couchdb COUCH_URL=http://admin:password@host:5984")
	}
	s := testserver.StartPouchDB(t) // the CouchDB of COUCHREP_TEST_COUCH_URL
	src, tgt := s.CreateDB(t, "csrc"), s.DBURL("ctgt")
	seedVerify(t, s, src, 2000)
	withCouchConfig(t, s, "replicator", "max_jobs", "500", func() {
		s.Do(t, http.MethodPost, s.URL+"_replicate", map[string]any{"source": src, "target": tgt, "create_target": true}, http.StatusOK)
	})
	r := runVerifyCmd(t, "--extra", src, tgt)
	if r.code != 0 || len(r.lines) != 0 || r.summary.DocsChecked != 2006 || r.summary.TargetDocsChecked != 2006 || r.summary.AttachmentsChecked != 6 {
		t.Fatalf("CouchDB's copy: exit %d, %v, %+v\n%s", r.code, r.kinds(), r.summary, r.stderr)
	}
	t.Logf("CouchDB's copy of %d documents verified clean in %.2fs: %+v", r.summary.DocsChecked, r.summary.Seconds, r.summary)
	// Its history stemmed to one revision and compacted: still clean.
	s.Do(t, http.MethodPut, tgt+"_revs_limit", []byte("1"), http.StatusOK)
	s.Do(t, http.MethodPost, tgt+"_compact", []byte("{}"), http.StatusAccepted)
	if r = runVerifyCmd(t, src, tgt); r.code != 0 || len(r.lines) != 0 {
		t.Fatalf("stemmed and compacted: exit %d, %v\n%s", r.code, r.kinds(), r.stderr)
	}
}
