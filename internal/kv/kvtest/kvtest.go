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
//
// The cases live in one file a topic: reads.go (point and range reads),
// conflicts.go (transactions and conflicts), atomic.go, versionstamps.go,
// watch.go, limits.go (size, cancellation, lifecycle) and multiprocess.go;
// this file holds Run and the helpers they share.
package kvtest

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
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
		{"SizeLimits", testSizeLimits},
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
