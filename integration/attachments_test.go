package integration

import (
	"context"
	"crypto/md5"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
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

// Large attachments (issue 27): an attachment's bytes flow from the
// source's GET to the target's multipart PUT through a fixed buffer, so a
// node's peak memory does not grow with the attachment's size.

const (
	largeAttachment = 100 << 20
	// maxAttachmentGrowth bounds how much more a node's peak RSS may grow
	// for a 100 MiB attachment than for a 1 KiB one: buffers, not the body
	// (held whole, it would be 100 MiB at least, twice that as base64).
	maxAttachmentGrowth = 48 << 20
)

// attachmentStream is size bytes of incompressible data, the same for the
// same seed, generated as it is read.
func attachmentStream(seed uint64, size int64) io.Reader {
	return io.LimitReader(rand.NewChaCha8(seedBytes(seed)), size)
}

func seedBytes(seed uint64) [32]byte {
	var s [32]byte
	for i := range 8 {
		s[i] = byte(seed >> (8 * i))
	}
	return s
}

// putLargeAttachment creates doc id (revision 1-a) in db with one
// attachment "data.bin" of size bytes from attachmentStream(seed, size),
// and returns its md5 digest in CouchDB's "md5-<base64>" form. It is
// written as a replicator writes (multipart PUT, new_edits=false, the
// digest given), which PouchDB Server stores without hashing the bytes
// again: a plain attachment PUT of 100 MiB takes it 30 s.
func putLargeAttachment(t testing.TB, db, id string, seed uint64, size int64) string {
	t.Helper()
	sum := md5.New()
	if _, err := io.Copy(sum, attachmentStream(seed, size)); err != nil {
		t.Fatal(err)
	}
	digest := "md5-" + base64.StdEncoding.EncodeToString(sum.Sum(nil))
	doc := fmt.Sprintf(`{"_id":%q,"_rev":"1-a","_revisions":{"start":1,"ids":["a"]},"_attachments":{"data.bin":`+
		`{"content_type":"application/octet-stream","revpos":1,"digest":%q,"length":%d,"follows":true}}}`, id, digest, size)
	const boundary = "large-attachment-boundary"
	head := "--" + boundary + "\r\nContent-Type: application/json\r\n\r\n" + doc +
		"\r\n--" + boundary + "\r\nContent-Disposition: attachment; filename=\"data.bin\"\r\n" +
		"Content-Type: application/octet-stream\r\nContent-Length: " + strconv.FormatInt(size, 10) + "\r\n\r\n"
	tail := "\r\n--" + boundary + "--"
	body := io.MultiReader(strings.NewReader(head), attachmentStream(seed, size), strings.NewReader(tail))
	req, err := http.NewRequest(http.MethodPut, db+id+"?new_edits=false", body)
	if err != nil {
		t.Fatal(err)
	}
	req.ContentLength = int64(len(head)+len(tail)) + size
	req.Header.Set("Content-Type", `multipart/related; boundary="`+boundary+`"`)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("PUT %s: %v", id, err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		t.Fatalf("PUT %s: %d %s", id, resp.StatusCode, b)
	}
	return digest
}

// attachmentDigest streams db/id/data.bin and returns its length and md5
// digest; it also checks the stub's digest and length say the same.
func attachmentDigest(t testing.TB, db, id string) (int64, string) {
	t.Helper()
	resp, err := http.Get(db + id + "/data.bin")
	if err != nil {
		t.Fatalf("GET %s/data.bin: %v", id, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s%s/data.bin: %d", db, id, resp.StatusCode)
	}
	sum := md5.New()
	n, err := io.Copy(sum, resp.Body)
	if err != nil {
		t.Fatalf("GET %s/data.bin: %v", id, err)
	}
	digest := "md5-" + base64.StdEncoding.EncodeToString(sum.Sum(nil))
	var doc struct {
		Atts map[string]struct {
			Digest string `json:"digest"`
			Length int64  `json:"length"`
		} `json:"_attachments"`
	}
	r, err := http.Get(db + id)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Body.Close()
	if err := json.NewDecoder(r.Body).Decode(&doc); err != nil {
		t.Fatalf("GET %s: %v", id, err)
	}
	if a := doc.Atts["data.bin"]; a.Digest != digest || a.Length != n {
		t.Errorf("%s%s: stub says %d bytes %s, the bytes are %d %s", db, id, a.Length, a.Digest, n, digest)
	}
	return n, digest
}

// maxRSS is a finished child's peak resident set (ru_maxrss) in bytes.
func maxRSS(t testing.TB, ps *os.ProcessState) int64 {
	t.Helper()
	ru, ok := ps.SysUsage().(*syscall.Rusage)
	if !ok {
		t.Fatalf("no rusage for the child process")
	}
	return ru.Maxrss << 10
}

// vmHWM is a running process's peak resident set (VmHWM) in bytes.
func vmHWM(t *testing.T, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				t.Fatalf("VmHWM %q: %v", v, err)
			}
			return kb << 10
		}
	}
	t.Fatalf("no VmHWM in /proc/%d/status", pid)
	return 0
}

// replicateOnce runs `couchrepd replicate SOURCE TARGET` and returns its
// result body, peak RSS and wall time.
func replicateOnce(t testing.TB, src, tgt string) (map[string]any, int64, time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(binDir, "couchrepd"), "replicate", "--quiet", src, tgt)
	var stdout, stderr syncBuffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	start := time.Now()
	if err := cmd.Run(); err != nil {
		t.Fatalf("couchrepd replicate: %v\n%s", err, stderr.String())
	}
	wall := time.Since(start)
	var res map[string]any
	if err := json.Unmarshal([]byte(stdout.String()), &res); err != nil || res["ok"] != true {
		t.Fatalf("couchrepd replicate result %q (%v)\n%s", stdout.String(), err, stderr.String())
	}
	return res, maxRSS(t, cmd.ProcessState), wall
}

// docsWritten is docs_written of a one-shot replication's result body.
func docsWritten(res map[string]any) float64 {
	hist, _ := res["history"].([]any)
	if len(hist) == 0 {
		return -1
	}
	n, _ := hist[0].(map[string]any)["docs_written"].(float64)
	return n
}

func TestLargeAttachmentStreams(t *testing.T) {
	skipShort(t)
	s := testserver.StartPouchDB(t)
	small := s.CreateDB(t, "small-src")
	smallDigest := putLargeAttachment(t, small, "doc", 1, 1<<10)
	large := s.CreateDB(t, "large-src")
	largeDigest := putLargeAttachment(t, large, "doc", 2, largeAttachment)

	check := func(t *testing.T, tgt string, size int64, digest string) {
		t.Helper()
		n, got := attachmentDigest(t, tgt, "doc")
		if n != size || got != digest {
			t.Fatalf("target attachment: %d bytes %s; want %d %s", n, got, size, digest)
		}
	}
	t.Run("couchrepd replicate", func(t *testing.T) {
		_, base, _ := replicateOnce(t, small, s.CreateDB(t, "small-cli"))
		tgt := s.CreateDB(t, "large-cli")
		res, peak, _ := replicateOnce(t, large, tgt)
		check(t, tgt, largeAttachment, largeDigest)
		if docsWritten(res) != 1 {
			t.Errorf("result %v: want docs_written 1", res)
		}
		t.Logf("peak RSS: %d MiB with a 1 KiB attachment, %d MiB with %d MiB", base>>20, peak>>20, largeAttachment>>20)
		if peak-base > maxAttachmentGrowth {
			t.Errorf("peak RSS grew by %d MiB for a %d MiB attachment (limit %d MiB)", (peak-base)>>20, largeAttachment>>20, maxAttachmentGrowth>>20)
		}
	})
	t.Run("POST /_replicate", func(t *testing.T) {
		n := startNode(t, nodeOptions{})
		addr := n.httpAddr("")
		post := func(src, tgt string) {
			t.Helper()
			r := api(t, addr, "POST", "/_replicate", fmt.Sprintf(`{"source":%q,"target":%q}`, src, tgt))
			if r.status != http.StatusOK || r.obj(t)["ok"] != true {
				t.Fatalf("POST /_replicate: %d %s", r.status, r.body)
			}
		}
		smallTgt := s.CreateDB(t, "small-node")
		post(small, smallTgt)
		check(t, smallTgt, 1<<10, smallDigest)
		base := vmHWM(t, n.cmd.Process.Pid)
		tgt := s.CreateDB(t, "large-node")
		post(large, tgt)
		check(t, tgt, largeAttachment, largeDigest)
		peak := vmHWM(t, n.cmd.Process.Pid)
		t.Logf("node VmHWM: %d MiB after a 1 KiB attachment, %d MiB after %d MiB", base>>20, peak>>20, largeAttachment>>20)
		if peak-base > maxAttachmentGrowth {
			t.Errorf("node VmHWM grew by %d MiB for a %d MiB attachment (limit %d MiB)", (peak-base)>>20, largeAttachment>>20, maxAttachmentGrowth>>20)
		}
	})
	t.Run("_replicator document", func(t *testing.T) {
		plainReplicatorDB(t, s, true)
		cfg := filepath.Join(t.TempDir(), "couchrep.ini")
		if err := os.WriteFile(cfg, []byte("[couchrep]\nwatch = "+strings.TrimSuffix(s.URL, "/")+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		n := startNode(t, nodeOptions{config: cfg})
		rdb := s.DBURL("_replicator")
		completed := func(id string) func() bool {
			return func() bool { return docField(t, s, "_replicator", id, "_replication_state") == "completed" }
		}
		s.Do(t, "PUT", rdb+"small", map[string]any{"source": small, "target": s.DBURL("small-doc"), "create_target": true}, 201)
		waitUntil(t, "the small document's replication completed", 2*time.Minute, completed("small"))
		base := vmHWM(t, n.cmd.Process.Pid)
		s.Do(t, "PUT", rdb+"large", map[string]any{"source": large, "target": s.DBURL("large-doc"), "create_target": true}, 201)
		waitUntil(t, "the large document's replication completed", 2*time.Minute, completed("large"))
		check(t, s.DBURL("large-doc"), largeAttachment, largeDigest)
		peak := vmHWM(t, n.cmd.Process.Pid)
		t.Logf("node VmHWM: %d MiB after a 1 KiB attachment, %d MiB after %d MiB", base>>20, peak>>20, largeAttachment>>20)
		if peak-base > maxAttachmentGrowth {
			t.Errorf("node VmHWM grew by %d MiB for a %d MiB attachment (limit %d MiB)", (peak-base)>>20, largeAttachment>>20, maxAttachmentGrowth>>20)
		}
	})
}

// TestTargetRequestSizeLimit replicates into a target that refuses request
// bodies over 1 MiB (nginx's client_max_body_size in front of PouchDB
// Server, as a CouchDB with a small max_http_request_size answers: 413):
// batches are split, and each document too large for the target fails
// alone, counted in doc_write_failures, as CouchDB's replicator does
// (couch_replicator_small_max_request_size_target); the rest arrive.
func TestTargetRequestSizeLimit(t *testing.T) {
	skipShort(t)
	s := testserver.StartPouchDB(t)
	ngx := testserver.StartNginx(t, testserver.NewPKI(t), s.URL)
	src := s.CreateDB(t, "src")
	var docs []map[string]any
	for i := range 40 {
		docs = append(docs, map[string]any{"_id": fmt.Sprintf("small-%02d", i), "pad": strings.Repeat("s", 40<<10)})
	}
	docs = append(docs, map[string]any{"_id": "big-json", "pad": strings.Repeat("j", testserver.SmallBodyLimit+1)})
	s.PutDocs(t, src, docs...)
	fits := putLargeAttachment(t, src, "att-fits", 3, testserver.SmallBodyLimit*3/4) // read whole, then PUT
	putLargeAttachment(t, src, "att-too-big", 4, 2*testserver.SmallBodyLimit)        // streamed, refused
	putLargeAttachment(t, src, "att-much-too-big", 5, 64*testserver.SmallBodyLimit)  // streamed, refused
	// "tgt/", prefixed on an external server (make test-couchdb).
	tgtPath := strings.TrimPrefix(s.CreateDB(t, "tgt"), s.URL)
	ngxURL := ngx.SmallBodyURL
	if u, _ := url.Parse(s.URL); u.User != nil {
		ngxURL = strings.Replace(ngxURL, "http://", "http://"+u.User.String()+"@", 1)
	}
	res, _, _ := replicateOnce(t, src, ngxURL+tgtPath)

	hist, _ := res["history"].([]any)
	if len(hist) == 0 {
		t.Fatalf("result without history: %v", res)
	}
	h := hist[0].(map[string]any)
	if h["docs_written"] != float64(41) || h["doc_write_failures"] != float64(3) {
		t.Errorf("docs_written %v, doc_write_failures %v; want 41 and 3", h["docs_written"], h["doc_write_failures"])
	}
	tgt := s.DBURL("tgt")
	for _, id := range []string{"big-json", "att-too-big", "att-much-too-big"} {
		if _, status, _ := doRaw(http.MethodGet, tgt+id, nil); status != http.StatusNotFound {
			t.Errorf("%s on the target: status %d, want 404", id, status)
		}
	}
	var info struct {
		DocCount int `json:"doc_count"`
	}
	s.GetJSON(t, tgt, &info)
	if info.DocCount != 41 {
		t.Errorf("target has %d documents, want 41", info.DocCount)
	}
	if n, digest := attachmentDigest(t, tgt, "att-fits"); n != testserver.SmallBodyLimit*3/4 || digest != fits {
		t.Errorf("att-fits on the target: %d bytes %s, want %d %s", n, digest, testserver.SmallBodyLimit*3/4, fits)
	}
	if !strings.Contains(ngx.Access(), `"PUT /`+tgtPath+`att-much-too-big?new_edits=false HTTP/1.1" 413`) {
		t.Errorf("nginx did not refuse att-much-too-big's PUT with 413:\n%s", ngx.Access())
	}
}
