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
// consumed (narrowed by its iterator), in which direction, and a digest
// of those rows.
type rangeRead struct {
	kvbuf.Span
	reverse bool
	h       maphash.Hash
	snap    bool // a snapshot read: its span is tracked, not validated
}

// tx is one attempt of a logical transaction.
type tx struct {
	kvbuf.Tx // the buffered writes, the first internal error, done
	db       *DB
	ctx      context.Context
	reader   *readerConn // the snapshot; nil until the first read

	points  []pointRead
	ranges  []*rangeRead
	watches []*watch
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

var (
	_ kv.Tx       = (*tx)(nil)
	_ kvbuf.Store = (*tx)(nil)
)

func newTx(ctx context.Context, db *DB, classic bool) *tx {
	t := &tx{db: db, ctx: ctx, classic: classic}
	t.Init(t)
	return t
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

// ReadStored implements kvbuf.Store: it reads key from the snapshot,
// recording it unless snapshot.
func (t *tx) ReadStored(key []byte, snapshot bool) ([]byte, error) {
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

// AddReadConflictKey implements kv.Tx.
func (t *tx) AddReadConflictKey(key []byte) {
	if !t.Writable() {
		return
	}
	if _, err := t.ReadStored(key, false); err != nil {
		t.Fail(err)
	}
}

// AddReadConflictRange implements kv.Tx.
func (t *tx) AddReadConflictRange(begin, end []byte) {
	if !t.Writable() || bytes.Compare(begin, end) >= 0 {
		return
	}
	rr := &rangeRead{Span: kvbuf.Span{Range: kvbuf.Range{Begin: slices.Clone(begin), End: slices.Clone(end)}}}
	rr.h.SetSeed(t.db.seed)
	if err := t.read(func(s stmts) error { return digestRange(s, rr.Begin, rr.End, false, &rr.h) }); err != nil {
		t.Fail(fmt.Errorf("sqlite: read conflict range: %w", err))
		return
	}
	t.ranges = append(t.ranges, rr)
}

// digestRange hashes every stored row in [begin, end), streaming by pages.
func digestRange(s stmts, begin, end []byte, reverse bool, h *maphash.Hash) error {
	var buf []kvbuf.Row
	var err error
	for {
		buf, err = s.page(begin, end, reverse, rangePageMax, buf[:0])
		if err != nil {
			return err
		}
		for _, p := range buf {
			hashPair(h, p.K, p.V)
		}
		if len(buf) < rangePageMax {
			return nil
		}
		last := buf[len(buf)-1].K
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
	if t.Done {
		w.fail(kv.ErrTxDone)
		return w
	}
	t.watches = append(t.watches, w)
	return w
}

// finishReads closes the spans of range reads still being iterated.
func (t *tx) finishReads() {
	for _, rr := range t.ranges {
		rr.Close()
	}
	for _, rr := range t.snapRanges {
		rr.Close()
	}
}

// finish fails the attempt's watches and stamps with err (nil: they were
// handled by the commit) and marks the tx done.
func (t *tx) finish(err error) {
	t.Finish(err)
	t.endSnapshot()
	if err == nil {
		return
	}
	for _, w := range t.watches {
		w.fail(err)
	}
}
