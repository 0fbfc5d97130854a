package kv

import "bytes"

// Keys drains it and returns copies of its keys: for a caller that writes
// to the range while going through what it read.
func Keys(it RangeIterator) ([][]byte, error) {
	var keys [][]byte
	for it.Next() {
		keys = append(keys, bytes.Clone(it.KeyValue().Key))
	}
	return keys, it.Err()
}

// ClearWhere clears, in tx, each entry of [begin, end) (at most opts.Limit
// of them read) for which drop reports true, and returns how many it
// cleared. drop may read through tx; the entries are cleared after the
// range was read whole, and none if drop or the read fails.
func ClearWhere(tx Tx, begin, end []byte, opts RangeOptions, drop func(KeyValue) (bool, error)) (int, error) {
	it := tx.GetRange(begin, end, opts)
	var gone [][]byte
	for it.Next() {
		ok, err := drop(it.KeyValue())
		if err != nil {
			return 0, err
		}
		if ok {
			gone = append(gone, bytes.Clone(it.KeyValue().Key))
		}
	}
	if err := it.Err(); err != nil {
		return 0, err
	}
	for _, k := range gone {
		tx.Clear(k)
	}
	return len(gone), nil
}
