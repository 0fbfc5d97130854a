package sqlite

import (
	"context"
	"errors"
	"path/filepath"
	"sync"
	"testing"

	"github.com/couchrep/couchrep/internal/kv"
	"github.com/couchrep/couchrep/internal/kv/tuple"
)

// TestValidateWithoutRereads: while only this process commits, commit
// validation decides conflicts from what its own commits wrote, without
// re-reading; a commit by another handle on the file (as another process
// would make) sends validation back to re-reading; both detect conflicts.
func TestValidateWithoutRereads(t *testing.T) {
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
	a, b := open(), open()
	s := tuple.NewSubspace(nil, tuple.Tuple{"validate"})
	key := s.Pack(tuple.Tuple{"n"})
	inc := func(db *DB) error {
		return db.Transact(ctx, func(tx kv.Tx) error {
			v, err := tx.Get(key)
			tx.Set(key, kv.EncodeInt64LE(kv.Int64LE(v)+1))
			return err
		})
	}
	get := func() int64 {
		var n int64
		if err := a.ReadTransact(ctx, func(tx kv.ReadTx) error {
			v, err := tx.Get(key)
			n = kv.Int64LE(v)
			return err
		}); err != nil {
			t.Fatal(err)
		}
		return n
	}
	// interfering commits, from the same handle or the other one, between a
	// transaction's read and its commit: the first attempt must conflict.
	cases := []struct {
		name        string
		interferer  *DB
		wantRereads bool
	}{
		{"own commits", a, false},
		{"foreign commit", b, true},
		{"own commits again", a, false},
	}
	want := int64(0)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := a.rereads.Load()
			attempts := 0
			err := a.Transact(ctx, func(tx kv.Tx) error {
				attempts++
				v, err := tx.Get(key)
				if err != nil {
					return err
				}
				if attempts == 1 {
					if err := inc(tc.interferer); err != nil {
						return err
					}
				}
				tx.Set(key, kv.EncodeInt64LE(kv.Int64LE(v)+1))
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			want += 2
			if attempts != 2 {
				t.Errorf("attempts = %d, want 2 (the first read was invalidated)", attempts)
			}
			if got := get(); got != want {
				t.Errorf("counter = %d, want %d", got, want)
			}
			if got := a.rereads.Load() > before; got != tc.wantRereads {
				t.Errorf("validated by re-reading = %v, want %v", got, tc.wantRereads)
			}
		})
	}
	// Concurrent increments in one process (group commits with conflicts
	// inside a batch and between batches) lose nothing and re-read nothing.
	before := a.rereads.Load()
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 50 {
				if err := inc(a); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	if got := get(); got != want+400 {
		t.Errorf("counter = %d, want %d", got, want+400)
	}
	if n := a.rereads.Load() - before; n != 0 {
		t.Errorf("%d transactions re-read their read set with no other process committing", n)
	}
}

// TestValidateRangesAndClears: range reads and range clears of this
// process's commits conflict as re-reading would decide.
func TestValidateRangesAndClears(t *testing.T) {
	ctx := context.Background()
	db, _ := openTemp(t, Options{})
	s := tuple.NewSubspace(nil, tuple.Tuple{"ranges"})
	begin, end := s.Range()
	other := tuple.NewSubspace(nil, tuple.Tuple{"zz-other"})
	cases := []struct {
		name      string
		interfere func(tx kv.Tx)
		conflict  bool
	}{
		{"insert in range", func(tx kv.Tx) { tx.Set(s.Pack(tuple.Tuple{"b"}), []byte("x")) }, true},
		{"clear range over it", func(tx kv.Tx) { tx.ClearRange(begin, end) }, true},
		{"write elsewhere", func(tx kv.Tx) { tx.Set(other.Pack(tuple.Tuple{"b"}), []byte("x")) }, false},
		{"clear elsewhere", func(tx kv.Tx) { b, e := other.Range(); tx.ClearRange(b, e) }, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if err := db.Transact(ctx, func(tx kv.Tx) error {
				tx.Set(s.Pack(tuple.Tuple{"a"}), []byte("a"))
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			attempts := 0
			if err := db.Transact(ctx, func(tx kv.Tx) error {
				attempts++
				it := tx.GetRange(begin, end, kv.RangeOptions{})
				for it.Next() {
				}
				if err := it.Err(); err != nil {
					return err
				}
				if attempts == 1 {
					if err := db.Transact(ctx, func(tx kv.Tx) error { tc.interfere(tx); return nil }); err != nil {
						return err
					}
				}
				tx.Set(other.Pack(tuple.Tuple{"seen"}), nil)
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			if got := attempts == 2; got != tc.conflict {
				t.Errorf("conflicted = %v (attempts %d), want %v", got, attempts, tc.conflict)
			}
		})
	}
	if n := db.rereads.Load(); n != 0 {
		t.Errorf("%d transactions re-read their read set in a single-process store", n)
	}
}

// TestInflightAccounting: every way out of Transact uncounts the attempt,
// so the leader's gather never waits for transactions that are gone.
func TestInflightAccounting(t *testing.T) {
	db, _ := openTemp(t, Options{})
	key := tuple.Tuple{"inflight"}.Pack()
	errFn := errors.New("fn failed")
	cases := []struct {
		name string
		ctx  func() context.Context
		fn   func(tx kv.Tx) error
	}{
		{"commit", context.Background, func(tx kv.Tx) error { tx.Set(key, []byte("v")); return nil }},
		{"read only", context.Background, func(tx kv.Tx) error { _, err := tx.Get(key); return err }},
		{"fn error", context.Background, func(tx kv.Tx) error { tx.Set(key, nil); return errFn }},
		{"context ended in fn", func() context.Context {
			ctx, cancel := context.WithCancel(context.Background())
			t.Cleanup(cancel)
			return ctx
		}, nil},
		{"panic", context.Background, func(tx kv.Tx) error { panic("fn panicked") }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx := tc.ctx()
			fn := tc.fn
			if fn == nil {
				cctx, cancel := context.WithCancel(ctx)
				ctx = cctx
				fn = func(tx kv.Tx) error { tx.Set(key, nil); cancel(); return nil }
			}
			func() {
				defer func() { _ = recover() }()
				_ = db.Transact(ctx, fn)
			}()
			if n := db.inflight.Load(); n != 0 {
				t.Errorf("inflight = %d after Transact returned, want 0", n)
			}
		})
	}
}
