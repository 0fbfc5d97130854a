package sqlite

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"hash/maphash"
	"slices"
	"sort"

	"github.com/couchrep/couchrep/internal/kv"
)

type opKind uint8

const (
	opSet    opKind = iota // value is the new value
	opClear                // the key is removed
	opAdd                  // delta is added to the stored value at commit
	opSetVSV               // value with a versionstamp at vsOffset
)

type op struct {
	kind     opKind
	value    []byte
	delta    int64
	vsOffset int
}

type keyRange struct{ begin, end []byte }

func (r keyRange) contains(k []byte) bool {
	return bytes.Compare(k, r.begin) >= 0 && bytes.Compare(k, r.end) < 0
}

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

type vsKeyWrite struct {
	key    []byte
	offset int
	value  []byte
}

// tx is one attempt of a logical transaction.
type tx struct {
	db     *DB
	ctx    context.Context
	reader *readerConn // the snapshot; nil until the first read
	err    error       // first internal error, fails the commit

	writes  map[string]*op
	clears  []keyRange
	vsKeys  []vsKeyWrite
	points  []pointRead
	ranges  []*rangeRead
	watches []*watch
	stamps  []*stampFuture
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
	return &tx{db: db, ctx: ctx, writes: map[string]*op{}, classic: classic}
}

func (t *tx) fail(err error) {
	if t.err == nil {
		t.err = err
	}
}

func (t *tx) hasWrites() bool {
	return len(t.writes) > 0 || len(t.clears) > 0 || len(t.vsKeys) > 0 || len(t.stamps) > 0
}

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

func (t *tx) cleared(k []byte) bool {
	for _, r := range t.clears {
		if r.contains(k) {
			return true
		}
	}
	return false
}

// Get implements kv.ReadTx.
func (t *tx) Get(key []byte) ([]byte, error) { return t.get(key, false) }

func (t *tx) get(key []byte, snapshot bool) ([]byte, error) {
	if t.done {
		return nil, kv.ErrTxDone
	}
	if o, ok := t.writes[string(key)]; ok {
		switch o.kind {
		case opSet:
			return slices.Clone(o.value), nil
		case opClear:
			return nil, nil
		case opSetVSV:
			return nil, fmt.Errorf("%w: key %x", kv.ErrUnreadable, key)
		case opAdd:
			base, err := t.readStored(key, snapshot)
			if err != nil {
				return nil, err
			}
			return kv.EncodeInt64LE(kv.Int64LE(base) + o.delta), nil
		}
	}
	if t.cleared(key) {
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
		t.writes[string(key)] = &op{kind: opSet, value: slices.Clone(nonNil(value))}
	}
}

// Clear implements kv.Tx.
func (t *tx) Clear(key []byte) {
	if t.checkWrite() {
		t.writes[string(key)] = &op{kind: opClear}
	}
}

// ClearRange implements kv.Tx.
func (t *tx) ClearRange(begin, end []byte) {
	if !t.checkWrite() || bytes.Compare(begin, end) >= 0 {
		return
	}
	r := keyRange{slices.Clone(nonNil(begin)), slices.Clone(end)}
	for k := range t.writes {
		if r.contains([]byte(k)) {
			delete(t.writes, k)
		}
	}
	t.clears = append(t.clears, r)
}

// Add implements kv.Tx.
func (t *tx) Add(key []byte, delta int64) {
	if !t.checkWrite() {
		return
	}
	o, ok := t.writes[string(key)]
	switch {
	case ok && o.kind == opSet:
		o.value = kv.EncodeInt64LE(kv.Int64LE(o.value) + delta)
	case ok && o.kind == opClear, !ok && t.cleared(key):
		t.writes[string(key)] = &op{kind: opSet, value: kv.EncodeInt64LE(delta)}
	case ok && o.kind == opAdd:
		o.delta += delta
	case ok && o.kind == opSetVSV:
		t.fail(fmt.Errorf("%w: Add on key %x", kv.ErrUnreadable, key))
	default:
		t.writes[string(key)] = &op{kind: opAdd, delta: delta}
	}
}

// SetVersionstampedKey implements kv.Tx.
func (t *tx) SetVersionstampedKey(key []byte, offset int, value []byte) error {
	if t.done {
		return kv.ErrTxDone
	}
	if offset < 0 || offset+kv.VersionstampLength > len(key) {
		return fmt.Errorf("%w: offset %d in a %d-byte key", kv.ErrInvalidVersionstamp, offset, len(key))
	}
	t.vsKeys = append(t.vsKeys, vsKeyWrite{key: slices.Clone(key), offset: offset, value: slices.Clone(nonNil(value))})
	return nil
}

// SetVersionstampedValue implements kv.Tx.
func (t *tx) SetVersionstampedValue(key, value []byte, offset int) error {
	if t.done {
		return kv.ErrTxDone
	}
	if offset < 0 || offset+kv.VersionstampLength > len(value) {
		return fmt.Errorf("%w: offset %d in a %d-byte value", kv.ErrInvalidVersionstamp, offset, len(value))
	}
	t.writes[string(key)] = &op{kind: opSetVSV, value: slices.Clone(value), vsOffset: offset}
	return nil
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
	f := &stampFuture{done: make(chan struct{})}
	if t.done {
		f.resolve([kv.VersionstampLength]byte{}, kv.ErrTxDone)
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
		f.resolve([kv.VersionstampLength]byte{}, err)
	}
}

// localKeys returns the buffered keys in [begin, end), sorted.
func (t *tx) localKeys(begin, end []byte, reverse bool) []string {
	var ks []string
	r := keyRange{begin, end}
	for k := range t.writes {
		if r.contains([]byte(k)) {
			ks = append(ks, k)
		}
	}
	sort.Strings(ks)
	if reverse {
		slices.Reverse(ks)
	}
	return ks
}

type stampFuture struct {
	done  chan struct{}
	stamp [kv.VersionstampLength]byte
	err   error
}

func (f *stampFuture) resolve(s [kv.VersionstampLength]byte, err error) {
	select {
	case <-f.done:
		return
	default:
	}
	f.stamp, f.err = s, err
	close(f.done)
}

// Get implements kv.VersionstampFuture.
func (f *stampFuture) Get(ctx context.Context) ([kv.VersionstampLength]byte, error) {
	select {
	case <-f.done:
		return f.stamp, f.err
	case <-ctx.Done():
		return [kv.VersionstampLength]byte{}, ctx.Err()
	}
}
