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

// testLargeTransaction: a transaction near FoundationDB's limits (80
// values of 90 kB, one of exactly kv.MaxValueSize, 20,000 keys: about
// 7.9 MB) commits whole.
func testLargeTransaction(t *testing.T, db kv.Database) {
	s := newSpace(t)
	const nbig, many = 80, 20000
	big := make([][]byte, nbig)
	for i := range big {
		big[i] = make([]byte, 90_000)
		if i == 0 {
			big[i] = make([]byte, kv.MaxValueSize)
		}
		_, _ = rand.Read(big[i])
	}
	if err := db.Transact(testCtx(t), func(tx kv.Tx) error {
		for i, v := range big {
			tx.Set(k(s, "big", int64(i)), v)
		}
		for i := range many {
			tx.Set(k(s, "many", int64(i)), []byte("v"))
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	for i, want := range big {
		if v := get(t, db, k(s, "big", int64(i))); !bytes.Equal(v, want) {
			t.Fatalf("big value %d (%d bytes) read back as %d bytes", i, len(want), len(v))
		}
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

// testSizeLimits: a write beyond FoundationDB's limits (kv.MaxKeySize,
// kv.MaxValueSize, kv.MaxTransactionSize) fails the transaction with the
// same sentinel on every backend, even if the function ignores the
// error: nothing of it commits and it is not retried. Writes at the
// limits commit.
func testSizeLimits(t *testing.T, db kv.Database) {
	s := newSpace(t)
	// A key of exactly n bytes under s.
	keyOf := func(name string, n int) []byte {
		key := k(s, name)
		return append(key, bytes.Repeat([]byte{'k'}, n-len(key))...)
	}
	atKey, atValue := keyOf("at", kv.MaxKeySize), make([]byte, kv.MaxValueSize)
	if err := db.Transact(testCtx(t), func(tx kv.Tx) error {
		tx.Set(atKey, atValue)
		return nil
	}); err != nil {
		t.Fatalf("a %d-byte key with a %d-byte value: %v", kv.MaxKeySize, kv.MaxValueSize, err)
	}
	if v := get(t, db, atKey); len(v) != kv.MaxValueSize {
		t.Fatalf("the value at the limit read back as %d bytes", len(v))
	}
	long, big := keyOf("long", kv.MaxKeySize+1), make([]byte, kv.MaxValueSize+1)
	for _, tc := range []struct {
		name  string
		write func(tx kv.Tx) error
		want  error
	}{
		{"Set value", func(tx kv.Tx) error { tx.Set(k(s, "v"), big); return nil }, kv.ErrValueTooLarge},
		{"Set key", func(tx kv.Tx) error { tx.Set(long, nil); return nil }, kv.ErrKeyTooLarge},
		{"Clear key", func(tx kv.Tx) error { tx.Clear(long); return nil }, kv.ErrKeyTooLarge},
		{"Add key", func(tx kv.Tx) error { tx.Add(long, 1); return nil }, kv.ErrKeyTooLarge},
		{"SetVersionstampedValue", func(tx kv.Tx) error {
			_ = tx.SetVersionstampedValue(k(s, "vsv"), big, 0) // the error is ignored: the commit fails anyway
			return nil
		}, kv.ErrValueTooLarge},
		{"SetVersionstampedKey", func(tx kv.Tx) error {
			_ = tx.SetVersionstampedKey(long, 0, nil)
			return nil
		}, kv.ErrKeyTooLarge},
		{"SetVersionstampedValue error", func(tx kv.Tx) error {
			return tx.SetVersionstampedValue(k(s, "vsv"), big, 0)
		}, kv.ErrValueTooLarge},
		{"transaction", func(tx kv.Tx) error {
			v := make([]byte, kv.MaxValueSize-1_000)
			for i := range kv.MaxTransactionSize/len(v) + 1 {
				tx.Set(k(s, "t", int64(i)), v)
			}
			return nil
		}, kv.ErrTransactionTooLarge},
	} {
		t.Run(tc.name, func(t *testing.T) {
			calls := 0
			err := db.Transact(testCtx(t), func(tx kv.Tx) error {
				calls++
				tx.Set(k(s, "witness", tc.name), []byte("x"))
				return tc.write(tx)
			})
			if !errors.Is(err, tc.want) {
				t.Fatalf("Transact err = %v, want %v", err, tc.want)
			}
			if calls != 1 {
				t.Fatalf("the function ran %d times, want once (a size error is not retried)", calls)
			}
			if v := get(t, db, k(s, "witness", tc.name)); v != nil {
				t.Fatalf("a write of the refused transaction committed")
			}
		})
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
