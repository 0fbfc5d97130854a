package docproc

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/couchrep/couchrep/internal/jobqueue"
	"github.com/couchrep/couchrep/internal/kv"
	"github.com/couchrep/couchrep/internal/kv/sqlite"
	"github.com/couchrep/couchrep/internal/repjob"
	"github.com/couchrep/couchrep/internal/testserver"
)

// repStore opens a store holding both the doc processor's records and a
// real replication job store, as a node has.
func repStore(tb testing.TB) (kv.Database, *repjob.Store) {
	tb.Helper()
	store, err := sqlite.Open(context.Background(), filepath.Join(tb.TempDir(), "store.db"), sqlite.Options{})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { store.Close() })
	jobs := repjob.New(jobqueue.New(store, jobqueue.Options{}), store, repjob.Options{ServerUUID: "u"})
	if err := jobs.Init(context.Background()); err != nil {
		tb.Fatal(err)
	}
	return store, jobs
}

// runProcessor runs a Processor on srv until the test ends.
func runProcessor(tb testing.TB, srv *testserver.Server, store kv.Database, jobs *repjob.Store, client *http.Client) *Processor {
	tb.Helper()
	p, err := New(Options{Servers: []string{srv.URL}, Node: "n1", Store: store, Jobs: RepJobs{Store: jobs},
		HTTPClient: client, Logger: zerolog.Nop(), PollInterval: 100 * time.Millisecond})
	if err != nil {
		tb.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	tb.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			tb.Errorf("Run: %v", err)
		}
	})
	return p
}

// bulkDocs posts docs to the database at dbURL in _bulk_docs of 500.
func bulkDocs(tb testing.TB, srv *testserver.Server, dbURL string, docs []map[string]any) {
	tb.Helper()
	for i := 0; i < len(docs); i += 500 {
		b, err := json.Marshal(map[string]any{"docs": docs[i:min(i+500, len(docs))]})
		if err != nil {
			tb.Fatal(err)
		}
		srv.Do(tb, "POST", dbURL+"_bulk_docs", b, 201)
	}
}

// TestBatchWithInvalidDocuments posts one _bulk_docs of valid and invalid
// replication documents: each valid one gets its pending job, each invalid
// one a failed job and the reason naming its field written back, and the
// invalid ones do not hold the others up.
func TestBatchWithInvalidDocuments(t *testing.T) {
	if testing.Short() {
		t.Skip("starts pouchdb-server: skipped with -short")
	}
	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()
	srv := testserver.StartPouchDB(t)
	plainReplicatorDB(t, srv, true)
	store, jobs := repStore(t)

	invalid := map[int]struct {
		doc    map[string]any
		reason string
	}{
		7:   {map[string]any{"target": "http://127.0.0.1:1/b"}, "Missing `source` field"},
		50:  {map[string]any{"source": "http://127.0.0.1:1/a"}, "Missing `target` field"},
		51:  {map[string]any{"source": "http://127.0.0.1:1/a", "target": "http://127.0.0.1:1/b", "continuous": "yes"}, "parameter `continuous` must be a boolean"},
		120: {map[string]any{"source": "http://127.0.0.1:1/a", "target": "http://127.0.0.1:1/b", "doc_ids": "r1"}, "parameter `doc_ids` must be an array"},
		199: {map[string]any{"source": 5, "target": "http://127.0.0.1:1/b"}, "`source` must be a URL string or an object with a `url`"},
	}
	const n = 200
	docs := make([]map[string]any, n)
	for i := range docs {
		doc := map[string]any{"source": fmt.Sprintf("http://127.0.0.1:1/s%d", i), "target": "http://127.0.0.1:1/t", "continuous": true}
		if bad, ok := invalid[i]; ok {
			doc = bad.doc
		}
		doc["_id"] = fmt.Sprintf("d%03d", i)
		docs[i] = doc
	}
	rdb := srv.DBURL("_replicator")
	bulkDocs(t, srv, rdb, docs)
	runProcessor(t, srv, store, jobs, client)

	key := couchKey(t, srv.URL)
	eventually(t, "every document has a job", func() bool {
		recs, err := jobs.List(context.Background(), repjob.Filter{})
		return err == nil && len(recs) == n
	})
	for i := range n {
		id := fmt.Sprintf("d%03d", i)
		rec, err := jobs.Get(context.Background(), repjob.PersistentJobID(key, "_replicator", id))
		if err != nil {
			t.Fatalf("%s: %v", id, err)
		}
		bad, isBad := invalid[i]
		switch {
		case isBad && (rec.State() != repjob.StateFailed || rec.GetLastError() != bad.reason):
			t.Errorf("%s: job %s %q, want failed %q", id, rec.State(), rec.GetLastError(), bad.reason)
		case !isBad && rec.State() != repjob.StatePending:
			t.Errorf("%s: job %s %q, want pending", id, rec.State(), rec.GetLastError())
		}
	}
	for i, bad := range invalid {
		id := fmt.Sprintf("d%03d", i)
		eventually(t, id+" failed state written", func() bool {
			return getDoc(t, srv, "_replicator", id)["_replication_state"] == repjob.StateFailed.String()
		})
		if r := getDoc(t, srv, "_replicator", id)["_replication_state_reason"]; r != bad.reason {
			t.Errorf("%s: written reason %v, want %q", id, r, bad.reason)
		}
	}
	// The valid documents were left alone (only terminal states are
	// written back).
	for _, i := range []int{0, 8, 52, 198} {
		id := fmt.Sprintf("d%03d", i)
		if doc := getDoc(t, srv, "_replicator", id); doc["_replication_state"] != nil || doc["_rev"] != nil && doc["_rev"].(string)[:2] != "1-" {
			t.Errorf("%s was written: %v", id, doc)
		}
	}
}

// BenchmarkDocSubmission measures _replicator documents turned into jobs
// per second: b.N continuous replication documents posted in _bulk_docs of
// 500 to PouchDB Server, the doc processor following the database with a
// real job store (SQLite); timed from the first post until the processor's
// checkpoint (committed with the jobs) covers every document. It also
// reports how fast the server took the writes and the processor's lag
// after the last one.
func BenchmarkDocSubmission(b *testing.B) {
	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()
	srv := testserver.StartPouchDB(b)
	srv.Do(b, "PUT", srv.URL+"_config/replicator/db", []byte(`"pouchdb_own_replicator"`), 200)
	srv.Do(b, "DELETE", srv.URL+"_replicator", nil, 200)
	srv.Do(b, "PUT", srv.URL+"_replicator", nil, 201)
	store, jobs := repStore(b)
	runProcessor(b, srv, store, jobs, client)
	st := &state{store: store, keys: newKeyspace(nil), server: couchKey(b, srv.URL), db: "_replicator"}
	rdb := srv.DBURL("_replicator")
	docs := make([]map[string]any, b.N)
	for i := range docs {
		docs[i] = map[string]any{"_id": fmt.Sprintf("d%06d", i), "source": fmt.Sprintf("http://127.0.0.1:1/s%d", i),
			"target": "http://127.0.0.1:1/t", "continuous": true}
	}
	b.ResetTimer()
	start := time.Now()
	bulkDocs(b, srv, rdb, docs)
	written := time.Since(start)
	deadline := time.Now().Add(10 * time.Minute)
	for {
		seq, err := st.loadSeq(context.Background())
		if err != nil {
			b.Fatal(err)
		}
		if n, ok := seq.Int(); ok && n >= int64(b.N) {
			break
		}
		if time.Now().After(deadline) {
			b.Fatalf("checkpoint at %v after 10 min, want %d", seq, b.N)
		}
		time.Sleep(10 * time.Millisecond)
	}
	b.StopTimer()
	took := time.Since(start)
	b.ReportMetric(float64(b.N)/took.Seconds(), "docs/s")
	b.ReportMetric(float64(b.N)/written.Seconds(), "written-docs/s")
	b.ReportMetric((took-written).Seconds()*1000, "lag-ms")
}
