package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/couchrep/couchrep/internal/testserver"
)

// BenchmarkLargeAttachments replicates documents with large attachments
// (incompressible, generated) from one in-memory PouchDB Server 4.2.0 into
// a fresh database on a second one, with `couchrepd replicate` (a child
// process: its wall time and peak RSS, ru_maxrss) and with PouchDB's own
// replicator (npm pouchdb 9.0.0 in node, integration/bench/replicate.js).
// Cases: one 100 MiB attachment; ten documents of one 100 MiB attachment
// each, in one batch; one 1 GiB attachment. Every copy is checked byte for
// byte (md5 of a streamed read of the target).
//
// Metrics: couchrep-s and couchrep-MB/s; couchrep-rss-growth-MB, the peak
// RSS above that of the same command replicating one 1 KiB attachment;
// pouchdb-s and pouchdb-peak-RSS-MB (node's whole process).
//
//	go test -run '^$' -bench LargeAttachments -benchtime 1x -timeout 60m ./integration/
func BenchmarkLargeAttachments(b *testing.B) {
	script := pouchScript(b)
	cases := []struct {
		name string
		docs int
		size int64
	}{
		{"1x100MiB", 1, 100 << 20},
		{"10x100MiB", 10, 100 << 20},
		{"1x1GiB", 1, 1 << 30},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			s1, s2 := testserver.StartPouchDB(b), testserver.StartPouchDB(b)
			small := s1.CreateDB(b, "small")
			putLargeAttachment(b, small, "doc", 1, 1<<10)
			src := s1.CreateDB(b, "src")
			digests := make([]string, c.docs)
			for i := range digests {
				digests[i] = putLargeAttachment(b, src, fmt.Sprintf("doc%02d", i), uint64(100+i), c.size)
			}
			check := func(tgt string) {
				b.Helper()
				for i, want := range digests {
					n, got := attachmentDigest(b, tgt, fmt.Sprintf("doc%02d", i))
					if n != c.size || got != want {
						b.Fatalf("doc%02d on the target: %d bytes %s, want %d %s", i, n, got, c.size, want)
					}
				}
			}
			_, base, _ := replicateOnce(b, small, s2.CreateDB(b, "small"))
			var wall, pouchWall time.Duration
			var growth, pouchRSS int64
			var pouchErr error // PouchDB's replicator fails some cases
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				tgt := s2.CreateDB(b, fmt.Sprintf("couchrep%d", i))
				res, peak, took := replicateOnce(b, src, tgt)
				b.StopTimer()
				if docsWritten(res) != float64(c.docs) {
					b.Fatalf("result %v: want docs_written %d", res, c.docs)
				}
				check(tgt)
				s2.Do(b, "DELETE", tgt, nil, 200)
				wall += took
				growth = max(growth, peak-base)

				ptgt := s2.CreateDB(b, fmt.Sprintf("pouchdb%d", i))
				ms, rss, err := runPouchDBRSS(script, src, ptgt)
				if err != nil {
					pouchErr = err
				} else {
					check(ptgt)
					pouchWall += time.Duration(ms * float64(time.Millisecond))
				}
				pouchRSS = max(pouchRSS, rss)
				s2.Do(b, "DELETE", ptgt, nil, 200)
				b.StartTimer()
			}
			b.StopTimer()
			total := float64(c.docs) * float64(c.size) * float64(b.N)
			b.ReportMetric(wall.Seconds()/float64(b.N), "couchrep-s")
			b.ReportMetric(total/(1<<20)/wall.Seconds(), "couchrep-MB/s")
			b.ReportMetric(float64(growth)/(1<<20), "couchrep-rss-growth-MB")
			b.ReportMetric(float64(pouchRSS)/(1<<20), "pouchdb-peak-RSS-MB")
			pouch := fmt.Sprintf("PouchDB %.1f s", pouchWall.Seconds()/float64(b.N))
			if pouchErr != nil {
				pouch = fmt.Sprintf("PouchDB failed: %.120s", pouchErr)
			} else {
				b.ReportMetric(pouchWall.Seconds()/float64(b.N), "pouchdb-s")
			}
			b.Logf("%s: couchrep %.1f s (peak RSS %d MiB, %d MiB above a 1 KiB run), %s (node peak RSS %d MiB); load %s",
				c.name, wall.Seconds()/float64(b.N), (base+growth)>>20, growth>>20, pouch, pouchRSS>>20, loadAvg())
		})
	}
}

// runPouchDBRSS runs PouchDB's replicator (replicate.js) and returns the
// replicate call's wall time in ms and node's peak RSS (also when it
// failed).
func runPouchDBRSS(script, src, tgt string) (float64, int64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", script, src, tgt)
	var stdout, stderr syncBuffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var rss int64
	if ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
		rss = ru.Maxrss << 10
	}
	if err != nil {
		return 0, rss, fmt.Errorf("node replicate.js: %w: %s", err, strings.TrimSpace(stderr.String()))
	}
	var r pouchRun
	if err := json.Unmarshal([]byte(strings.TrimSpace(stdout.String())), &r); err != nil {
		return 0, rss, fmt.Errorf("replicate.js output %q: %w", stdout.String(), err)
	}
	return r.MS, rss, nil
}
