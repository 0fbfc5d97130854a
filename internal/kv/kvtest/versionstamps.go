package kvtest

// Versionstamped keys and values: commit order and misuse errors.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/couchrep/couchrep/internal/kv"
	"github.com/couchrep/couchrep/internal/kv/tuple"
)

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
