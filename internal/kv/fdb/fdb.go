//go:build fdb

// Package fdb is the FoundationDB backend of internal/kv: a thin adapter
// from kv.Database to the official Go bindings
// (github.com/apple/foundationdb/bindings/go, API version 730, FDB 7.3),
// for job stores shared by nodes on many machines.
//
// It is built only with the build tag fdb, because the bindings need cgo and
// the FoundationDB client library (libfdb_c); the default build and
// `go vet ./...` never compile it. See README.md in this directory for
// installing the client and running the conformance suite against a
// cluster.
//
// The mapping is direct: transactions, snapshot reads, read-conflict keys
// and ranges, atomic ADD, versionstamped keys and values and watches are
// FDB's own. Transact runs its own retry loop around Transaction.OnError so
// that it can honour the context (the transaction is cancelled when the
// context ends) and bound the number of attempts.
package fdb

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"

	"github.com/apple/foundationdb/bindings/go/src/fdb"
	"github.com/rs/zerolog"

	"github.com/couchrep/couchrep/internal/kv"
)

// APIVersion is the FoundationDB API version this adapter selects; it needs
// a client library of version 7.3 or later.
const APIVersion = 730

// Options configure Open.
type Options struct {
	// ClusterFile is the cluster file path; empty means FDB's default
	// (FDB_CLUSTER_FILE or /etc/foundationdb/fdb.cluster).
	ClusterFile string
	// MaxAttempts bounds the attempts of one Transact; 100 by default.
	MaxAttempts int
	// Logger receives the adapter's structured logs.
	Logger zerolog.Logger
}

// DB is a kv.Database on a FoundationDB cluster.
type DB struct {
	db     fdb.Database
	opts   Options
	log    zerolog.Logger
	mu     sync.Mutex
	closed bool
}

var _ kv.Database = (*DB)(nil)

var apiOnce sync.Once
var apiErr error

// The bindings' fdb.OpenDatabase caches one handle per cluster file in an
// unsynchronised map, and fdb.Database.Close destroys that shared handle.
// Open and Close therefore go through this reference-counted table: opens
// are serialised, and the handle is closed only when the last DB using it
// is.
var (
	handlesMu sync.Mutex
	handles   = map[string]*handle{}
)

type handle struct {
	db   fdb.Database
	refs int
}

// Open connects to the cluster named by opts.ClusterFile.
func Open(ctx context.Context, opts Options) (*DB, error) {
	if opts.MaxAttempts <= 0 {
		opts.MaxAttempts = 100
	}
	apiOnce.Do(func() { apiErr = fdb.APIVersion(APIVersion) })
	if apiErr != nil {
		return nil, fmt.Errorf("fdb: select API version %d: %w", APIVersion, apiErr)
	}
	handlesMu.Lock()
	defer handlesMu.Unlock()
	h := handles[opts.ClusterFile]
	if h == nil {
		db, err := fdb.OpenDatabase(opts.ClusterFile)
		if err != nil {
			return nil, fmt.Errorf("fdb: open cluster %q: %w", opts.ClusterFile, err)
		}
		h = &handle{db: db}
		handles[opts.ClusterFile] = h
	}
	h.refs++
	return &DB{db: h.db, opts: opts, log: opts.Logger.With().Str("component", "kv/fdb").Logger()}, nil
}

func (d *DB) isClosed() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.closed
}

// Close implements kv.Database. The bindings keep the network thread; the
// database handle is released when the last DB on its cluster file closes.
func (d *DB) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil
	}
	d.closed = true
	handlesMu.Lock()
	defer handlesMu.Unlock()
	if h := handles[d.opts.ClusterFile]; h != nil {
		if h.refs--; h.refs == 0 {
			delete(handles, d.opts.ClusterFile)
			h.db.Close()
		}
	}
	return nil
}

// begin creates a transaction that is cancelled if ctx ends; end releases
// it.
func (d *DB) begin(ctx context.Context) (tr fdb.Transaction, end func(), err error) {
	if d.isClosed() {
		return tr, nil, kv.ErrClosed
	}
	tr, err = d.db.CreateTransaction()
	if err != nil {
		return tr, nil, fmt.Errorf("fdb: create transaction: %w", err)
	}
	stop := context.AfterFunc(ctx, tr.Cancel)
	return tr, func() { stop(); tr.Cancel() }, nil
}

// run runs fn in a transaction (see begin), again after each retryable FDB
// error, up to Options.MaxAttempts.
func (d *DB) run(ctx context.Context, fn func(fdb.Transaction) error) error {
	tr, end, err := d.begin(ctx)
	if err != nil {
		return err
	}
	defer end()
	for attempt := 1; ; attempt++ {
		if err := ctx.Err(); err != nil {
			return err
		}
		err := fn(tr)
		if err == nil {
			return nil
		}
		var fe fdb.Error
		if !errors.As(err, &fe) {
			return err
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if attempt >= d.opts.MaxAttempts {
			return fmt.Errorf("fdb: gave up after %d attempts: %w: %w", attempt, kv.ErrConflict, err)
		}
		if err := tr.OnError(fe).Get(); err != nil {
			return fmt.Errorf("fdb: %w", sizeError(err))
		}
	}
}

// Transact implements kv.Database.
func (d *DB) Transact(ctx context.Context, fn func(kv.Tx) error) error {
	return d.run(ctx, func(tr fdb.Transaction) error {
		t := &tx{tr: tr, rt: tr}
		err := fn(t)
		if err == nil {
			err = t.err
		}
		if err == nil {
			if err = ctx.Err(); err == nil {
				err = tr.Commit().Get()
			}
		}
		t.finish(err)
		return err
	})
}

// ReadTransact implements kv.Database.
func (d *DB) ReadTransact(ctx context.Context, fn func(kv.ReadTx) error) error {
	// fn runs exactly once (the kv contract: callers collect what it
	// reads); a retryable FDB error, such as transaction_too_old on a long
	// read, is returned rather than retried.
	tr, end, err := d.begin(ctx)
	if err != nil {
		return err
	}
	defer end()
	t := &tx{tr: tr, rt: tr}
	err = fn(t)
	t.finish(err)
	if err != nil && ctx.Err() != nil {
		return ctx.Err()
	}
	return err
}

// tx adapts fdb.Transaction to kv.Tx.
type tx struct {
	tr      fdb.Transaction
	rt      fdb.ReadTransaction
	root    *tx // the transaction a Snapshot view belongs to; nil for the root
	err     error
	done    bool
	size    kv.WriteCounter // bytes written, for kv.MaxTransactionSize
	watches []*watch
	stamps  []*stampFuture
}

func (t *tx) fail(err error) {
	if t.err == nil {
		t.err = err
	}
}

// checkWrite enforces kv's size limits before FDB sees the write, so that
// the transaction fails with the same error as on the other backends
// (FDB's own key_too_large, value_too_large and transaction_too_large are
// mapped to them too, by sizeError). A refused write is not sent.
func (t *tx) checkWrite(key, value []byte) error {
	err := kv.CheckWrite(key, value)
	if err == nil {
		err = t.size.Add(len(key) + len(value))
	}
	t.fail(err)
	return err
}

// sizeError wraps FDB's size errors with kv's sentinels.
func sizeError(err error) error {
	var fe fdb.Error
	if !errors.As(err, &fe) {
		return err
	}
	switch fe.Code {
	case 2101: // transaction_too_large
		return fmt.Errorf("%w: %w", kv.ErrTransactionTooLarge, err)
	case 2102: // key_too_large
		return fmt.Errorf("%w: %w", kv.ErrKeyTooLarge, err)
	case 2103: // value_too_large
		return fmt.Errorf("%w: %w", kv.ErrValueTooLarge, err)
	}
	return err
}

func (t *tx) finish(err error) {
	t.done = true
	for _, w := range t.watches {
		if err != nil {
			w.f.Cancel()
			w.setErr(err)
		}
	}
	for _, s := range t.stamps {
		s.resolve(err)
	}
}

// isDone reports whether the function this transaction (or the transaction
// a Snapshot view belongs to) was given to has returned.
func (t *tx) isDone() bool {
	if t.root != nil {
		return t.root.done
	}
	return t.done
}

func (t *tx) Get(key []byte) ([]byte, error) {
	if t.isDone() {
		return nil, kv.ErrTxDone
	}
	return t.rt.Get(fdb.Key(key)).Get()
}

func (t *tx) GetRange(begin, end []byte, opts kv.RangeOptions) kv.RangeIterator {
	if t.isDone() {
		return &iterator{err: kv.ErrTxDone}
	}
	r := fdb.KeyRange{Begin: fdb.Key(begin), End: fdb.Key(end)}
	res := t.rt.GetRange(r, fdb.RangeOptions{Limit: opts.Limit, Reverse: opts.Reverse, Mode: fdb.StreamingModeIterator})
	return &iterator{ri: res.Iterator()}
}

func (t *tx) Snapshot() kv.ReadTx {
	root := t
	if t.root != nil {
		root = t.root
	}
	return &tx{tr: t.tr, rt: t.tr.Snapshot(), root: root}
}

func (t *tx) Set(key, value []byte) {
	if t.checkWrite(key, value) == nil {
		t.tr.Set(fdb.Key(key), value)
	}
}

func (t *tx) Clear(key []byte) {
	if t.checkWrite(key, nil) == nil {
		t.tr.Clear(fdb.Key(key))
	}
}

func (t *tx) ClearRange(begin, end []byte) {
	if err := t.size.Add(len(begin) + len(end)); err != nil {
		t.fail(err)
		return
	}
	t.tr.ClearRange(fdb.KeyRange{Begin: fdb.Key(begin), End: fdb.Key(end)})
}

func (t *tx) Add(key []byte, delta int64) {
	d := kv.EncodeInt64LE(delta)
	if t.checkWrite(key, d) == nil {
		t.tr.Add(fdb.Key(key), d)
	}
}

// withOffset appends the 4-byte little-endian offset FDB's versionstamp
// mutations expect (API version 520 and later).
func withOffset(b []byte, offset int) []byte {
	out := make([]byte, len(b)+4)
	copy(out, b)
	binary.LittleEndian.PutUint32(out[len(b):], uint32(offset))
	return out
}

func (t *tx) SetVersionstampedKey(key []byte, offset int, value []byte) error {
	if offset < 0 || offset+kv.VersionstampLength > len(key) {
		return fmt.Errorf("%w: offset %d in a %d-byte key", kv.ErrInvalidVersionstamp, offset, len(key))
	}
	if err := t.checkWrite(key, value); err != nil {
		return err
	}
	t.tr.SetVersionstampedKey(fdb.Key(withOffset(key, offset)), value)
	return nil
}

func (t *tx) SetVersionstampedValue(key, value []byte, offset int) error {
	if offset < 0 || offset+kv.VersionstampLength > len(value) {
		return fmt.Errorf("%w: offset %d in a %d-byte value", kv.ErrInvalidVersionstamp, offset, len(value))
	}
	if err := t.checkWrite(key, value); err != nil {
		return err
	}
	t.tr.SetVersionstampedValue(fdb.Key(key), withOffset(value, offset))
	return nil
}

func (t *tx) AddReadConflictKey(key []byte) {
	if err := t.tr.AddReadConflictKey(fdb.Key(key)); err != nil {
		t.fail(err)
	}
}

func (t *tx) AddReadConflictRange(begin, end []byte) {
	if err := t.tr.AddReadConflictRange(fdb.KeyRange{Begin: fdb.Key(begin), End: fdb.Key(end)}); err != nil {
		t.fail(err)
	}
}

func (t *tx) Watch(key []byte) kv.Watch {
	w := &watch{f: t.tr.Watch(fdb.Key(key)), failed: make(chan struct{})}
	t.watches = append(t.watches, w)
	return w
}

func (t *tx) Versionstamp() kv.VersionstampFuture {
	s := &stampFuture{f: t.tr.GetVersionstamp(), done: make(chan struct{})}
	t.stamps = append(t.stamps, s)
	return s
}

type iterator struct {
	ri  *fdb.RangeIterator
	cur kv.KeyValue
	err error
}

func (it *iterator) Next() bool {
	if it.err != nil || it.ri == nil || !it.ri.Advance() {
		return false
	}
	e, err := it.ri.Get()
	if err != nil {
		it.err = err
		return false
	}
	it.cur = kv.KeyValue{Key: e.Key, Value: e.Value}
	return true
}

func (it *iterator) KeyValue() kv.KeyValue { return it.cur }
func (it *iterator) Err() error            { return it.err }

// watch adapts fdb.FutureNil; a watch of a transaction that did not commit
// fails with the transaction's error.
type watch struct {
	f      fdb.FutureNil
	once   sync.Once
	err    error
	failed chan struct{}
}

func (w *watch) setErr(err error) {
	w.once.Do(func() { w.err = err; close(w.failed) })
}

func (w *watch) Wait(ctx context.Context) error {
	ready := make(chan error, 1)
	go func() { ready <- w.f.Get() }()
	select {
	case err := <-ready:
		return err
	case <-w.failed:
		return w.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (w *watch) Cancel() {
	w.f.Cancel()
	w.setErr(kv.ErrWatchCancelled)
}

type stampFuture struct {
	f     fdb.FutureKey
	done  chan struct{}
	err   error
	stamp [kv.VersionstampLength]byte
}

func (s *stampFuture) resolve(err error) {
	if err == nil {
		k, e := s.f.Get()
		switch {
		case e != nil:
			err = e
		case len(k) != kv.VersionstampLength:
			err = fmt.Errorf("fdb: versionstamp of %d bytes", len(k))
		default:
			copy(s.stamp[:], k)
		}
	}
	s.err = err
	close(s.done)
}

func (s *stampFuture) Get(ctx context.Context) ([kv.VersionstampLength]byte, error) {
	select {
	case <-s.done:
		return s.stamp, s.err
	case <-ctx.Done():
		return [kv.VersionstampLength]byte{}, ctx.Err()
	}
}
