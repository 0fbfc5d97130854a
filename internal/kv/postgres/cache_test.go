package postgres

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/couchrep/couchrep/internal/kv"
	"github.com/couchrep/couchrep/internal/kv/postgres/pgtest"
)

// TestCommitCache: a transaction reading what its DB committed reads it
// from the commit cache (no round trip but the commit's), and an outdated
// entry (another DB, standing for another node, wrote the key since) is
// never the result: it conflicts, and the retry reads the server. Every
// way an attempt can end is covered: a commit, a commit without writes,
// an error returned by the function, a snapshot read after a cached read,
// and ReadTransact.
func TestCommitCache(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: starts a PostgreSQL server")
	}
	dsn := pgtest.Shared(t).NewDatabase(t)
	a, b := openDB(t, dsn, Options{}), openDB(t, dsn, Options{})
	ctx := context.Background()
	set := func(db *DB, kvs ...string) {
		t.Helper()
		if err := db.Transact(ctx, func(tx kv.Tx) error {
			for i := 0; i < len(kvs); i += 2 {
				tx.Set([]byte(kvs[i]), []byte(kvs[i+1]))
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	get := func(tx kv.ReadTx, k string) string {
		t.Helper()
		v, err := tx.Get([]byte(k))
		if err != nil {
			t.Fatal(err)
		}
		return string(v)
	}
	// stored reads k through db's ReadTransact (never from the cache).
	stored := func(db *DB, k string) (v string) {
		t.Helper()
		if err := db.ReadTransact(ctx, func(tx kv.ReadTx) error { v = get(tx, k); return nil }); err != nil {
			t.Fatal(err)
		}
		return v
	}

	t.Run("served from the cache", func(t *testing.T) {
		set(a, "c/x", "1")
		rt := a.RoundTrips()
		if err := a.Transact(ctx, func(tx kv.Tx) error {
			if v := get(tx, "c/x"); v != "1" {
				return fmt.Errorf("read %q, want 1", v)
			}
			tx.Set([]byte("c/x"), []byte("2"))
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		if n := a.RoundTrips() - rt; n != 1 {
			t.Errorf("read-modify-write of a key this DB wrote took %d round trips, want 1 (the commit)", n)
		}
	})

	t.Run("outdated entry conflicts", func(t *testing.T) {
		// Increments alternate between the DBs: each reads a value the
		// other one changed since its own last write of it.
		set(a, "c/n", "0")
		for i := range 20 {
			db := []*DB{a, b}[i%2]
			if err := db.Transact(ctx, func(tx kv.Tx) error {
				n, err := strconv.Atoi(get(tx, "c/n"))
				if err != nil {
					return err
				}
				tx.Set([]byte("c/n"), []byte(strconv.Itoa(n+1)))
				return nil
			}); err != nil {
				t.Fatal(err)
			}
		}
		if v := stored(a, "c/n"); v != "20" {
			t.Errorf("after 20 increments from two DBs: %q", v)
		}
	})

	t.Run("commit without writes", func(t *testing.T) {
		set(a, "c/r", "old")
		set(b, "c/r", "new")
		var seen string
		if err := a.Transact(ctx, func(tx kv.Tx) error {
			seen = get(tx, "c/r")
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		if seen != "new" {
			t.Errorf("the last attempt read %q, want new", seen)
		}
	})

	t.Run("error result", func(t *testing.T) {
		set(a, "c/e", "old")
		set(b, "c/e", "new")
		errOld := errors.New("saw the old value")
		if err := a.Transact(ctx, func(tx kv.Tx) error {
			if get(tx, "c/e") == "old" {
				return errOld // resting on an outdated read: must not be the result
			}
			return nil
		}); err != nil {
			t.Fatalf("Transact returned %v", err)
		}
	})

	t.Run("one state", func(t *testing.T) {
		// x and y always change together. a has x cached at its old
		// value; reading y opens a snapshot, which must not pair the old
		// x with the new y.
		set(a, "c/s/x", "1", "c/s/y", "1")
		set(b, "c/s/x", "2", "c/s/y", "2")
		attempts := 0
		if err := a.Transact(ctx, func(tx kv.Tx) error {
			attempts++
			x := get(tx, "c/s/x")
			y, err := tx.Snapshot().Get([]byte("c/s/y"))
			if err != nil {
				return err
			}
			if x != string(y) {
				t.Errorf("attempt %d saw x=%s and y=%s", attempts, x, y)
			}
			tx.Set([]byte("c/s/z"), []byte(x))
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		if attempts != 2 {
			t.Errorf("%d attempts, want 2 (the first read the outdated x from the cache)", attempts)
		}
	})

	t.Run("check failure ignored by the function", func(t *testing.T) {
		// The read that finds the cached x outdated fails; a function
		// that goes on anyway must not commit what it wrote from it.
		set(a, "c/i/x", "1", "c/i/y", "1")
		set(b, "c/i/x", "2", "c/i/y", "2")
		var last string
		if err := a.Transact(ctx, func(tx kv.Tx) error {
			last = get(tx, "c/i/x")
			_, _ = tx.Snapshot().Get([]byte("c/i/y")) // error ignored
			tx.Set([]byte("c/i/z"), []byte(last))
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		if v := stored(a, "c/i/z"); v != "2" || last != "2" {
			t.Errorf("committed z=%q (last attempt read x=%q), want 2", v, last)
		}
	})

	t.Run("ReadTransact reads the server", func(t *testing.T) {
		set(a, "c/t", "old")
		set(b, "c/t", "new")
		if v := stored(a, "c/t"); v != "new" {
			t.Errorf("ReadTransact read %q, want new", v)
		}
	})

	t.Run("batch order", func(t *testing.T) {
		// Two transactions of one batch write the same key: the cache
		// keeps the later one's value, which is the stored one.
		a.commitQ.mu.Lock() // as if maxInFlight batches were in flight: both queue
		a.commitQ.inflight += maxInFlight
		a.commitQ.mu.Unlock()
		done := make(chan error, 2)
		for i, v := range []string{"first", "second"} {
			go func() {
				done <- a.Transact(ctx, func(tx kv.Tx) error {
					tx.Set([]byte("c/b"), []byte(v))
					return nil
				})
			}()
			waitQueued(t, a, i+1)
		}
		// As if those batches came back: both go in one batch.
		a.commitQ.mu.Lock()
		a.commitQ.inflight -= maxInFlight
		a.commitQ.mu.Unlock()
		a.sendNext()
		for range 2 {
			if err := <-done; err != nil {
				t.Fatal(err)
			}
		}
		want := stored(a, "c/b")
		if err := a.Transact(ctx, func(tx kv.Tx) error {
			if v := get(tx, "c/b"); v != want {
				t.Errorf("cached %q, stored %q", v, want)
			}
			tx.Set([]byte("c/b2"), nil)
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	})
}

// waitQueued waits until n commits are queued on db.
func waitQueued(t *testing.T, db *DB, n int) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		_, q := db.commitQ.state()
		if q >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d commits not queued after a minute", n)
		}
		time.Sleep(time.Millisecond)
	}
}
