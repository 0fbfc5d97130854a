package kvbuf

import (
	"bytes"
	"slices"

	"github.com/couchrep/couchrep/internal/kv"
)

// Row is a stored key and its value.
type Row struct{ K, V []byte }

// Rows is the stored side of an Iterator: the backend's iterator, which
// embeds the Iterator.
type Rows interface {
	// Start is called by the first Next on a non-empty range, before any
	// Fetch; an error ends the iteration with it.
	Start() error
	// Fetch returns up to n stored rows of [begin, end), in the
	// iteration's order; fewer than n: there are no more. An error ends
	// the iteration with it.
	Fetch(begin, end []byte, n int) ([]Row, error)
	// Consumed is called for each stored row the iteration passes.
	Consumed(r Row)
}

// Iterator is a kv.RangeIterator that merges the stored rows of a range,
// fetched in pages growing from a minimum to a maximum size, with the
// transaction's buffered writes (read-your-writes), in key order or
// reverse. Backends embed it and implement Rows.
type Iterator struct {
	Range   Range // the range asked for
	Reverse bool

	tx             *Tx
	rows           Rows
	rest           Range // the stored range not fetched yet
	limit, emitted int
	size, maxSize  int   // the next page's size, its maximum
	span           *Span // the read's span, narrowed when the iteration stops

	started, stored, complete bool // stored: every stored row fetched
	page                      []Row
	pos                       int
	local                     []string // buffered keys in the range, in order
	lpos                      int
	last                      []byte // the last key consumed
	cur                       kv.KeyValue
	err                       error
}

// Init readies it to read [begin, end) of t's snapshot from rows in pages
// of pageMin rows, doubling up to pageMax.
func (it *Iterator) Init(t *Tx, rows Rows, begin, end []byte, opts kv.RangeOptions, pageMin, pageMax int) {
	it.Range = Range{slices.Clone(NonNil(begin)), slices.Clone(NonNil(end))}
	it.rest = it.Range
	it.Reverse, it.limit = opts.Reverse, opts.Limit
	it.tx, it.rows = t, rows
	it.size, it.maxSize = pageMin, pageMax
	if t.Done {
		it.err = kv.ErrTxDone
	}
}

// Span is the key range a range read covers, for conflicts: while its
// iterator runs, it is narrowed to what the caller consumed when the
// iteration stops or Close is called.
type Span struct {
	Range
	it *Iterator
}

// Track makes s the span of it's read (the whole range, until narrowed).
func (it *Iterator) Track(s *Span) {
	s.Range, s.it = it.Range, it
	it.span = s
}

// Close narrows s to what its iterator consumed if it still runs: rows
// past the last one the caller saw were not read.
func (s *Span) Close() {
	if s.it != nil {
		s.it.closeSpan()
	}
}

func (it *Iterator) closeSpan() {
	s := it.span
	if s == nil || s.it == nil {
		return
	}
	s.it = nil
	switch {
	case it.complete:
	case it.last == nil:
		s.End = s.Begin // nothing read: no conflict
	case it.Reverse:
		s.Begin = slices.Clone(it.last)
	default:
		s.End = append(slices.Clone(it.last), 0)
	}
}

func (it *Iterator) start() {
	it.started = true
	if bytes.Compare(it.Range.Begin, it.Range.End) >= 0 {
		it.complete = true
		return
	}
	if err := it.rows.Start(); err != nil {
		it.err = err
		return
	}
	it.local = it.tx.Buf.Keys(it.Range.Begin, it.Range.End, it.Reverse)
}

// before reports whether a comes before b in the iteration order.
func (it *Iterator) before(a, b []byte) bool {
	if it.Reverse {
		return bytes.Compare(a, b) > 0
	}
	return bytes.Compare(a, b) < 0
}

// peek returns the next stored row, fetching a page when needed.
func (it *Iterator) peek() (Row, bool) {
	if it.pos < len(it.page) {
		return it.page[it.pos], true
	}
	if it.stored || it.err != nil {
		return Row{}, false
	}
	n := it.size
	it.size = min(2*it.size, it.maxSize)
	if it.limit > 0 {
		n = min(n, max(it.limit-it.emitted, 1))
	}
	page, err := it.rows.Fetch(it.rest.Begin, it.rest.End, n)
	if err != nil {
		it.err = err
		return Row{}, false
	}
	it.page, it.pos = page, 0
	if len(page) < n {
		it.stored = true
	}
	if len(page) == 0 {
		return Row{}, false
	}
	lastKey := page[len(page)-1].K
	if it.Reverse {
		it.rest.End = lastKey
	} else {
		it.rest.Begin = append(slices.Clone(lastKey), 0)
	}
	return page[0], true
}

func (it *Iterator) consume(r Row) {
	it.pos++
	it.rows.Consumed(r)
	it.last = r.K
}

// Next implements kv.RangeIterator.
func (it *Iterator) Next() bool {
	if it.err != nil || it.complete {
		return false
	}
	if it.tx.Done {
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
		r, ok := it.peek()
		if it.err != nil {
			return false
		}
		haveLocal := it.lpos < len(it.local)
		if !ok && !haveLocal {
			it.complete = true
			it.closeSpan()
			return false
		}
		if haveLocal && (!ok || !it.before(r.K, []byte(it.local[it.lpos]))) {
			lk := []byte(it.local[it.lpos])
			it.lpos++
			var base []byte
			if ok && bytes.Equal(r.K, lk) {
				base = r.V
				it.consume(r)
			}
			it.last = lk
			o := it.tx.Buf.Writes[string(lk)]
			if o == nil || o.Kind == Clear {
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
		it.consume(r)
		if it.tx.Buf.Cleared(r.K) {
			continue
		}
		it.cur = kv.KeyValue{Key: r.K, Value: r.V}
		it.emitted++
		return true
	}
}

// KeyValue implements kv.RangeIterator.
func (it *Iterator) KeyValue() kv.KeyValue { return it.cur }

// Err implements kv.RangeIterator.
func (it *Iterator) Err() error { return it.err }
