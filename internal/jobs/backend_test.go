package jobs

import (
	"testing"

	"github.com/couchrep/couchrep/internal/kv"
)

// openTestDB opens the store the unit tests run on.
func openTestDB(t *testing.T) kv.Database {
	t.Helper()
	db := newMemDB()
	t.Cleanup(func() { _ = db.Close() })
	return db
}

func isHelperProcess() bool { return false }
func helperMain()           {}
