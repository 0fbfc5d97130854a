package jobqueue

import (
	"context"
	"os"
	"testing"

	"github.com/couchrep/couchrep/internal/kv"
	"github.com/couchrep/couchrep/internal/kv/sqlite"
	"github.com/couchrep/couchrep/internal/kv/storetest"
)

// openTestDB opens the store the unit tests run on: a fresh one of the
// backend storetest.Each runs the test under (SQLite, PostgreSQL), or the
// in-memory one with JOBS_TEST_BACKEND=mem.
func openTestDB(t *testing.T) kv.Database {
	t.Helper()
	if os.Getenv("JOBS_TEST_BACKEND") == "mem" {
		db := newMemDB()
		t.Cleanup(func() { _ = db.Close() })
		return db
	}
	return storetest.Open(t)
}

func openSQLite(tb testing.TB, path string, opts sqlite.Options) *sqlite.DB {
	tb.Helper()
	db, err := sqlite.Open(context.Background(), path, opts)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = db.Close() })
	return db
}
