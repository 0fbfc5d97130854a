package kvtest

// Serializable transactions: rollback on error, concurrent read-modify-write,
// conflict retry on keys and ranges, snapshot reads and explicit read
// conflicts.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"

	"github.com/couchrep/couchrep/internal/kv"
)

func testFnErrorRollsBack(t *testing.T, db kv.Database) {
	s := newSpace(t)
	boom := errors.New("boom")
	err := db.Transact(testCtx(t), func(tx kv.Tx) error {
		tx.Set(k(s, "x"), []byte("1"))
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("Transact err = %v, want the fn's error", err)
	}
	if v := get(t, db, k(s, "x")); v != nil {
		t.Fatalf("write of a failed tx committed: %q", v)
	}
}

// increment does one read-modify-write of a little-endian counter.
func increment(ctx context.Context, db kv.Database, key []byte) error {
	return db.Transact(ctx, func(tx kv.Tx) error {
		v, err := tx.Get(key)
		if err != nil {
			return err
		}
		tx.Set(key, kv.EncodeInt64LE(kv.Int64LE(v)+1))
		return nil
	})
}

func testCounterGoroutines(t *testing.T, db kv.Database) {
	s := newSpace(t)
	key := k(s, "counter")
	const workers, each = 8, 50
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for range workers {
		wg.Go(func() {
			for range each {
				if err := increment(testCtx(t), db, key); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if got := kv.Int64LE(get(t, db, key)); got != workers*each {
		t.Fatalf("counter = %d, want %d: increments lost", got, workers*each)
	}
}

// interfere commits a change to key from inside another transaction's
// function, the first time only.
func interfere(t *testing.T, db kv.Database, attempts int, key []byte) {
	if attempts == 1 {
		set(t, db, key, []byte("changed"))
	}
}

func testConflictRetry(t *testing.T, db kv.Database) {
	// Every way the key read can change between the read and the commit:
	// a new value, removed (by Clear or ClearRange), created. The
	// function reads it with Get or a snapshot Get and AddReadConflictKey.
	for _, tc := range []struct {
		name         string
		orig         string // "" : absent before
		change       func(tx kv.Tx, key []byte)
		want         string // what the retry reads
		conflictOnly bool   // read with a snapshot Get + AddReadConflictKey
	}{
		{"set", "orig", func(tx kv.Tx, key []byte) { tx.Set(key, []byte("changed")) }, "changed", false},
		{"clear", "orig", func(tx kv.Tx, key []byte) { tx.Clear(key) }, "", false},
		{"clear range", "orig", func(tx kv.Tx, key []byte) { tx.ClearRange(key, append(slices.Clone(key), 0)) }, "", false},
		{"create", "", func(tx kv.Tx, key []byte) { tx.Set(key, []byte("created")) }, "created", false},
		{"conflict key set", "orig", func(tx kv.Tx, key []byte) { tx.Set(key, []byte("changed")) }, "changed", true},
		{"conflict key clear", "orig", func(tx kv.Tx, key []byte) { tx.Clear(key) }, "", true},
		{"conflict key create", "", func(tx kv.Tx, key []byte) { tx.Set(key, []byte("created")) }, "created", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newSpace(t)
			key := k(s, "k")
			if tc.orig != "" {
				set(t, db, key, []byte(tc.orig))
			}
			attempts := 0
			var seen []string
			err := db.Transact(testCtx(t), func(tx kv.Tx) error {
				attempts++
				var v []byte
				var err error
				if tc.conflictOnly {
					v, err = tx.Snapshot().Get(key)
					tx.AddReadConflictKey(key)
				} else {
					v, err = tx.Get(key)
				}
				if err != nil {
					return err
				}
				seen = append(seen, string(v))
				if attempts == 1 {
					if err := db.Transact(testCtx(t), func(tx kv.Tx) error { tc.change(tx, key); return nil }); err != nil {
						t.Fatal(err)
					}
				}
				tx.Set(k(s, "copy"), v)
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			if want := fmt.Sprint([]string{tc.orig, tc.want}); attempts != 2 || fmt.Sprint(seen) != want {
				t.Fatalf("attempts %d saw %q; want a retry that sees the change: %s", attempts, seen, want)
			}
			if v := get(t, db, k(s, "copy")); string(v) != tc.want {
				t.Fatalf("committed copy %q, want the value read by the retry (%q)", v, tc.want)
			}
		})
	}
}

func testRangeConflict(t *testing.T, db kv.Database) {
	s := newSpace(t)
	set(t, db, k(s, "a"), []byte("1"))
	attempts := 0
	var counts []int
	b, e := s.Range()
	err := db.Transact(testCtx(t), func(tx kv.Tx) error {
		attempts++
		n := len(collect(tx.GetRange(b, e, kv.RangeOptions{})))
		counts = append(counts, n)
		interfere(t, db, attempts, k(s, "b")) // an insert into the range read
		tx.Set(k(s, "other"), []byte("x"))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if attempts != 2 || fmt.Sprint(counts) != "[1 2]" {
		t.Fatalf("attempts %d saw %v entries; want a retry after the phantom insert", attempts, counts)
	}
}

func testSnapshotNoConflict(t *testing.T, db kv.Database) {
	s := newSpace(t)
	key := k(s, "k")
	set(t, db, key, []byte("orig"))
	attempts := 0
	b, e := s.Range()
	err := db.Transact(testCtx(t), func(tx kv.Tx) error {
		attempts++
		if _, err := tx.Snapshot().Get(key); err != nil {
			return err
		}
		_ = collect(tx.Snapshot().GetRange(b, e, kv.RangeOptions{}))
		interfere(t, db, attempts, key)
		tx.Set(k(s, "other"), []byte("x"))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if attempts != 1 {
		t.Fatalf("snapshot reads conflicted: %d attempts", attempts)
	}
}

func testAddReadConflictKey(t *testing.T, db kv.Database) {
	s := newSpace(t)
	key := k(s, "k")
	set(t, db, key, []byte("orig"))
	for _, tc := range []struct {
		name     string
		conflict func(tx kv.Tx)
	}{
		{"key", func(tx kv.Tx) { tx.AddReadConflictKey(key) }},
		{"range", func(tx kv.Tx) { b, e := s.Range(); tx.AddReadConflictRange(b, e) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			attempts := 0
			err := db.Transact(testCtx(t), func(tx kv.Tx) error {
				attempts++
				if _, err := tx.Snapshot().Get(key); err != nil {
					return err
				}
				tc.conflict(tx)
				interfere(t, db, attempts, key)
				tx.Clear(key)
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			if attempts != 2 {
				t.Fatalf("%d attempts; the explicit read conflict must force a retry", attempts)
			}
			set(t, db, key, []byte("orig"))
		})
	}
}
