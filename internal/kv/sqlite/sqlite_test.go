package sqlite

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"go.uber.org/goleak"

	"github.com/couchrep/couchrep/internal/kv"
	"github.com/couchrep/couchrep/internal/kv/kvtest"
)

func TestMain(m *testing.M) {
	if kvtest.IsChild() {
		os.Exit(kvtest.RunChildRoles(openShared, childRoles))
	}
	goleak.VerifyTestMain(m)
}

func openShared(ctx context.Context, path string) (kv.Database, error) {
	return Open(ctx, path, Options{})
}

func openTemp(t testing.TB, opts Options) (*DB, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "store.db")
	db, err := Open(context.Background(), path, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := db.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	return db, path
}

func TestConformance(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts Options
	}{
		{"normal", Options{}},
		{"full", Options{Durability: kv.DurabilityFull}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if testing.Short() && tc.opts.Durability == kv.DurabilityFull {
				t.Skip("FULL durability conformance runs without -short")
			}
			kvtest.Run(t, func(t *testing.T) kv.Database {
				db, _ := openTemp(t, tc.opts)
				return db
			})
		})
	}
}

func TestConformanceMultiProcess(t *testing.T) {
	db, path := openTemp(t, Options{})
	kvtest.RunMultiProcess(t, db, path)
}

func errorsIs(err, target error) bool { return errors.Is(err, target) }
