package main

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"go.uber.org/goleak"

	"github.com/couchrep/couchrep/internal/testserver"
)

// TestEmbedReplicatesAndStopsClean runs the example program's run against
// two real PouchDB Servers: the in-process node replicates every document,
// reports the completion event, and stops leaving no goroutine behind.
func TestEmbedReplicatesAndStopsClean(t *testing.T) {
	if testing.Short() {
		t.Skip("starts two PouchDB Servers")
	}
	from, to := testserver.StartPouchDB(t), testserver.StartPouchDB(t)
	src, tgt := from.CreateDB(t, "embed-src"), to.CreateDB(t, "embed-tgt")
	const n = 50
	var docs []map[string]any
	for i := range n {
		docs = append(docs, map[string]any{"_id": fmt.Sprintf("doc%03d", i), "i": i})
	}
	from.PutDocs(t, src, docs...)

	// Goroutines of the test servers' helpers are not the node's.
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent(),
		// protoactor's dead-letter throttle outlives its actor system by design.
		goleak.IgnoreTopFunction("github.com/asynkron/protoactor-go/actor.NewDeadLetter.NewThrottle.func4.1"))

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var out bytes.Buffer
	if err := run(ctx, src, tgt, &out, zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.WarnLevel)); err != nil {
		t.Fatalf("run: %v\n%s", err, out.String())
	}
	want := fmt.Sprintf("job completed: docs_read %d, docs_written %d, doc_write_failures 0", n, n)
	if !strings.Contains(out.String(), want) || !strings.Contains(out.String(), "job running on node") {
		t.Fatalf("output lacks %q:\n%s", want, out.String())
	}
	var info struct {
		DocCount int `json:"doc_count"`
	}
	to.GetJSON(t, tgt, &info)
	if info.DocCount != n {
		t.Fatalf("target has %d docs, want %d", info.DocCount, n)
	}
}
