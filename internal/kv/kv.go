// Package kv is couchrep's job-store seam: a transactional, ordered key-value
// store shaped like FoundationDB, so that the same job queue code runs on the
// embedded SQLite backend (internal/kv/sqlite, the default), on PostgreSQL
// (internal/kv/postgres, nodes on several machines) and on a FoundationDB
// cluster (internal/kv/fdb, build tag fdb).
//
// The model is FoundationDB's: serializable transactions retried
// automatically on conflict, ordered byte keys (built with the tuple encoding
// in internal/kv/tuple), range reads, atomic adds, versionstamps that are
// strictly increasing in commit order across every process sharing the
// store, snapshot reads that add no read conflicts, explicit read-conflict
// ranges, and watches that fire after a commit changes a key.
//
// Every backend must pass the conformance suite in internal/kv/kvtest.
package kv

import (
	"context"
	"errors"
)

// Sentinel errors callers branch on.
var (
	// ErrConflict is returned by a commit that conflicted with another
	// transaction. Transact retries it; callers see it only when retries are
	// exhausted (wrapped).
	ErrConflict = errors.New("kv: transaction conflict")
	// ErrClosed is returned by any call on a closed Database.
	ErrClosed = errors.New("kv: database closed")
	// ErrTxDone is returned when a Tx is used after its function returned.
	ErrTxDone = errors.New("kv: transaction already finished")
	// ErrUnavailable wraps the errors of a store that cannot be reached
	// for now (its server is down or restarting, the network is gone):
	// the same call may work later. Backends whose store can come back
	// (PostgreSQL) wrap such errors with it.
	ErrUnavailable = errors.New("kv: store unavailable")
	// ErrInvalidVersionstamp is returned by versionstamp operations whose
	// offset does not leave room for the 10-byte stamp.
	ErrInvalidVersionstamp = errors.New("kv: invalid versionstamp offset")
)

// VersionstampLength is the size of a transaction versionstamp: 8 bytes of
// big-endian commit version followed by 2 bytes of batch order, as in FDB.
const VersionstampLength = 10

// KeyValue is one entry returned by a range read.
type KeyValue struct {
	Key   []byte
	Value []byte
}

// RangeOptions controls GetRange.
type RangeOptions struct {
	// Limit is the maximum number of entries returned; 0 means no limit.
	Limit int
	// Reverse returns entries in descending key order.
	Reverse bool
}

// RangeIterator streams the result of a range read. It does not hold the
// whole range in memory. Typical use:
//
//	it := tx.GetRange(begin, end, kv.RangeOptions{})
//	for it.Next() {
//		kv := it.KeyValue()
//		...
//	}
//	if err := it.Err(); err != nil { ... }
type RangeIterator interface {
	// Next advances to the next entry, returning false at the end or on error.
	Next() bool
	// KeyValue returns the current entry. Its slices are valid until the next
	// call to Next.
	KeyValue() KeyValue
	// Err returns the first error met, if any.
	Err() error
}

// ReadTx is the read half of a transaction.
type ReadTx interface {
	// Get returns the value of key, or nil (and no error) if it is absent.
	Get(key []byte) ([]byte, error)
	// GetRange reads the keys in [begin, end) in order.
	GetRange(begin, end []byte, opts RangeOptions) RangeIterator
	// Snapshot returns a view of the same transaction whose reads add no
	// read conflicts (FDB's snapshot reads).
	Snapshot() ReadTx
}

// Tx is a read-write transaction. It is not safe for concurrent use.
type Tx interface {
	ReadTx
	// Set writes value at key.
	Set(key, value []byte)
	// Clear removes key.
	Clear(key []byte)
	// ClearRange removes every key in [begin, end).
	ClearRange(begin, end []byte)
	// Add atomically adds delta to the little-endian signed 64-bit integer
	// stored at key (absent counts as 0), without adding a read conflict,
	// as FDB's atomic ADD does.
	Add(key []byte, delta int64)
	// SetVersionstampedKey writes value at a key whose bytes
	// [offset, offset+10) are replaced at commit by the transaction's
	// versionstamp.
	SetVersionstampedKey(key []byte, offset int, value []byte) error
	// SetVersionstampedValue writes at key a value whose bytes
	// [offset, offset+10) are replaced at commit by the versionstamp.
	SetVersionstampedValue(key, value []byte, offset int) error
	// AddReadConflictKey makes the transaction conflict with any concurrent
	// commit that writes key, as if key had been read.
	AddReadConflictKey(key []byte)
	// AddReadConflictRange does the same for every key in [begin, end).
	AddReadConflictRange(begin, end []byte)
	// Watch returns a watch on key that is armed when this transaction
	// commits and fires once a later commit changes the key's value. If the
	// transaction does not commit, the watch fails with the commit error.
	Watch(key []byte) Watch
	// Versionstamp returns a future for this transaction's versionstamp,
	// resolved once the transaction has committed.
	Versionstamp() VersionstampFuture
}

// BatchReader is implemented by transactions that can read many keys in
// one round trip (PostgreSQL); GetMany uses it.
type BatchReader interface {
	// GetMany returns the values of keys (nil where absent), read as Get
	// reads them (with read conflicts, seeing the transaction's writes).
	GetMany(keys [][]byte) ([][]byte, error)
}

// GetMany reads keys as tx.Get would, one after the other, or in one round
// trip where the backend can (BatchReader): for a transaction that must
// read many records it knows the keys of (a dead node's jobs, a batch of
// accepts).
func GetMany(tx ReadTx, keys [][]byte) ([][]byte, error) {
	if b, ok := tx.(BatchReader); ok {
		return b.GetMany(keys)
	}
	out := make([][]byte, len(keys))
	for i, k := range keys {
		v, err := tx.Get(k)
		if err != nil {
			return nil, err
		}
		out[i] = v
	}
	return out, nil
}

// Watch fires once after a committed change to its key.
type Watch interface {
	// Wait blocks until the key changed (nil), the context ended, the watch
	// was cancelled or the store closed (an error).
	Wait(ctx context.Context) error
	// Cancel releases the watch.
	Cancel()
}

// VersionstampFuture yields a committed transaction's versionstamp.
type VersionstampFuture interface {
	// Get blocks until the transaction has finished and returns its
	// 10-byte versionstamp, or an error if it did not commit.
	Get(ctx context.Context) ([VersionstampLength]byte, error)
}

// Database is an open store. It is safe for concurrent use.
type Database interface {
	// Transact runs fn in a serializable read-write transaction and commits
	// it. On ErrConflict (and other retryable backend errors) fn is run
	// again in a new transaction, with backoff, up to a bounded number of
	// attempts and never past ctx. fn must have no side effects outside the
	// transaction that would be wrong to repeat.
	Transact(ctx context.Context, fn func(Tx) error) error
	// ReadTransact runs fn exactly once in a read-only transaction on a
	// consistent snapshot: callers may collect what fn reads. Where a
	// backend would retry (FoundationDB's transaction_too_old on a long
	// read), it returns the error instead of calling fn again.
	ReadTransact(ctx context.Context, fn func(ReadTx) error) error
	// Close releases the store. Pending watches fail with ErrClosed.
	Close() error
}

// Checker is implemented by backends that can tell cheaply whether their
// storage is still usable, beyond what a transaction served from caches
// shows (the embedded store checks its file). Callers run it with their
// health checks (the clustering actor, at every heartbeat).
type Checker interface {
	Check(ctx context.Context) error
}
