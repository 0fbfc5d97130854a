package postgres

import (
	"fmt"

	"github.com/couchrep/couchrep/internal/kv"
	"github.com/couchrep/couchrep/internal/kv/kvbuf"
)

// Stored rows are fetched in pages growing from pageMin to pageMax rows:
// a short read (Limit 1) costs one small query, a long one streams.
const (
	pageMin = 16
	pageMax = 1024
)

// iterator is a range read: kvbuf.Iterator merging the snapshot's rows
// with the transaction's buffered writes.
type iterator struct {
	kvbuf.Iterator
	t     *tx
	track bool       // validated: not a snapshot read or a read-only transaction
	span  kvbuf.Span // the validated span, when track
}

// ReadRange implements kvbuf.Store.
func (t *tx) ReadRange(begin, end []byte, opts kv.RangeOptions, snapshot bool) kv.RangeIterator {
	it := &iterator{t: t, track: !snapshot && !t.readOnly}
	it.Init(&t.Tx, it, begin, end, opts, pageMin, pageMax)
	return it
}

// Start implements kvbuf.Rows.
func (it *iterator) Start() error {
	if it.track {
		it.Track(&it.span)
		it.t.reads = append(it.t.reads, &it.span)
	}
	return nil
}

// Fetch implements kvbuf.Rows.
func (it *iterator) Fetch(begin, end []byte, n int) ([]kvbuf.Row, error) {
	q := fwdSQL
	if it.Reverse {
		q = revSQL
	}
	page, err := it.t.query(q, begin, end, n)
	if err != nil {
		return nil, it.t.db.errorf(fmt.Sprintf("range [%x, %x)", it.Range.Begin, it.Range.End), err)
	}
	return page, nil
}

// Consumed implements kvbuf.Rows.
func (it *iterator) Consumed(kvbuf.Row) {}
