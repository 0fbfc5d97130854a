package sqlite

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/couchrep/couchrep/internal/kv"
)

var _ kv.Checker = (*DB)(nil)

func TestCheckNoticesAnOverwrittenFile(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "store.db")
	db, err := Open(ctx, path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := db.Transact(ctx, func(tx kv.Tx) error { tx.Set([]byte("k"), []byte("v")); return nil }); err != nil {
		t.Fatal(err)
	}
	if err := db.Check(ctx); err != nil {
		t.Fatalf("healthy store: %v", err)
	}
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, bytes.Repeat([]byte{0x5a}, int(st.Size())), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := db.Check(ctx); !errors.Is(err, ErrNotStore) {
		t.Fatalf("overwritten store: Check = %v, want ErrNotStore", err)
	}
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if err := db.Check(ctx); err == nil {
		t.Fatal("removed store: Check = nil")
	}
}
