// Package kvtest is the conformance suite every internal/kv backend must
// pass: serializable read-modify-write under concurrency, range reads,
// conflict retry, snapshot reads and explicit read conflicts, atomic add,
// versionstamp order, watches, large transactions and context cancellation,
// plus multi-process cases run by re-executing the backend's test binary.
//
// A backend's test file calls Run with a function that opens a fresh,
// empty store, and RunMultiProcess with one that opens a store shared by
// several processes; its TestMain hands control to RunChild when the binary
// was started as a child:
//
//	func TestMain(m *testing.M) {
//		if kvtest.IsChild() {
//			os.Exit(kvtest.RunChild(openShared))
//		}
//		os.Exit(m.Run())
//	}
//
// Every key a case writes lies under a fresh prefix, so the suite can also
// run against a shared FoundationDB cluster.
package kvtest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/couchrep/couchrep/internal/kv"
	"github.com/couchrep/couchrep/internal/kv/tuple"
)

// caseTimeout bounds every blocking call of a case, generously: it is a
// hang guard, not a speed assertion.
const caseTimeout = 2 * time.Minute

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), caseTimeout)
	t.Cleanup(cancel)
	return ctx
}

// newSpace returns a fresh random subspace for one case.
func newSpace(t testing.TB) tuple.Subspace {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return tuple.NewSubspace(nil, tuple.Tuple{"kvtest", b[:]})
}

func k(s tuple.Subspace, elems ...any) []byte { return s.Pack(tuple.Tuple(elems)) }

// Run runs the single-process conformance cases. open must return a store
// that stays open until the test ends (register Close with t.Cleanup).
func Run(t *testing.T, open func(t *testing.T) kv.Database) {
	cases := []struct {
		name string
		fn   func(t *testing.T, db kv.Database)
	}{
		{"GetSetClear", testGetSetClear},
		{"ReadYourWrites", testReadYourWrites},
		{"FnErrorRollsBack", testFnErrorRollsBack},
		{"Range", testRange},
		{"RangeStreaming", testRangeStreaming},
		{"CounterGoroutines", testCounterGoroutines},
		{"ConflictRetry", testConflictRetry},
		{"RangeConflict", testRangeConflict},
		{"SnapshotNoConflict", testSnapshotNoConflict},
		{"AddReadConflictKey", testAddReadConflictKey},
		{"AddNoConflict", testAddNoConflict},
		{"Versionstamps", testVersionstamps},
		{"VersionstampErrors", testVersionstampErrors},
		{"Watch", testWatch},
		{"WatchNotOnRollback", testWatchNotOnRollback},
		{"LargeTransaction", testLargeTransaction},
		{"ContextCancel", testContextCancel},
		{"TxDone", testTxDone},
		{"ReadTransact", testReadTransact},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if testing.Short() && (c.name == "LargeTransaction" || c.name == "RangeStreaming") {
				t.Skip("slow case skipped in -short")
			}
			c.fn(t, open(t))
		})
	}
}

func get(t *testing.T, db kv.Database, key []byte) []byte {
	t.Helper()
	var v []byte
	if err := db.ReadTransact(testCtx(t), func(tx kv.ReadTx) error {
		var err error
		v, err = tx.Get(key)
		return err
	}); err != nil {
		t.Fatalf("get %x: %v", key, err)
	}
	return v
}

func set(t *testing.T, db kv.Database, key, value []byte) {
	t.Helper()
	if err := db.Transact(testCtx(t), func(tx kv.Tx) error {
		tx.Set(key, value)
		return nil
	}); err != nil {
		t.Fatalf("set %x: %v", key, err)
	}
}

func testGetSetClear(t *testing.T, db kv.Database) {
	s := newSpace(t)
	for _, tc := range []struct {
		name  string
		value []byte
	}{{"bytes", []byte("v")}, {"empty", []byte{}}, {"binary", []byte{0, 0xff, 0}}} {
		key := k(s, tc.name)
		if v := get(t, db, key); v != nil {
			t.Fatalf("%s: absent key read as %q", tc.name, v)
		}
		set(t, db, key, tc.value)
		v := get(t, db, key)
		if v == nil || !bytes.Equal(v, tc.value) {
			t.Fatalf("%s: got %q, want %q", tc.name, v, tc.value)
		}
		if err := db.Transact(testCtx(t), func(tx kv.Tx) error { tx.Clear(key); return nil }); err != nil {
			t.Fatal(err)
		}
		if v := get(t, db, key); v != nil {
			t.Fatalf("%s: cleared key read as %q", tc.name, v)
		}
	}
}

func testReadYourWrites(t *testing.T, db kv.Database) {
	s := newSpace(t)
	set(t, db, k(s, "a"), []byte("stored-a"))
	set(t, db, k(s, "b"), []byte("stored-b"))
	set(t, db, k(s, "c"), []byte("stored-c"))
	set(t, db, k(s, "n"), kv.EncodeInt64LE(40))
	err := db.Transact(testCtx(t), func(tx kv.Tx) error {
		tx.Set(k(s, "a"), []byte("new-a"))
		tx.Clear(k(s, "b"))
		tx.Set(k(s, "d"), []byte("new-d"))
		tx.ClearRange(k(s, "c"), k(s, "d"))
		tx.Set(k(s, "c2"), []byte("after-clear"))
		tx.Add(k(s, "n"), 2)
		for _, c := range []struct {
			key  string
			want []byte
		}{{"a", []byte("new-a")}, {"b", nil}, {"c", nil}, {"c2", []byte("after-clear")}, {"d", []byte("new-d")}, {"n", kv.EncodeInt64LE(42)}} {
			v, err := tx.Get(k(s, c.key))
			if err != nil {
				return err
			}
			if !bytes.Equal(v, c.want) || (v == nil) != (c.want == nil) {
				return fmt.Errorf("Get(%s) = %q, want %q", c.key, v, c.want)
			}
		}
		b, e := s.Range()
		got := collect(tx.GetRange(b, e, kv.RangeOptions{}))
		want := []string{"a=new-a", "c2=after-clear", "d=new-d", "n=" + string(kv.EncodeInt64LE(42))}
		if err := sameEntries(s, got, want); err != nil {
			return fmt.Errorf("merged range: %w", err)
		}
		gotRev := collect(tx.GetRange(b, e, kv.RangeOptions{Reverse: true, Limit: 2}))
		if err := sameEntries(s, gotRev, []string{want[3], want[2]}); err != nil {
			return fmt.Errorf("merged reverse range: %w", err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if v := get(t, db, k(s, "c2")); string(v) != "after-clear" {
		t.Fatalf("write after ClearRange lost: %q", v)
	}
	if v := get(t, db, k(s, "c")); v != nil {
		t.Fatalf("ClearRange did not clear: %q", v)
	}
}

type entry struct{ key, value []byte }

func collect(it kv.RangeIterator) []entry {
	var out []entry
	for it.Next() {
		kv := it.KeyValue()
		out = append(out, entry{bytes.Clone(kv.Key), bytes.Clone(kv.Value)})
	}
	if err := it.Err(); err != nil {
		out = append(out, entry{[]byte("ERROR"), []byte(err.Error())})
	}
	return out
}

// sameEntries compares entries with "name=value" strings, name being the
// key's single string element in s.
func sameEntries(s tuple.Subspace, got []entry, want []string) error {
	var g []string
	for _, e := range got {
		tup, err := s.Unpack(e.key)
		if err != nil || len(tup) != 1 {
			g = append(g, fmt.Sprintf("%x=%s", e.key, e.value))
			continue
		}
		g = append(g, fmt.Sprintf("%v=%s", tup[0], e.value))
	}
	if fmt.Sprint(g) != fmt.Sprint(want) {
		return fmt.Errorf("got %q, want %q", g, want)
	}
	return nil
}

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

func testRange(t *testing.T, db kv.Database) {
	s := newSpace(t)
	if err := db.Transact(testCtx(t), func(tx kv.Tx) error {
		for i := range 10 {
			tx.Set(k(s, int64(i)), []byte{byte('0' + i)})
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	b, e := s.Range()
	for _, tc := range []struct {
		name       string
		begin, end []byte
		opts       kv.RangeOptions
		want       string
	}{
		{"all", b, e, kv.RangeOptions{}, "0123456789"},
		{"limit", b, e, kv.RangeOptions{Limit: 3}, "012"},
		{"reverse", b, e, kv.RangeOptions{Reverse: true}, "9876543210"},
		{"reverse limit", b, e, kv.RangeOptions{Reverse: true, Limit: 4}, "9876"},
		{"begin inclusive end exclusive", k(s, 3), k(s, 7), kv.RangeOptions{}, "3456"},
		{"reverse bounds", k(s, 3), k(s, 7), kv.RangeOptions{Reverse: true}, "6543"},
		{"limit above size", k(s, 8), e, kv.RangeOptions{Limit: 100}, "89"},
		{"empty", k(s, 5), k(s, 5), kv.RangeOptions{}, ""},
		{"inverted", k(s, 7), k(s, 3), kv.RangeOptions{}, ""},
		{"between keys", append(k(s, 2), 0), k(s, 4), kv.RangeOptions{}, "3"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []byte
			if err := db.ReadTransact(testCtx(t), func(tx kv.ReadTx) error {
				it := tx.GetRange(tc.begin, tc.end, tc.opts)
				for it.Next() {
					got = append(got, it.KeyValue().Value...)
				}
				return it.Err()
			}); err != nil {
				t.Fatal(err)
			}
			if string(got) != tc.want {
				t.Fatalf("got %q, want %q", got, tc.want)
			}
		})
	}
}

func testRangeStreaming(t *testing.T, db kv.Database) {
	s := newSpace(t)
	const n = 5000
	value := bytes.Repeat([]byte("x"), 300) // 1.5 MB in all: many pages
	for start := 0; start < n; start += 1000 {
		if err := db.Transact(testCtx(t), func(tx kv.Tx) error {
			for i := start; i < start+1000; i++ {
				tx.Set(k(s, int64(i)), value)
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	b, e := s.Range()
	for _, reverse := range []bool{false, true} {
		for _, limit := range []int{0, 1025, 4999} {
			count, prev := 0, int64(-1)
			if reverse {
				prev = n
			}
			err := db.ReadTransact(testCtx(t), func(tx kv.ReadTx) error {
				it := tx.GetRange(b, e, kv.RangeOptions{Reverse: reverse, Limit: limit})
				for it.Next() {
					tup, err := s.Unpack(it.KeyValue().Key)
					if err != nil {
						return err
					}
					i := tup[0].(int64)
					if (!reverse && i != prev+1) || (reverse && i != prev-1) {
						return fmt.Errorf("key %d after %d", i, prev)
					}
					prev = i
					count++
				}
				return it.Err()
			})
			if err != nil {
				t.Fatal(err)
			}
			want := n
			if limit > 0 {
				want = limit
			}
			if count != want {
				t.Fatalf("reverse=%v limit=%d: %d entries, want %d", reverse, limit, count, want)
			}
		}
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
	s := newSpace(t)
	key := k(s, "k")
	set(t, db, key, []byte("orig"))
	attempts := 0
	var seen []string
	err := db.Transact(testCtx(t), func(tx kv.Tx) error {
		attempts++
		v, err := tx.Get(key)
		if err != nil {
			return err
		}
		seen = append(seen, string(v))
		interfere(t, db, attempts, key)
		tx.Set(k(s, "copy"), v)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if attempts != 2 || fmt.Sprint(seen) != "[orig changed]" {
		t.Fatalf("attempts %d saw %q; want a retry that sees the new value", attempts, seen)
	}
	if v := get(t, db, k(s, "copy")); string(v) != "changed" {
		t.Fatalf("committed copy %q, want the value read by the retry", v)
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

// stampedCommit commits one transaction that takes the next sequence number
// (a serializable read-modify-write, so sequence order is commit order) and
// writes it under a versionstamped key and in a versionstamped value.
func stampedCommit(ctx context.Context, db kv.Database, s tuple.Subspace) (seq int64, stamp [kv.VersionstampLength]byte, err error) {
	var f kv.VersionstampFuture
	err = db.Transact(ctx, func(tx kv.Tx) error {
		v, err := tx.Get(k(s, "seq"))
		if err != nil {
			return err
		}
		seq = kv.Int64LE(v) + 1
		tx.Set(k(s, "seq"), kv.EncodeInt64LE(seq))
		key, off, err := s.Sub("log").PackWithVersionstamp(tuple.Tuple{tuple.IncompleteVersionstamp(0)})
		if err != nil {
			return err
		}
		if err := tx.SetVersionstampedKey(key, off, kv.EncodeInt64LE(seq)); err != nil {
			return err
		}
		val := append(make([]byte, kv.VersionstampLength), kv.EncodeInt64LE(seq)...)
		if err := tx.SetVersionstampedValue(k(s, "last"), val, 0); err != nil {
			return err
		}
		f = tx.Versionstamp()
		return nil
	})
	if err != nil {
		return 0, stamp, err
	}
	stamp, err = f.Get(ctx)
	return seq, stamp, err
}

// checkStampLog verifies that the versionstamped log under s is in strictly
// increasing stamp order and that stamp order is sequence (commit) order.
func checkStampLog(ctx context.Context, db kv.Database, s tuple.Subspace, want int) error {
	return db.ReadTransact(ctx, func(tx kv.ReadTx) error {
		b, e := s.Sub("log").Range()
		it := tx.GetRange(b, e, kv.RangeOptions{})
		n, prevSeq := 0, int64(0)
		var prev []byte
		for it.Next() {
			e := it.KeyValue()
			seq := kv.Int64LE(e.Value)
			if seq != prevSeq+1 {
				return fmt.Errorf("stamp order breaks commit order: seq %d after %d", seq, prevSeq)
			}
			if prev != nil && bytes.Compare(prev, e.Key) >= 0 {
				return fmt.Errorf("stamps not strictly increasing")
			}
			prev, prevSeq = bytes.Clone(e.Key), seq
			n++
		}
		if err := it.Err(); err != nil {
			return err
		}
		if n != want {
			return fmt.Errorf("%d log entries, want %d", n, want)
		}
		return nil
	})
}

func testVersionstamps(t *testing.T, db kv.Database) {
	s := newSpace(t)
	const workers, each = 4, 25
	var wg sync.WaitGroup
	var failed atomic.Value
	stamps := make(chan [kv.VersionstampLength]byte, workers*each)
	for range workers {
		wg.Go(func() {
			for range each {
				_, st, err := stampedCommit(testCtx(t), db, s)
				if err != nil {
					failed.Store(err)
					return
				}
				stamps <- st
			}
		})
	}
	wg.Wait()
	if err, _ := failed.Load().(error); err != nil {
		t.Fatal(err)
	}
	if err := checkStampLog(testCtx(t), db, s, workers*each); err != nil {
		t.Fatal(err)
	}
	// Every future's stamp is the one written into the key.
	close(stamps)
	for st := range stamps {
		key := s.Sub("log").Pack(tuple.Tuple{tuple.Versionstamp{TransactionVersion: st}})
		if get(t, db, key) == nil {
			t.Fatalf("no log entry at the future's stamp %x", st)
		}
	}
	last := get(t, db, k(s, "last"))
	if len(last) != kv.VersionstampLength+8 || kv.Int64LE(last[kv.VersionstampLength:]) != workers*each {
		t.Fatalf("versionstamped value = %x", last)
	}
}

func testVersionstampErrors(t *testing.T, db kv.Database) {
	s := newSpace(t)
	err := db.Transact(testCtx(t), func(tx kv.Tx) error {
		if err := tx.SetVersionstampedKey([]byte("short"), 0, nil); !errors.Is(err, kv.ErrInvalidVersionstamp) {
			return fmt.Errorf("short key: err = %v", err)
		}
		if err := tx.SetVersionstampedValue(k(s, "v"), make([]byte, 12), 5); !errors.Is(err, kv.ErrInvalidVersionstamp) {
			return fmt.Errorf("bad value offset: err = %v", err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// A transaction that fails resolves its future with an error.
	var f kv.VersionstampFuture
	_ = db.Transact(testCtx(t), func(tx kv.Tx) error {
		f = tx.Versionstamp()
		tx.Set(k(s, "x"), nil)
		return errors.New("abort")
	})
	if _, err := f.Get(testCtx(t)); err == nil {
		t.Fatal("future of an aborted transaction resolved without error")
	}
}

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

func testReadTransact(t *testing.T, db kv.Database) {
	s := newSpace(t)
	set(t, db, k(s, "a"), []byte("1"))
	set(t, db, k(s, "b"), []byte("1"))
	err := db.ReadTransact(testCtx(t), func(tx kv.ReadTx) error {
		a, err := tx.Get(k(s, "a"))
		if err != nil {
			return err
		}
		// A commit in between is not visible: the read is one snapshot.
		if err := db.Transact(testCtx(t), func(w kv.Tx) error {
			w.Set(k(s, "a"), []byte("2"))
			w.Set(k(s, "b"), []byte("2"))
			return nil
		}); err != nil {
			return err
		}
		b, err := tx.Get(k(s, "b"))
		if err != nil {
			return err
		}
		if string(a) != string(b) {
			return fmt.Errorf("inconsistent snapshot: a=%s b=%s", a, b)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// prefixHex and parsePrefix move a subspace to child processes.
func prefixHex(s tuple.Subspace) string { return hex.EncodeToString(s.Bytes()) }

func parsePrefix(h string) (tuple.Subspace, error) {
	b, err := hex.DecodeString(h)
	if err != nil {
		return tuple.Subspace{}, err
	}
	return tuple.NewSubspace(b, nil), nil
}
