package integration

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/couchrep/couchrep/internal/replicate"
	"github.com/couchrep/couchrep/internal/testserver"
)

// textDocs returns n documents of about 1 KB of JSON: text drawn from a
// 2,000-word vocabulary (seeded), numbers, ids; it compresses about as
// well as application data does (gzip -1: ~2.4×).
func textDocs(n int, seed uint64) []map[string]any {
	rng := rand.New(rand.NewPCG(seed, 7))
	vocab := make([]string, 2000)
	for i := range vocab {
		w := make([]byte, 3+rng.IntN(8))
		for j := range w {
			w[j] = byte('a' + rng.IntN(26))
		}
		vocab[i] = string(w)
	}
	docs := make([]map[string]any, n)
	for i := range docs {
		var text strings.Builder
		for text.Len() < 800 {
			text.WriteString(vocab[rng.IntN(len(vocab))])
			text.WriteByte(' ')
		}
		docs[i] = testserver.Doc(fmt.Sprintf("t-%05d", i), []string{fmt.Sprintf("1-%x", rng.Uint64())},
			map[string]any{"n": rng.IntN(100000), "customer": fmt.Sprintf("c-%d", rng.IntN(1000)), "note": text.String()})
	}
	return docs
}

// compressedPush pushes src to a target behind link (a fresh database
// tgtName) with compress_requests on or off, and returns the run's time
// and toxiproxy's count of the bytes couchrep sent through the link.
func compressedPush(t testing.TB, s *testserver.Server, l *testserver.Link, src, tgtName string, compress bool, logs *logLines) (time.Duration, int64) {
	t.Helper()
	tgt := s.CreateDB(t, tgtName)
	before := l.Stats(t).ReceivedUp
	p := params(t, map[string]any{"source": src, "target": l.URL + tgtName + "/", "worker_batch_size": 100})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	began := time.Now()
	res, err := replicate.New(p, replicate.Options{ServerUUID: "compress-uuid", Logger: zerolog.New(logs),
		Endpoints: replicate.EndpointConfig{CompressRequests: compress}}).Run(ctx)
	took := time.Since(began)
	if err != nil {
		t.Fatalf("Run (compress_requests %v): %v", compress, err)
	}
	if res.Stats.DocWriteFailures != 0 {
		t.Fatalf("doc_write_failures %d", res.Stats.DocWriteFailures)
	}
	verify(t, s, s, src, tgt, nil)
	// toxiproxy's metrics lag the bytes: wait until they stop moving.
	up := l.Stats(t).ReceivedUp
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); {
		time.Sleep(50 * time.Millisecond) // polling toxiproxy's counters
		next := l.Stats(t).ReceivedUp
		if next == up {
			break
		}
		up = next
	}
	return took, up - before
}

// TestWANCompressedWrites pushes the same 300 documents to a PouchDB
// Server behind a toxiproxy link twice, with compress_requests off and on:
// the target takes the compressed _bulk_docs and _revs_diff bodies (no
// refusal logged, every document verified), and toxiproxy counts at most
// two thirds of the plain run's bytes towards the target.
func TestWANCompressedWrites(t *testing.T) {
	if testing.Short() {
		t.Skip("starts PouchDB Server and toxiproxy")
	}
	s := testserver.StartPouchDB(t)
	tp := testserver.StartToxiproxy(t)
	l := tp.Link(t, "compress", s.URL)
	l.Latency(t, 10*time.Millisecond, 2*time.Millisecond)
	src := s.CreateDB(t, "zsrc")
	s.PutRevs(t, src, textDocs(300, 1)...)
	logs := &logLines{}
	_, plain := compressedPush(t, s, l, src, "ztgt-plain", false, logs)
	_, gz := compressedPush(t, s, l, src, "ztgt-gzip", true, logs)
	t.Logf("bytes sent to the target (toxiproxy): plain %d, compressed %d (%.2f×)", plain, gz, float64(plain)/float64(gz))
	if logs.has("couch: the server refused a gzip-compressed request body; sending it and the next ones plain") {
		t.Fatalf("PouchDB Server refused a compressed body: %s", logs.warnings())
	}
	if plain == 0 || gz*3 > plain*2 {
		t.Fatalf("compressed run sent %d bytes, plain %d: want at most two thirds", gz, plain)
	}
}

// BenchmarkWANCompress pushes 3,000 documents of ~1 KB to a PouchDB Server
// behind a link of 50 ms RTT whose every connection is limited to
// COUCHREP_WAN_KBPS KB/s towards the server (toxiproxy's bandwidth toxic
// is per connection: a slow connection, not a link's capacity), with
// compress_requests off and on: the time, the bytes sent and the CPU time
// of the whole process.
func BenchmarkWANCompress(b *testing.B) {
	s := testserver.StartPouchDB(b)
	tp := testserver.StartToxiproxy(b)
	kbps := envInt(b, "COUCHREP_WAN_KBPS", 1000)
	l := tp.Link(b, "compress-bench", s.URL)
	l.Latency(b, 25*time.Millisecond, time.Millisecond)
	l.Bandwidth(b, testserver.Upstream, kbps)
	src := s.CreateDB(b, "zbsrc")
	s.PutRevs(b, src, textDocs(3000, 2)...)
	for _, compress := range []bool{false, true} {
		b.Run(fmt.Sprintf("compress=%v", compress), func(b *testing.B) {
			for i := 0; b.Loop(); i++ {
				cpu := cpuTime()
				took, sent := compressedPush(b, s, l, src, fmt.Sprintf("zbtgt-%v-%d", compress, i), compress, &logLines{})
				b.ReportMetric(took.Seconds(), "s/push")
				b.ReportMetric(float64(sent)/1e6, "MB-sent")
				b.ReportMetric((cpuTime() - cpu).Seconds(), "cpu-s")
			}
		})
	}
}
