package postgres

import (
	"bytes"
	"fmt"
	"slices"

	"github.com/couchrep/couchrep/internal/kv"
	"github.com/couchrep/couchrep/internal/kv/kvbuf"
)

// Stored rows are fetched in pages growing from pageMin to pageMax rows:
// a short read (Limit 1) costs one small query, a long one streams.
const (
	pageMin = 16
	pageMax = 1024
)

type row struct{ k, v []byte }

// iterator merges the snapshot's rows with the transaction's buffered
// writes, in key order or reverse.
type iterator struct {
	t       *tx
	all     span // the range asked for
	rest    span // the stored range not fetched yet
	reverse bool
	limit   int
	emitted int
	read    *rangeRd // nil for snapshot reads and read-only transactions

	started, stored, complete bool // stored: every stored row fetched
	page                      []row
	pos                       int
	size                      int
	local                     []string // buffered keys in the range, in order
	lpos                      int
	last                      []byte // the last key consumed
	cur                       kv.KeyValue
	err                       error
}

func (t *tx) getRange(begin, end []byte, opts kv.RangeOptions, snapshot bool) kv.RangeIterator {
	all := span{slices.Clone(kvbuf.NonNil(begin)), slices.Clone(kvbuf.NonNil(end))}
	it := &iterator{t: t, all: all, rest: all, reverse: opts.Reverse, limit: opts.Limit, size: pageMin}
	if t.done {
		it.err = kv.ErrTxDone
	}
	if !snapshot && !t.readOnly {
		it.read = &rangeRd{span: all, it: it}
	}
	return it
}

// GetRange implements kv.ReadTx.
func (t *tx) GetRange(begin, end []byte, opts kv.RangeOptions) kv.RangeIterator {
	return t.getRange(begin, end, opts, false)
}

func (it *iterator) start() {
	it.started = true
	if bytes.Compare(it.all.begin, it.all.end) >= 0 {
		it.complete = true
		return
	}
	it.local = it.t.buf.Keys(it.all.begin, it.all.end, it.reverse)
	if it.read != nil {
		it.t.reads = append(it.t.reads, it.read)
	}
}

// before reports whether a comes before b in the iteration order.
func (it *iterator) before(a, b []byte) bool {
	if it.reverse {
		return bytes.Compare(a, b) > 0
	}
	return bytes.Compare(a, b) < 0
}

// next returns the next stored row, fetching a page when needed.
func (it *iterator) next() (row, bool) {
	if it.pos < len(it.page) {
		return it.page[it.pos], true
	}
	if it.stored || it.err != nil {
		return row{}, false
	}
	n := it.size
	it.size = min(2*it.size, pageMax)
	if it.limit > 0 {
		n = min(n, max(it.limit-it.emitted, 1))
	}
	q := fwdSQL
	if it.reverse {
		q = revSQL
	}
	page, err := it.t.query(q, it.rest.begin, it.rest.end, n)
	if err != nil {
		it.err = it.t.db.errorf(fmt.Sprintf("range [%x, %x)", it.all.begin, it.all.end), err)
		return row{}, false
	}
	it.page, it.pos = page, 0
	if len(it.page) < n {
		it.stored = true
	}
	if len(it.page) == 0 {
		return row{}, false
	}
	lastKey := it.page[len(it.page)-1].k
	if it.reverse {
		it.rest.end = lastKey
	} else {
		it.rest.begin = append(slices.Clone(lastKey), 0)
	}
	return it.page[0], true
}

// Next implements kv.RangeIterator.
func (it *iterator) Next() bool {
	if it.err != nil || it.complete {
		return false
	}
	if it.t.done {
		it.err = kv.ErrTxDone
		return false
	}
	if !it.started {
		if it.start(); it.err != nil || it.complete {
			return false
		}
	}
	if it.limit > 0 && it.emitted >= it.limit {
		it.closeSpan()
		return false
	}
	for {
		r, ok := it.next()
		if it.err != nil {
			return false
		}
		haveLocal := it.lpos < len(it.local)
		if !ok && !haveLocal {
			it.complete = true
			it.closeSpan()
			return false
		}
		if haveLocal && (!ok || !it.before(r.k, []byte(it.local[it.lpos]))) {
			lk := []byte(it.local[it.lpos])
			it.lpos++
			var base []byte
			if ok && bytes.Equal(r.k, lk) {
				base = r.v
				it.pos++
			}
			it.last = lk
			o := it.t.buf.Writes[string(lk)]
			if o == nil || o.Kind == kvbuf.Clear {
				continue
			}
			v, err := o.Merge(lk, base)
			if err != nil {
				it.err = err
				return false
			}
			it.cur = kv.KeyValue{Key: lk, Value: v}
			it.emitted++
			return true
		}
		it.pos++
		it.last = r.k
		if it.t.buf.Cleared(r.k) {
			continue
		}
		it.cur = kv.KeyValue{Key: r.k, Value: r.v}
		it.emitted++
		return true
	}
}

// closeSpan narrows the validated range to what was consumed: rows past
// the last one the caller saw were not read.
func (it *iterator) closeSpan() {
	rd := it.read
	if rd == nil || rd.it == nil {
		return
	}
	rd.it = nil
	switch {
	case it.complete:
	case it.last == nil:
		rd.end = rd.begin
	case it.reverse:
		rd.begin = slices.Clone(it.last)
	default:
		rd.end = append(slices.Clone(it.last), 0)
	}
}

// KeyValue implements kv.RangeIterator.
func (it *iterator) KeyValue() kv.KeyValue { return it.cur }

// Err implements kv.RangeIterator.
func (it *iterator) Err() error { return it.err }
