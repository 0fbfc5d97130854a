package sqlite

import (
	"context"
	"errors"
	"math/rand/v2"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/couchrep/couchrep/internal/kv"
	"github.com/couchrep/couchrep/internal/kv/tuple"
)

// TestWriterReadsStayConsistent: a transaction reading through the writer
// connection while commits land between its reads either moves on (the
// commits wrote nothing it read) or runs again on a reader snapshot; in
// every case its reads come from one state of the store.
func TestWriterReadsStayConsistent(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "store.db")
	open := func() *DB {
		db, err := Open(ctx, path, Options{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		return db
	}
	a, other := open(), open()
	s := tuple.NewSubspace(nil, tuple.Tuple{"wr"})
	x, y, z := s.Pack(tuple.Tuple{"x"}), s.Pack(tuple.Tuple{"y"}), s.Pack(tuple.Tuple{"z"})
	rangeBegin, rangeEnd := s.Range()
	set := func(db *DB, k []byte, v string) error {
		return db.Transact(ctx, func(tx kv.Tx) error {
			tx.Set(k, []byte(v))
			return nil
		})
	}
	// firstRead is the transaction's first read; between it and a read of y
	// another transaction (on writer) sets key. x and y are always written
	// together, so a consistent reader sees them equal.
	type firstRead int
	const (
		getX firstRead = iota
		snapshotGetX
		scanRange
		snapshotScanRange
	)
	cases := []struct {
		name      string
		first     firstRead
		writer    *DB
		key       []byte
		wantMoved bool
	}{
		{"own commit of an unread key: moves on", getX, a, z, false},
		{"own commit of a read key", getX, a, x, true},
		{"own commit of a snapshot-read key", snapshotGetX, a, x, true},
		{"own commit inside a read range", scanRange, a, z, true},
		{"own commit inside a snapshot-read range", snapshotScanRange, a, z, true},
		{"another handle's commit of an unread key", getX, other, z, true},
	}
	for i, tc := range cases {
		for _, readOnly := range []bool{false, true} {
			name := tc.name
			if readOnly {
				name += "/ReadTransact"
			}
			t.Run(name, func(t *testing.T) {
				before := string(rune('a' + 2*i))
				after := string(rune('a' + 2*i + 1))
				if err := a.Transact(ctx, func(tx kv.Tx) error {
					tx.Set(x, []byte(before))
					tx.Set(y, []byte(before))
					return nil
				}); err != nil {
					t.Fatal(err)
				}
				moves := a.moves.Load()
				runs := 0
				var gotX, gotY []byte
				fn := func(tx kv.ReadTx) error {
					runs++
					var err error
					switch tc.first {
					case getX:
						gotX, err = tx.Get(x)
					case snapshotGetX:
						gotX, err = tx.Snapshot().Get(x)
					case scanRange, snapshotScanRange:
						r := kv.ReadTx(tx)
						if tc.first == snapshotScanRange {
							r = tx.Snapshot()
						}
						it := r.GetRange(rangeBegin, rangeEnd, kv.RangeOptions{})
						for it.Next() {
							if string(it.KeyValue().Key) == string(x) {
								gotX = it.KeyValue().Value
							}
						}
						err = it.Err()
					}
					if err != nil {
						return err
					}
					if runs == 1 {
						// A commit of x goes with one of y, as one transaction.
						if err := tc.writer.Transact(ctx, func(tx kv.Tx) error {
							tx.Set(tc.key, []byte(after))
							if string(tc.key) == string(x) {
								tx.Set(y, []byte(after))
							}
							return nil
						}); err != nil {
							return err
						}
					}
					gotY, err = tx.Get(y)
					return err
				}
				var err error
				if readOnly {
					err = a.ReadTransact(ctx, fn)
				} else {
					err = a.Transact(ctx, func(tx kv.Tx) error { return fn(tx) })
				}
				if err != nil {
					t.Fatal(err)
				}
				if string(gotX) != string(gotY) {
					t.Errorf("inconsistent reads: x=%q y=%q", gotX, gotY)
				}
				// ReadTransact runs fn once, on a reader snapshot: it never
				// moves (its callers collect what fn reads).
				wantMoved := tc.wantMoved && !readOnly
				wantRuns := 1
				if wantMoved {
					wantRuns = 2
				}
				if runs != wantRuns {
					t.Errorf("fn ran %d times, want %d", runs, wantRuns)
				}
				if moved := a.moves.Load() - moves; (moved > 0) != wantMoved {
					t.Errorf("moved %d times, want moved = %v", moved, wantMoved)
				}
				if err := set(a, z, ""); err != nil { // reset z for the next case
					t.Fatal(err)
				}
			})
		}
	}
}

// TestWriterReadsAfterClose: a transaction still reading (through the
// writer connection) when the store closes gets kv.ErrClosed, not a closed
// connection.
func TestWriterReadsAfterClose(t *testing.T) {
	db, _ := openTemp(t, Options{})
	ctx := context.Background()
	err := db.Transact(ctx, func(tx kv.Tx) error {
		if _, err := tx.Get([]byte("a")); err != nil {
			return err
		}
		if err := db.Close(); err != nil {
			return err
		}
		_, err := tx.Get([]byte("b"))
		return err
	})
	if err == nil {
		t.Fatal("read after close succeeded")
	}
	if !errorsIs(err, kv.ErrClosed) {
		t.Fatalf("read after close: %v, want kv.ErrClosed", err)
	}
}

// TestGroupCommitCancellation: many goroutines commit increments, some
// with contexts that end while they wait in the commit queue (possibly
// just as the leading is handed to them). Every Transact returns, and the
// counter equals the number of increments reported committed.
func TestGroupCommitCancellation(t *testing.T) {
	db, _ := openTemp(t, Options{})
	key := tuple.Tuple{"cancel", "n"}.Pack()
	const workers, rounds = 8, 60
	var committed [workers]int64
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := range rounds {
				ctx, cancel := context.WithCancel(context.Background())
				if (w+i)%3 == 0 {
					// Ends at some point of the attempt: in fn, in the
					// commit queue, or while its batch runs.
					ctx, cancel = context.WithTimeout(context.Background(), time.Duration(rand.IntN(300))*time.Microsecond)
				}
				err := db.Transact(ctx, func(tx kv.Tx) error {
					v, err := tx.Get(key)
					tx.Set(key, kv.EncodeInt64LE(kv.Int64LE(v)+1))
					return err
				})
				cancel()
				switch {
				case err == nil:
					committed[w]++
				case errors.Is(err, context.DeadlineExceeded):
					// Not committed, unless the batch already had it:
					// then Transact reports its outcome (nil).
				default:
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	var want int64
	for _, n := range committed {
		want += n
	}
	var got int64
	if err := db.ReadTransact(context.Background(), func(tx kv.ReadTx) error {
		v, err := tx.Get(key)
		got = kv.Int64LE(v)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if got != want {
		t.Fatalf("counter = %d, %d increments reported committed", got, want)
	}
}
