package httpapi_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"testing"

	"github.com/couchrep/couchrep/internal/httpapi"
	"github.com/couchrep/couchrep/internal/jobqueue"
	"github.com/couchrep/couchrep/internal/kv"
	"github.com/couchrep/couchrep/internal/kv/sqlite"
	"github.com/couchrep/couchrep/internal/repjob"
	"github.com/couchrep/couchrep/internal/schedpolicy"
)

// pagingStore is a SQLite job store holding n continuous jobs of
// _replicator documents (one in ten with a named filter: its replication id
// is unknown until it runs), added 500 per transaction.
func pagingStore(tb testing.TB, n int) (*repjob.Store, kv.Database) {
	tb.Helper()
	ctx := context.Background()
	db, err := sqlite.Open(ctx, filepath.Join(tb.TempDir(), "store.db"), sqlite.Options{})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { db.Close() })
	q := jobqueue.New(db, jobqueue.Options{NodeName: "n1"})
	st := repjob.New(q, db, repjob.Options{ServerUUID: uuid, Policy: schedpolicy.DefaultPolicy()})
	if err := st.Init(ctx); err != nil {
		tb.Fatal(err)
	}
	for i := 0; i < n; i += 500 {
		err := db.Transact(ctx, func(tx kv.Tx) error {
			for j := i; j < min(i+500, n); j++ {
				body := fmt.Sprintf(`{"source":"http://127.0.0.1:1/s%d","target":"http://127.0.0.1:1/t","continuous":true}`, j)
				if j%10 == 3 {
					body = fmt.Sprintf(`{"source":"http://127.0.0.1:1/s%d","target":"http://127.0.0.1:1/t","continuous":true,"filter":"d/f"}`, j)
				}
				doc := repjob.PersistentDoc{Server: "http://127.0.0.1:1/", DB: "_replicator", DocID: fmt.Sprintf("doc%06d", j), Body: []byte(body)}
				if _, err := st.AddPersistentTx(tx, doc); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			tb.Fatal(err)
		}
	}
	return st, db
}

// BenchmarkSchedulerPage measures GET /_scheduler/jobs?limit=100 and
// GET /_scheduler/docs?limit=100 against a store of 1,000, 5,000 and
// 10,000 jobs, and repjob's page of 100 in job id order (what couchrepctl
// jobs --limit 100 reads).
func BenchmarkSchedulerPage(b *testing.B) {
	for _, n := range []int{1000, 5000, 10000} {
		st, _ := pagingStore(b, n)
		srv := httptest.NewServer(httpapi.New(httpapi.Options{Store: httpapi.NewRepjobStore(st, uuid)}))
		for _, path := range []string{"/_scheduler/jobs?limit=100", "/_scheduler/docs?limit=100"} {
			b.Run(fmt.Sprintf("%s/%d", path[1:16], n), func(b *testing.B) {
				for range b.N {
					resp, err := http.Get(srv.URL + path)
					if err != nil {
						b.Fatal(err)
					}
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if resp.StatusCode != 200 {
						b.Fatalf("%s: %d", path, resp.StatusCode)
					}
				}
			})
		}
		b.Run(fmt.Sprintf("repjob.Jobs/%d", n), func(b *testing.B) {
			for range b.N {
				p, err := st.Jobs(context.Background(), 0, 100)
				if err != nil || len(p.Jobs) != 100 || p.Total != n {
					b.Fatalf("page of %d of %d: %v", len(p.Jobs), p.Total, err)
				}
			}
		})
		srv.Close()
	}
}
