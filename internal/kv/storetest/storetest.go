// Package storetest runs a package's tests on every job-store backend, from
// one list: the embedded SQLite file and PostgreSQL (one throw-away server
// per test binary, a fresh database per test; not in -short, as it starts
// a server). A test body wrapped in Each runs once per backend, as a
// subtest named after it, and opens its store with Open:
//
//	func TestLifecycle(t *testing.T) {
//		storetest.Each(t, func(t *testing.T) {
//			db := storetest.Open(t)
//			...
//		})
//	}
//
// A package using it calls Stop from its TestMain after m.Run.
package storetest

import (
	"context"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/couchrep/couchrep/internal/kv"
	"github.com/couchrep/couchrep/internal/kv/postgres"
	"github.com/couchrep/couchrep/internal/kv/postgres/pgtest"
	"github.com/couchrep/couchrep/internal/kv/sqlite"
)

// Backend is one store the suites run on.
type Backend struct {
	// Name names the subtests ("sqlite", "postgres").
	Name string
	// Short: the backend also runs under -short.
	Short bool
	// Open opens a fresh, empty store, closed when the test ends.
	Open func(t testing.TB) kv.Database
}

// Backends is the list every suite runs on.
var Backends = []Backend{
	{Name: "sqlite", Short: true, Open: OpenSQLite},
	{Name: "postgres", Open: OpenPostgres},
}

// Each runs fn as one subtest per backend.
func Each(t *testing.T, fn func(t *testing.T)) {
	t.Helper()
	for _, b := range Backends {
		t.Run(b.Name, func(t *testing.T) {
			if testing.Short() && !b.Short {
				t.Skipf("the %s backend runs without -short (it starts a server)", b.Name)
			}
			fn(t)
		})
	}
}

// Open opens a fresh store of the backend that Each runs t (or the test
// t is a subtest of) under; outside Each, the embedded SQLite store.
func Open(t testing.TB) kv.Database {
	t.Helper()
	parts := strings.Split(t.Name(), "/")
	for _, b := range Backends {
		if slices.Contains(parts[1:], b.Name) {
			return b.Open(t)
		}
	}
	return OpenSQLite(t)
}

// OpenSQLite opens a fresh embedded store in t's temporary directory.
func OpenSQLite(t testing.TB) kv.Database {
	t.Helper()
	db, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "store.db"), sqlite.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// OpenPostgres opens a store on a fresh database of the test binary's
// shared PostgreSQL server.
func OpenPostgres(t testing.TB) kv.Database {
	t.Helper()
	dsn := pgtest.Shared(t).NewDatabase(t)
	db, err := postgres.Open(context.Background(), dsn, postgres.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// Stop stops the shared PostgreSQL server, if one was started.
func Stop() { pgtest.StopShared() }
