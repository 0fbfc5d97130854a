package kvtest

// Atomic operations: Add commits without read conflicts.

import (
	"testing"

	"github.com/couchrep/couchrep/internal/kv"
)

func testAddNoConflict(t *testing.T, db kv.Database) {
	s := newSpace(t)
	key := k(s, "n")
	attempts := 0
	err := db.Transact(testCtx(t), func(tx kv.Tx) error {
		attempts++
		tx.Add(key, 5)
		if attempts == 1 {
			if err := db.Transact(testCtx(t), func(tx2 kv.Tx) error { tx2.Add(key, 3); return nil }); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if attempts != 1 {
		t.Fatalf("atomic Add conflicted: %d attempts", attempts)
	}
	if got := kv.Int64LE(get(t, db, key)); got != 8 {
		t.Fatalf("counter = %d, want 8", got)
	}
	if err := db.Transact(testCtx(t), func(tx kv.Tx) error { tx.Add(key, -10); return nil }); err != nil {
		t.Fatal(err)
	}
	if got := kv.Int64LE(get(t, db, key)); got != -2 {
		t.Fatalf("counter = %d, want -2", got)
	}
}
