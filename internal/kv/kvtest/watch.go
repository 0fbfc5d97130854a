package kvtest

// Watches: fire on a committed change, not on a rolled-back one.

import (
	"context"
	"errors"
	"testing"

	"github.com/couchrep/couchrep/internal/kv"
)

func watchKey(t *testing.T, db kv.Database, key []byte) kv.Watch {
	t.Helper()
	var w kv.Watch
	if err := db.Transact(testCtx(t), func(tx kv.Tx) error {
		w = tx.Watch(key)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return w
}

func fired(w kv.Watch) bool {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return w.Wait(ctx) == nil
}

func testWatch(t *testing.T, db kv.Database) {
	s := newSpace(t)
	key := k(s, "w")
	set(t, db, key, []byte("v1"))
	w := watchKey(t, db, key)
	set(t, db, key, []byte("v2"))
	if err := w.Wait(testCtx(t)); err != nil {
		t.Fatalf("watch after a committed change: %v", err)
	}

	// Absent key; a watch armed in a transaction that also writes the key
	// is armed with the value that transaction wrote.
	var w2 kv.Watch
	if err := db.Transact(testCtx(t), func(tx kv.Tx) error {
		tx.Set(k(s, "new"), []byte("mine"))
		w2 = tx.Watch(k(s, "new"))
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := db.Transact(testCtx(t), func(tx kv.Tx) error { tx.Clear(k(s, "new")); return nil }); err != nil {
		t.Fatal(err)
	}
	if err := w2.Wait(testCtx(t)); err != nil {
		t.Fatalf("watch after a clear: %v", err)
	}

	// ClearRange over a watched key fires it.
	set(t, db, k(s, "r"), []byte("x"))
	w3 := watchKey(t, db, k(s, "r"))
	if err := db.Transact(testCtx(t), func(tx kv.Tx) error { b, e := s.Range(); tx.ClearRange(b, e); return nil }); err != nil {
		t.Fatal(err)
	}
	if err := w3.Wait(testCtx(t)); err != nil {
		t.Fatalf("watch after ClearRange: %v", err)
	}

	// Cancel and context end.
	w4 := watchKey(t, db, key)
	ctx, cancel := context.WithCancel(testCtx(t))
	cancel()
	if err := w4.Wait(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("Wait on a cancelled context = %v", err)
	}
	w4.Cancel()
	if err := w4.Wait(testCtx(t)); err == nil {
		t.Fatal("Wait after Cancel returned nil")
	}
}

func testWatchNotOnRollback(t *testing.T, db kv.Database) {
	s := newSpace(t)
	key := k(s, "w")
	set(t, db, key, []byte("v1"))
	w := watchKey(t, db, key)

	// A watch created in a transaction that does not commit fails.
	var failedWatch kv.Watch
	_ = db.Transact(testCtx(t), func(tx kv.Tx) error {
		failedWatch = tx.Watch(key)
		return errors.New("abort")
	})
	if err := failedWatch.Wait(testCtx(t)); err == nil {
		t.Fatal("watch of an aborted transaction fired")
	}
	// A rolled-back write and a commit rewriting the same value do not fire it.
	_ = db.Transact(testCtx(t), func(tx kv.Tx) error {
		tx.Set(key, []byte("rolled back"))
		return errors.New("abort")
	})
	set(t, db, key, []byte("v1"))
	// Let the store process a later, real change to another key, then check.
	marker := watchKey(t, db, k(s, "marker"))
	set(t, db, k(s, "marker"), []byte("m"))
	if err := marker.Wait(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	if fired(w) {
		t.Fatal("watch fired without a committed change to its key")
	}
	set(t, db, key, []byte("v2"))
	if err := w.Wait(testCtx(t)); err != nil {
		t.Fatal(err)
	}
}
