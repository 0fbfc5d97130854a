package sqlite

import (
	"bytes"
	"fmt"
	"slices"

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

// iterator merges the snapshot's stored rows with the transaction's own
// buffered writes (read-your-writes), in key order or reverse.
type iterator struct {
	t                  *tx
	origBegin, origEnd []byte
	begin, end         []byte // the stored range not fetched yet
	reverse, snapshot  bool
	limit, emitted     int

	rr       *rangeRead // the span read (validated unless rr.snap); nil for classic snapshot reads
	started  bool
	page     []kvPair
	pos      int
	pageSize int
	dbDone   bool
	local    []string
	lpos     int
	lastKey  []byte
	complete bool
	cur      kv.KeyValue
	err      error
}

func (t *tx) getRange(begin, end []byte, opts kv.RangeOptions, snapshot bool) kv.RangeIterator {
	it := &iterator{
		t: t, origBegin: slices.Clone(nonNil(begin)), origEnd: slices.Clone(nonNil(end)),
		reverse: opts.Reverse, snapshot: snapshot, limit: opts.Limit, pageSize: rangePageMin,
	}
	it.begin, it.end = it.origBegin, it.origEnd
	if t.done {
		it.err = kv.ErrTxDone
	}
	return it
}

func (it *iterator) start() bool {
	it.started = true
	if bytes.Compare(it.begin, it.end) >= 0 {
		it.complete, it.dbDone = true, true
		return true
	}
	if it.t.classic {
		if _, err := it.t.snapshot(); err != nil {
			it.err = err
			return false
		}
	}
	it.local = it.t.buf.Keys(it.begin, it.end, it.reverse)
	switch {
	case !it.snapshot:
		it.rr = &rangeRead{begin: it.origBegin, end: it.origEnd, reverse: it.reverse, it: it}
		it.rr.h.SetSeed(it.t.db.seed)
		it.t.ranges = append(it.t.ranges, it.rr)
	case !it.t.classic:
		// Not validated; only for moving to a newer view (read.go).
		it.rr = &rangeRead{begin: it.origBegin, end: it.origEnd, reverse: it.reverse, it: it, snap: true}
		it.t.snapRanges = append(it.t.snapRanges, it.rr)
	}
	return true
}

// peek returns the next stored row, fetching a page if needed.
func (it *iterator) peek() (kvPair, bool) {
	if it.pos < len(it.page) {
		return it.page[it.pos], true
	}
	if it.dbDone || it.err != nil {
		return kvPair{}, false
	}
	n := it.pageSize
	if it.pageSize < rangePageMax {
		it.pageSize *= 2
	}
	if it.limit > 0 && it.limit-it.emitted < n {
		n = it.limit - it.emitted
	}
	var page []kvPair
	err := it.t.read(func(s stmts) error {
		var err error
		page, err = s.page(it.begin, it.end, it.reverse, n, nil)
		return err
	})
	if err != nil {
		it.err = fmt.Errorf("sqlite: range [%x, %x): %w", it.origBegin, it.origEnd, err)
		return kvPair{}, false
	}
	it.page, it.pos = page, 0
	if len(page) < n {
		it.dbDone = true
	}
	if len(page) > 0 {
		last := page[len(page)-1].k
		if it.reverse {
			it.end = last
		} else {
			it.begin = append(slices.Clone(last), 0)
		}
	}
	if len(page) == 0 {
		return kvPair{}, false
	}
	return page[0], true
}

func (it *iterator) consume(p kvPair) {
	it.pos++
	if it.rr != nil && !it.rr.snap {
		hashPair(&it.rr.h, p.k, p.v)
	}
	it.lastKey = p.k
}

// before reports whether a comes before b in the iteration order.
func (it *iterator) before(a, b []byte) bool {
	c := bytes.Compare(a, b)
	if it.reverse {
		return c > 0
	}
	return c < 0
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
	if !it.started && !it.start() {
		return false
	}
	if it.complete {
		return false
	}
	if it.limit > 0 && it.emitted >= it.limit {
		it.closeSpan() // nothing past the last row is read
		return false
	}
	for {
		row, hasRow := it.peek()
		if it.err != nil {
			return false
		}
		hasLocal := it.lpos < len(it.local)
		if !hasRow && !hasLocal {
			it.complete = true
			it.closeSpan()
			return false
		}
		if hasLocal {
			lk := []byte(it.local[it.lpos])
			if !hasRow || !it.before(row.k, lk) {
				var base []byte
				if hasRow && bytes.Equal(row.k, lk) {
					base = row.v
					it.consume(row)
				}
				it.lpos++
				it.lastKey = lk
				o, ok := it.t.buf.Writes[string(lk)]
				if !ok || o.Kind == kvbuf.Clear {
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
		}
		it.consume(row)
		if it.t.buf.Cleared(row.k) {
			continue
		}
		it.cur = kv.KeyValue{Key: row.k, Value: row.v}
		it.emitted++
		return true
	}
}

// closeSpan fixes the conflict span to what was consumed so far.
func (it *iterator) closeSpan() {
	rr := it.rr
	if rr == nil || rr.it == nil {
		return
	}
	rr.it = nil
	switch {
	case it.complete:
	case it.lastKey == nil:
		rr.end = rr.begin // nothing read: no conflict
	case it.reverse:
		rr.begin = slices.Clone(it.lastKey)
	default:
		rr.end = append(slices.Clone(it.lastKey), 0)
	}
}

// KeyValue implements kv.RangeIterator.
func (it *iterator) KeyValue() kv.KeyValue { return it.cur }

// Err implements kv.RangeIterator.
func (it *iterator) Err() error { return it.err }
