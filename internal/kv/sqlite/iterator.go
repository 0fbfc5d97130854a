package sqlite

import (
	"fmt"

	"github.com/couchrep/couchrep/internal/kv"
	"github.com/couchrep/couchrep/internal/kv/kvbuf"
)

// Range reads fetch stored rows in pages that grow from rangePageMin to
// rangePageMax rows, so a short read stays cheap and a long one streams
// without holding the range in memory.
const (
	rangePageMin = 32
	rangePageMax = 1024
)

// iterator is a range read: kvbuf.Iterator merging the snapshot's stored
// rows with the transaction's buffered writes.
type iterator struct {
	kvbuf.Iterator
	t        *tx
	snapshot bool
	rr       *rangeRead // the span read (validated unless rr.snap); nil for classic snapshot reads
}

// ReadRange implements kvbuf.Store.
func (t *tx) ReadRange(begin, end []byte, opts kv.RangeOptions, snapshot bool) kv.RangeIterator {
	it := &iterator{t: t, snapshot: snapshot}
	it.Init(&t.Tx, it, begin, end, opts, rangePageMin, rangePageMax)
	return it
}

// Start implements kvbuf.Rows.
func (it *iterator) Start() error {
	t := it.t
	if t.classic {
		if _, err := t.snapshot(); err != nil {
			return err
		}
	}
	switch {
	case !it.snapshot:
		it.rr = &rangeRead{reverse: it.Reverse}
		it.rr.h.SetSeed(t.db.seed)
		t.ranges = append(t.ranges, it.rr)
	case !t.classic:
		// Not validated; only for moving to a newer view (read.go).
		it.rr = &rangeRead{reverse: it.Reverse, snap: true}
		t.snapRanges = append(t.snapRanges, it.rr)
	default:
		return nil
	}
	it.Track(&it.rr.Span)
	return nil
}

// Fetch implements kvbuf.Rows.
func (it *iterator) Fetch(begin, end []byte, n int) ([]kvbuf.Row, error) {
	var page []kvbuf.Row
	err := it.t.read(func(s stmts) error {
		var err error
		page, err = s.page(begin, end, it.Reverse, n, nil)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("sqlite: range [%x, %x): %w", it.Range.Begin, it.Range.End, err)
	}
	return page, nil
}

// Consumed implements kvbuf.Rows: a validated read hashes the row.
func (it *iterator) Consumed(r kvbuf.Row) {
	if it.rr != nil && !it.rr.snap {
		hashPair(&it.rr.h, r.K, r.V)
	}
}
