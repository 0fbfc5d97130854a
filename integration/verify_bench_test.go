package integration

import (
	"crypto/md5"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/couchrep/couchrep/internal/testserver"
)

// BenchmarkVerify verifies a clean copy of COUCHREP_VERIFY_BENCH_DOCS
// documents (default 100,000; both databases written with the same
// revisions) with `couchrepd verify`, and reads the source's
// _changes?style=all_docs once beside it: the goal is a verify within
// 1.5x of that read, in bounded memory (the verify process's peak RSS).
// Against two PouchDB Servers, or the CouchDB of COUCHREP_TEST_COUCH_URL.
// Run it under `flock /work/bigrun.lock`.
func BenchmarkVerify(b *testing.B) {
	n := 100_000
	if v, err := strconv.Atoi(os.Getenv("COUCHREP_VERIFY_BENCH_DOCS")); err == nil && v > 0 {
		n = v
	}
	// Source and target on two servers, as a copy usually is: one PouchDB
	// Server process is single-threaded, and would serve the verify's
	// _revs_diff to the target between the source's _changes pages.
	s, t := testserver.StartPouchDB(b), testserver.StartPouchDB(b)
	src, tgt := s.CreateDB(b, "vbsrc"), t.CreateDB(b, "vbtgt")
	seedStart := time.Now()
	const chunk = 5000
	for i := 0; i < n; i += chunk {
		docs := make([]map[string]any, 0, chunk)
		for j := i; j < min(i+chunk, n); j++ {
			id := fmt.Sprintf("doc%08d", j)
			h := md5.Sum([]byte(id))
			docs = append(docs, testserver.Doc(id, []string{"1-" + hex.EncodeToString(h[:])}, map[string]any{"n": j, "name": "document " + id}))
		}
		s.PutRevs(b, src, docs...)
		t.PutRevs(b, tgt, docs...)
	}
	b.Logf("seeded %d documents into both databases in %s", n, time.Since(seedStart).Round(time.Second))

	readChanges := func(query string) time.Duration {
		start := time.Now()
		resp, err := http.Get(src + "_changes?" + query)
		if err != nil {
			b.Fatal(err)
		}
		nb, err := io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != 200 {
			b.Fatalf("_changes: %d %v", resp.StatusCode, err)
		}
		d := time.Since(start)
		b.Logf("GET _changes?%s: %d bytes in %s", query, nb, d.Round(time.Millisecond))
		return d
	}
	b.ResetTimer()
	for range b.N {
		changes := readChanges("style=all_docs")
		withDocs := readChanges("style=all_docs&include_docs=true")
		start := time.Now()
		r := runVerifyCmd(b, src, tgt)
		took := time.Since(start)
		if r.code != 0 || r.summary.DocsChecked != int64(n) {
			b.Fatalf("verify: exit %d, %+v\n%s", r.code, r.summary, r.stderr)
		}
		b.ReportMetric(took.Seconds(), "verify_s")
		b.ReportMetric(changes.Seconds(), "changes_s")
		b.ReportMetric(took.Seconds()/changes.Seconds(), "x_changes")
		b.ReportMetric(withDocs.Seconds(), "changes_docs_s")
		b.ReportMetric(float64(r.maxRSS)/(1<<20), "verify_MB")
		b.Logf("%d docs: verify %s (%.2fx the _changes read of %s; _changes with documents %s), peak RSS %.1f MB, load %s",
			n, took.Round(time.Millisecond), took.Seconds()/changes.Seconds(), changes.Round(time.Millisecond),
			withDocs.Round(time.Millisecond), float64(r.maxRSS)/(1<<20), loadAvg())
	}
}
