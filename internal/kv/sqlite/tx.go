package sqlite

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"hash/maphash"
	"slices"

	"github.com/couchrep/couchrep/internal/kv"
	"github.com/couchrep/couchrep/internal/kv/kvbuf"
)

// pointRead is a validated point read: the key and what the snapshot held.
type pointRead struct {
	key     []byte
	value   []byte
	present bool
}

// rangeRead is a validated range read: the span whose stored rows were
// consumed, in which direction, and a digest of those rows.
type rangeRead struct {
	begin, end []byte
	reverse    bool
	h          maphash.Hash
	it         *iterator // while still iterating, the iterator that owns the span
	snap       bool      // a snapshot read: its span is tracked, not validated
}

// tx is one attempt of a logical transaction.
type tx struct {
	db     *DB
	ctx    context.Context
	reader *readerConn // the snapshot; nil until the first read
	err    error       // first internal error, fails the commit

	buf     kvbuf.Buffer // the buffered writes
	points  []pointRead
	ranges  []*rangeRead
	watches []*watch
	stamps  []*kvbuf.StampFuture
	done    bool
	// snapVersion is a lower bound of the snapshot's commit version
	// (db.committed before the read transaction began); see validateKnown.
	snapVersion int64
	// inflight: counted in db.inflight (running its function, not yet
	// queued for commit); see DB.gather.
	inflight bool

	// classic: reads use a reader connection's snapshot (t.reader); else
	// they go through the writer connection (see read.go).
	classic bool
	// Through the writer connection: the generation and version of the
	// view the reads saw (wgen 0: no read yet), whether they could not
	// go on consistently, and the snapshot reads (kept only to decide
	// whether the transaction can move to a newer view).
	wgen       uint64
	wver       int64
	moved      bool
	snapPoints []pointRead
	snapRanges []*rangeRead
}

// leaveInflight uncounts t from db.inflight, once.
func (t *tx) leaveInflight() {
	if t.inflight {
		t.inflight = false
		t.db.inflight.Add(-1)
	}
}

var _ kv.Tx = (*tx)(nil)

func newTx(ctx context.Context, db *DB, classic bool) *tx {
	return &tx{db: db, ctx: ctx, buf: kvbuf.New(), classic: classic}
}

func (t *tx) fail(err error) {
	if t.err == nil {
		t.err = err
	}
}

// failSize fails the transaction with err if it is a write beyond kv's
// size limits (other errors leave it usable), and returns err.
func (t *tx) failSize(err error) error {
	if kv.IsTooLarge(err) {
		t.fail(err)
	}
	return err
}

func (t *tx) hasWrites() bool { return t.buf.HasWrites() || len(t.stamps) > 0 }

// snapshot starts the read transaction on first use.
func (t *tx) snapshot() (*readerConn, error) {
	if t.reader != nil {
		return t.reader, nil
	}
	r, err := t.db.getReader()
	if err != nil {
		return nil, fmt.Errorf("sqlite: reader: %w", err)
	}
	t.snapVersion = t.db.committed.Load()
	if err := r.begin.exec(); err != nil {
		t.db.putReader(r)
		return nil, fmt.Errorf("sqlite: begin read: %w", err)
	}
	t.reader = r
	return r, nil
}

// endSnapshot ends the read transaction and returns its connection.
func (t *tx) endSnapshot() {
	if t.reader == nil {
		return
	}
	if err := t.reader.rollback.exec(); err != nil {
		t.reader.close()
	} else {
		t.db.putReader(t.reader)
	}
	t.reader = nil
}

// Get implements kv.ReadTx.
func (t *tx) Get(key []byte) ([]byte, error) { return t.get(key, false) }

func (t *tx) get(key []byte, snapshot bool) ([]byte, error) {
	if t.done {
		return nil, kv.ErrTxDone
	}
	if o, ok := t.buf.Writes[string(key)]; ok {
		var base []byte
		if o.Kind == kvbuf.Add {
			var err error
			if base, err = t.readStored(key, snapshot); err != nil {
				return nil, err
			}
		}
		return o.Merge(key, base)
	}
	if t.buf.Cleared(key) {
		return nil, nil
	}
	return t.readStored(key, snapshot)
}

// readStored reads key from the snapshot, recording it unless snapshot.
func (t *tx) readStored(key []byte, snapshot bool) ([]byte, error) {
	var v []byte
	var present bool
	if err := t.read(func(s stmts) error {
		var err error
		v, present, err = s.getValue(key)
		return err
	}); err != nil {
		return nil, fmt.Errorf("sqlite: get %x: %w", key, err)
	}
	switch {
	case !snapshot:
		t.points = append(t.points, pointRead{key: slices.Clone(key), value: v, present: present})
	case !t.classic:
		t.snapPoints = append(t.snapPoints, pointRead{key: slices.Clone(key)})
	}
	return slices.Clone(v), nil
}

// GetRange implements kv.ReadTx.
func (t *tx) GetRange(begin, end []byte, opts kv.RangeOptions) kv.RangeIterator {
	return t.getRange(begin, end, opts, false)
}

// Snapshot implements kv.ReadTx.
func (t *tx) Snapshot() kv.ReadTx { return snapshotTx{t} }

type snapshotTx struct{ t *tx }

func (s snapshotTx) Get(key []byte) ([]byte, error) { return s.t.get(key, true) }
func (s snapshotTx) GetRange(begin, end []byte, opts kv.RangeOptions) kv.RangeIterator {
	return s.t.getRange(begin, end, opts, true)
}
func (s snapshotTx) Snapshot() kv.ReadTx { return s }

func (t *tx) checkWrite() bool {
	if t.done {
		t.fail(kv.ErrTxDone)
		return false
	}
	return true
}

// Set implements kv.Tx.
func (t *tx) Set(key, value []byte) {
	if t.checkWrite() {
		t.fail(t.buf.Set(key, value))
	}
}

// Clear implements kv.Tx.
func (t *tx) Clear(key []byte) {
	if t.checkWrite() {
		t.fail(t.buf.Clear(key))
	}
}

// ClearRange implements kv.Tx.
func (t *tx) ClearRange(begin, end []byte) {
	if t.checkWrite() {
		t.fail(t.buf.ClearRange(begin, end))
	}
}

// Add implements kv.Tx.
func (t *tx) Add(key []byte, delta int64) {
	if t.checkWrite() {
		if err := t.buf.Add(key, delta); err != nil {
			t.fail(err)
		}
	}
}

// SetVersionstampedKey implements kv.Tx.
func (t *tx) SetVersionstampedKey(key []byte, offset int, value []byte) error {
	if t.done {
		return kv.ErrTxDone
	}
	return t.failSize(t.buf.SetVersionstampedKey(key, offset, value))
}

// SetVersionstampedValue implements kv.Tx.
func (t *tx) SetVersionstampedValue(key, value []byte, offset int) error {
	if t.done {
		return kv.ErrTxDone
	}
	return t.failSize(t.buf.SetVersionstampedValue(key, value, offset))
}

// AddReadConflictKey implements kv.Tx.
func (t *tx) AddReadConflictKey(key []byte) {
	if !t.checkWrite() {
		return
	}
	if _, err := t.readStored(key, false); err != nil {
		t.fail(err)
	}
}

// AddReadConflictRange implements kv.Tx.
func (t *tx) AddReadConflictRange(begin, end []byte) {
	if !t.checkWrite() || bytes.Compare(begin, end) >= 0 {
		return
	}
	rr := &rangeRead{begin: slices.Clone(begin), end: slices.Clone(end)}
	rr.h.SetSeed(t.db.seed)
	if err := t.read(func(s stmts) error { return digestRange(s, rr.begin, rr.end, false, &rr.h) }); err != nil {
		t.fail(fmt.Errorf("sqlite: read conflict range: %w", err))
		return
	}
	t.ranges = append(t.ranges, rr)
}

// digestRange hashes every stored row in [begin, end), streaming by pages.
func digestRange(s stmts, begin, end []byte, reverse bool, h *maphash.Hash) error {
	var buf []kvPair
	var err error
	for {
		buf, err = s.page(begin, end, reverse, rangePageMax, buf[:0])
		if err != nil {
			return err
		}
		for _, p := range buf {
			hashPair(h, p.k, p.v)
		}
		if len(buf) < rangePageMax {
			return nil
		}
		last := buf[len(buf)-1].k
		if reverse {
			end = last
		} else {
			begin = append(slices.Clone(last), 0)
		}
	}
}

func hashPair(h *maphash.Hash, k, v []byte) {
	var n [8]byte
	binary.LittleEndian.PutUint32(n[:4], uint32(len(k)))
	binary.LittleEndian.PutUint32(n[4:], uint32(len(v)))
	h.Write(n[:])
	h.Write(k)
	h.Write(v)
}

// Watch implements kv.Tx.
func (t *tx) Watch(key []byte) kv.Watch {
	w := newWatch(t.db, key)
	if t.done {
		w.fail(kv.ErrTxDone)
		return w
	}
	t.watches = append(t.watches, w)
	return w
}

// Versionstamp implements kv.Tx.
func (t *tx) Versionstamp() kv.VersionstampFuture {
	f := kvbuf.NewStampFuture()
	if t.done {
		f.Resolve([kv.VersionstampLength]byte{}, kv.ErrTxDone)
		return f
	}
	t.stamps = append(t.stamps, f)
	return f
}

// finishReads closes the spans of range reads still being iterated.
func (t *tx) finishReads() {
	for _, rr := range t.ranges {
		if rr.it != nil {
			rr.it.closeSpan()
		}
	}
	for _, rr := range t.snapRanges {
		if rr.it != nil {
			rr.it.closeSpan()
		}
	}
}

// finish fails the attempt's watches and stamps with err (nil: they were
// handled by the commit) and marks the tx done.
func (t *tx) finish(err error) {
	t.done = true
	t.endSnapshot()
	if err == nil {
		return
	}
	for _, w := range t.watches {
		w.fail(err)
	}
	for _, f := range t.stamps {
		f.Resolve([kv.VersionstampLength]byte{}, err)
	}
}
