package integration

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/couchrep/couchrep/internal/replicate"
	"github.com/couchrep/couchrep/internal/testserver"
)

// TestWANConnections proves keep-alive and connection reuse at the proxy:
// a pull whose source and target are each behind a toxiproxy link
// (10 ± 2 ms each way) sends some hundred requests through each (batches,
// attachments read and written one by one, checkpoints), and toxiproxy's
// own log must show a handful of connections per link, bounded by the
// engine's cap (its own transport: 2 × http_connections per endpoint, room
// for a worker that holds a streamed attachment GET while it waits for the
// PUT's connection, the _changes request, and batches overlapped), not by
// the number of requests. (In a node, the connection_pool lease bounds the
// requests in flight per endpoint to http_connections.)
func TestWANConnections(t *testing.T) {
	if testing.Short() {
		t.Skip("starts PouchDB Server and toxiproxy")
	}
	s := testserver.StartPouchDB(t)
	tp := testserver.StartToxiproxy(t)
	const (
		docs    = 600
		batch   = 20
		workers = 4
		conns   = 4
	)
	srcLink := tp.Link(t, "conns-src", s.URL)
	tgtLink := tp.Link(t, "conns-tgt", s.URL)
	for _, l := range []*testserver.Link{srcLink, tgtLink} {
		l.Latency(t, 10*time.Millisecond, 2*time.Millisecond)
	}
	src := s.CreateDB(t, "csrc")
	tgt := s.CreateDB(t, "ctgt")
	fillWAN(t, s, src, tgt) // conflicts, deletions, a design doc, 200 KiB attachments (GET, multipart PUT)
	var all []map[string]any
	for i := range docs {
		all = append(all, testserver.Doc(fmt.Sprintf("c-%04d", i), []string{"1-c"}, map[string]any{"i": i, "s": strings.Repeat("x", 1000)}))
	}
	s.PutRevs(t, src, all...)
	p := params(t, map[string]any{
		"source": srcLink.URL + "csrc/", "target": tgtLink.URL + "ctgt/",
		"worker_batch_size": batch, "worker_processes": workers, "http_connections": conns,
	})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	logs := &logLines{}
	res, err := replicate.New(p, replicate.Options{ServerUUID: "conns-uuid", Logger: zerolog.New(logs)}).Run(ctx)
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	if res.Stats.DocWriteFailures != 0 || res.Stats.DocsWritten < docs {
		t.Fatalf("stats %+v, want %d documents written, no failure", res.Stats, docs)
	}
	verify(t, s, s, src, tgt, nil)
	// At least one _bulk_get per batch on the source, a _revs_diff and a
	// _bulk_docs per batch on the target.
	batches := docs / batch
	for _, c := range []struct {
		l        *testserver.Link
		requests int
	}{{srcLink, batches}, {tgtLink, 2 * batches}} {
		n := c.l.Connections()
		t.Logf("%s: %d connections accepted (toxiproxy's log) for at least %d requests; warnings: %s", c.l.Name, n, c.requests, logs.warnings())
		if n == 0 || n > 2*conns || n*4 > c.requests {
			t.Errorf("%s: toxiproxy accepted %d connections for at least %d requests; want 1..%d (2 × http_connections %d) and a quarter of the requests at most", c.l.Name, n, c.requests, 2*conns, conns)
		}
	}
}
