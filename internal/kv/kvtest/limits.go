package kvtest

// Limits and transaction lifecycle: large transactions, context
// cancellation, use of a transaction after its function returned.

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"testing"

	"github.com/couchrep/couchrep/internal/kv"
)

func testLargeTransaction(t *testing.T, db kv.Database) {
	s := newSpace(t)
	big := make([]byte, 8<<20)
	_, _ = rand.Read(big)
	const many = 20000
	if err := db.Transact(testCtx(t), func(tx kv.Tx) error {
		tx.Set(k(s, "big"), big)
		for i := range many {
			tx.Set(k(s, "many", int64(i)), []byte("v"))
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if v := get(t, db, k(s, "big")); !bytes.Equal(v, big) {
		t.Fatalf("8 MiB value read back as %d bytes", len(v))
	}
	n := 0
	if err := db.ReadTransact(testCtx(t), func(tx kv.ReadTx) error {
		b, e := s.Sub("many").Range()
		it := tx.GetRange(b, e, kv.RangeOptions{})
		for it.Next() {
			n++
		}
		return it.Err()
	}); err != nil {
		t.Fatal(err)
	}
	if n != many {
		t.Fatalf("%d keys read back, want %d", n, many)
	}
}

func testContextCancel(t *testing.T, db kv.Database) {
	s := newSpace(t)
	// Cancelled during the function: nothing commits.
	ctx, cancel := context.WithCancel(testCtx(t))
	err := db.Transact(ctx, func(tx kv.Tx) error {
		for i := range 100 {
			tx.Set(k(s, int64(i)), []byte("x"))
		}
		cancel()
		return nil
	})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Transact err = %v, want context.Canceled", err)
	}
	b, e := s.Range()
	if err := db.ReadTransact(testCtx(t), func(tx kv.ReadTx) error {
		if got := collect(tx.GetRange(b, e, kv.RangeOptions{})); len(got) != 0 {
			return fmt.Errorf("%d keys of a cancelled transaction committed", len(got))
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	// Cancelled before: the function does not run.
	ran := false
	if err := db.Transact(ctx, func(kv.Tx) error { ran = true; return nil }); !errors.Is(err, context.Canceled) || ran {
		t.Fatalf("Transact on a cancelled ctx: err %v, ran %v", err, ran)
	}
	// Cancelled while retrying a conflict: returns the ctx error.
	key := k(s, "hot")
	ctx2, cancel2 := context.WithCancel(testCtx(t))
	defer cancel2()
	attempts := 0
	err = db.Transact(ctx2, func(tx kv.Tx) error {
		attempts++
		if _, err := tx.Get(key); err != nil {
			return err
		}
		set(t, db, key, []byte{byte(attempts)}) // always conflicts
		if attempts == 3 {
			cancel2()
		}
		tx.Set(key, []byte("mine"))
		return nil
	})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Transact err = %v after cancel during retries (%d attempts)", err, attempts)
	}
	if v := get(t, db, key); bytes.Equal(v, []byte("mine")) {
		t.Fatal("cancelled transaction's write committed")
	}
}

func testTxDone(t *testing.T, db kv.Database) {
	s := newSpace(t)
	var saved kv.Tx
	if err := db.Transact(testCtx(t), func(tx kv.Tx) error { saved = tx; return nil }); err != nil {
		t.Fatal(err)
	}
	if _, err := saved.Get(k(s, "x")); !errors.Is(err, kv.ErrTxDone) {
		t.Fatalf("Get after the function returned: err = %v, want ErrTxDone", err)
	}
}
