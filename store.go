package couchrep

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/rs/zerolog"

	"github.com/couchrep/couchrep/internal/config"
	"github.com/couchrep/couchrep/internal/kv"
	"github.com/couchrep/couchrep/internal/kv/postgres"
	"github.com/couchrep/couchrep/internal/kv/sqlite"
)

// Store is an open job store: the shared state of every node that uses it
// (jobs, fair-share accounts, checkpoints of the queue). Open one with
// OpenStore and hand it to Start with WithStore; close it after the nodes
// using it stopped.
type Store struct {
	db kv.Database
}

// OpenStore opens (creating if needed) the job store at location: the path
// of the embedded SQLite file that node processes on one machine may share,
// a "postgres://user:password@host:5432/db?..." URL for a PostgreSQL
// database that nodes on several machines share (the schema is created on
// first use), or "fdb:<cluster file>" ("fdb:" alone for FoundationDB's
// default cluster file) for a FoundationDB cluster, in a build with -tags
// fdb. Durability is "normal": commits survive a process crash.
func OpenStore(ctx context.Context, location string) (*Store, error) {
	db, err := openStore(ctx, location, kv.DurabilityNormal, zerolog.Nop())
	if err != nil {
		return nil, err
	}
	return &Store{db: db}, nil
}

// ErrNoFDB is returned for an "fdb:" store by a build without FoundationDB
// support.
var ErrNoFDB = errors.New("couchrep: this build has no FoundationDB support (build with -tags fdb and the FoundationDB client installed)")

// openFDB opens a FoundationDB store; builds with -tags fdb set it
// (store_fdb.go).
var openFDB func(ctx context.Context, clusterFile string, log zerolog.Logger) (kv.Database, error)

// FDBSupported reports whether this build can open FoundationDB stores.
func FDBSupported() bool { return openFDB != nil }

// FDBPrefix marks a store location as a FoundationDB cluster file.
const FDBPrefix = "fdb:"

func openStore(ctx context.Context, location string, d kv.Durability, log zerolog.Logger) (kv.Database, error) {
	if clusterFile, ok := strings.CutPrefix(location, FDBPrefix); ok {
		if openFDB == nil {
			return nil, ErrNoFDB
		}
		db, err := openFDB(ctx, clusterFile, log)
		if err != nil {
			return nil, fmt.Errorf("couchrep: open FoundationDB job store %q: %w", clusterFile, err)
		}
		return db, nil
	}
	if postgres.IsDSN(location) {
		db, err := postgres.Open(ctx, location, postgres.Options{Durability: d, Logger: log})
		if err != nil {
			// The error names the server and database, never the password.
			return nil, fmt.Errorf("couchrep: open PostgreSQL job store: %w", err)
		}
		return db, nil
	}
	db, err := sqlite.Open(ctx, location, sqlite.Options{Durability: d, Logger: log})
	if err != nil {
		return nil, fmt.Errorf("couchrep: open job store %s: %w", location, err)
	}
	return db, nil
}

// Close closes the store.
func (s *Store) Close() error { return s.db.Close() }

func durability(cfg Config) kv.Durability {
	if cfg.Couchrep.Durability == config.DurabilityFull {
		return kv.DurabilityFull
	}
	return kv.DurabilityNormal
}
