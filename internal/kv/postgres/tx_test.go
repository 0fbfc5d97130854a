package postgres

import (
	"context"
	"testing"

	"github.com/couchrep/couchrep/internal/kv"
	"github.com/couchrep/couchrep/internal/kv/postgres/pgtest"
)

// TestAutoRead: a transaction's first point read runs without a snapshot
// (tx.autoRead); a second read opens one and checks the first read's row,
// so the function never sees two states: a change to the first key (its
// value, its removal, its creation) in between makes the attempt run
// again, and no change costs no attempt.
func TestAutoRead(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: starts a PostgreSQL server")
	}
	dsn := pgtest.Shared(t).NewDatabase(t)
	a, b := openDB(t, dsn, Options{}), openDB(t, dsn, Options{})
	ctx := context.Background()
	write := func(db *DB, k, v string) {
		t.Helper()
		if err := db.Transact(ctx, func(tx kv.Tx) error {
			if v == "" {
				tx.Clear([]byte(k))
			} else {
				tx.Set([]byte(k), []byte(v))
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name           string
		before, during string // x's value before the transaction, and written by b between its reads ("": none)
		attempts       int
	}{
		{"unchanged", "1", "", 1},
		{"changed", "1", "2", 2},
		{"removed", "1", "-", 2},
		{"created", "", "3", 2},
		{"still absent", "", "", 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			x, y := "a/"+tc.name+"/x", "a/"+tc.name+"/y"
			if tc.before != "" {
				write(b, x, tc.before)
			}
			write(b, y, "y")
			attempts := 0
			var gotX, gotY string
			if err := a.Transact(ctx, func(tx kv.Tx) error {
				attempts++
				v, err := tx.Get([]byte(x))
				if err != nil {
					return err
				}
				if !isAuto(tx) {
					t.Errorf("attempt %d: the first read took a snapshot", attempts)
				}
				if attempts == 1 && tc.during != "" {
					if tc.during == "-" {
						write(b, x, "")
					} else {
						write(b, x, tc.during)
					}
				}
				w, err := tx.Get([]byte(y))
				if err != nil {
					return err
				}
				gotX, gotY = string(v), string(w)
				tx.Set([]byte("a/"+tc.name+"/z"), v)
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			want := tc.before
			if tc.during != "" {
				want = tc.during
			}
			if want == "-" {
				want = ""
			}
			if attempts != tc.attempts || gotX != want || gotY != "y" {
				t.Errorf("%d attempts, last read x=%q y=%q; want %d, x=%q y=y", attempts, gotX, gotY, tc.attempts, want)
			}
		})
	}
}

// isAuto reports whether the transaction's first read ran without a
// snapshot.
func isAuto(t kv.Tx) bool { return t.(*tx).auto }

// TestGetMany: kv.GetMany reads many keys in one statement: absent keys
// are nil, a present empty value is empty, the transaction's own writes
// and clears are seen, and a key read so conflicts as a point read does
// (a commit of another process in between makes the attempt run again).
func TestGetMany(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: starts a PostgreSQL server")
	}
	dsn := pgtest.Shared(t).NewDatabase(t)
	a, b := openDB(t, dsn, Options{}), openDB(t, dsn, Options{})
	ctx := context.Background()
	if err := a.Transact(ctx, func(tx kv.Tx) error {
		tx.Set([]byte("m/1"), []byte("one"))
		tx.Set([]byte("m/2"), []byte{})
		tx.Set([]byte("m/3"), []byte("three"))
		tx.Set([]byte("m/4"), []byte("four"))
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	attempts := 0
	if err := a.Transact(ctx, func(tx kv.Tx) error {
		attempts++
		tx.Set([]byte("m/3"), []byte("mine"))
		tx.Clear([]byte("m/4"))
		got, err := kv.GetMany(tx, [][]byte{[]byte("m/1"), []byte("m/2"), []byte("m/3"), []byte("m/4"), []byte("m/5"), []byte("m/1")})
		if err != nil {
			return err
		}
		want := []string{"one", "", "mine", "<nil>", "<nil>", "one"}
		for i, v := range got {
			s := string(v)
			if v == nil {
				s = "<nil>"
			}
			if s != want[i] {
				t.Errorf("attempt %d: key %d = %q, want %q", attempts, i, s, want[i])
			}
		}
		if attempts == 1 {
			// Another process writes m/1 (read above) before this commits.
			if err := b.Transact(ctx, func(tx kv.Tx) error { tx.Set([]byte("m/1"), []byte("one")); return nil }); err != nil {
				return err
			}
		}
		tx.Set([]byte("m/out"), []byte("x"))
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if attempts != 2 {
		t.Fatalf("%d attempts, want 2 (the first conflicts on a key read with GetMany)", attempts)
	}
}
